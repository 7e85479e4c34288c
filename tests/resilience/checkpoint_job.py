"""A batch job with a checkpoint, run as its own process by test_checkpoint.py.

    python checkpoint_job.py BASE_URL CHECKPOINT_DIR OUTPUT_JSON

Sends ``ITEMS`` through one LLM call each against the scripted server at
BASE_URL, at most ``MAX_CONCURRENT`` at once, checkpointing to CHECKPOINT_DIR,
and writes the list of outputs to OUTPUT_JSON when the whole batch is done.
The test kills it with SIGKILL mid-batch and runs it again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from plait import LLMInference, ResourceManager, run

ITEMS = [f"item {i}" for i in range(60)]
MAX_CONCURRENT = 8


async def main(base_url: str, checkpoint_dir: str, output: str) -> None:
    config = {
        "llm": {
            "provider": "openai",
            "model": "scripted",
            "base_url": base_url,
            "api_key": "test-key",
            "max_concurrent": MAX_CONCURRENT,
        }
    }
    async with ResourceManager(config) as manager:
        outputs = await run(
            LLMInference("llm", temperature=0.0),
            ITEMS,
            resources=manager,
            checkpoint_dir=checkpoint_dir,
            max_concurrent=MAX_CONCURRENT,
            progress=False,
        )
    Path(output).write_text(json.dumps(outputs))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
