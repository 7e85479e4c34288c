"""One usage record: every record of tokens, cost and cache hits holds a `Usage` (issue 35).

`plait.backends.types.Usage` is the only class that declares those fields; the
records of a call or a piece of work hold one as ``usage`` and read their
``input_tokens`` / ``output_tokens`` / ``cost`` / ``cache_hit`` from it. What
plait wrote before (run.json spans, evaluation rows, a served run's usage, a
batch checkpoint's usage, pickled results) keeps its shape and still loads.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import pickle
import typing
from pathlib import Path

import pytest

import plait
from plait import LLMInference, ResourceConfig, ResourceManager
from plait.backends.types import Usage
from plait.modules.tool_loop import ToolRun
from plait.modules.traces import TraceRecord
from plait.optimization.results import ExampleRow
from plait.report import RunReport
from plait.report.profiling import NodeTiming, RequestTiming, profile
from plait.resources.usage import UsageMeter, metered
from plait.serve.programs import RunUsage
from plait.testing import ScriptedServer

SRC = Path(__file__).resolve().parents[1] / "src" / "plait"
USAGE_NAMES = {"input_tokens", "output_tokens", "cost", "cache_hit", "cached"}
NOT_A_USAGE_RECORD = {
    "Usage": "the record itself",
    "NodeSpan": "run.json's node span as a file holds it (a TypedDict of the format)",
    "RequestSpan": "run.json's request span as a file holds it (a TypedDict of the format)",
    "CostEstimate": "a range a run may spend, not what calls consumed",
    "Claim": "a budget's hold on a request's worst case, before anything is spent",
    "Trial": "a search trial's cost alone, kept in search checkpoints and reports",
}
RECORDS = (NodeTiming, RequestTiming, TraceRecord, ExampleRow, UsageMeter)


def usage_fields_by_class() -> dict[str, set[str]]:
    """Returns the classes in src/plait that declare a token, cost or cache field."""
    found: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = {
                    statement.target.id
                    for statement in node.body
                    if isinstance(statement, ast.AnnAssign)
                    and isinstance(statement.target, ast.Name)
                    and statement.target.id in USAGE_NAMES
                }
                if names:
                    found[node.name] = names
    return found


def test_only_usage_declares_tokens_cost_and_cache_hits() -> None:
    declared = usage_fields_by_class()
    assert set(declared) <= set(NOT_A_USAGE_RECORD), (
        "declare usage as a `usage: Usage` field instead: "
        f"{sorted(set(declared) - set(NOT_A_USAGE_RECORD))}"
    )
    assert declared["Usage"] == USAGE_NAMES - {"cache_hit"}


@pytest.mark.parametrize("record", RECORDS, ids=lambda cls: cls.__name__)
def test_each_record_holds_a_usage(record: type) -> None:
    names = {f.name for f in dataclasses.fields(record)}
    assert not names & USAGE_NAMES
    assert typing.get_type_hints(record)["usage"] is Usage


def test_the_served_usage_schema_is_built_from_the_record() -> None:
    hints = typing.get_type_hints(Usage)
    schema = RunUsage.model_fields
    assert list(schema) == [name for name in UsageMeter().as_dict() if name != "refused"]
    assert {name: schema[name].annotation for name in hints} == hints
    assert schema["calls"].annotation is int


def test_adding_usages() -> None:
    a, b = Usage(3, 4, 0.5), Usage(1, 2, 0.25, cached=1)
    assert a + b == Usage(4, 6, 0.75, 1) and a == Usage(3, 4, 0.5)  # + makes a new one
    total = Usage()
    total += a
    total += b
    assert total == a + b and (total.cache_hit, a.cache_hit) == (True, False)


async def test_every_record_of_a_run_reads_the_same_usage(tmp_path: Path) -> None:
    """A run's rows, node and request records and meter agree, cache hits too."""
    data = [(f"q{i}", f"q{i}") for i in range(4)]
    async with ScriptedServer() as server:
        config = ResourceConfig(
            {
                "llm": server.endpoint(
                    price={"input": 1.0, "output": 2.0}, cache=str(tmp_path / "cache.sqlite")
                )
            }
        )
        async with ResourceManager(config) as manager:
            for run in ("sent", "cached"):
                program = LLMInference("llm")
                with profile() as prof, metered() as meter:
                    result = await plait.evaluate(program, data, resources=manager)
                rows = sum((row.usage for row in result.rows), Usage())
                nodes = sum((record.usage for record in prof.records), Usage())
                requests = sum((record.usage for record in prof.requests), Usage())
                if run == "sent":
                    assert rows == meter.usage == nodes == requests
                    assert rows.cost == pytest.approx(
                        (rows.input_tokens * 1.0 + rows.output_tokens * 2.0) / 1e6
                    )
                    assert rows.cost > 0 and not rows.cache_hit
                    sent = nodes
                else:  # the cache answered: the tokens are the first run's, nothing was spent
                    assert (meter.usage, rows) == (Usage(cached=4), Usage(cached=4))
                    assert nodes == Usage(sent.input_tokens, sent.output_tokens, 0.0, 4)
                    assert prof.requests == [] and all(r.cache_hit for r in prof.records)
                for record in (*result.rows, *prof.records, meter):
                    assert (record.input_tokens, record.output_tokens, record.cost) == (
                        record.usage.input_tokens,
                        record.usage.output_tokens,
                        record.usage.cost,
                    )


async def test_spans_traces_and_rows_keep_their_flat_shape(tmp_path: Path) -> None:
    async with ScriptedServer() as server:
        config = ResourceConfig({"llm": server.endpoint(price={"input": 1.0, "output": 2.0})})
        async with ResourceManager(config) as manager:
            program = plait.Predict("question -> answer").bind(manager)
            with profile() as prof:
                await program(question="q")
            result = await plait.evaluate(LLMInference("llm"), [("q", "q")], resources=manager)
    spans = prof.report().spans
    assert list(spans["nodes"][0]) == [
        "node_id", "module_path", "input_index", "start", "end", "input_tokens",
        "output_tokens", "cost", "cache_hit", "finish_reason", "wait",
    ]  # fmt: skip
    assert list(spans["requests"][0]) == [
        "endpoint", "alias", "call", "attempt", "queued", "sent", "end", "status", "error",
        "input_tokens", "output_tokens", "cost",
    ]  # fmt: skip
    trace = program.traces()[0].as_dict()
    assert list(trace)[6:11] == ["latency", "input_tokens", "output_tokens", "cost", "cache_hit"]
    assert trace["input_tokens"] > 0 and trace["cost"] > 0
    row = result.rows[0]
    assert list(row.as_record())[7:] == [
        "calls", "cached", "refused", "input_tokens", "output_tokens", "cost",
    ]  # fmt: skip
    saved = json.loads(result.save(tmp_path / "rows.jsonl").read_text())
    assert saved["input_tokens"] == row.usage.input_tokens and saved["cost"] == row.cost


OLD_RUN_JSON = {
    "format": "plait.run/1",
    "program": "old",
    "kind": "run",
    "started_at": 1.0,
    "wall_time": 2.0,
    "items": {"ok": 1, "failed": 0, "restored": 0},
    "aliases": {
        "llm": {"calls": 1, "cache_hits": 0, "requests": 1, "retries": 0, "rate_limited": 0,
                "failures": 0, "input_tokens": 5, "output_tokens": 2, "cost": 0.25},
    },
    "spans": {
        "nodes": [{"node_id": "llm", "module_path": "llm", "input_index": 0, "start": 0.0,
                   "end": 1.0, "input_tokens": 5, "output_tokens": 2, "cost": 0.25,
                   "cache_hit": False, "finish_reason": "stop", "wait": 0.0}],
        "requests": [{"endpoint": "llm", "alias": "llm", "call": 1, "attempt": 1, "queued": 0.0,
                      "sent": 0.0, "end": 1.0, "status": 200, "error": None, "input_tokens": 5,
                      "output_tokens": 2, "cost": 0.25}],
    },
}  # fmt: skip
"""A run.json as plait wrote it before the usage record (its spans flat)."""


def test_a_run_json_written_before_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(OLD_RUN_JSON))
    report = RunReport.load(path)
    assert report.spans["nodes"][0]["input_tokens"] == 5
    assert "$0.2500" in report.summary()
    assert report.trace_events()["traceEvents"]


OLD_PICKLE = (
    b"\x80\x04\x95\xfc\x00\x00\x00\x00\x00\x00\x00\x8c\x1aplait.optimization.results\x94\x8c"
    b"\x08_rebuild\x94\x93\x94G?\xf0\x00\x00\x00\x00\x00\x00]\x94h\x00\x8c\nExampleRow\x94\x93"
    b"\x94)\x81\x94}\x94(\x8c\x05index\x94K\x00\x8c\x05input\x94\x8c\x01q\x94\x8c\x06output"
    b"\x94\x8c\x01a\x94\x8c\x06target\x94h\x0c\x8c\x05score\x94G?\xf0\x00\x00\x00\x00\x00\x00"
    b"\x8c\x08feedback\x94N\x8c\x05error\x94N\x8c\x05calls\x94K\x02\x8c\x06cached\x94K\x01\x8c"
    b"\x07refused\x94K\x00\x8c\x0cinput_tokens\x94K\x07\x8c\routput_tokens\x94K\x03\x8c\x04cost"
    b"\x94G?\xd0\x00\x00\x00\x00\x00\x00uba\x86\x94R\x94."
)
"""An `EvaluationResult` pickled by plait before the usage record: one row, its tokens,
cost and cache hits as fields of their own."""


def test_a_result_pickled_before_still_loads() -> None:
    result = pickle.loads(OLD_PICKLE)  # our own bytes, written by the plait before this one
    (row,) = result.rows
    assert row.usage == Usage(7, 3, 0.25, cached=1) and (row.calls, row.refused) == (2, 0)
    assert (row.input_tokens, result.cost, float(result)) == (7, 0.25, 1.0)
    assert pickle.loads(pickle.dumps(result)).rows[0].usage == row.usage


async def test_the_managers_totals_count_cache_hits_as_the_meters_do(tmp_path: Path) -> None:
    async with ScriptedServer() as server:
        config = ResourceConfig({"llm": server.endpoint(cache=str(tmp_path / "cache.sqlite"))})
        async with ResourceManager(config) as manager:
            for _ in range(3):
                with metered() as meter:
                    await plait.run(LLMInference("llm"), ["same"], resources=manager)
            stats = manager.stats()
            usage = manager.usage()
        assert (stats["llm"].calls, stats["llm"].cache_hits, stats["llm"].usage.cached) == (3, 2, 2)
        assert usage["llm"].cached == manager.total_usage().cached == 2
        assert meter.usage.cached == 1 and server.stats.requests == 1


def test_a_paused_tool_run_saved_before_still_restores() -> None:
    run = ToolRun.start([])
    run.usage = Usage(5, 2, 0.5, cached=1)
    saved = run.to_dict("agent")
    assert saved["usage"] == {"input_tokens": 5, "output_tokens": 2, "cost": 0.5, "cached": 1}
    assert ToolRun.restore(saved).usage == run.usage
    del saved["usage"]["cached"]  # as a plait before the usage record saved it
    assert ToolRun.restore(saved).usage == Usage(5, 2, 0.5)
