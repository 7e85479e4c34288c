"""A cold process's first call imports only what it uses (issue 27: cold start).

Each test runs a fresh Python process; the imports counted are those of the
threads on the first call's path (the script's and the event loop's).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from plait.testing import start_server_process

WATCH = """
import sys, threading

imported = {}


class Watch:
    def find_spec(self, name, path=None, target=None):
        imported.setdefault(threading.current_thread().name, []).append(name)


sys.meta_path.insert(0, Watch())
"""

# Loaded on use: a checkpointed batch, provider Batch APIs, response formats, streamed
# runs, JSON slots in templates, error sites, media and checkpoint hashes, callbacks'
# call ids, retry jitter, Retry-After dates, files (configuration, media). json and uuid
# are not listed: orjson, the http transport's body encoder, imports both when it loads.
UNUSED_BY_A_FIRST_CALL = (
    "plait.execution.checkpoint",
    "plait.execution.batch_api",
    "plait.execution.structured",
    "plait.streaming",
    "sysconfig",
    "pathlib",
    "hashlib",
    "random",
    "email.utils",
)


def test_a_first_call_of_a_text_program_imports_nothing_it_does_not_use():
    code = (
        WATCH
        + """
import plait
from plait import LLMInference, Module, ResourceConfig


class Revise(Module):
    def __init__(self):
        super().__init__()
        self.draft = LLMInference("llm", "Write a first draft.")
        self.revise = LLMInference("llm", "Improve the draft.")

    def forward(self, topic):
        return self.revise(self.draft(topic))


config = ResourceConfig(
    {"llm": {"provider": "openai", "base_url": sys.argv[1], "api_key": "k", "model": "m"}}
)
program = Revise().bind(resources=config)
# The host name is checked as the IDNA codec would, without loading it.
print("encodings.idna" in imported["MainThread"])
print(program("otters"))
on_path = imported["MainThread"] + imported.get("plait-loop", [])
print(sorted(set(on_path) & set(sys.argv[2:])))
"""
    )
    with start_server_process() as (_server, base_url):
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), base_url, *UNUSED_BY_A_FIRST_CALL],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["False", "echo: echo: otters", "[]"]


def test_import_plait_loads_neither_the_runtime_nor_error_formatting():
    code = "import sys, plait\nprint(sorted(m for m in sys.argv[1:] if m in sys.modules))\n"
    # traceback (and textwrap behind it) load when an error Value is made.
    later = ("traceback", "textwrap", "asyncio", "json", "logging", "pathlib", "hashlib")
    result = subprocess.run(
        [sys.executable, "-c", code, *later], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
