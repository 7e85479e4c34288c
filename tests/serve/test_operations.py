"""Shared limits, backpressure, health, metrics, keys, limits and errors over real HTTP."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from plait import LLMInference, Module
from plait.serve import app
from plait.testing import Fault, ScriptedServer
from serve.support import Gate, serving, until, upstream


async def test_200_concurrent_clients_share_the_endpoint_limit() -> None:
    async with ScriptedServer(latency=0.02, keep_log=False) as server:
        served = app({"llm": LLMInference("llm")}, upstream(server, max_concurrent=4))
        async with serving(served) as url:
            limits = httpx.Limits(max_connections=200)
            async with httpx.AsyncClient(limits=limits, timeout=120) as client:
                answers = await asyncio.gather(
                    *(
                        client.post(f"{url}/programs/llm/run", json={"prompt": f"q{i}"})
                        for i in range(200)
                    )
                )
    assert [a.status_code for a in answers] == [200] * 200
    assert {a.json()["output"] for a in answers} == {f"echo: q{i}" for i in range(200)}
    assert server.stats.requests == 200
    assert server.stats.peak_concurrency <= 4


async def test_beyond_the_queue_a_request_is_answered_429_with_retry_after() -> None:
    gate = Gate()
    async with ScriptedServer(responder=gate) as server:
        served = app(
            {"llm": LLMInference("llm")},
            upstream(server),
            max_active=1,
            max_queued=1,
            retry_after=3,
        )
        admission = served.state.runs.admission
        async with serving(served) as url, httpx.AsyncClient(timeout=60) as client:

            def run(prompt: str) -> asyncio.Future[httpx.Response]:
                return asyncio.ensure_future(
                    client.post(f"{url}/programs/llm/run", json={"prompt": prompt})
                )

            running, queued = run("a"), None
            await until(lambda: admission.active == 1, "the first run")
            queued = run("b")
            await until(lambda: admission.waiting == 1, "the second run to queue")
            refused = await client.post(f"{url}/programs/llm/run", json={"prompt": "c"})
            streamed = await client.post(
                f"{url}/programs/llm/run?stream=true", json={"prompt": "d"}
            )
            gate.opened.set()
            done = await asyncio.gather(running, queued)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
    assert refused.json()["error"]["type"] == "overloaded"
    assert streamed.status_code == 429
    assert [answer.status_code for answer in done] == [200, 200]
    assert server.stats.requests == 2


async def test_health_readiness_and_prometheus_metrics() -> None:
    async with ScriptedServer() as server:
        server.inject(Fault(status=429, headers={"Retry-After": "0"}, times=1))
        resources = {"*": server.endpoint(max_retries=2)}
        served = app({"llm": LLMInference("llm")}, resources)
        async with serving(served) as url, httpx.AsyncClient() as client:
            health = await client.get(f"{url}/healthz")
            ready = await client.get(f"{url}/readyz")
            ran = await client.post(f"{url}/programs/llm/run", json={"prompt": "hi"})
            metrics = (await client.get(f"{url}/metrics")).text
    assert health.json() == {"status": "ok"} and ready.json() == {"status": "ready"}
    assert ran.status_code == 200
    lines = set(metrics.splitlines())
    assert (
        'plait_http_requests_total{method="POST",route="/programs/llm/run",status="200"} 1.0'
        in lines
    )
    assert 'plait_llm_calls_total{endpoint="*"} 1.0' in lines
    assert 'plait_llm_requests_total{endpoint="*"} 2.0' in lines
    assert 'plait_llm_rate_limited_total{endpoint="*"} 1.0' in lines
    assert any(line.startswith('plait_llm_tokens_total{direction="input"') for line in lines)
    assert 'plait_http_request_duration_seconds_count{route="/programs/llm/run"} 1.0' in lines
    assert "plait_http_requests_in_flight 1.0" in lines  # the scrape itself
    assert "plait_runs_queued 0.0" in lines


async def test_api_keys_are_required_except_for_probes() -> None:
    async with ScriptedServer() as server:
        served = app(
            {"llm": LLMInference("llm")}, upstream(server), api_keys=("first-key-1", "second-key")
        )
        async with serving(served) as url, httpx.AsyncClient() as client:
            run = f"{url}/programs/llm/run"
            none = await client.post(run, json={"prompt": "x"})
            wrong = await client.post(run, json={"prompt": "x"}, headers=bearer("first-key-2"))
            right = await client.post(run, json={"prompt": "x"}, headers=bearer("second-key"))
            metrics = await client.get(f"{url}/metrics")
            health = await client.get(f"{url}/healthz")
    assert none.status_code == wrong.status_code == metrics.status_code == 401
    assert none.headers["www-authenticate"] == "Bearer"
    assert none.json()["error"]["type"] == "unauthorized"
    assert right.status_code == 200 and health.status_code == 200
    assert server.stats.requests == 1


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_a_body_over_the_limit_is_413_and_a_run_past_the_deadline_504() -> None:
    gate = Gate()
    async with ScriptedServer(responder=gate) as server:
        served = app(
            {"llm": LLMInference("llm")}, upstream(server), max_body_bytes=64, deadline=0.3
        )
        async with serving(served) as url, httpx.AsyncClient() as client:
            large = await client.post(f"{url}/programs/llm/run", json={"prompt": "x" * 100})

            async def chunks():  # no Content-Length: the limit counts what arrives
                for _ in range(10):
                    yield b"x" * 20

            chunked = await client.post(
                f"{url}/programs/llm/run",
                content=chunks(),
                headers={"content-type": "application/json"},
            )
            slow = await client.post(f"{url}/programs/llm/run", json={"prompt": "x"})
            gate.opened.set()
    assert large.status_code == chunked.status_code == 413
    assert large.json()["error"]["type"] == "body_too_large"
    assert slow.status_code == 504 and slow.json()["error"]["type"] == "deadline_exceeded"


class Leaky(Module):
    """Fails with a message that must not reach clients."""

    async def forward(self, text: str) -> str:
        raise RuntimeError("token sk-secret-123 refused by the database")


async def test_a_failure_is_a_500_with_an_error_id_and_the_details_only_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="plait.serve")
    async with ScriptedServer() as server:
        served = app({"leaky": Leaky()}, upstream(server))
        async with serving(served) as url, httpx.AsyncClient() as client:
            failed = await client.post(f"{url}/programs/leaky/run", json={"text": "x"})
            streamed = await client.post(
                f"{url}/programs/leaky/run?stream=true", json={"text": "x"}
            )
    assert failed.status_code == 500
    error = failed.json()["error"]
    assert error["type"] == "internal_error" and error["error_id"] in error["message"]
    assert "secret" not in failed.text and "Traceback" not in failed.text
    assert "secret" not in streamed.text and "event: error" in streamed.text
    logged = [r for r in caplog.records if error["error_id"] in r.getMessage()]
    assert logged and "sk-secret-123" in str(
        logged[0].exc_info[1].__cause__ or logged[0].exc_info[1]
    )
