"""The served app on Ray Serve: two replicas on a local Ray, clients through Serve's proxy.

The scripted upstream counts what reached it, so its peak is the test of whether the
endpoint's ``max_concurrent`` held across both replicas' processes; the program answers
with its process id, which tells which replica served each request.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from plait.errors import ConfigError
from plait.testing import ScriptedServer, server_in_thread

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")

from ray import serve  # noqa: E402

from plait.serve.ray_serve import deployment, run  # noqa: E402
from serve.ray_programs import WhoAnswers, WhoAnswersBriefly  # noqa: E402
from serve.support import free_port, sse_events, start_ray, upstream  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]
LIMIT = 3


@pytest.fixture(scope="module")
def upstream_server() -> Iterator[ScriptedServer]:
    with server_in_thread(latency=0.05) as running:
        yield running


@pytest.fixture(scope="module")
def served(upstream_server: ScriptedServer) -> Iterator[str]:
    """Two replicas of the app on a local Ray; yields the base URL of Serve's proxy."""
    start_ray({"PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), str(TESTS)])})
    port = free_port()
    try:
        run(
            {"who": WhoAnswers()},
            upstream(upstream_server, max_concurrent=LIMIT),
            replicas=2,
            port=port,
            ray_options={"ray_actor_options": {"num_cpus": 0}},
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


async def _post_all(url: str, bodies: list[dict]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        return await asyncio.gather(*(client.post(url, json=body) for body in bodies))


def test_two_replicas_keep_the_endpoint_limit_and_both_serve(served, upstream_server):
    upstream_server.stats.reset()
    bodies = [{"text": f"q{i}"} for i in range(120)]
    pids: set[int] = set()
    sent = 0
    # Rounds until both replicas answered: the proxy routes to a replica once it has
    # heard of it, which on a busy machine can come after the first round.
    for _ in range(20):
        answers = asyncio.run(_post_all(f"{served}/programs/who/run", bodies))
        sent += len(bodies)

        assert [a.status_code for a in answers] == [200] * len(bodies)
        outputs = [a.json()["output"] for a in answers]
        assert [o["reply"] for o in outputs] == [f"echo: q{i}" for i in range(len(bodies))]
        pids |= {o["pid"] for o in outputs}
        if len(pids) == 2:
            break
    assert len(pids) == 2, "both replicas serve requests"
    assert upstream_server.stats.requests == sent
    assert 1 <= upstream_server.stats.peak_concurrency <= LIMIT


def test_each_replica_opened_its_lease_before_taking_requests(served, upstream_server):
    from plait.distributed.ray import _actor_name
    from plait.resources import ResourceConfig
    from plait.serve.ray_serve import _namespace

    config = ResourceConfig(upstream(upstream_server, max_concurrent=LIMIT))
    (endpoint,) = config.endpoints()
    name = _actor_name(_namespace("plait", config), endpoint.name)
    # the replicas made it, detached, in their Ray namespace
    (where,) = [
        actor["namespace"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"] == name
    ]
    limits = ray.get_actor(name, where)

    stats = ray.get(limits.stats.remote())

    assert stats["limit"] == LIMIT
    assert stats["opened"] >= 2, "each replica opened its lease as it started"


def test_events_and_the_openai_route_pass_through_the_proxy(served):
    async def both() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            streamed = await client.post(
                f"{served}/programs/who/run?stream=true", json={"text": "hello"}
            )
            chat = await client.post(
                f"{served}/v1/chat/completions",
                json={"model": "who", "messages": [{"role": "user", "content": "hi there"}]},
            )
            return streamed, chat

    streamed, chat = asyncio.run(both())

    assert streamed.headers["content-type"].startswith("text/event-stream")
    name, data = sse_events(streamed.text)[-1]
    assert name == "output" and data["output"]["reply"] == "echo: hello"
    assert chat.status_code == 200
    content = json.loads(chat.json()["choices"][0]["message"]["content"])
    assert content["reply"] == "echo: hi there"


def test_two_replicas_spend_one_endpoint_budget_together(served, upstream_server):
    """Rounds of 40 requests at once against a budget with room for 100 calls: the two
    replicas send at most 100 together (each one's own $100 would let all 120 of three
    rounds through), and no fewer than the budget less one call's worst case."""
    port = int(served.rsplit(":", 1)[1])
    # Prompts are free and a reply ("echo: qN") is 2 tokens at $0.50 each: a call costs
    # (and, with max_tokens=2, holds at most) $1.00.
    budgeted = upstream(
        upstream_server, max_concurrent=64, budget=100.0, price={"input": 0, "output": 500_000}
    )
    serve.delete("plait")
    upstream_server.stats.reset()
    try:
        run({"who": WhoAnswersBriefly()}, budgeted, replicas=2, port=port, name="budgeted",
            ray_options={"ray_actor_options": {"num_cpus": 0}})  # fmt: skip
        served_pids: set[int] = set()
        answered = refused = 0
        for _ in range(6):  # rounds until the budget refuses
            bodies = [{"text": f"q{i}"} for i in range(40)]
            answers = asyncio.run(_post_all(f"{served}/programs/who/run", bodies))
            ok = [a for a in answers if a.status_code == 200]
            answered += len(ok)
            served_pids |= {a.json()["output"]["pid"] for a in ok}
            refused += len(answers) - len(ok)
            if refused:
                break
    finally:
        serve.delete("budgeted")
        run({"who": WhoAnswers()}, upstream(upstream_server, max_concurrent=LIMIT), replicas=2,
            port=port, ray_options={"ray_actor_options": {"num_cpus": 0}})  # fmt: skip
    assert refused > 0
    assert 99 <= answered == upstream_server.stats.requests <= 100  # one budget, and used
    assert len(served_pids) == 2


def test_resources_built_in_code_are_refused_with_what_to_pass_instead():
    from plait.resources import ResourceConfig

    built = ResourceConfig({"*": {"provider": "openai", "model": "m", "api_key": "k"}})

    with pytest.raises(ConfigError, match=r"cannot get these resources.*ResourceConfig\.from_file"):
        deployment(WhoAnswers(), built)
