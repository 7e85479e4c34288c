"""Gives deep runs room, and prints how many inputs each parser was given at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from .support import TRIED, is_long_run

DEEP_RUN_TIMEOUT = 3600
"""Seconds a fuzz test may take in a deep run (50 times the inputs; the suite allows 300)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not is_long_run():
        return
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.timeout(DEEP_RUN_TIMEOUT))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TRIED:
        return
    run = "deep run" if is_long_run() else "default run"
    terminalreporter.section(f"fuzz: inputs tried per parser ({run})")
    width = max(len(name) for name in TRIED)
    for name, count in sorted(TRIED.items()):
        terminalreporter.write_line(f"{name:<{width}}  {count:>7,}")
