"""plait over Ray Data on a local cluster started here, against a scripted server on loopback.

The server counts what really reached it: its peak concurrency is the test
of whether an endpoint's ``max_concurrent`` held across worker processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from plait.testing import ScriptedServer, server_in_thread

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from tests.cli.sample_programs import Answer, Summarize  # noqa: E402
from tests.distributed.ray_programs import Brief  # noqa: E402

from plait import LLMInference, Module  # noqa: E402
from plait.distributed import PlaitMapper, map_dataset  # noqa: E402
from plait.distributed.ray import cluster_limiters, endpoint_actor, endpoints_used  # noqa: E402
from plait.resources import ResourceConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# Ray Data warns about its own deprecated settings when it reads its context.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with server_in_thread(latency=0.05, responder=fail_marked) as running:
        yield running


def fail_marked(body: dict) -> str:
    text = body["messages"][-1]["content"]
    if "FAIL" in text:
        raise ValueError("scripted failure")
    return f"echo: {text}"


def test_two_workers_keep_max_concurrent_across_the_cluster_and_input_order(cluster, server):
    rows = [{"text": f"FAIL {i}" if i == 7 else f"row {i}", "id": i} for i in range(80)]
    ds = ray.data.from_items(rows, override_num_blocks=4)
    resources = {"llm": server.endpoint(max_concurrent=3, max_retries=0)}

    out = map_dataset(
        Summarize(), ds, resources=resources, concurrency=2, batch_size=10, max_concurrent=16
    ).take_all()

    assert [r["id"] for r in out] == list(range(80))
    assert out[0]["output"] == "echo: row 0" and out[0]["error"] is None
    assert out[7]["output"] is None and "scripted failure" in out[7]["error"]
    assert out[7]["error"].startswith("BackendError: ") and out[7]["error"].endswith("(in summary)")
    assert server.stats.requests == 80
    assert 1 <= server.stats.peak_concurrency <= 3


def test_shares_split_the_limit_between_workers(cluster, server):
    rows = [{"text": f"row {i}"} for i in range(40)]
    resources = {"llm": server.endpoint(max_concurrent=4, max_retries=0)}
    ds = ray.data.from_items(rows, override_num_blocks=4)

    out = map_dataset(
        Summarize(), ds, resources=resources, limits="shares", concurrency=2, batch_size=10
    ).take_all()

    assert [r["output"] for r in out] == [f"echo: row {i}" for i in range(40)]
    assert server.stats.peak_concurrency <= 4


def test_the_mapper_fills_several_arguments_by_column_and_fails_a_row_without_them(cluster, server):
    rows = [{"q": "who?", "context": "docs"}, {"context": "no question"}]
    resources = {"llm": server.endpoint(max_retries=0)}
    ds = ray.data.from_items(rows)

    out = ds.map_batches(
        PlaitMapper,
        fn_constructor_kwargs={
            "program": Answer,
            "resources": resources,
            "columns": {"question": "q"},
        },
        concurrency=1,
        batch_size=2,
    ).take_all()

    assert '"answer": "echo: who? | docs"' in out[0]["output"]
    assert out[1]["output"] is None and "has null in column 'q'" in out[1]["error"]


@ray.remote(num_cpus=0)
class Caller:
    """A worker whose calls take permits through the cluster's limiters and never end."""

    def __init__(self, namespace: str, resources: dict) -> None:
        (endpoint,) = ResourceConfig(resources).endpoints()
        self.limiter = cluster_limiters(namespace)(endpoint)

    async def start_calls(self, count: int) -> int:
        for _ in range(count):
            await self.limiter.acquire()
        return self.limiter.permits


def test_a_killed_workers_permits_come_back_when_its_lease_lapses(cluster):
    resources = {"llm": {"provider": "openai", "model": "m", "api_key": "k", "max_concurrent": 3}}
    (endpoint,) = ResourceConfig(resources).endpoints()
    # made here first, so that its lease term is this short one
    limits = endpoint_actor("killed-worker", endpoint, lease_term=1.0)
    dying = Caller.remote("killed-worker", resources)
    assert ray.get(dying.start_calls.remote(3)) == 3
    assert ray.get(limits.stats.remote())["leased"] == 3

    ray.kill(dying)  # dies with three calls holding every permit
    other = Caller.remote("killed-worker", resources)

    assert ray.get(other.start_calls.remote(3), timeout=120) == 3
    stats = ray.get(limits.stats.remote())
    assert stats["lapsed"] == 1
    assert stats["leased"] == 3 and list(stats["holders"].values()) == [3]


def test_a_mapper_opens_its_lease_before_the_first_rows(cluster, server):
    resources = {"llm": server.endpoint(max_concurrent=3, max_retries=0)}
    (endpoint,) = ResourceConfig(resources).endpoints()

    mapper = PlaitMapper(Summarize(), resources, namespace="opened-early")
    try:
        limits = endpoint_actor("opened-early", endpoint)  # the actor the mapper made
        before = ray.get(limits.stats.remote())
        assert before["opened"] == 1 and before["asks"] == 0
        assert list(before["holders"].values()) == [0], "a lease, no permits, before any row"

        out = mapper({"text": ["a", "b", "c"]})

        assert out["output"] == ["echo: a", "echo: b", "echo: c"]
        after = ray.get(limits.stats.remote())
    finally:
        # Here, not in a Ray worker: its loop would go on sending to the actor after this
        # module's ray.shutdown(), which would start a Ray of its own in this process.
        mapper._loop.call_soon_threadsafe(mapper._loop.stop)
        mapper._thread.join()
    assert after["opened"] == 1 and after["asks"] >= 1
    assert list(after["holders"]) == list(before["holders"]), "the calls used the opened lease"


class TwoAliases(Module):
    def __init__(self) -> None:
        super().__init__()
        self.draft = LLMInference("chain")
        self.check = LLMInference("judge")
        self.again = LLMInference("chain")
        self.lost = LLMInference("nowhere")

    def forward(self, text: str) -> str:
        return self.check(self.draft(text))


def test_the_endpoints_a_program_names_are_found_through_its_modules_and_chains():
    endpoint = {"provider": "openai", "model": "m", "api_key": "k"}
    config = ResourceConfig(
        {"a": endpoint, "b": endpoint, "judge": endpoint, "chain": {"fallback": ["a", "b"]}}
    )

    found = endpoints_used({"one": TwoAliases(), "two": Summarize()}, config)

    # "nowhere" is unknown and "llm" too (no "*" entry): their calls will say so
    assert [e.name for e in found] == ["a", "b", "judge"]
    assert endpoints_used(TwoAliases(), config) == found


def _spent_by_workers(out: list[dict]) -> tuple[int, set[str]]:
    served = [r for r in out if r["error"] is None]
    return len(served), {r["output"].split()[0] for r in served}


def test_two_workers_spend_one_endpoint_budget_together(cluster, server, tmp_path):
    rows = [{"text": f"row {i}"} for i in range(60)]
    ds = ray.data.from_items(rows, override_num_blocks=6)
    # Prompts are free and a reply ("echo: row N") is 3 tokens at $1/3 each: a call costs
    # (and, with max_tokens=3, holds at most) $1.00, so $20 has room for 20 calls.
    price = {"input": 0.0, "output": 1_000_000 / 3}
    resources = {"llm": server.endpoint(max_retries=0, price=price, budget=20.0)}

    # both workers call from the start (on a busy machine the second may start late)
    brief = Brief(meet=str(tmp_path))
    out = map_dataset(brief, ds, resources=resources, concurrency=2, batch_size=10).take_all()

    served, pids = _spent_by_workers(out)
    assert 19 <= server.stats.requests <= 20  # one budget for both workers, and used
    assert served == server.stats.requests
    assert len(pids) == 2
    refused = [r["error"] for r in out if r["error"] is not None]
    assert len(refused) == 60 - served and all("budget" in e for e in refused)


def test_a_jobs_own_budget_holds_across_its_workers(cluster, server, tmp_path):
    rows = [{"text": f"row {i}"} for i in range(40)]
    ds = ray.data.from_items(rows, override_num_blocks=4)
    resources = {"llm": server.endpoint(max_retries=0)}

    # both workers call from the start (CI saw the first spend all 15 calls alone)
    brief = Brief(meet=str(tmp_path))
    out = map_dataset(
        brief, ds, resources=resources, concurrency=2, batch_size=10, max_calls=15
    ).take_all()

    served, pids = _spent_by_workers(out)
    assert server.stats.requests == served == 15  # max_calls is exact, whatever is in flight
    assert len(pids) == 2


def test_the_job_owns_its_limits_actor_not_a_worker(cluster, server):
    # Ray Data stops each mapper once it has no rows left, the first one while the other
    # still calls: an actor a mapper made died with it (a moment later), under the other's
    # calls. Owned by the job's driver, as the budget actor is, it lasts the job.
    resources = {"llm": server.endpoint(max_concurrent=2, max_retries=0)}
    ds = ray.data.from_items([{"text": f"row {i}"} for i in range(40)], override_num_blocks=4)

    out = map_dataset(
        Summarize(), ds, resources=resources, namespace="owned", batch_size=10
    ).take_all()

    assert [r["error"] for r in out] == [None] * 40
    assert server.stats.requests == 40 and server.stats.peak_concurrency <= 2
    owners = _owners()
    assert owners["plait-limits:owned:llm"] == owners["plait-budgets:owned"]


def _owners() -> dict[str, tuple[str, int]]:
    """The address of the process owning each named actor alive, by name."""
    # ray.util.state needs the dashboard, which this cluster runs without: GCS's table
    from ray._private import state

    return {
        actor["Name"]: (actor["OwnerAddress"]["IPAddress"], actor["OwnerAddress"]["Port"])
        for actor in state.actors(actor_state_name="ALIVE").values()
        if actor["Name"]
    }


def test_an_in_process_endpoint_keeps_its_own_limit_in_each_worker(cluster):
    # the `test` provider answers in the calling process, as `local` runs its model there
    resources = {"llm": {"provider": "test", "max_concurrent": 1}}
    (endpoint,) = ResourceConfig(resources).endpoints()

    assert cluster_limiters("in-process")(endpoint) is None  # the manager's own Limiter
    ds = ray.data.from_items([{"text": f"row {i}"} for i in range(20)])
    out = map_dataset(Summarize(), ds, resources=resources, namespace="in-process").take_all()

    assert [r["error"] for r in out] == [None] * 20 and all(r["output"] for r in out)
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert not [n for n in names if n.startswith("plait-limits:in-process:")]
