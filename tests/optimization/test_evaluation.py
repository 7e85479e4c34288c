"""`plait.evaluate`: the mean metric of a program over a dataset, run concurrently."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import plait
from plait import LLMInference, ResourceConfig, ResourceManager
from plait.errors import FileError
from plait.feedback import Feedback
from plait.optimization.evaluation import (
    EvaluationResult,
    ExampleRow,
    exact_match,
    examples_of,
    run_dataset,
    score_of,
)
from plait.testing import ScriptedServer


def answer(body: dict[str, Any]) -> str:
    """Answers the part of the input after ':'; refuses inputs containing 'boom'."""
    text = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    if "boom" in text:
        raise RuntimeError("cannot answer")
    return text.rsplit(":", 1)[1]


@pytest.fixture
async def manager() -> AsyncIterator[ResourceManager]:
    async with ScriptedServer(responder=answer) as server:
        config = ResourceConfig({"*": server.endpoint(max_retries=0)})
        async with ResourceManager(config) as running:
            yield running


async def test_evaluate_returns_the_mean_score(manager: ResourceManager) -> None:
    task = LLMInference("task")
    data = [("a:yes", "yes"), ("b:no", "yes"), {"input": "c:YES ", "target": "yes"}, ("d:no", "no")]
    assert await plait.evaluate(task, data, resources=manager) == 0.75


async def test_a_failed_example_scores_zero_and_training_mode_is_restored(
    manager: ResourceManager,
) -> None:
    task = LLMInference("task").train()
    data = [("a:yes", "yes"), ("boom:yes", "yes")]
    assert await plait.evaluate(task, data, exact_match, resources=manager) == 0.5
    assert task.training


def test_metrics_and_examples_are_checked() -> None:
    assert score_of(lambda o, t: Feedback("ok", score=0.25), "x", "y") == 0.25
    assert score_of(lambda o, t: 1, "x", "y") == 1.0
    with pytest.raises(TypeError, match="returned str"):
        score_of(lambda o, t: "fine", "x", "y")
    with pytest.raises(ValueError, match="example 1"):
        examples_of([("a", "b"), {"question": "a"}])


def test_exact_match_compares_a_typed_output_field_by_field_with_a_row_of_labels() -> None:
    # a Predict of several outputs against a dataset row of labels: the fields the row names
    triaged = plait.Prediction(queue="Billing", urgent=True)
    assert exact_match(triaged, {"queue": "billing", "urgent": True})
    assert not exact_match(triaged, {"queue": "bug", "urgent": True})
    assert exact_match(triaged, {"queue": "billing"})  # a row may label some fields only
    assert not exact_match(triaged, {"queue": "billing", "priority": "high"})  # not answered
    assert exact_match(plait.Prediction(reasoning="2 + 2", answer="4"), {"answer": 4})
    assert exact_match({"a": {"b": "X"}}, {"a": {"b": "x"}})  # nested rows alike


async def test_an_empty_dataset_is_an_error(manager: ResourceManager) -> None:
    with pytest.raises(ValueError, match="empty dataset"):
        await plait.evaluate(LLMInference("task"), [], resources=manager)


# ------------------------------------------------------------ result object
async def test_the_result_is_its_mean_and_keeps_every_row(manager: ResourceManager) -> None:
    task = LLMInference("task")
    data = [("a:yes", "yes"), ("boom:yes", "yes"), ("c:no", "yes"), ("d:no", "no")]
    result = await plait.evaluate(task, data, resources=manager)

    assert result == 0.5 and f"{result:.2f}" == "0.50" and result > 0.25
    assert json.loads(json.dumps({"score": result})) == {"score": 0.5}
    assert [row.score for row in result.rows] == [1.0, 0.0, 0.0, 1.0]
    first, failed = result.rows[0], result.rows[1]
    assert (first.index, first.input, first.output, first.target) == (0, "a:yes", "yes", "yes")
    assert first.calls == 1 and first.input_tokens > 0 and first.error is None
    assert failed.output is None and failed.error.startswith("BackendError: ")
    assert failed.error.endswith(" failed on input 1)") and failed.score == 0.0
    assert result.failed == 1 and result.calls == 3  # the failed call returned no usage
    assert result.input_tokens == sum(row.input_tokens for row in result.rows)
    low, high = result.ci
    assert 0.0 <= low <= 0.5 <= high <= 1.0
    assert "mean=0.5" in repr(result) and "failed=1" in repr(result)


async def test_a_feedback_metric_and_an_async_metric(manager: ResourceManager) -> None:
    async def judge(output: Any, target: Any) -> Feedback:
        return Feedback("right" if output == target else "wrong", score=float(output == target))

    result = await plait.evaluate(
        LLMInference("task"), [("a:yes", "yes"), ("b:no", "yes")], judge, resources=manager
    )
    assert result == 0.5
    assert [row.feedback for row in result.rows] == ["right\nScore: 1.00", "wrong\nScore: 0.00"]


def test_the_confidence_interval_narrows_with_more_examples() -> None:
    def result_of(n: int) -> EvaluationResult:
        return EvaluationResult.from_rows([ExampleRow(i, i, score=float(i % 2)) for i in range(n)])

    small, large = result_of(10).ci, result_of(400).ci
    assert small[0] < large[0] <= 0.5 <= large[1] < small[1]
    assert result_of(10).confidence_interval(seed=1) == result_of(10).confidence_interval(seed=1)


async def test_rows_save_as_jsonl_parquet_and_a_frame(
    manager: ResourceManager, tmp_path: Path
) -> None:
    result = await plait.evaluate(
        LLMInference("task"), [("a:yes", "yes"), ("b:no", "no")], resources=manager
    )
    lines = result.save(tmp_path / "eval.jsonl").read_text().splitlines()
    assert [json.loads(line)["output"] for line in lines] == ["yes", "no"]
    pytest.importorskip("pyarrow")
    import pyarrow.parquet

    table = pyarrow.parquet.read_table(result.save(tmp_path / "eval.parquet"))
    assert table.column("score").to_pylist() == [1.0, 1.0]
    pytest.importorskip("pandas")
    assert list(result.to_frame()["input"]) == ["a:yes", "b:no"]
    with pytest.raises(ValueError, match=r"\.jsonl or \.parquet"):
        result.save(tmp_path / "eval.csv")


@pytest.mark.parametrize("name", ["eval.jsonl", "eval.parquet"])
def test_saved_rows_never_go_through_a_planted_link(tmp_path: Path, name: str) -> None:
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    result = EvaluationResult.from_rows([ExampleRow(0, "a", score=1.0)])
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / name).symlink_to(victim)
    with pytest.raises(FileError, match=rf"{name} is a symbolic link"):
        result.save(tmp_path / name)
    assert victim.read_text() == "precious\n"
    assert result.save(tmp_path / f"fresh-{name}").stat().st_size > 0


async def test_run_dataset_gives_outputs_alone(manager: ResourceManager) -> None:
    runs = await run_dataset(
        LLMInference("task"),
        ["a:one", {"input": "b:two", "target": "two"}, "boom:x"],
        resources=manager,
    )
    assert runs.outputs == ["one", "two", None]
    assert runs.rows[1].target == "two" and runs.rows[1].score is None
    assert runs.failed == 1 and runs.calls == 2


# ------------------------------------------------------------ DSPy's metric order
def validate_answer(example: Any, pred: Any, trace: Any = None) -> bool:
    """A metric as DSPy writes it: the example (its labels) first, then the prediction."""
    return example.answer.lower() == pred.answer.lower()


def gold_first(gold: Any, prediction: Any) -> float:
    """DSPy's other spelling of the same order."""
    return float(gold["answer"] == prediction.answer)


def json_answer(body: dict[str, Any]) -> str:
    """Answers a ``question -> answer`` Predict with the part of the question after ':'."""
    text = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    return json.dumps({"answer": text.rsplit(":", 1)[1].strip()})


async def test_a_metric_written_for_dspy_gets_the_example_first_and_reads_its_labels() -> None:
    qa = plait.Predict("question -> answer")
    data = [({"question": "a:yes"}, {"answer": "YES"}), ({"question": "b:no"}, {"answer": "yes"})]
    async with ScriptedServer(responder=json_answer) as server:
        config = ResourceConfig({"*": server.endpoint(max_retries=0)})
        for metric in (validate_answer, gold_first):
            result = await plait.evaluate(qa, data, metric, resources=config)
            assert [row.score for row in result.rows] == [float(metric is validate_answer), 0.0]
            assert result.rows[0].target == {"answer": "YES"}  # the row keeps the target as given


def test_dspy_order_is_recognised_by_parameter_names_wherever_a_metric_is_called() -> None:
    from plait.optimization import VerifierLoss

    pred = plait.Prediction(answer="Paris")
    assert score_of(validate_answer, pred, {"answer": "paris"}) == 1.0
    assert score_of(validate_answer, pred, plait.Prediction(answer="Rome")) == 0.0
    assert VerifierLoss(validate_answer)(pred, {"answer": "Rome"}).score == 0.0
    assert VerifierLoss(validate_answer)(pred, {"answer": "PARIS"}).score == 1.0


def test_only_dspy_names_turn_a_metric_around_and_only_once() -> None:
    from plait.evaluation import as_metric

    def plait_order(prediction: Any, example: Any) -> bool:  # output first: left alone
        return prediction.answer == example

    assert as_metric(plait_order) is plait_order and as_metric(exact_match) is exact_match
    assert as_metric(len) is len  # a builtin: plait's order
    turned = as_metric(validate_answer)
    assert as_metric(turned) is turned  # turned around once, never twice
    assert turned.__name__ == "validate_answer"  # errors and reports name the user's metric
