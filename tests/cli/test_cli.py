"""The ``plait`` command line, run as a child process against a scripted server on loopback."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import SRC, plait_cli, program


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def fail_marked(body: dict) -> str:
    text = body["messages"][-1]["content"]
    if "FAIL" in text:
        raise ValueError("scripted failure")
    return f"echo: {text}"


def test_run_streams_outputs_in_input_order_and_writes_a_report(server, resources, tmp_path):
    rows = [{"text": f"row {i}", "id": i} for i in range(7)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"

    done = plait_cli(
        "run", program("Summarize"), "-i", str(source), "-o", str(out),
        "-r", str(resources), "--chunk-size", "3",
    )  # fmt: skip

    assert done.code == 0, done.stderr
    written = read_jsonl(out)
    assert [r["row"] for r in written] == list(range(7))
    expected = {"row": 2, "text": "row 2", "id": 2, "output": "echo: row 2", "error": None}
    assert written[2] == expected
    assert server.stats.requests == 7
    assert "7 items: 7 ok, 0 failed" in done.stderr and "7 LLM calls" in done.stderr
    report = json.loads((tmp_path / "out.run.json").read_text())
    assert report["format"] == "plait.run/1" and report["kind"] == "run"
    assert report["items"] == {"ok": 7, "failed": 0, "restored": 0}
    assert report["aliases"]["llm"]["calls"] == 7


def test_a_server_of_your_own_needs_no_api_key(server, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    keyless = tmp_path / "keyless.toml"
    keyless.write_text(
        f'llm = {{provider = "openai", model = "m", base_url = "{server.base_url}"}}\n'
    )
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}, {"text": "b"}])

    done = plait_cli(
        "run", program("Summarize"), "-i", str(source), "-o", str(tmp_path / "out.jsonl"),
        "-r", str(keyless),
    )  # fmt: skip

    assert done.code == 0, done.stderr
    assert server.stats.requests == 2 and "2 requests" in done.stderr


def test_a_file_run_traces_its_program_once_across_chunks_and_report(
    server, resources, tmp_path, monkeypatch
):
    log = tmp_path / "traces.log"
    monkeypatch.setenv("PLAIT_TEST_TRACE_LOG", str(log))
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": f"row {i}"} for i in range(7)])

    done = plait_cli(
        "run", program("CountsItsTraces"), "-i", str(source), "-o", str(tmp_path / "out.jsonl"),
        "-r", str(resources), "--chunk-size", "3",
    )  # fmt: skip

    assert done.code == 0, done.stderr
    assert log.read_text().splitlines() == ["traced"]
    assert json.loads((tmp_path / "out.run.json").read_text())["graph"]


def test_a_failed_row_is_its_error_column_and_exit_code_1(server, resources, tmp_path):
    server.responder = fail_marked
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "ok"}, {"text": "FAIL"}, {"text": "ok"}])
    out = tmp_path / "out.jsonl"

    done = plait_cli("run", program("Summarize"), "-i", str(source), "-o", str(out),
                     "-r", str(resources))  # fmt: skip

    assert done.code == 1
    written = read_jsonl(out)
    assert [r["error"] is None for r in written] == [True, False, True]
    error = written[1]["error"]  # the error's own class, and the module where it happened
    assert error.startswith("BackendError: ") and error.endswith(" (in summary)")
    assert "scripted failure" in error
    assert f"row 1: {error}" in done.stderr


def test_columns_fill_forward_by_name_and_csv_goes_in_and_out(server, resources, tmp_path):
    source = tmp_path / "in.csv"
    source.write_text("q,context,extra\nwho?,the docs,x\nwhat?,the code,y\n")
    out = tmp_path / "out.csv"

    done = plait_cli(
        "run", program("Answer"), "-i", str(source), "-o", str(out), "-r", str(resources),
        "--column", "question=q",
    )  # fmt: skip

    assert done.code == 0, done.stderr
    with out.open() as file:
        written = list(csv.DictReader(file))
    assert written[1]["answer"] == "echo: what? | the code"
    assert written[1]["question_seen"] == "what?" and written[1]["extra"] == "y"
    assert list(written[0]) == ["row", "q", "context", "extra", "answer", "question_seen", "error"]


def test_a_first_row_without_the_column_is_a_usage_error_naming_row_and_column(
    server, resources, tmp_path
):
    source = write_jsonl(tmp_path / "in.jsonl", [{"body": "x"}])

    done = plait_cli("run", program("Summarize"), "-i", str(source),
                     "-o", str(tmp_path / "o.jsonl"), "-r", str(resources))  # fmt: skip

    assert done.code == 2
    assert "row 0 has no column 'text'" in done.stderr and "--column text=COLUMN" in done.stderr
    assert server.stats.requests == 0


def test_a_later_row_without_the_column_fails_alone(server, resources, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}, {"body": "b"}, {"text": "c"}])
    out = tmp_path / "o.jsonl"

    done = plait_cli("run", program("Summarize"), "-i", str(source), "-o", str(out),
                     "-r", str(resources))  # fmt: skip

    assert done.code == 1
    written = read_jsonl(out)
    assert "row 1 has no column 'text'" in written[1]["error"]
    assert [written[0]["output"], written[2]["output"]] == ["echo: a", "echo: c"]


def test_a_rerun_with_the_checkpoint_dir_calls_only_the_rows_that_did_not_finish(
    server, resources, tmp_path
):
    server.responder = fail_marked
    rows = [{"text": f"FAIL {i}" if i in (1, 4) else f"row {i}"} for i in range(6)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    args = ("run", program("Summarize"), "-i", str(source), "-o", str(out), "-r", str(resources),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--chunk-size", "4")  # fmt: skip

    first = plait_cli(*args)
    assert first.code == 1 and server.stats.requests == 6

    server.responder = lambda body: f"fixed: {body['messages'][-1]['content']}"
    server.reset_stats()
    second = plait_cli(*args)

    assert second.code == 0, second.stderr
    assert server.stats.requests == 2  # only rows 1 and 4 ran again
    outputs = [r["output"] for r in read_jsonl(out)]
    assert outputs[1] == "fixed: FAIL 1" and outputs[0] == "echo: row 0"
    assert len(outputs) == 6

    other = plait_cli(*args[:-2], "--chunk-size", "5")
    assert other.code == 2 and "--chunk-size 4" in other.stderr


def test_a_link_planted_as_the_checkpoint_state_is_refused_not_written_through(
    server, resources, tmp_path
):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "cli.json").symlink_to(victim)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])

    done = plait_cli("run", program("Summarize"), "-i", str(source),
                     "-o", str(tmp_path / "o.jsonl"), "-r", str(resources),
                     "--checkpoint-dir", str(checkpoint))  # fmt: skip

    assert done.code == 3 and f"{checkpoint / 'cli.json'} is a symbolic link" in done.stderr
    assert victim.read_text() == "precious\n" and server.stats.requests == 0


@pytest.mark.parametrize("name", ["out.jsonl", "out.csv", "out.parquet"])
def test_an_output_file_that_is_a_link_is_refused_before_any_call(
    server, resources, tmp_path, name
):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / name).symlink_to(victim)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])

    done = plait_cli("run", program("Summarize"), "-i", str(source), "-o", str(tmp_path / name),
                     "-r", str(resources))  # fmt: skip

    assert done.code == 2 and f"{tmp_path / name} is a symbolic link" in done.stderr
    assert victim.read_text() == "precious\n" and server.stats.requests == 0


def test_the_report_trace_graph_and_page_never_go_through_planted_links(
    server, resources, tmp_path
):
    from plait.report import RunReport

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in ("run.json", "trace.json", "graph.mmd", "page.html"):
        (tmp_path / name).symlink_to(victim)
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])
    args = ("run", program("Summarize"), "-i", str(source), "-o", str(tmp_path / "out.jsonl"),
            "-r", str(resources))  # fmt: skip

    report = plait_cli(*args, "--report", str(tmp_path / "run.json"))
    assert report.code == 3 and "run.json is a symbolic link" in report.stderr
    trace = plait_cli(*args, "--trace", str(tmp_path / "trace.json"))
    assert trace.code == 3 and "trace.json is a symbolic link" in trace.stderr
    graph = plait_cli("graph", program("Summarize"), "-o", str(tmp_path / "graph.mmd"))
    assert graph.code == 2 and "graph.mmd is a symbolic link" in graph.stderr
    saved = tmp_path / "saved.run.json"
    RunReport(program="empty").save(saved)
    page = plait_cli("report", str(saved), "-o", str(tmp_path / "page.html"))
    assert page.code == 2 and "page.html is a symbolic link" in page.stderr
    assert victim.read_text() == "precious\n"


def test_parquet_in_and_out(server, resources, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c"], "n": [1, 2, 3]}), source)
    out = tmp_path / "out.parquet"

    done = plait_cli("run", program("Summarize"), "-i", str(source), "-o", str(out),
                     "-r", str(resources))  # fmt: skip

    assert done.code == 0, done.stderr
    table = pq.read_table(out).to_pylist()
    assert [r["output"] for r in table] == ["echo: a", "echo: b", "echo: c"]
    assert table[0]["n"] == 1 and table[0]["error"] is None


def test_eval_scores_each_row_and_fail_under_sets_exit_code_4(server, resources, tmp_path):
    rows = [{"text": "a", "target": "echo: a"}, {"text": "b", "target": "wrong"}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "scored.jsonl"
    args = ("eval", program("Summarize"), "-i", str(source), "-o", str(out), "-r", str(resources))

    done = plait_cli(*args)
    assert done.code == 0, done.stderr
    assert "score: 0.5000 (exact_match over 2 rows)" in done.stdout
    assert [r["score"] for r in read_jsonl(out)] == [1.0, 0.0]
    assert json.loads((tmp_path / "scored.run.json").read_text())["metrics"]["score"] == 0.5

    assert plait_cli(*args, "--fail-under", "0.9").code == 4
    missing = plait_cli(*args, "--target", "label")
    assert missing.code == 2 and "no column 'label' to score against" in missing.stderr


def test_graph_prints_mermaid_and_dot_without_calling_anything(tmp_path):
    mermaid = plait_cli("graph", program("Answer"))
    dot = plait_cli("graph", program("build_summarize"), "--format", "dot")

    assert mermaid.code == 0 and mermaid.stdout.startswith("graph TD")
    assert "input_question" in mermaid.stdout and "answer" in mermaid.stdout
    assert dot.code == 0 and dot.stdout.startswith("digraph")


def test_a_program_file_imports_its_sibling_modules_from_any_directory(server, resources, tmp_path):
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "prompts.py").write_text('INSTRUCTIONS = "Summarize."\n')
    (folder / "program.py").write_text(
        "from plait import LLMInference, Module\n"
        "from prompts import INSTRUCTIONS\n\n\n"
        "class Summarize(Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        '        self.llm = LLMInference("llm", INSTRUCTIONS)\n\n'
        "    def forward(self, text):\n"
        "        return self.llm(text)\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    source = write_jsonl(elsewhere / "in.jsonl", [{"text": "a"}])

    ran = plait_cli("run", "../app/program.py:Summarize", "-i", "in.jsonl", "-o", "out.jsonl",
                    "-r", str(resources), cwd=elsewhere)  # fmt: skip
    graph = plait_cli("graph", str(folder / "program.py:Summarize"), cwd=elsewhere)

    assert ran.code == 0, ran.stderr
    assert read_jsonl(source.with_name("out.jsonl"))[0]["output"] == "echo: a"
    assert server.stats.requests == 1
    assert graph.code == 0 and graph.stdout.startswith("graph TD"), graph.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "must look like pkg.module:Name"),
        (program("missing"), "has no 'missing'"),
        (program("not_a_program"), "is a int, not a plait Module"),
        ("no_such_package_xyz:Thing", "no module named 'no_such_package_xyz'"),
    ],
)
def test_a_bad_program_name_is_a_usage_error(spec, message, tmp_path):
    done = plait_cli("graph", spec)
    assert done.code == 2 and message in done.stderr


def test_train_saves_learned_parameters_and_a_training_report(server, resources, tmp_path):
    from tests.optimization.test_trainer import model

    server.responder = model("GOOD")
    train = write_jsonl(
        tmp_path / "train.jsonl",
        [{"text": f"t{i}:{'yes' if i % 2 else 'no'}", "target": "yes" if i % 2 else "no"}
         for i in range(4)],
    )  # fmt: skip
    val = write_jsonl(
        tmp_path / "val.jsonl",
        [{"text": f"v{i}:{'yes' if i % 2 else 'no'}", "target": "yes" if i % 2 else "no"}
         for i in range(4)],
    )  # fmt: skip
    saved = tmp_path / "learned.json"

    done = plait_cli("train", program("Task"), "--train", str(train), "--val", str(val),
                     "-r", str(resources), "--batch-size", "2", "--save", str(saved))  # fmt: skip

    assert done.code == 0, done.stderr
    assert "validation: 0.5000 -> 1.0000" in done.stdout
    assert "training kept the parameters of epoch 1: validation 0.5 -> 1" in done.stdout
    assert "GOOD" in json.dumps(json.loads(saved.read_text()))
    report = json.loads((tmp_path / "learned.run.json").read_text())
    assert report["kind"] == "train"
    assert report["training"]["scores"] == [1.0]
    assert [step["epoch"] for step in report["training"]["history"]] == [1, 1]
    assert report["training"]["accepted"] == 2 and report["training"]["discarded"] == 0


def test_the_training_report_holds_every_learning_step_without_the_prompts(
    server, resources, tmp_path
):
    from tests.optimization.test_trainer import model

    server.responder = model("GOOD")
    rows = [{"text": f"t{i}:{'yes' if i % 2 else 'no'}", "target": "yes" if i % 2 else "no"}
            for i in range(4)]  # fmt: skip
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    saved = tmp_path / "learned.json"

    done = plait_cli("train", program("Task"), "--train", str(train), "--val", str(train),
                     "-r", str(resources), "--batch-size", "2", "--save", str(saved))  # fmt: skip

    assert done.code == 0, done.stderr
    steps = json.loads((tmp_path / "learned.run.json").read_text())["learning"]
    root, *rest = steps
    assert (root["kind"], root["parent"], root["inputs"]["optimizer"]) == (
        "optimize",
        None,
        "Trainer",
    )
    assert root["outputs"]["best_score"] == 1.0 and root["outputs"]["improved"] is True
    children = [(s["kind"], s["inputs"].get("candidate", s["inputs"].get("round"))) for s in rest
                if s["parent"] == root["id"]]  # fmt: skip
    assert children == [("candidate", 0), ("round", 1), ("round", 2), ("candidate", 1),
                        ("decision", 1)]  # fmt: skip
    by_id = {s["id"]: s for s in steps}
    updates = [s for s in steps if s["kind"] == "update"]
    assert len(updates) == 2 and {by_id[u["parent"]]["kind"] for u in updates} == {"round"}
    assert updates[0]["inputs"]["parameter"] == "task.system_prompt"
    assert updates[0]["inputs"]["new_chars"] == len("PLAIN GOOD")
    keep = next(s for s in steps if s["kind"] == "decision" and s["parent"] == root["id"])
    assert keep["inputs"]["accepted"] is True and keep["inputs"]["new_score"] == 1.0
    assert "GOOD" not in json.dumps(steps)  # the learned prompt stays in --save only


def test_import_plait_does_not_import_click():
    code = "import sys, plait; print('click' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC)}, check=True)  # fmt: skip
    assert out.stdout.strip() == "False"


def test_run_help_shows_a_resources_file_that_loads_and_is_the_docs(tmp_path):
    from plait.resources import ResourceConfig

    done = plait_cli("run", "--help")

    assert done.code == 0, done.stderr
    lines = done.stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().startswith("# res.toml")]
    assert starts, done.stdout
    example = [line.strip() for line in lines[starts[0] :] if line.strip()]
    path = tmp_path / "res.toml"
    path.write_text("\n".join(example) + "\n")
    config = ResourceConfig.from_file(path)
    assert config.resolve("llm").provider == "openai"
    assert config.resolve("judge").provider == "local"
    page = (SRC.parent / "docs" / "how-to" / "run-files.md").read_text()
    assert all(line in page for line in example)


def _training_files(tmp_path: Path) -> tuple[Path, Path]:
    rows = [
        {"text": f"{prefix}{i}:{'yes' if i % 2 else 'no'}", "target": "yes" if i % 2 else "no"}
        for prefix in ("t", "v")
        for i in range(4)
    ]
    train = write_jsonl(tmp_path / "train.jsonl", rows[:4])
    val = write_jsonl(tmp_path / "val.jsonl", rows[4:])
    return train, val


def test_eval_estimate_prints_the_table_and_makes_only_the_sample_calls(
    server, resources, tmp_path
):
    rows = [{"text": f"t{i}", "target": f"echo: t{i}"} for i in range(10)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "scored.jsonl"

    done = plait_cli("eval", program("Summarize"), "-i", str(source), "-o", str(out),
                     "-r", str(resources), "--estimate", "--sample", "1")  # fmt: skip

    assert done.code == 0, done.stderr
    assert "low / expected / high" in done.stdout and "10 / 10 / 10" in done.stdout
    assert "1 call(s) made" in done.stdout
    assert server.stats.requests == 1 and not out.exists()


def test_eval_with_a_budget_writes_every_row_marks_the_undone_and_resumes(
    server, resources, tmp_path
):
    rows = [{"text": f"t{i}", "target": f"echo: t{i}"} for i in range(6)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "scored.jsonl"
    command = ("eval", program("Summarize"), "-i", str(source), "-o", str(out),
               "-r", str(resources), "--no-progress", "--max-concurrent", "1",
               "--checkpoint-dir", str(tmp_path / "ck"))  # fmt: skip

    done = plait_cli(*command, "--max-calls", "2")

    assert done.code == 3, done.stderr
    assert server.stats.requests == 2
    score = "score: 0.3333 (exact_match over 6 rows, 4 of them left undone and scored 0)"
    assert done.stdout == score + "\n"
    stop = done.stderr.splitlines()[-1]
    assert stop.startswith("plait: stopped by the budget: max_calls=2 are spent (2 calls, ")
    assert "4 of 6 rows left undone" in stop and "rerun the same command with a larger" in stop
    written = read_jsonl(out)
    assert [row["score"] for row in written] == [1.0, 1.0, 0, 0, 0, 0]
    assert all(row["error"].startswith("left undone by the budget: ") for row in written[2:])
    assert "more failed rows" not in done.stderr and "row 2:" not in done.stderr
    report = json.loads(out.with_name("scored.run.json").read_text())
    assert report["items"]["refused"] == 4 and report["items"]["failed"] == 4
    assert done.stderr.startswith("6 items: 2 ok, 0 failed, 4 left undone by the budget")

    # a larger budget goes on from the checkpoint: only the rows left undone are sent
    server.reset_stats()
    done = plait_cli(*command, "--max-calls", "4")

    assert done.code == 0, done.stderr
    assert server.stats.requests == 4 and "stopped by the budget" not in done.stderr
    assert [row["score"] for row in read_jsonl(out)] == [1.0] * 6


def test_eval_stopped_by_its_budget_without_a_checkpoint_says_a_rerun_starts_over(
    server, resources, tmp_path
):
    rows = [{"text": f"t{i}", "target": f"echo: t{i}"} for i in range(4)]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "scored.jsonl"

    done = plait_cli("eval", program("Summarize"), "-i", str(source), "-o", str(out),
                     "-r", str(resources), "--no-progress", "--max-tokens", "1",
                     "--fail-under", "0.9")  # fmt: skip

    assert done.code == 3, done.stderr  # the budget's stop, not the score's 4
    assert server.stats.requests == 0
    stop = done.stderr.splitlines()[-1]
    assert stop.startswith("plait: stopped by the budget: max_tokens=1 leave no room")
    assert "(0 calls, 0 tokens spent); 4 of 4 rows left undone" in stop
    assert "nothing was checkpointed (add --checkpoint-dir DIR to make it resumable)" in stop
    assert len(read_jsonl(out)) == 4


def test_train_estimate_prints_the_table_and_saves_nothing(server, resources, tmp_path):
    from tests.optimization.test_trainer import model

    server.responder = model("GOOD")
    train, val = _training_files(tmp_path)
    before = set(tmp_path.iterdir())

    done = plait_cli("train", program("Task"), "--train", str(train), "--val", str(val),
                     "-r", str(resources), "--batch-size", "2", "--estimate")  # fmt: skip

    assert done.code == 0, done.stderr  # no --save needed: nothing is written
    assert set(tmp_path.iterdir()) == before
    assert "Estimate for Trainer" in done.stdout and "optimizer steps" in done.stdout
    # the calls made are the sample's alone: 2 rows, and a step sampled on a copy
    assert server.stats.requests > 2
    assert f"measured on a sample: {server.stats.requests} call(s) made" in done.stdout


def test_train_with_a_budget_stops_within_it_and_exits_3(server, resources, tmp_path):
    from tests.optimization.test_trainer import model

    server.responder = model("GOOD")
    train, val = _training_files(tmp_path)
    saved = tmp_path / "learned.json"

    done = plait_cli("train", program("Task"), "--train", str(train), "--val", str(val),
                     "-r", str(resources), "--batch-size", "2", "--save", str(saved),
                     "--max-calls", "7")  # fmt: skip

    assert done.code == 3, done.stderr
    assert server.stats.requests <= 7
    assert "stopped by the budget" in done.stderr and saved.exists()
    # told in the command's words: its option, not the Trainer's argument
    assert "add --checkpoint-dir DIR to make it resumable" in done.stderr
    assert "checkpoint_dir" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("max_calls", "validation", "reason"),
    [
        # cut inside the validation before training: no score to show, not 0 -> 0
        ("2", "validation: none finished (the program is saved as it was)",
         "kept the program as it was: nothing was validated"),
        # cut inside the first epoch: no epoch's validation to list, not "()"
        ("11", "validation: 0.5000 -> 0.5000 (best epoch 0)",
         "no epoch ended, so the 1 update(s) applied during training were never validated"),
    ],
    ids=["in the first validation", "in the first epoch"],
)  # fmt: skip
def test_train_stopped_by_its_budget_says_what_it_validated(
    server, resources, tmp_path, max_calls, validation, reason
):
    from tests.optimization.test_trainer import model

    server.responder = model("GOOD")
    train, val = _training_files(tmp_path)
    saved = tmp_path / "learned.json"

    done = plait_cli("train", program("Task"), "--train", str(train), "--val", str(val),
                     "-r", str(resources), "--batch-size", "2", "--save", str(saved),
                     "--max-calls", max_calls, "--no-progress",
                     "--checkpoint-dir", str(tmp_path / "ck"))  # fmt: skip

    assert done.code == 3, done.stderr
    assert done.stdout.startswith(validation), done.stdout
    assert reason in done.stdout and "()" not in done.stdout
    if max_calls == "2":  # the validation examples the budget refused: undone, not failed
        summary = done.stderr.splitlines()[0]
        assert summary.startswith("4 items: 2 ok, 0 failed, 2 left undone by the budget")
        report = json.loads(saved.with_name("learned.run.json").read_text())
        assert report["items"]["refused"] == 2
    assert "a rerun on the same --checkpoint-dir with a larger budget" in done.stderr


def test_train_on_a_checkpoint_of_other_settings_or_data_stops_before_any_call(
    server, resources, tmp_path
):
    from tests.optimization.test_trainer import model

    server.responder = model("GOOD")
    train, val = _training_files(tmp_path)
    checkpoint = tmp_path / "ck"
    command = ("train", program("Task"), "--train", str(train), "--val", str(val),
               "-r", str(resources), "--batch-size", "2", "--save", str(tmp_path / "l.json"),
               "--checkpoint-dir", str(checkpoint), "--max-calls", "6",
               "--no-progress")  # fmt: skip
    assert plait_cli(*command).code == 3
    server.reset_stats()
    other_val = write_jsonl(tmp_path / "other.jsonl", [{"text": "w:no", "target": "no"}] * 4)

    for changed, told in [
        (("--batch-size", "3"), "was written for batch_size=2 (this Trainer has 3)"),
        (("--val", str(other_val)), "was written for another validation set"),
    ]:
        done = plait_cli(*command, *changed)
        assert done.code == 2, done.stderr
        assert done.stderr.startswith("plait: error: ") and done.stderr.count("\n") == 1
        assert told in done.stderr and "use another --checkpoint-dir" in done.stderr
    (checkpoint / "trainer.json").write_text('{"format": "plait.trainer/1"')
    done = plait_cli(*command)
    assert done.code == 2 and "trainer.json is not valid JSON" in done.stderr, done.stderr
    assert server.stats.requests == 0
