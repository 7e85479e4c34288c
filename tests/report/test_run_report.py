"""RunReport: a run's usage, cost, retries, errors and timeline, from real runs on loopback."""

from __future__ import annotations

import json

import pytest

from plait import LLMInference, Module, run
from plait.errors import FileError
from plait.profiling import profile
from plait.report import RunReport
from plait.testing import ScriptedServer
from plait.testing._faults import Fault


class TwoSteps(Module):
    def __init__(self) -> None:
        super().__init__()
        self.draft = LLMInference("llm", "Draft.")
        self.polish = LLMInference("llm", "Polish.")

    def forward(self, text: str) -> str:
        return self.polish(f"polish: {self.draft(text)}")


def fail_on_bad(body: dict) -> str:
    text = body["messages"][-1]["content"]
    if "bad" in text:
        raise ValueError("no bad rows here")
    return f"echo: {text}"


async def test_run_with_report_returns_outputs_and_the_runs_usage_retries_and_429s():
    faults = [Fault(status=429, headers={"Retry-After": "0.01"}, times=2)]
    async with ScriptedServer(faults=faults) as server:
        config = {"llm": server.endpoint(price={"input": 1.0, "output": 2.0})}
        outputs, report = await run(TwoSteps(), ["a b", "c"], resources=config, report=True)
        requests = server.stats.requests

    assert outputs == ["echo: polish: echo: a b", "echo: polish: echo: c"]
    assert isinstance(report, RunReport)
    usage = report.usage
    assert (usage["calls"], usage["requests"], usage["retries"]) == (4, requests, 2)
    assert usage["rate_limited"] == 2 and usage["failures"] == 0
    assert report.items == {"ok": 2, "failed": 0}
    # scripted tokens are word counts; price is $ per million tokens
    assert usage["cost"] == pytest.approx(
        (usage["input_tokens"] * 1.0 + usage["output_tokens"] * 2.0) / 1e6
    )
    assert set(report.modules) == {"draft", "polish"}
    assert report.modules["draft"]["count"] == 2
    timeline = report.timeline["llm"]
    assert sum(timeline["requests"]) == requests and sum(timeline["rate_limited"]) == 2
    assert report.graph is not None
    assert [n["id"] for n in report.graph["nodes"] if n["llm"]] == ["draft", "polish"]


async def test_a_report_keeps_failed_items_with_the_node_and_counts_failed_calls():
    async with ScriptedServer(responder=fail_on_bad) as server:
        config = {"llm": server.endpoint(max_retries=0)}
        outputs, report = await run(
            TwoSteps(), ["good", "bad", "fine"], resources=config, report=True, on_error="collect"
        )

    assert isinstance(outputs[1], Exception)
    assert report.items == {"ok": 2, "failed": 1}
    [failure] = report.failures
    assert failure["index"] == 1 and failure["node"] == "draft"
    assert "no bad rows here" in failure["message"]
    assert report.usage["failures"] == 1
    assert "1 failed" in report.summary()


async def test_a_saved_report_loads_back_equal_and_refuses_other_json(tmp_path):
    async with ScriptedServer() as server:
        _, report = await run(TwoSteps(), ["x"], resources={"llm": server.endpoint()}, report=True)
    path = tmp_path / "run.json"
    report.save(path)
    assert RunReport.load(path) == report

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something/2"}))
    with pytest.raises(ValueError, match=r"other.json: not a plait run report"):
        RunReport.load(other)


@pytest.mark.parametrize("write", [RunReport.save, RunReport.save_trace], ids=["report", "trace"])
def test_a_report_or_trace_never_goes_through_a_planted_link(tmp_path, write):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "run.json").symlink_to(victim)
    with pytest.raises(FileError, match=r"run\.json is a symbolic link"):
        write(RunReport(program="empty"), tmp_path / "run.json")
    assert victim.read_text() == "precious\n"
    write(RunReport(program="empty"), tmp_path / "fresh.json")
    assert json.loads((tmp_path / "fresh.json").read_text())


async def test_a_profiler_with_max_records_samples_spans_but_keeps_exact_totals():
    async with ScriptedServer() as server:
        config = {"llm": server.endpoint()}
        with profile(max_records=5) as prof:
            await run(TwoSteps(), [f"row {i}" for i in range(20)], resources=config)
    report = prof.report()

    assert len(prof.records) == 5 and len(prof.requests) == 5
    assert report.sampled
    assert report.usage["calls"] == 40 and report.items["ok"] == 20
    assert sum(report.timeline["llm"]["requests"]) == 40


# ------------------------------------------------------------------ a hand-edited run.json
async def a_saved_report() -> dict:
    """The JSON data of a real run with a failed item."""
    async with ScriptedServer(responder=fail_on_bad) as server:
        config = {"llm": server.endpoint(max_retries=0)}
        _, report = await run(
            TwoSteps(), ["good", "bad"], resources=config, report=True, on_error="collect"
        )
    return json.loads(json.dumps(report.to_dict()))


def first_node(data: dict) -> dict:
    return data["graph"]["nodes"][0]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.update(wall_time="soon"), "wall_time"),
        (lambda d: d.update(program=5), "program"),
        (lambda d: d["items"].update(ok="7"), "items.ok"),
        (lambda d: d["aliases"]["llm"].update(cost="free"), "aliases.llm.cost"),
        (lambda d: d["aliases"]["llm"].update(calls=float("nan")), "aliases.llm.calls"),
        (lambda d: d["modules"]["draft"].update(samples="abc"), "modules.draft.samples"),
        (lambda d: d.update(failures={"index": 1}), "failures"),
        (lambda d: first_node(d).pop("id"), "graph.nodes[0].id"),
        (lambda d: d.update(training={"scores": ["x"]}), "training.scores[0]"),
        (lambda d: d["spans"]["requests"][0].update(call="c"), "spans.requests[0].call"),
        (lambda d: d["timeline"]["llm"].update(t=None), "timeline.llm.t"),
    ],
)
async def test_plait_report_refuses_a_run_json_of_the_wrong_shape_naming_the_field(
    tmp_path, edit, field
):
    from tests.cli.conftest import plait_cli

    data = await a_saved_report()
    edit(data)
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(data))

    done = plait_cli("report", str(saved), "-o", str(tmp_path / "report.html"))

    assert done.code == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"plait: error: {saved}: {field} " in done.stderr
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize("depth", [150, 5000])
async def test_plait_report_refuses_a_deeply_nested_run_json_naming_line_and_column(
    tmp_path, depth
):
    from tests.cli.conftest import plait_cli

    data = await a_saved_report()
    data["metrics"]["tree"] = "TREE"
    text = json.dumps(data, indent=1)
    saved = tmp_path / "run.json"
    saved.write_text(text.replace('"TREE"', "[" * depth + "]" * depth))
    line = text[: text.index('"TREE"')].count("\n") + 1

    done = plait_cli("report", str(saved), "-o", str(tmp_path / "report.html"))

    assert done.code == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"plait: error: {saved}:{line}:" in done.stderr
    assert "nested more than 100 levels" in done.stderr


async def test_a_report_that_loads_is_a_report_the_page_and_trace_can_draw(tmp_path):
    from tests.cli.conftest import plait_cli

    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(await a_saved_report()))

    done = plait_cli("report", str(saved), "-o", str(tmp_path / "report.html"),
                     "--trace", str(tmp_path / "trace.json"))  # fmt: skip

    assert done.code == 0, done.stderr
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
