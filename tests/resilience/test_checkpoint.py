"""Checkpoint and resume: a batch killed with SIGKILL finishes on rerun, losing only what
was in flight; a checkpoint of another program or other inputs is refused."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plait import LLMInference, ResourceManager, run
from plait.execution.checkpoint import CheckpointMismatchError
from plait.testing import ScriptedServer, fetch_stats, start_server_process

from .checkpoint_job import ITEMS, MAX_CONCURRENT
from .support import TwoStep, endpoint

JOB = Path(__file__).with_name("checkpoint_job.py")


def finished_lines(items_file: Path) -> list[dict]:
    """Returns the complete records of a checkpoint's items file (a torn line is skipped)."""
    if not items_file.exists():
        return []
    records = []
    for line in items_file.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


@pytest.mark.timeout(120)
def test_a_batch_killed_mid_run_completes_on_rerun_with_each_item_once(tmp_path: Path) -> None:
    checkpoint_dir = tmp_path / "checkpoint"
    items_file = checkpoint_dir / "items.jsonl"
    output = tmp_path / "outputs.json"
    with start_server_process(latency=0.25) as (_server, base_url):
        command = [sys.executable, str(JOB), base_url, str(checkpoint_dir), str(output)]
        job = subprocess.Popen(command)
        try:
            while len(finished_lines(items_file)) < 10:
                assert job.poll() is None, f"the job ended (code {job.returncode}) before the kill"
                time.sleep(0.01)
            job.send_signal(signal.SIGKILL)
        finally:
            job.kill()
            job.wait()
        assert job.returncode == -signal.SIGKILL and not output.exists()
        done_before_kill = {r["index"] for r in finished_lines(items_file)}
        assert 10 <= len(done_before_kill) < len(ITEMS)

        subprocess.run(command, check=True, timeout=60)
        requests = fetch_stats(base_url)["requests"]

    assert json.loads(output.read_text()) == [f"echo: {item}" for item in ITEMS]
    indices = [r["index"] for r in finished_lines(items_file)]
    assert sorted(indices) == list(range(len(ITEMS)))  # each item recorded exactly once
    # only the calls in flight at the kill were sent twice
    assert len(ITEMS) <= requests <= len(ITEMS) + MAX_CONCURRENT


@pytest.fixture
async def server():
    async with ScriptedServer() as running:
        yield running


async def test_a_checkpoint_of_another_program_or_other_inputs_is_refused(
    server: ScriptedServer, tmp_path: Path
) -> None:
    items = ["a", "b", "c"]
    async with ResourceManager({"llm": endpoint(server)}) as manager:
        await run(TwoStep(), items, resources=manager, checkpoint_dir=tmp_path)
        server.reset_stats()
        with pytest.raises(CheckpointMismatchError, match="different program"):
            await run(LLMInference("llm"), items, resources=manager, checkpoint_dir=tmp_path)
        with pytest.raises(CheckpointMismatchError, match="different inputs"):
            await run(TwoStep(), ["a", "b", "x"], resources=manager, checkpoint_dir=tmp_path)
        with pytest.raises(CheckpointMismatchError, match="different inputs"):
            await run(TwoStep(), [*items, "d"], resources=manager, checkpoint_dir=tmp_path)
        assert server.stats.requests == 0  # refused before anything was sent
        # the checkpoint is intact: the right program and inputs resume from it
        outputs = await run(TwoStep(), items, resources=manager, checkpoint_dir=tmp_path)
    assert outputs == [f"echo: echo: {x}" for x in items]
    assert server.stats.requests == 0


async def test_a_torn_last_line_is_tolerated_and_its_item_runs_again(
    server: ScriptedServer, tmp_path: Path
) -> None:
    items = [f"item {i}" for i in range(5)]
    program = LLMInference("llm", temperature=0.0)
    async with ResourceManager({"llm": endpoint(server)}) as manager:
        await run(program, items, resources=manager, checkpoint_dir=tmp_path, max_concurrent=1)
        items_file = tmp_path / "items.jsonl"
        lines = items_file.read_text().splitlines(keepends=True)
        torn = lines[-1][: len(lines[-1]) // 2]  # a crash in the middle of the last write
        items_file.write_text("".join(lines[:-1]) + torn)
        torn_index = json.loads(lines[-1])["index"]
        server.reset_stats()

        outputs = await run(program, items, resources=manager, checkpoint_dir=tmp_path)
        assert outputs == [f"echo: {item}" for item in items]
        assert server.stats.requests == 1
        assert server.stats.log[0].body["messages"][-1]["content"] == items[torn_index]

        # the rewritten item stands on its own line: a third run sends nothing
        await run(program, items, resources=manager, checkpoint_dir=tmp_path)
    assert server.stats.requests == 1
    assert sorted(r["index"] for r in finished_lines(items_file)) == list(range(5))
