"""The embedded model's CPU threads: chosen from the CPUs the process may use, and settable.

llama.cpp's own default reads the prompt on every CPU of the machine with
threads that spin while they wait; beside other work on a small machine that
made a call several times slower. No model is loaded here: the counts are
chosen when the backend is made.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from plait import ResourceConfig
from plait.backends.local import LocalBackend
from plait.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src"


def threads_with_affinity(cpus: set[int]) -> tuple[int, int]:
    """The default thread counts of a LocalBackend made in a process allowed only ``cpus``."""
    code = (
        f"import os; os.sched_setaffinity(0, {cpus!r}); "
        "from plait.backends.local import LocalBackend; b = LocalBackend(); "
        "print(b.n_threads, b.n_threads_batch)"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    generation, batch = done.stdout.split()
    return int(generation), int(batch)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_the_default_threads_follow_the_cpus_the_process_may_use() -> None:
    usable = os.sched_getaffinity(0)
    assert threads_with_affinity({min(usable)}) == (1, 1)
    half = max(1, len(usable) // 2)
    assert threads_with_affinity(usable) == (half, half)


def test_thread_counts_are_settable_and_the_prompt_threads_follow_generation() -> None:
    three = LocalBackend(n_threads=3)
    assert (three.n_threads, three.n_threads_batch) == (3, 3)
    chosen = LocalBackend(n_threads=1, n_threads_batch=2)
    assert (chosen.n_threads, chosen.n_threads_batch) == (1, 2)


def test_a_resource_file_sets_them_and_a_misspelling_is_named() -> None:
    ResourceConfig({"*": {"provider": "local", "backend_options": {"n_threads_batch": 1}}})
    with pytest.raises(ConfigError, match="n_threads_bach"):
        ResourceConfig({"*": {"provider": "local", "backend_options": {"n_threads_bach": 1}}})
