"""Ctrl-C and SIGTERM: one signal stops a run cleanly and a rerun resumes; a second quits at once.

Each scenario runs in its own process (``plait run``, a script calling the
program synchronously, a script under ``asyncio.run``) against a scripted
server in another process, which counts what it saw. Before the signal the
run is brought to a steady state: after some items finished, every further
request hangs for a minute, so the items finished before the signal are
exactly the ones the server answered, and a process that exits well under
that minute has cancelled its requests in flight.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from interruptible import interruptible
from plait.testing import fetch_stats, start_server_process

from .interrupt_job import ITEMS, MAX_CONCURRENT

SRC = Path(__file__).resolve().parents[2] / "src"
JOB = Path(__file__).with_name("interrupt_job.py")
SUMMARIZE = f"{Path(__file__).parents[1] / 'cli' / 'sample_programs.py'}:Summarize"
STALL = 60.0
"""Seconds every request hangs once the run is stalled; exits are asserted well under it."""


class Child:
    """A child process with this checkout's plait, SIGINT at its default (`interruptible`);
    its stderr is collected line by line."""

    def __init__(self, command: list[str]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            interruptible(command),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def finish(self, timeout: float) -> int:
        """Waits for the exit (failing after ``timeout`` s) and returns the exit code."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the process did not exit within {timeout:g} s; stderr: {self.stderr}")
        self._reader.join(timeout=10)
        return code

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def wait_until(condition: Callable[[], bool], what: str, child: Child, timeout: float = 60) -> None:
    """Polls ``condition`` until it holds; fails if the child exits or ``timeout`` s pass first."""
    give_up = time.monotonic() + timeout
    while not condition():
        if child.process.poll() is not None:
            pytest.fail(f"the process exited ({child.process.returncode}) before {what}: "
                        f"{child.stderr}")  # fmt: skip
        if time.monotonic() > give_up:
            pytest.fail(f"no {what} within {timeout:g} s")
        time.sleep(0.02)


def set_faults(base_url: str, method: str, faults: list[dict] | None = None) -> None:
    root = base_url.removesuffix("/v1")
    data = json.dumps(faults).encode() if faults is not None else None
    request = urllib.request.Request(f"{root}/faults", data=data, method=method)
    with urllib.request.urlopen(request, timeout=10):
        pass


def checkpoint_indices(directory: Path) -> list[int]:
    """Returns the item index of every complete record in the checkpoint (chunk folders too)."""
    indices = []
    for items in sorted(directory.rglob("items.jsonl")):
        # A line still being written has no newline yet: it is not a record (as for the reader).
        for line in items.read_text().splitlines(keepends=True):
            if line.endswith("\n"):
                indices.append(json.loads(line)["index"])
    return indices


def answered_texts(base_url: str) -> list[str]:
    """Returns the user text of every request the server answered with 200."""
    log = fetch_stats(base_url, include_log=True)["log"]
    return [r["body"]["messages"][-1]["content"] for r in log if r["status"] == 200]


def stall_after_some_items(base_url: str, checkpoint: Path, child: Child) -> int:
    """Lets 20 items finish, then makes every request hang; returns how many items finished.

    Returns once every slot holds a hanging request and every answered item
    is checkpointed: the run can make no more progress until it is stopped.
    """
    wait_until(lambda: len(checkpoint_indices(checkpoint)) >= 20, "20 items checkpointed", child)
    set_faults(base_url, "POST", [{"kind": "slow", "delay": STALL}])

    def stalled() -> bool:
        # Every request in flight hangs (a request that came before the fault is
        # still answered as usual), and every answered item is checkpointed.
        log = fetch_stats(base_url, include_log=True)["log"]
        hanging = [r for r in log if r["finished"] is None]
        answered = [r for r in log if r["status"] == 200]
        return (
            len(hanging) == MAX_CONCURRENT
            and all(r["fault"] is not None for r in hanging)
            and len(checkpoint_indices(checkpoint)) == len(answered)
        )

    wait_until(stalled, "stall with every slot hanging", child)
    return len(answered_texts(base_url))


def resume(base_url: str) -> None:
    """Makes the server answer at once again and zeroes its counters, for the rerun."""
    set_faults(base_url, "DELETE")
    urllib.request.urlopen(urllib.request.Request(
        base_url.removesuffix("/v1") + "/stats/reset", data=b"", method="POST"
    ), timeout=10).close()  # fmt: skip


def write_inputs(tmp_path: Path, base_url: str) -> tuple[Path, Path]:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": item}) + "\n" for item in ITEMS))
    resources = tmp_path / "res.toml"
    resources.write_text(
        '["*"]\nprovider = "openai"\nmodel = "m"\napi_key = "k"\nmax_retries = 0\n'
        f'base_url = "{base_url}"\nmax_concurrent = {MAX_CONCURRENT}\n'
    )
    return source, resources


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("signum", "code", "named"),
    [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")],
)
def test_one_signal_stops_plait_run_cleanly_and_the_same_command_resumes(
    tmp_path: Path, signum: int, code: int, named: str
) -> None:
    checkpoint, out = tmp_path / "ck", tmp_path / "out.jsonl"
    with start_server_process(latency=0.2, keep_log=True) as (_server, base_url):
        source, resources = write_inputs(tmp_path, base_url)
        command = [sys.executable, "-m", "plait", "run", SUMMARIZE, "-i", str(source),
                   "-o", str(out), "-r", str(resources), "--checkpoint-dir", str(checkpoint),
                   "--chunk-size", "100"]  # fmt: skip
        child = Child(command)
        try:
            finished = stall_after_some_items(base_url, checkpoint, child)
            child.process.send_signal(signum)
            assert child.finish(timeout=STALL / 2) == code, child.stderr
        finally:
            child.kill()
        stats = fetch_stats(base_url)
        answered = answered_texts(base_url)
        done = sorted(checkpoint_indices(checkpoint))
        written = [json.loads(line) for line in out.read_text().splitlines()]
        resume(base_url)
        rerun = subprocess.run(
            command, env={**os.environ, "PYTHONPATH": str(SRC)},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        rerun_requests = fetch_stats(base_url)["requests"]

    assert all(line.startswith("plait: ") for line in child.lines), child.stderr  # no tracebacks
    stopped = [line for line in child.lines if line.startswith(f"plait: stopped by {named}")]
    assert len(stopped) == 1 and "rerun the same command to resume" in stopped[0], child.stderr
    assert str(checkpoint) in stopped[0]
    assert stats["peak_concurrency"] <= MAX_CONCURRENT and stats["in_flight"] == 0
    # The checkpoint holds exactly the items finished before the signal.
    assert len(answered) == finished == len(done)
    assert sorted(f"item {i}" for i in done) == sorted(answered)
    # The output holds every row finished in input order before the first unfinished one.
    prefix = next(i for i in range(len(ITEMS)) if i not in done)
    assert [row["row"] for row in written] == list(range(prefix))
    assert all(row["output"] == f"echo: item {row['row']}" for row in written)
    # The rerun does only the rest and writes every row once.
    assert rerun.returncode == 0, rerun.stderr
    assert rerun_requests == len(ITEMS) - len(done)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["output"] for row in rows] == [f"echo: {item}" for item in ITEMS]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_one_ctrl_c_reaches_a_script_as_keyboard_interrupt_after_the_batch_stopped(
    tmp_path: Path, mode: str
) -> None:
    checkpoint, output = tmp_path / "ck", tmp_path / "outputs.json"
    with start_server_process(latency=0.2, keep_log=True) as (_server, base_url):
        command = [sys.executable, str(JOB), mode, base_url, str(checkpoint), str(output)]
        child = Child(command)
        try:
            finished = stall_after_some_items(base_url, checkpoint, child)
            child.process.send_signal(signal.SIGINT)
            assert child.finish(timeout=STALL / 2) == 130, child.stderr
        finally:
            child.kill()
        stats = fetch_stats(base_url)
        resume(base_url)
        subprocess.run(command, env={**os.environ, "PYTHONPATH": str(SRC)}, check=True,
                       timeout=120)  # fmt: skip
        rerun_requests = fetch_stats(base_url)["requests"]

    # The interrupt reached the script once the checkpoint held every finished item,
    # and nothing else was printed: no traceback, no asyncio noise at exit.
    assert child.lines == [f"job: KeyboardInterrupt ({finished} items checkpointed)"]
    assert stats["peak_concurrency"] <= MAX_CONCURRENT and stats["in_flight"] == 0
    assert rerun_requests == len(ITEMS) - finished
    assert json.loads(output.read_text()) == [f"echo: {item}" for item in ITEMS]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("where", ["cli", "sync", "async"])
def test_a_second_ctrl_c_during_a_slow_stop_exits_at_once(tmp_path: Path, where: str) -> None:
    checkpoint = tmp_path / "ck"
    with start_server_process(latency=STALL, keep_log=True) as (_server, base_url):
        if where == "cli":
            source, resources = write_inputs(tmp_path, base_url)
            command = [sys.executable, "-m", "plait", "run", f"{JOB}:SlowToStop",
                       "-i", str(source), "-o", str(tmp_path / "out.jsonl"), "-r", str(resources),
                       "--checkpoint-dir", str(checkpoint)]  # fmt: skip
        else:
            command = [sys.executable, str(JOB), f"{where}-slow-to-stop", base_url,
                       str(checkpoint), str(tmp_path / "outputs.json")]  # fmt: skip
        child = Child(command)
        try:
            in_flight = lambda: fetch_stats(base_url)["in_flight"] == MAX_CONCURRENT  # noqa: E731
            wait_until(in_flight, "every slot in flight", child)
            child.process.send_signal(signal.SIGINT)
            cleaning = lambda: "job: cleaning up" in child.lines  # noqa: E731
            wait_until(cleaning, "the program's clean-up started", child)
            child.process.send_signal(signal.SIGINT)
            assert child.finish(timeout=STALL / 2) == 130, child.stderr  # not after the clean-up
        finally:
            child.kill()

    assert all(line.startswith(("plait: ", "job: ")) for line in child.lines), child.stderr
    assert "Traceback" not in child.stderr
    if where != "cli":  # the command quits at once on the second signal, by os._exit
        # The second Ctrl-C ended the clean-ups before the script got its interrupt:
        # none runs on beside the script's handler (in a notebook, for a minute).
        assert child.lines[-1] == "job: 0 clean-ups still running", child.stderr


TASK = f"{Path(__file__).parents[1] / 'cli' / 'sample_programs.py'}:Task"


@pytest.mark.timeout(240)
def test_one_ctrl_c_stops_a_budgeted_plait_train_and_the_rerun_resumes_within_its_budget(
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "ck"
    rows = [{"text": f"t{i}", "target": "yes"} for i in range(16)]
    val = [{"text": f"v{i}", "target": "yes"} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    with start_server_process(latency=0.05, keep_log=True) as (_server, base_url):
        _, resources = write_inputs(tmp_path, base_url)
        command = [sys.executable, "-m", "plait", "train", TASK, "--train",
                   str(tmp_path / "train.jsonl"), "--val", str(tmp_path / "val.jsonl"),
                   "-r", str(resources), "--batch-size", "2", "--save", str(tmp_path / "l.json"),
                   "--checkpoint-dir", str(checkpoint), "--max-calls", "400",
                   "--no-progress"]  # fmt: skip
        child = Child(command)
        try:
            saved = checkpoint / "trainer.json"
            wait_until(saved.exists, "the training state checkpointed", child)
            set_faults(base_url, "POST", [{"kind": "slow", "delay": STALL}])
            hanging = lambda: fetch_stats(base_url)["in_flight"] > 0  # noqa: E731
            wait_until(hanging, "a request hanging", child)
            child.process.send_signal(signal.SIGINT)
            assert child.finish(timeout=STALL / 2) == 130, child.stderr
        finally:
            child.kill()
        position = json.loads(saved.read_text())
        kept = json.loads((tmp_path / "l.json").read_text())
        report = json.loads((tmp_path / "l.run.json").read_text())
        resume(base_url)
        rerun = subprocess.run(
            command, env={**os.environ, "PYTHONPATH": str(SRC)},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        rerun_texts = answered_texts(base_url)
        rerun_requests = fetch_stats(base_url)["requests"]

    assert all(line.startswith("plait: ") for line in child.lines), child.stderr  # no tracebacks
    stopped = [line for line in child.lines if line.startswith("plait: stopped by Ctrl-C")]
    assert len(stopped) == 1 and str(checkpoint) in stopped[0], child.stderr
    assert "rerun the same command to resume" in stopped[0]
    assert position["initial_score"] is not None  # the state of the training so far
    # what ran is reported, and the best parameters validated so far are saved
    told = "saved the best parameters validated so far (epoch 0, validation "
    assert told in stopped[0] and f"to {tmp_path / 'l.json'}; report " in stopped[0]
    best = position["best"]["parameters"]
    assert {name: entry["value"] for name, entry in kept["parameters"].items()} == best
    assert report["kind"] == "train" and report["training"]["reason"].startswith("cancelled: ")
    assert report["items"]["ok"] >= 4  # the validation before training, at least
    assert rerun.returncode == 0, rerun.stderr
    assert rerun_requests <= 400
    # the validation before training is in the checkpoint: the rerun validates only after
    # the epoch, each validation example once
    assert sorted(t for t in rerun_texts if t.startswith("v")) == [f"v{i}" for i in range(4)]
