"""RunReport: a run's usage, cost, retries, errors and timeline, from real runs on loopback."""

from __future__ import annotations

import json
from typing import Any

import pytest

from plait import LLMInference, Module, Parameter, Predict, ResourceConfig, run
from plait.errors import FileError
from plait.report import RunReport
from plait.report.profiling import profile
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
    assert report.items == {"ok": 2, "failed": 0, "restored": 0}
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
    assert report.items == {"ok": 2, "failed": 1, "restored": 0}
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


class Summarize(Module):
    """An async leaf (a Predict) and an LLM node, so both kinds of node are timed."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = LLMInference("llm", "Draft.")
        self.title = Predict("text -> title")

    def forward(self, text: str) -> Any:
        return self.title(text=self.draft(text))


def titled(body: dict) -> str:
    return '{"title": "A title"}' if "title" in json.dumps(body) else "a draft"


async def test_a_modules_time_waiting_for_a_slot_is_shown_apart_from_its_request():
    latency = 0.2
    async with ScriptedServer(latency=latency, responder=titled) as server:
        config = {"llm": server.endpoint(max_concurrent=1)}  # four items queue for one slot
        _, report = await run(Summarize(), ["a", "b", "c", "d"], resources=config, report=True)

    for name in ("draft", "title"):
        module = report.modules[name]
        waits, totals = module["wait_samples"], module["samples"]
        assert len(waits) == len(totals) == module["count"] == 4
        # the last of four calls sharing one slot waited for at least two others to be answered
        assert max(waits) >= 2 * latency and module["wait"]["max"] == pytest.approx(max(waits))
        requests = [total - wait for total, wait in zip(totals, waits, strict=True)]
        assert min(requests) >= latency * 0.9  # what is left is the request itself (and parsing)
        assert min(waits) >= 0.0


class TwoViews(Module):
    """Two calls that could run at once."""

    def __init__(self) -> None:
        super().__init__()
        self.pros = LLMInference("llm", "Pros.")
        self.cons = LLMInference("llm", "Cons.")

    def forward(self, text: str) -> list:
        return [self.pros(text), self.cons(text)]


async def test_waiting_for_the_runs_own_limit_on_calls_is_waiting_too():
    latency = 0.2
    async with ScriptedServer(latency=latency) as server:
        config = {"llm": server.endpoint()}  # the endpoint has no limit; the run allows one call
        _, report = await run(TwoViews(), "x", resources=config, report=True, max_concurrent=1)

    first, second = sorted(report.modules.values(), key=lambda m: m["wait"]["max"])
    assert first["wait"]["max"] < second["wait"]["max"]  # one call went first
    assert second["wait"]["max"] >= latency * 0.9  # the other waited for its answer


async def test_the_summary_says_how_many_items_came_from_the_checkpoint(tmp_path):
    async with ScriptedServer(responder=fail_on_bad) as server:
        config = {"llm": server.endpoint(max_retries=0)}
        first = await run(TwoSteps(), ["good", "bad", "fine"], resources=config, report=True,
                          on_error="collect", checkpoint_dir=str(tmp_path))  # fmt: skip
        server.responder = lambda body: "fixed"
        _, again = await run(TwoSteps(), ["good", "bad", "fine"], resources=config,
                             report=True, checkpoint_dir=str(tmp_path))  # fmt: skip

    assert first[1].items == {"ok": 2, "failed": 1, "restored": 0}
    assert again.items == {"ok": 3, "failed": 0, "restored": 2}
    assert "3 items: 3 ok (2 from the checkpoint), 0 failed" in again.summary()
    assert again.usage["calls"] == 2  # only the item that failed ran again


async def test_a_run_without_prices_says_so_instead_of_costing_nothing():
    async with ScriptedServer() as free, ScriptedServer() as paid:
        config = {"llm": free.endpoint(), "judge": paid.endpoint(price={"input": 1, "output": 2})}
        _, unpriced = await run(TwoSteps(), ["x"], resources={"llm": free.endpoint()}, report=True)
        _, mixed = await run(Pipeline(), ["x"], resources=config, report=True)

    assert unpriced.unpriced == ["llm"]
    assert 'cost unknown: no prices set (add "price": {"input"' in unpriced.summary()
    assert "$0" not in unpriced.summary()  # not a cost of nothing
    assert mixed.unpriced == ["llm"]
    assert f"cost ${mixed.usage['cost']:.4f} (no price set for llm)" in mixed.summary()


class Pipeline(Module):
    def __init__(self) -> None:
        super().__init__()
        self.draft = LLMInference("llm", "Draft.")
        self.judge = LLMInference("judge", "Judge.")

    def forward(self, text: str) -> str:
        return self.judge(self.draft(text))


async def test_a_training_runs_modules_are_named_as_in_the_program():
    from tests.optimization.test_trainer import exact, examples, model

    from plait.optimization import SFAOptimizer, Trainer

    class Task(Module):
        def __init__(self) -> None:
            super().__init__()
            self.answer = LLMInference("llm", system_prompt=Parameter("PLAIN", description="t"))

        def forward(self, text: str) -> str:
            return self.answer(text)

    async with ScriptedServer(responder=model("GOOD")) as server:
        config = ResourceConfig({"*": server.endpoint(max_retries=0)})
        task = Task()
        trainer = Trainer(
            task, exact, SFAOptimizer(task.named_parameters(), conservatism=0),
            resources=config, train_set=examples("t", 4), val_set=examples("v", 2),
            metric=exact, batch_size=2, progress=False,
        )  # fmt: skip
        with profile() as prof:
            await trainer.fit()
    report = prof.report(kind="train")

    assert set(report.modules) == {"answer"}  # trained and validated: one module, one name
    assert {span["module_path"] for span in report.spans["nodes"]} == {"answer"}
    assert report.modules["answer"]["count"] == len(report.spans["nodes"])


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
