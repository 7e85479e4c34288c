"""A Ray Data job keeping its rows in a state store, run as its own process by
test_ray_resume.py, which kills it with SIGKILL mid-way and runs it again.

    python resume_job.py STATE_URL BASE_URL OUTPUT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray
from tests.cli.sample_programs import Summarize

from plait.distributed import map_dataset

ROWS = 24
IN_FLIGHT = 4


def main(state: str, base_url: str, output: str) -> None:
    root = Path(__file__).resolve().parents[2]
    path = f"{root / 'src'}:{root}"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})  # fmt: skip
    endpoint = {"provider": "openai", "model": "scripted", "base_url": base_url,
                "api_key": "test-key", "max_concurrent": IN_FLIGHT}  # fmt: skip
    rows = [{"text": f"row {n}", "id": n} for n in range(ROWS)]
    ds = ray.data.from_items(rows, override_num_blocks=4)
    out = map_dataset(Summarize(), ds, resources={"llm": endpoint}, state=state,
                      concurrency=2, batch_size=3).take_all()  # fmt: skip
    Path(output).write_text(json.dumps([[r["id"], r["output"], r["error"]] for r in out]))


if __name__ == "__main__":
    main(*sys.argv[1:4])
