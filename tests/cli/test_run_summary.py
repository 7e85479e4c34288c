"""What ``plait run`` and ``plait train`` say about a run: in the summary and in the report.

Each test runs the real command in a child process against the scripted server.
"""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import plait_cli, program


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def fail_marked(body: dict) -> str:
    text = body["messages"][-1]["content"]
    if "FAIL" in text:
        raise ValueError("scripted failure")
    return f"echo: {text}"


def test_a_resumed_run_says_how_many_rows_came_from_the_checkpoint(server, resources, tmp_path):
    server.responder = fail_marked
    rows = [{"text": f"FAIL {i}" if i in (1, 4) else f"row {i}"} for i in range(6)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    args = ("run", program("Summarize"), "-i", str(source), "-o", str(out), "-r", str(resources),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--chunk-size", "4")  # fmt: skip
    assert plait_cli(*args).code == 1
    server.responder = lambda body: "fixed"
    server.reset_stats()

    again = plait_cli(*args)

    assert again.code == 0, again.stderr
    assert server.stats.requests == 2  # only the rows that failed ran again
    assert "6 items: 6 ok (4 from the checkpoint), 0 failed" in again.stderr
    report = json.loads((tmp_path / "out.run.json").read_text())
    assert report["items"] == {"ok": 6, "failed": 0, "restored": 4}


def test_a_run_without_prices_says_its_cost_is_unknown(server, resources, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])

    done = plait_cli("run", program("Summarize"), "-i", str(source),
                     "-o", str(tmp_path / "out.jsonl"), "-r", str(resources))  # fmt: skip

    assert done.code == 0, done.stderr
    assert "cost unknown: no prices set" in done.stderr and "$0.0000" not in done.stderr
    assert json.loads((tmp_path / "out.run.json").read_text())["unpriced"] == ["llm"]


def test_a_training_report_names_the_program_and_its_modules_as_the_user_does(
    server, resources, tmp_path
):
    from tests.optimization.test_trainer import model

    server.responder = model("GOOD")
    rows = [{"text": f"t{i}:{'yes' if i % 2 else 'no'}", "target": "yes" if i % 2 else "no"}
            for i in range(4)]  # fmt: skip
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    spec = program("Task")

    done = plait_cli("train", spec, "--train", str(train), "--val", str(train),
                     "-r", str(resources), "--batch-size", "2",
                     "--save", str(tmp_path / "learned.json"))  # fmt: skip

    assert done.code == 0, done.stderr
    text = (tmp_path / "learned.run.json").read_text()
    report = json.loads(text)
    assert report["program"] == spec  # as typed on the command line, not an import name
    assert list(report["modules"]) == ["task"]  # Task's own attribute, trained and validated
    assert "_plait_cli_" not in text and "step.module" not in text
