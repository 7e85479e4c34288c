"""The ``plait`` command line: run, eval, train, graph and report over data files.

``main`` is the console script (and ``python -m plait``). It imports click
and the rest of plait only when called, so ``import plait`` never pays for it.

Exit codes scripts can rely on:

* 0 — every row succeeded (``eval``: and the score met ``--fail-under``);
* 1 — the run finished but some rows failed (their ``error`` column says why);
* 2 — bad usage, found before any model call and told on one line,
  ``plait: error: <what>; <what to do>``: arguments, a program that cannot be
  imported, built or traced, parameters, resources or aliases, columns, an
  unreadable file, a file to write with no folder;
* 3 — the run stopped early (checkpoint of another run, budget spent, a file
  that could not be written); rows already written and checkpointed stay;
* 4 — ``eval`` finished but its score is below ``--fail-under``;
* 130 — stopped by Ctrl-C, 143 — stopped by SIGTERM: requests in flight were
  cancelled and finished rows kept (``train``: its report written and the best
  parameters validated so far saved); with ``--checkpoint-dir``, rerunning the
  same command resumes (a second signal during the stop quits at once).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "EXIT_ABORTED",
    "EXIT_BELOW_THRESHOLD",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_ROWS_FAILED",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "main",
]

EXIT_OK = 0
EXIT_ROWS_FAILED = 1
EXIT_USAGE = 2
EXIT_ABORTED = 3
EXIT_BELOW_THRESHOLD = 4
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


def main(argv: Sequence[str] | None = None) -> None:
    """Runs the ``plait`` command line (exits with one of the codes above)."""
    from plait.cli.app import cli  # import time: `import plait.cli` loads no command

    cli.main(args=list(argv) if argv is not None else None, prog_name="plait")
