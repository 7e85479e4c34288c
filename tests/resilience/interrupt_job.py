"""Scripts that test_interrupt.py runs as their own processes and interrupts with a signal.

    python interrupt_job.py MODE BASE_URL CHECKPOINT_DIR OUTPUT_JSON

MODE ``sync`` calls the bound program on the batch from synchronous code
(``program(ITEMS)``, which runs it through ``run_sync``); ``async`` runs
``asyncio.run(run(program, ITEMS))``; ``sync-slow-to-stop`` and
``async-slow-to-stop`` do the same with a program whose clean-up on cancel
takes a minute (the script then also reports how many clean-ups still run
when the interrupt reaches it). Every call goes to the
scripted server at BASE_URL, at most ``MAX_CONCURRENT`` at once, with a
checkpoint in CHECKPOINT_DIR; the outputs go to OUTPUT_JSON when all are done.

A ``KeyboardInterrupt`` that reaches this script is reported as one line,
``job: KeyboardInterrupt (N items checkpointed)``, and the script exits 130,
so the test can tell the interrupt reached user code (after the checkpoint
was flushed) and that nothing else was printed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from plait import LLMInference, Module, run

ITEMS = [f"item {i}" for i in range(300)]
MAX_CONCURRENT = 16


class SlowToStop(Module):
    """One LLM call in an async leaf whose clean-up on cancel takes a minute.

    A stop has to wait for it, so a second Ctrl-C is what ends the process.
    """

    cleaning = 0
    """Clean-ups running now; the script reports them when the interrupt reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm", temperature=0.0)

    async def forward(self, text: str) -> str:
        try:
            return await self.llm(text)
        except asyncio.CancelledError:
            SlowToStop.cleaning += 1
            try:
                print("job: cleaning up", file=sys.stderr, flush=True)
                await asyncio.sleep(60)
            finally:
                SlowToStop.cleaning -= 1
            raise


def checkpointed(checkpoint_dir: str) -> int:
    items = Path(checkpoint_dir) / "items.jsonl"
    return len(items.read_text().splitlines()) if items.exists() else 0


def main(mode: str, base_url: str, checkpoint_dir: str, output: str) -> None:
    resources = {
        "llm": {
            "provider": "openai",
            "model": "scripted",
            "base_url": base_url,
            "api_key": "test-key",
            "max_concurrent": MAX_CONCURRENT,
            "max_retries": 0,
        }
    }
    slow = mode.endswith("-slow-to-stop")
    program = SlowToStop() if slow else LLMInference("llm", temperature=0.0)
    program.bind(resources, checkpoint_dir=checkpoint_dir, progress=False)
    try:
        outputs = asyncio.run(run(program, ITEMS)) if mode.startswith("async") else program(ITEMS)
    except KeyboardInterrupt:
        count = checkpointed(checkpoint_dir)
        print(f"job: KeyboardInterrupt ({count} items checkpointed)", file=sys.stderr, flush=True)
        if slow:
            print(
                f"job: {SlowToStop.cleaning} clean-ups still running", file=sys.stderr, flush=True
            )
        sys.exit(130)
    Path(output).write_text(json.dumps(outputs))


if __name__ == "__main__":
    main(*sys.argv[1:5])
