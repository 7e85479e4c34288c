"""Traces: every LLM call of a module is recorded, gathered over the tree, bounded, exported."""

import json
import sys

import pytest

from plait import Module, Predict, run
from plait.errors import BackendError
from plait.modules import TraceRecord
from plait.testing import Fault
from plait.testing._replies import count_words

from .scripted import scripted


def answer(body):
    return json.dumps({"answer": "forty-two"})


async def test_a_call_is_recorded_with_tokens_latency_and_messages():
    async with scripted(answer, latency=0.05) as (_, manager):
        predict = Predict("question -> answer", alias="judge")
        await run(predict, question="Meaning of life?", resources=manager)

    (record,) = predict.traces()
    assert isinstance(record, TraceRecord)
    assert (record.module, record.module_type, record.alias) == ("Predict", "Predict", "judge")
    assert record.inputs == {"question": "Meaning of life?"}
    assert [m["role"] for m in record.messages] == ["system", "user"]
    assert record.messages[1] == {"role": "user", "content": "question: Meaning of life?"}
    assert record.output == {"answer": "forty-two"}
    assert record.input_tokens == sum(count_words(m["content"]) for m in record.messages)
    assert record.output_tokens == count_words(json.dumps({"answer": "forty-two"}))
    assert record.latency >= 0.05  # the server waited that long before answering
    assert (record.cache_hit, record.error, record.model) == (False, None, "scripted-model")


class Pipeline(Module):
    def __init__(self) -> None:
        super().__init__()
        self.draft = Predict("question -> answer")
        self.review = Predict("draft -> answer")

    def forward(self, question: str):
        return self.review(draft=self.draft(question=question).answer)


async def test_a_module_gathers_the_traces_of_its_children_in_call_order():
    async with scripted(answer) as (_, manager):
        pipeline = Pipeline()
        await run(pipeline, "q", resources=manager)
        await run(pipeline, "q", resources=manager)

    records = pipeline.traces()
    assert [r.module for r in records] == ["draft", "review", "draft", "review"]
    assert [r.timestamp for r in records] == sorted(r.timestamp for r in records)
    assert len(pipeline.draft.traces()) == 2
    pipeline.clear_traces()
    assert pipeline.traces() == [] and pipeline.review.traces() == []


async def test_a_failed_call_is_recorded_with_its_error():
    async with scripted(answer) as (server, manager):
        server.inject(Fault(status=400, times=1))
        predict = Predict("question -> answer")
        with pytest.raises(BackendError, match="400"):
            await run(predict, question="q", resources=manager)

    (record,) = predict.traces()
    assert record.error is not None and "400" in record.error
    assert record.output is None and record.output_tokens == 0


async def test_records_are_bounded_per_module():
    async with scripted(answer) as (_, manager):
        predict = Predict("question -> answer").bind(manager)
        predict.trace_limit = 3
        for i in range(5):
            await predict(question=f"q{i}")
    assert [r.inputs["question"] for r in predict.traces()] == ["q2", "q3", "q4"]


async def test_a_cache_hit_is_marked(tmp_path):
    async with scripted(answer, cache=str(tmp_path / "cache.sqlite")) as (server, manager):
        predict = Predict("question -> answer").bind(manager)
        await predict(question="same")
        await predict(question="same")
    assert server.stats.requests == 1
    assert [r.cache_hit for r in predict.traces()] == [False, True]


async def test_traces_frame_has_one_row_per_call():
    pandas = pytest.importorskip("pandas")
    async with scripted(answer) as (_, manager):
        predict = Predict("question -> answer").bind(manager)
        await predict(question="q")
    frame = predict.traces_frame()
    assert isinstance(frame, pandas.DataFrame) and len(frame) == 1
    assert {"module", "latency", "input_tokens", "output_tokens", "cost", "cache_hit"} <= set(
        frame.columns
    )


def test_traces_frame_without_pandas_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # makes `import pandas` fail
    with pytest.raises(ImportError, match=r"needs pandas.*pip install pandas"):
        Predict("q -> a").traces_frame()


def test_as_dict_gives_a_plain_row():
    record = TraceRecord(
        module="m", module_type="Predict", alias="llm", inputs={}, messages=[], output="x",
        latency=0.1,
    )  # fmt: skip
    row = record.as_dict()
    assert row["module"] == "m" and row["error"] is None and row["cache_hit"] is False


async def test_copies_start_without_traces_and_record_their_own():
    async with scripted(answer) as (_, manager):
        original = Predict("question -> answer").bind(manager)
        await original(question="q")
        for clone in (original.copy(), original.copy(deep=False)):
            assert clone.traces() == []
            assert clone._bound_resources is manager
            await clone(question="mine")
            assert [r.inputs["question"] for r in clone.traces()] == ["mine"]
    assert [r.inputs["question"] for r in original.traces()] == ["q"]
