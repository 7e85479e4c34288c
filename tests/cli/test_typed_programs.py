"""Typed programs through the real ``plait`` command: a `Predict` of a Signature takes its
input fields from columns, and typed outputs (a `Prediction`, any mapping, a pydantic
model, a dataclass) are written one field per column."""

from __future__ import annotations

import csv
import json

import pytest

from .conftest import plait_cli, program
from .test_cli import read_jsonl, write_jsonl


def read_order(body: dict) -> str:
    """Answers a Predict of ``Order`` or ``quote`` from the ``field: value`` lines it was sent."""
    sent = dict(
        line.split(": ", 1) for line in body["messages"][-1]["content"].splitlines() if ": " in line
    )
    if "quantity" in sent:
        return json.dumps({"total": 1.5 * int(sent["quantity"])})
    words = sent["text"].split()
    return json.dumps({"customer": words[0], "items": len(words)})


def test_a_predict_of_a_signature_runs_with_columns_filling_its_input_fields(
    server, resources, tmp_path
):
    server.responder = read_order
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "ann two pens"}, {"text": "bo one"}])
    out = tmp_path / "out.jsonl"

    done = plait_cli("run", program("order_reader"), "-i", str(source), "-o", str(out),
                     "-r", str(resources))  # fmt: skip

    assert done.code == 0, done.stderr
    assert read_jsonl(out) == [
        {"row": 0, "text": "ann two pens", "customer": "ann", "items": 3, "error": None},
        {"row": 1, "text": "bo one", "customer": "bo", "items": 2, "error": None},
    ]


def test_a_predict_with_two_inputs_takes_both_from_csv_columns(server, resources, tmp_path):
    server.responder = read_order
    source = tmp_path / "in.csv"
    source.write_text("item,quantity\npen,4\n")
    out = tmp_path / "out.csv"

    done = plait_cli("run", program("quote"), "-i", str(source), "-o", str(out),
                     "-r", str(resources), "--column", "product=item")  # fmt: skip

    assert done.code == 0, done.stderr
    with out.open(newline="") as file:
        assert list(csv.DictReader(file)) == [
            {"row": "0", "item": "pen", "quantity": "4", "total": "6.0", "error": ""}
        ]


def test_eval_writes_a_prediction_as_columns_beside_its_score(server, resources, tmp_path):
    server.responder = read_order
    rows = [{"text": "ann two pens", "target": "ann"}, {"text": "bo one", "target": "cy"}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "scored.jsonl"

    done = plait_cli("eval", program("order_reader"), "-i", str(source), "-o", str(out),
                     "-r", str(resources), "--metric", program("customer_matches"))  # fmt: skip

    assert done.code == 0, done.stderr
    written = read_jsonl(out)
    assert [(r["customer"], r["items"], r["score"]) for r in written] == [
        ("ann", 3, 1.0),
        ("bo", 2, 0.0),
    ]
    assert "output" not in written[0]


def test_mappings_models_dataclasses_and_predictions_become_columns_in_every_format(
    server, resources, tmp_path
):
    pq = pytest.importorskip("pyarrow.parquet")
    kinds = ["dataclass", "model", "prediction", "mapping"]
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "ann two", "kind": k} for k in kinds])
    expected = [{"customer": "ann", "items": 2}] * len(kinds)

    for suffix in ("jsonl", "csv", "parquet"):
        done = plait_cli("run", program("Shapes"), "-i", str(source),
                         "-o", str(tmp_path / f"out.{suffix}"), "-r", str(resources),
                         "--no-inputs")  # fmt: skip
        assert done.code == 0, done.stderr

    def outputs(rows: list[dict]) -> list[dict]:
        return [{"customer": r["customer"], "items": int(r["items"])} for r in rows]

    assert outputs(read_jsonl(tmp_path / "out.jsonl")) == expected
    with (tmp_path / "out.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["row", "customer", "items", "error"]
    assert outputs(rows) == expected
    assert outputs(pq.read_table(tmp_path / "out.parquet").to_pylist()) == expected


def test_run_without_a_metric_reports_no_score(server, resources, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])
    out = tmp_path / "out.jsonl"

    done = plait_cli("run", program("Summarize"), "-i", str(source), "-o", str(out),
                     "-r", str(resources))  # fmt: skip

    assert done.code == 0, done.stderr
    assert "score" not in done.stderr
    assert "score" not in json.loads((tmp_path / "out.run.json").read_text())["metrics"]
