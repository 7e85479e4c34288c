"""run_sync with a configuration built for every call leaks no client sessions.

A notebook builds a dict (or a new ResourceConfig) per cell; each call used
to create a manager on the background loop that nobody closed, so the
process printed "Unclosed client session" and, under ``-X dev``,
"Non-thread-safe operation" errors as the sessions were collected elsewhere.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from plait.testing import start_server_process

SCRIPT = textwrap.dedent(
    """
    import gc, sys
    from plait import LLMInference, ResourceConfig

    base_url = sys.argv[1]
    program = LLMInference("llm")
    for i in range(30):
        settings = {"llm": {"provider": "openai", "model": "m", "base_url": base_url}}
        program.bind(settings if i % 2 else ResourceConfig(settings))
        assert program.run_sync(f"hi {i}") == f"echo: hi {i}"
        gc.collect()
    print("finished")
    """
)


def test_thirty_calls_with_a_config_per_call_leave_no_unclosed_session() -> None:
    with start_server_process() as (_server, base_url):
        done = subprocess.run(
            [sys.executable, "-X", "dev", "-c", SCRIPT, base_url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "finished"
    assert "Unclosed" not in done.stderr
    assert "Non-thread-safe" not in done.stderr
    assert "Traceback" not in done.stderr


def test_exiting_after_a_synchronous_call_freezes_the_collector_once_sessions_are_closed() -> None:
    # Registered before plait's own exit handler, so it runs after it (atexit is LIFO).
    script = textwrap.dedent(
        """
        import atexit, gc, sys
        atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0))
        from plait import LLMInference

        program = LLMInference("llm").bind(
            {"llm": {"provider": "openai", "model": "m", "base_url": sys.argv[1]}}
        )
        print(program.run_sync("hi"), gc.get_freeze_count())
        """
    )
    with start_server_process() as (_server, base_url):
        done = subprocess.run(
            [sys.executable, "-X", "dev", "-c", script, base_url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["echo: hi 0", "frozen True"]
    assert "Unclosed" not in done.stderr
