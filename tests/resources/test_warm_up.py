"""The warm-up: a configuration with an OpenAI-compatible endpoint imports its backend on a thread.

Each test runs a fresh Python process: in this one the backend was imported long ago.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plait.testing import fetch_stats, start_server_process

PROGRAM = """
import sys, threading
import plait
from plait import LLMInference, Module, ResourceConfig
from plait.backends import _imports


class Revise(Module):
    def __init__(self):
        super().__init__()
        self.draft = LLMInference("llm", "Write a first draft.")
        self.revise = LLMInference("llm", "Improve the draft.")

    def forward(self, topic):
        return self.revise(self.draft(topic))


config = ResourceConfig(
    {"llm": {"provider": "openai", "base_url": sys.argv[1], "api_key": "k", "model": "m",
             "max_retries": 0}}
)
program = Revise().bind(resources=config)
"""


def run_python(code: str, *args: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a new interpreter (``path`` first on its PYTHONPATH); it must not hang."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_a_config_with_an_openai_endpoint_imports_its_backend_on_a_thread_that_then_ends():
    code = """
        import sys, threading
        import plait
        from plait.backends import _imports
        assert "httptools" not in sys.modules, "import plait imported httptools"
        from plait import ResourceConfig
        ResourceConfig({"*": {"provider": "local"}})
        ResourceConfig({"m": {"provider": "openai", "model": "m", "transport": "sdk"}})
        assert _imports.current() is None, "a warm-up started for endpoints that need none"
        ResourceConfig({"llm": {"provider": "openai", "model": "m", "api_key": "k"}})
        warm_up = _imports.current()
        assert warm_up is not None and warm_up.thread.name == "plait-warm-up"
        assert warm_up.modules == ("plait.backends.openai", "httptools"), warm_up.modules
        assert warm_up.join(60)
        warm_up.thread.join(60)
        assert warm_up.error is None, warm_up.error
        assert _imports.is_imported("httptools") and "plait.backends.openai" in sys.modules
        assert not warm_up.thread.is_alive()
        ResourceConfig({"other": {"provider": "openai", "model": "m", "api_key": "k"}})
        assert _imports.current() is warm_up, "a second warm-up started"
        names = [t.name for t in threading.enumerate() if t.name.startswith("plait")]
        assert names == [], names
        print("ok")
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_cold_process_calls_without_importing_aiohttp_and_leaves_no_thread():
    code = (
        PROGRAM
        + """
print(program("otters"))
for thread in threading.enumerate():
    if thread.name == "plait-warm-up":
        thread.join(60)
        assert not thread.is_alive(), thread.name
print(_imports.current().error, "aiohttp" in sys.modules)
print(program("again"))
"""
    )
    with start_server_process(latency=0.2, keep_log=True) as (_server, base_url):
        result = run_python(code, base_url)
        log = fetch_stats(base_url, include_log=True)["log"]
    assert result.returncode == 0, result.stderr
    expected = ["echo: echo: otters", "None False", "echo: echo: again"]
    assert result.stdout.split("\n")[:3] == expected
    agents = {record["headers"]["user-agent"] for record in log}
    assert all(agent.endswith(" plait") for agent in agents), agents


def test_a_broken_httptools_fails_the_first_call_with_the_fix_instead_of_hanging(tmp_path: Path):
    broken = tmp_path / "httptools"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        'raise ImportError("this httptools is broken for the test")\n'
    )
    code = (
        PROGRAM
        + """
assert _imports.current().join(60)
print(type(_imports.current().error).__name__)
try:
    program("otters")
except Exception as exc:
    print(type(exc).__name__, exc)
"""
    )
    with start_server_process() as (_server, base_url):
        result = run_python(code, base_url, path=tmp_path)
    assert result.returncode == 0, result.stderr
    first, failure = result.stdout.strip().split("\n", 1)
    assert first == "ImportError"
    assert "http transport needs httptools" in failure
    assert "this httptools is broken for the test" in failure
    assert "pip install --force-reinstall httptools" in failure


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_waits_for_the_imports_so_the_child_can_import_httptools():
    code = """
        import os, sys
        from plait import ResourceConfig
        from plait.backends import _imports
        ResourceConfig({"llm": {"provider": "openai", "model": "m", "api_key": "k"}})
        pid = os.fork()
        if pid == 0:
            import httptools
            os._exit(0 if httptools.HttpResponseParser else 1)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), _imports.current().done)
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "True"]


def test_exiting_waits_for_the_imports_so_none_runs_while_the_interpreter_tears_down(
    tmp_path: Path,
):
    # An import still running when the script ends may be inside C code without the GIL
    # (aiohttp loading CA certificates) while the exit frees what that code uses: a
    # segmentation fault. The exit waits for the imports, as a fork does.
    (tmp_path / "slow_to_import.py").write_text(
        "import time\ntime.sleep(0.5)\nprint('imported', flush=True)\n"
    )
    code = """
        from plait.backends import _imports
        assert _imports.import_in_background(["slow_to_import"]) is not None
        print("exiting", flush=True)
    """
    result = run_python(code, path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["exiting", "imported"]
