"""A fallback chain whose primary is down says so: in the run's summary and report, the
endpoint stats, ``/metrics`` and the spans; and budgets show what they spent, hold and have
left.

``primary`` is a port nobody listens on (every call is refused); ``backup`` is the scripted
server. Items run one at a time, so the circuit opens after exactly ``circuit_failures``
calls and every later call skips the primary.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx

import plait
from plait import LLMInference, Predict, ResourceManager, run
from plait.report import RunReport
from plait.report.profiling import profile
from plait.resources.usage import Budget, budgeted
from plait.serve import app
from plait.testing import ScriptedServer
from serve.support import serving

FAILURES = 2
PRICE = {"input": 1000.0, "output": 0.0}


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def dead_primary_chain(backup: ScriptedServer, **backup_options: Any) -> dict[str, Any]:
    primary = {
        "provider": "openai",
        "model": "m",
        "base_url": f"http://127.0.0.1:{dead_port()}/v1",
        "api_key": "k",
        "max_retries": 0,
        "circuit_failures": FAILURES,
        "circuit_cooldown": 600,
    }
    return {
        "primary": primary,
        "backup": backup.endpoint(max_retries=0, **backup_options),
        "smart": {"fallback": ["primary", "backup"]},
    }


async def test_the_summary_and_report_say_the_primary_is_down_and_the_backup_serves(
    tmp_path: Path,
) -> None:
    async with ScriptedServer() as backup, ResourceManager(dead_primary_chain(backup)) as manager:
        with profile() as profiler:
            outputs = await run(
                LLMInference("smart"), [f"q{i}" for i in range(8)], resources=manager,
                max_concurrent=1,
            )  # fmt: skip
        stats = manager.stats()
        assert backup.stats.requests == 8
    assert outputs == [f"echo: q{i}" for i in range(8)]

    report = profiler.report(program="chain")
    primary, second = report.fallbacks["smart"]
    assert (primary["endpoint"], primary["served"], primary["failed"]) == ("primary", 0, FAILURES)
    assert primary["skipped"] == 8 - FAILURES and primary["circuit_openings"] == 1
    assert primary["circuit_opened_at"] is not None
    assert (second["endpoint"], second["served"], second["failed"]) == ("backup", 8, 0)
    summary = report.summary()
    assert "fallback 'smart':" in summary
    assert (
        f"'primary' served 0 calls, {FAILURES} failed, {8 - FAILURES} skipped: circuit open "
        f"since " in summary
    )
    assert f"after {FAILURES} failed calls in a row" in summary
    assert "'backup' served 8 calls" in summary

    assert stats["primary"].circuit == "open" and stats["primary"].circuit_openings == 1
    assert stats["primary"].circuit_skipped == 8 - FAILURES
    assert stats["primary"].circuit_opened_at == primary["circuit_opened_at"]
    assert stats["backup"].circuit == "closed" and stats["backup"].calls == 8

    path = tmp_path / "run.json"
    report.save(path)
    again = RunReport.load(path)
    assert again.fallbacks == report.fallbacks
    from plait.report.html import render_html

    page = render_html(again)
    assert "&#x27;backup&#x27; served 8 calls" in page or "'backup' served 8 calls" in page


async def test_a_span_event_marks_the_circuit_opening() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from plait.report.telemetry import OpenTelemetryCallback

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with ScriptedServer() as backup:
        with plait.settings.context(callbacks=[OpenTelemetryCallback(provider)]):
            await run(
                LLMInference("smart"), ["a", "b", "c"], resources=dead_primary_chain(backup),
                max_concurrent=1,
            )  # fmt: skip
    spans = exporter.get_finished_spans()
    events = [(span, event) for span in spans for event in span.events]
    opened = [(s, e) for s, e in events if e.name == "plait.circuit.opened"]
    assert len(opened) == 1
    _, event = opened[0]
    assert event.attributes["plait.endpoint"] == "primary"
    assert event.attributes["plait.circuit.failures"] == FAILURES
    assert event.attributes["plait.circuit.opened_at"] > 0
    chats = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    served = [s.attributes["plait.endpoint"] for s in chats if s.status.is_ok]
    failed = [s.attributes["plait.endpoint"] for s in chats if not s.status.is_ok]
    assert served == ["backup"] * 3 and failed == ["primary"] * FAILURES


async def test_a_run_budget_shows_what_it_spent_held_and_left_in_the_report() -> None:
    async with ScriptedServer() as server:
        config = {"llm": server.endpoint(price=PRICE)}
        with budgeted(Budget(max_calls=5)), profile() as profiler:
            await run(LLMInference("llm"), ["a", "b"], resources=config)
            report = profiler.report()
    books = report.budgets["the run"]
    assert books["limits"] == {"calls": 5}
    assert books["spent"]["calls"] == 2 and books["left"] == {"calls": 3}
    assert "budget of the run: spent 2 calls" in report.summary()
    assert "left 3 calls" in report.summary()


async def test_metrics_name_the_open_circuit_the_backups_calls_and_the_budget() -> None:
    async with ScriptedServer() as backup:
        resources = dead_primary_chain(backup, price=PRICE, budget=100.0)
        served = app({"ask": Predict("question -> answer", alias="smart")}, resources)
        async with serving(served) as url, httpx.AsyncClient() as client:
            for n in range(4):
                answered = await client.post(f"{url}/programs/ask/run", json={"question": f"q{n}"})
                assert answered.status_code == 200, answered.text
            text = (await client.get(f"{url}/metrics")).text
    lines = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert lines['plait_llm_circuit_open{endpoint="primary"}'] == 1
    assert lines['plait_llm_circuit_open{endpoint="backup"}'] == 0
    assert lines['plait_llm_circuit_openings_total{endpoint="primary"}'] == 1
    assert lines['plait_llm_circuit_skipped_total{endpoint="primary"}'] == 4 - FAILURES
    assert lines['plait_llm_circuit_opened_timestamp_seconds{endpoint="primary"}'] > 0
    assert lines['plait_llm_failures_total{endpoint="primary"}'] == FAILURES
    assert lines['plait_llm_calls_total{endpoint="backup"}'] == 4
    spent = lines['plait_budget{books="spent",endpoint="backup",kind="cost"}']
    assert spent > 0
    assert lines['plait_budget{books="limit",endpoint="backup",kind="cost"}'] == 100.0
    assert lines['plait_budget{books="left",endpoint="backup",kind="cost"}'] == 100.0 - spent
    assert 'plait_budget{books="held",endpoint="backup",kind="cost"}' in lines


def test_the_cli_summary_names_the_dead_primary(tmp_path: Path) -> None:
    from cli.conftest import plait_cli, program
    from plait.testing import server_in_thread

    with server_in_thread() as backup:
        chain = dead_primary_chain(backup)
        resources = tmp_path / "res.json"
        resources.write_text(json.dumps({**chain, "llm": chain.pop("smart")}))
        rows = tmp_path / "in.jsonl"
        rows.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(6)))
        done = plait_cli(
            "run", program("Summarize"), "--resources", str(resources), "--input", str(rows),
            "--output", str(tmp_path / "out.jsonl"), "--max-concurrent", "1",
        )  # fmt: skip
    assert done.code == 0, done.stderr
    assert "fallback 'llm':" in done.stderr
    assert f"'primary' served 0 calls, {FAILURES} failed, {6 - FAILURES} skipped" in done.stderr
    assert "'backup' served 6 calls" in done.stderr


async def test_a_refused_connection_to_the_primary_spends_nothing_of_a_run_budget() -> None:
    """The dead primary never saw those requests: a budget of 4 calls buys 4 answers."""
    async with ScriptedServer() as backup:
        with budgeted(Budget(max_calls=4)) as budget:
            outputs = await run(
                LLMInference("smart"), ["a", "b", "c", "d"], resources=dead_primary_chain(backup),
                max_concurrent=1,
            )  # fmt: skip
    assert outputs == ["echo: a", "echo: b", "echo: c", "echo: d"]
    assert budget is not None and budget.spent()["calls"] == 4 and not budget.stopped


async def test_the_cost_is_known_when_a_priced_backup_answered_every_call_of_an_unpriced_primary():
    async with ScriptedServer() as backup:
        with profile() as profiler:
            chain = dead_primary_chain(backup, price=PRICE)
            await run(LLMInference("smart"), ["q0", "q1"], resources=chain, max_concurrent=1)
    report = profiler.report(program="chain")
    assert report.unpriced == []
    assert report.usage["cost"] > 0
    assert f"cost ${report.usage['cost']:.4f}" in report.summary()
