"""Fallback chains over two scripted servers: what is passed on, what is not, and the circuit.

``primary`` and ``backup`` are two real servers on loopback; the chain
``smart`` tries them in order. What each test asserts about where a call went
is what each server saw.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

import plait
from plait import LLMInference, ResourceManager, run
from plait.backends.types import Message, Request
from plait.callbacks import BaseCallback
from plait.errors import BackendError, BudgetExceededError, CircuitOpenError
from plait.report.profiling import profile
from plait.streaming import StreamRestart
from plait.testing import Fault, ScriptedServer

from .support import endpoint

REQUEST = Request(messages=(Message("user", "hello"),))


def chain(primary: ScriptedServer, backup: ScriptedServer, **primary_options: Any) -> dict:
    return {
        "primary": endpoint(primary, **primary_options),
        "backup": endpoint(backup),
        "smart": {"fallback": ["primary", "backup"]},
    }


@contextlib.asynccontextmanager
async def two_servers(*primary_faults: Fault) -> AsyncIterator[tuple[ScriptedServer, ...]]:
    async with (
        ScriptedServer(faults=list(primary_faults)) as primary,
        ScriptedServer() as backup,
    ):
        yield primary, backup


async def test_500s_after_the_primarys_retries_go_to_the_backup() -> None:
    async with (
        two_servers(Fault(status=500)) as (primary, backup),
        ResourceManager(chain(primary, backup, max_retries=2)) as manager,
    ):
        response = await manager.complete("smart", REQUEST)
        stats = manager.stats()
        usage = manager.usage()

    assert response.text == "echo: hello"
    assert response.meta["endpoint"] == "backup"
    assert response.meta["alias"] == "smart"
    assert response.meta["fell_back_from"] == ["primary"]
    assert len(primary.stats.log) == 3  # the first attempt and its two retries
    assert len(backup.stats.log) == 1
    # each endpoint keeps its own counts, tokens and cost; the alias sums what served it
    assert (stats["primary"].failures, stats["primary"].calls) == (1, 0)
    assert stats["primary"].usage.output_tokens == 0
    assert (stats["backup"].failures, stats["backup"].calls) == (0, 1)
    assert stats["backup"].usage.output_tokens > 0 and stats["backup"].usage.cost > 0
    assert usage["smart"].output_tokens == stats["backup"].usage.output_tokens


@pytest.mark.timeout(60)
async def test_a_primary_that_hangs_past_its_timeout_goes_to_the_backup() -> None:
    async with two_servers(Fault(kind="slow", delay=600.0)) as (primary, backup):
        config = chain(primary, backup, timeout=0.5, max_retries=0)
        response = await run(LLMInference("smart"), "hello", resources=config)
    assert response == "echo: hello"  # within the test's 60 s, far below the 600 s hang
    assert len(backup.stats.log) == 1


async def test_a_429_asking_for_longer_than_max_retry_after_goes_to_the_backup_at_once() -> None:
    quota = Fault(status=429, headers={"Retry-After": "3600"})
    async with (
        two_servers(quota) as (primary, backup),
        ResourceManager(chain(primary, backup, max_retry_after=60)) as manager,
    ):
        response = await manager.complete("smart", REQUEST)
    assert response.meta["endpoint"] == "backup"
    assert len(primary.stats.log) == 1  # not retried: that quota will not come back


@pytest.mark.parametrize("status", [400, 422])
async def test_a_request_any_endpoint_would_refuse_is_not_passed_on(status: int) -> None:
    async with (
        two_servers(Fault(status=status, message="content policy")) as (primary, backup),
        ResourceManager(chain(primary, backup)) as manager,
    ):
        with pytest.raises(BackendError, match=f"HTTP {status} is not retried") as info:
            await manager.complete("smart", REQUEST)
        circuit = manager.stats()["primary"].circuit
    assert info.value.status == status and info.value.alias == "smart"
    assert backup.stats.log == []
    assert circuit == "closed"  # the endpoint answered: it is up


@pytest.mark.parametrize("status", [401, 403, 404])
async def test_one_providers_auth_or_model_error_is_passed_on(status: int) -> None:
    async with (
        two_servers(Fault(status=status)) as (primary, backup),
        ResourceManager(chain(primary, backup)) as manager,
    ):
        response = await manager.complete("smart", REQUEST)
    assert response.meta["endpoint"] == "backup"
    assert len(primary.stats.log) == 1


async def test_a_spent_budget_passes_the_call_on_without_sending_it() -> None:
    async with (
        two_servers() as (primary, backup),
        ResourceManager(chain(primary, backup, budget=0.0)) as manager,
    ):
        response = await manager.complete("smart", REQUEST)
        circuit = manager.stats()["primary"].circuit
    assert response.meta["endpoint"] == "backup"
    assert primary.stats.log == []
    assert circuit == "closed"  # spent is not down


async def test_when_every_endpoint_fails_the_error_names_each() -> None:
    async with (
        ScriptedServer(faults=[Fault(status=500)]) as primary,
        ScriptedServer(faults=[Fault(status=503)]) as backup,
    ):
        config = {
            **chain(primary, backup, max_retries=0),
            "backup": endpoint(backup, max_retries=0),
        }
        async with ResourceManager(config) as manager:
            with pytest.raises(BackendError) as info:
                await manager.complete("smart", REQUEST)
    message = str(info.value)
    assert info.value.status == 503  # the last endpoint's own error
    assert message.startswith("alias 'smart': no endpoint of its fallback chain answered")
    assert "'primary': " in message and "HTTP 500" in message
    assert "'backup': " in message and "HTTP 503" in message


class Clock:
    """The manager's clock, moved on only by the test: a cool-down ends when the test says.

    (On the real clock a loaded machine can spend a short cool-down between two
    calls, and the circuit is then half-open where the test expects it open.)
    """

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_circuit_opens_skips_the_endpoint_and_a_probe_closes_it() -> None:
    clock = Clock()
    async with two_servers(Fault(status=500)) as (primary, backup):
        config = chain(primary, backup, max_retries=0, circuit_failures=2, circuit_cooldown=30)
        async with ResourceManager(config, clock=clock) as manager:
            for _ in range(2):
                assert (await manager.complete("smart", REQUEST)).meta["endpoint"] == "backup"
            assert len(primary.stats.log) == 2
            assert manager.stats()["primary"].circuit == "open"

            skipped = await manager.complete("smart", REQUEST)
            assert skipped.meta["endpoint"] == "backup"
            assert len(primary.stats.log) == 2  # open: the primary was not asked

            primary.clear_faults()  # it recovers; after the cool-down one call probes it
            clock.now += 29
            assert manager.stats()["primary"].circuit == "open"
            clock.now += 1
            assert manager.stats()["primary"].circuit == "half-open"
            probed = await manager.complete("smart", REQUEST)
            assert probed.meta["endpoint"] == "primary"
            assert "fell_back_from" not in probed.meta
            assert manager.stats()["primary"].circuit == "closed"
    assert len(primary.stats.log) == 3


async def test_a_failed_probe_opens_the_circuit_for_another_cool_down() -> None:
    clock = Clock()
    async with two_servers(Fault(status=500)) as (primary, backup):
        config = chain(primary, backup, max_retries=0, circuit_failures=1, circuit_cooldown=30)
        async with ResourceManager(config, clock=clock) as manager:
            await manager.complete("smart", REQUEST)
            assert manager.stats()["primary"].circuit == "open"
            clock.now += 30
            await manager.complete("smart", REQUEST)  # the probe fails
            assert len(primary.stats.log) == 2
            assert manager.stats()["primary"].circuit == "open"
            clock.now += 29
            await manager.complete("smart", REQUEST)
    assert len(primary.stats.log) == 2  # skipped again during the new cool-down


async def test_when_every_circuit_is_open_nothing_is_sent() -> None:
    async with (
        ScriptedServer(faults=[Fault(status=500)]) as primary,
        ScriptedServer(faults=[Fault(status=500)]) as backup,
    ):
        once = {"max_retries": 0, "circuit_failures": 1, "circuit_cooldown": 600}
        config = {
            "primary": endpoint(primary, **once),
            "backup": endpoint(backup, **once),
            "smart": {"fallback": ["primary", "backup"]},
        }
        async with ResourceManager(config) as manager:
            with pytest.raises(BackendError):
                await manager.complete("smart", REQUEST)
            with pytest.raises(CircuitOpenError, match="circuit open after 1 failed") as info:
                await manager.complete("smart", REQUEST)
    assert info.value.alias == "smart" and info.value.attempts == 0
    assert "'primary': skipped" in str(info.value) and "'backup': skipped" in str(info.value)
    assert len(primary.stats.log) == len(backup.stats.log) == 1


async def test_a_direct_call_to_an_endpoint_of_a_chain_ignores_its_circuit() -> None:
    async with two_servers(Fault(status=500, times=1)) as (primary, backup):
        config = chain(primary, backup, max_retries=0, circuit_failures=1, circuit_cooldown=600)
        async with ResourceManager(config) as manager:
            await manager.complete("smart", REQUEST)
            assert manager.stats()["primary"].circuit == "open"
            response = await manager.complete("primary", REQUEST)
            assert manager.stats()["backup"].circuit == "closed"
    assert response.meta["endpoint"] == "primary"


async def test_the_profiler_and_run_report_name_the_endpoint_that_served() -> None:
    async with two_servers(Fault(status=500)) as (primary, backup):
        with profile() as prof:
            await run(
                LLMInference("smart"), "hello", resources=chain(primary, backup, max_retries=0)
            )
    attempts = [(r.endpoint, r.alias, r.status) for r in prof.requests]
    assert attempts == [("primary", "smart", 500), ("backup", "smart", 200)]
    report = prof.report()
    spans = [(r["endpoint"], r["status"]) for r in report.spans["requests"]]
    assert spans == [("primary", 500), ("backup", 200)]
    assert set(report.timeline) == {"primary", "backup"}
    assert report.aliases["smart"]["requests"] == 2


class Heard(BaseCallback):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.events.append(("start", (inputs["alias"], inputs["endpoint"], instance.name)))

    def on_lm_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        self.events.append(("end", type(exception).__name__ if exception else outputs.text))


async def test_callbacks_hear_one_call_per_endpoint_tried() -> None:
    heard = Heard()
    async with two_servers(Fault(status=500)) as (primary, backup):
        with plait.settings.context(callbacks=[heard]):
            await run(
                LLMInference("smart"), "hello", resources=chain(primary, backup, max_retries=0)
            )
    assert heard.events == [
        ("start", ("smart", "primary", "primary")),
        ("end", "BackendError"),
        ("start", ("smart", "backup", "backup")),
        ("end", "echo: hello"),
    ]


async def test_open_telemetry_spans_name_each_endpoint_tried() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from plait.report.telemetry import OpenTelemetryCallback

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with two_servers(Fault(status=500)) as (primary, backup):
        with plait.settings.context(callbacks=[OpenTelemetryCallback(provider)]):
            await run(
                LLMInference("smart"), "hello", resources=chain(primary, backup, max_retries=0)
            )
    chats = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    seen = [(s.attributes["plait.alias"], s.attributes["plait.endpoint"]) for s in chats]
    assert seen == [("smart", "primary"), ("smart", "backup")]
    assert chats[0].attributes["http.response.status_code"] == 500
    assert "http.response.status_code" not in chats[1].attributes


async def test_a_cached_reply_is_keyed_on_the_endpoint_that_gave_it(tmp_path) -> None:
    async with two_servers(Fault(status=500)) as (primary, backup):
        config = {
            **chain(primary, backup, max_retries=0, cache=str(tmp_path / "primary.db")),
            "backup": endpoint(backup, cache=str(tmp_path / "backup.db")),
        }
        async with ResourceManager(config) as manager:
            first = await manager.complete("smart", REQUEST)
            again = await manager.complete("smart", REQUEST)
            primary.clear_faults()
            # the primary's cache holds nothing: a recovered primary is asked itself
            recovered = await manager.complete("smart", REQUEST)
    assert first.meta["endpoint"] == "backup" and "cached" not in first.meta
    assert again.meta["endpoint"] == "backup" and again.meta["cached"] is True
    assert len(backup.stats.log) == 1
    assert recovered.meta["endpoint"] == "primary" and "cached" not in recovered.meta


async def test_a_streamed_call_falls_back_before_its_first_chunk() -> None:
    async with two_servers(Fault(status=500)) as (primary, backup):
        config = chain(primary, backup, max_retries=0)
        async with ResourceManager(config) as manager:
            chunks = [c async for c in manager.stream("smart", REQUEST)]
    assert "".join(c.text for c in chunks) == "echo: hello"
    assert len(backup.stats.log) == 1


async def test_a_stream_that_broke_after_its_first_chunk_is_not_passed_on() -> None:
    async with two_servers(Fault(kind="drop", after_chunks=2)) as (primary, backup):
        config = chain(primary, backup, max_retries=0)
        async with ResourceManager(config) as manager:
            received = []
            with pytest.raises(BackendError, match="stream broke after its first chunk"):
                async for chunk in manager.stream("smart", REQUEST):
                    received.append(chunk.text)
    assert received  # the caller saw part of the primary's reply
    assert backup.stats.log == []


async def test_astream_falls_back_like_a_retry_and_ends_with_the_backups_reply() -> None:
    async with two_servers(Fault(kind="drop", after_chunks=2)) as (primary, backup):
        program = LLMInference("smart")
        config = chain(primary, backup, max_retries=0)
        events = [event async for event in program.astream("hello", resources=config)]
    restarts = [e for e in events if isinstance(e, StreamRestart)]
    assert len(restarts) == 1 and "fell back from 'primary'" in restarts[0].reason
    assert events[-1] == "echo: hello"  # the output, from the backup alone
    assert len(backup.stats.log) == 1


async def test_budget_error_of_the_whole_manager_fails_on_every_endpoint() -> None:
    async with (
        two_servers() as (primary, backup),
        ResourceManager(chain(primary, backup), budget=0.0) as manager,
    ):
        with pytest.raises(BudgetExceededError, match="no endpoint of its fallback chain"):
            await manager.complete("smart", REQUEST)
    assert primary.stats.log == backup.stats.log == []
