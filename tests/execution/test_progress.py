"""The batch progress bar: on stderr when asked for, absent (and rich unloaded) otherwise."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from plait import run
from plait.execution.progress import BatchProgress

from .support import Ask, refuse_marker


def test_progress_counts_done_and_failed_on_stderr(capsys):
    with BatchProgress(3, True) as progress:
        progress.advance(True)
        progress.advance(False)
        progress.advance(True)

    assert (progress.done, progress.failed) == (3, 1)
    captured = capsys.readouterr()
    assert "3/3" in captured.err and "1 failed" in captured.err
    assert captured.out == ""  # stdout belongs to the program


def test_progress_is_off_when_stderr_is_not_a_terminal(capsys):
    with BatchProgress(10, None) as progress:  # pytest captures stderr: not a terminal
        progress.advance(True)

    assert not progress.enabled and progress.done == 1
    assert capsys.readouterr().err == ""


async def test_a_batch_with_progress_shows_the_bar(server, manager, capsys):
    server.responder = refuse_marker("bad")

    outs = await run(Ask(), ["a", "bad", "c"], resources=manager, progress=True, on_error="collect")

    assert outs[0] == "echo: a" and isinstance(outs[1], Exception)
    err = capsys.readouterr().err
    assert "3/3" in err and "1 failed" in err


def test_a_batch_without_progress_never_imports_rich():
    script = textwrap.dedent(
        """
        import sys
        from plait import Module, ResourceConfig, run
        import asyncio

        class Shout(Module):
            def forward(self, text):
                return text.upper()

        config = ResourceConfig({"*": {"provider": "local"}})
        print(asyncio.run(run(Shout(), ["a", "b"], resources=config, progress=False)))
        print("rich" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split("\n")[:2] == ["['A', 'B']", "False"]
