"""A user's first hour with plait, walked as the README and the site tell it, on the embedded model.

Every step is typed as a user types it, in a folder of their own (subprocesses):
the demo; the typed program of docs/getting-started.md (a `Predict` of the `Triage`
signature, taken from the page itself) through ``plait run`` on a CSV and a JSON Lines file; the
run report drawn with ``plait report`` and opened in a browser; a chat turn and a
saved note in ``examples/chat.py``; one optimizer (`LabeledFewShot`) in a script,
its learned demos run again with ``plait run --load``. Each step checks what the
pages say the user will see; what SmolLM2 writes is not fixed, so the checks are
about shape, not wording.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from docs_blocks import blocks_of
from report.test_html import CHROMIUM, PROBE, open_in_chromium

ROOT = Path(__file__).parents[1]
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
PLAIT = Path(sys.executable).with_name("plait")  # the command pip installed beside python

TICKETS = ["I was charged twice this month", "The app crashes when I open settings"]
LEARN = """\
from plait import ResourceConfig
from plait.optimization import LabeledFewShot

from programs import triage

train = [
    ({"ticket": "I was charged twice this month"}, {"queue": "billing", "urgent": True}),
    ({"ticket": "The app crashes when I open settings"}, {"queue": "bug", "urgent": True}),
    ({"ticket": "Do you ship to Norway?"}, {"queue": "other", "urgent": False}),
    ({"ticket": "My invoice shows the wrong address"}, {"queue": "billing", "urgent": False}),
]
triage.bind(ResourceConfig.from_file("res.toml"))
report = LabeledFewShot(k=3).compile(triage, trainset=train)  # a script: no await
print(report.table())
print("reason:", report.reason)
triage.save("learned.json")
"""


def saved_file(page: Path, name: str) -> str:
    """Returns the block of ``page`` that the reader saves as ``name`` (``title="name"``)."""
    return next(block.body for block in blocks_of(page) if block.title == name)


def typed(folder: Path, *command: str, stdin: str | None = None, timeout: float = 600) -> str:
    """Runs a command in the user's folder with this checkout's plait; returns stdout + stderr."""
    done = subprocess.run(
        command,
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout + done.stderr


def plait(folder: Path, *arguments: str) -> str:
    command = [str(PLAIT)] if PLAIT.exists() else [sys.executable, "-m", "plait"]
    return typed(folder, *command, *arguments)


def demo_runs_the_perspectives_together_then_the_synthesis(folder: Path) -> None:
    out = typed(folder, sys.executable, str(ROOT / "examples" / "demo.py"))
    for part in ("[technical]", "[business]", "[user]", "[summary]"):
        assert part in out
    schedule = {
        name: (float(start), float(end))
        for name, start, end in re.findall(r"^(\S+)\s+([\d.]+)\s+([\d.]+)\s", out, re.MULTILINE)
    }
    perspectives = [schedule[f"perspectives.{name}"] for name in ("technical", "business", "user")]
    # a fan-out: all three were started before the first one finished ...
    assert max(start for start, _ in perspectives) < min(end for _, end in perspectives)
    # ... and the synthesis (the fan-in) waited for all of them
    assert schedule["synthesizer"][0] >= max(end for _, end in perspectives)


def the_typed_program_runs_over_csv_and_jsonl(folder: Path) -> None:
    (folder / "programs.py").write_text(saved_file(GETTING_STARTED, "triage.py"))
    (folder / "res.toml").write_text('[llm]\nprovider = "local"  # the embedded model\n')
    (folder / "tickets.csv").write_text("ticket\n" + "".join(f'"{t}"\n' for t in TICKETS))
    (folder / "tickets.jsonl").write_text(
        "".join(json.dumps({"ticket": t}) + "\n" for t in TICKETS)
    )

    out = plait(folder, "run", "programs.py:triage", "--input", "tickets.csv",
                "--output", "triaged.csv", "--resources", "res.toml")  # fmt: skip
    assert "2 items: 2 ok, 0 failed" in out and "LLM calls" in out and "tokens:" in out
    with (folder / "triaged.csv").open() as file:
        rows = list(csv.DictReader(file))
    # a Prediction is written one column per field, beside the input and plait's own columns
    assert list(rows[0]) == ["row", "ticket", "queue", "urgent", "error"]
    assert [row["ticket"] for row in rows] == TICKETS
    assert all(row["queue"] in {"billing", "bug", "other"} and not row["error"] for row in rows)

    out = plait(folder, "run", "programs.py:triage", "-i", "tickets.jsonl", "-o", "triaged.jsonl",
                "-r", "res.toml")  # fmt: skip
    lines = [json.loads(line) for line in (folder / "triaged.jsonl").read_text().splitlines()]
    assert [line["ticket"] for line in lines] == TICKETS
    assert all(isinstance(line["urgent"], bool) and line["error"] is None for line in lines)
    assert (folder / "triaged.run.json").exists()  # the run report, beside the output


def the_run_report_is_drawn(folder: Path) -> Path:
    plait(folder, "report", "triaged.run.json", "-o", "report.html")
    page = (folder / "report.html").read_text()
    # each module's calls, traffic per endpoint, cost by alias (the local model is free:
    # a price of its own, so $0 is its true cost), the program graph
    for plot in ("latency", "traffic", "cost", "graph"):
        assert f'id="plot-{plot}"' in page
    return folder / "report.html"


def a_chat_turn_streams_a_reply_and_a_note_is_saved_after_a_yes(folder: Path) -> None:
    chat = str(ROOT / "examples" / "chat.py")
    out = typed(folder, sys.executable, chat, "--notes", "notes.txt",
                stdin="hello\nnote: buy milk\ny\n")  # fmt: skip
    reply = out.split("assistant: ", 1)[1].split("you: ", 1)[0]
    assert reply.strip()  # the model answered the greeting
    assert out.count("[y/n]") == 1  # asked once before saving
    assert len((folder / "notes.txt").read_text().splitlines()) == 1


def one_optimizer_learns_demos_that_plait_run_loads(folder: Path) -> None:
    (folder / "learn.py").write_text(LEARN)
    out = typed(folder, sys.executable, "learn.py")
    assert "as it was" in out and "labeled demos" in out  # the trials table
    assert "reason: " in out  # why the program was kept or changed, in words
    saved = json.loads((folder / "learned.json").read_text())
    assert set(saved["parameters"]) == {"instructions", "demos"}
    out = plait(folder, "run", "programs.py:triage", "-i", "tickets.jsonl", "-o", "again.jsonl",
                "-r", "res.toml", "--load", "learned.json")  # fmt: skip
    assert "2 items: 2 ok, 0 failed" in out


@pytest.mark.slow
def test_the_first_hour_as_the_pages_tell_it(tmp_path: Path) -> None:
    demo_runs_the_perspectives_together_then_the_synthesis(tmp_path)
    the_typed_program_runs_over_csv_and_jsonl(tmp_path)
    report = the_run_report_is_drawn(tmp_path)
    a_chat_turn_streams_a_reply_and_a_note_is_saved_after_a_yes(tmp_path)
    one_optimizer_learns_demos_that_plait_run_loads(tmp_path)
    if CHROMIUM is None:
        pytest.skip("the report was not opened: needs Chromium (Debian: apt-get install chromium)")
    probe = open_in_chromium(report, PROBE, tmp_path)
    assert probe["errors"] == []
    assert all(plot["svg"] >= 1 and plot["marks"] > 0 for plot in probe["plots"]), probe["plots"]
