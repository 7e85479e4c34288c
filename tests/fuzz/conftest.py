"""Prints how many inputs each parser was given, at the end of a session that ran fuzz tests."""

from __future__ import annotations

import pytest

from .support import TRIED, is_long_run


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not TRIED:
        return
    run = "deep run" if is_long_run() else "default run"
    terminalreporter.section(f"fuzz: inputs tried per parser ({run})")
    width = max(len(name) for name in TRIED)
    for name, count in sorted(TRIED.items()):
        terminalreporter.write_line(f"{name:<{width}}  {count:>7,}")
