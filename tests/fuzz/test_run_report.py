"""Run reports read back from ``run.json``: `RunReport.load` and ``plait report``.

A real run (loopback server, one failed item) writes the valid report; each
input edits it. Loading gives a report or the ``ValueError`` `RunReport.load`
documents, and a loaded report gives its summary and trace; ``plait report``
draws it or exits 2 with one ``plait: error:`` line, never a traceback.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import example, given
from hypothesis import strategies as st

from plait import LLMInference, Module, run
from plait.cli.app import cli
from plait.errors import PlaitError
from plait.report import RunReport
from plait.testing import ScriptedServer

from .support import documents, fuzz, json_text, outcome


class TwoSteps(Module):
    def __init__(self) -> None:
        super().__init__()
        self.draft = LLMInference("llm", "Draft.")
        self.polish = LLMInference("llm", "Polish.")

    def forward(self, text: str) -> str:
        return self.polish(f"polish: {self.draft(text)}")


def refuse_bad(body: dict[str, Any]) -> str:
    text = body["messages"][-1]["content"]
    if "bad" in text:
        raise ValueError("no bad rows here")
    return f"echo: {text}"


async def a_real_report() -> dict[str, Any]:
    async with ScriptedServer(responder=refuse_bad) as server:
        config = {"llm": server.endpoint(max_retries=0)}
        _, report = await run(
            TwoSteps(), ["a b", "bad", "c"], resources=config, report=True, on_error="collect"
        )
    return report.to_dict()


@pytest.fixture(scope="module")
def valid() -> dict[str, Any]:
    return asyncio.run(a_real_report())


@pytest.fixture
def write(tmp_path: Path) -> Iterator[Any]:
    counter = itertools.count()

    def to_file(content: bytes) -> Path:
        path = tmp_path / f"{next(counter)}.run.json"
        path.write_bytes(content)
        return path

    yield to_file


def read(path: Path) -> RunReport:
    """Loads a report and reads it as the terminal summary and the trace do."""
    report = RunReport.load(path)
    report.summary()
    report.trace_events()
    return report


READ_ERRORS = (PlaitError, ValueError)
"""What `RunReport.load` documents: a ValueError naming the file and why."""

ITEMS_AS_TEXT = b'{"format": "plait.run/1", "items": "all"}'
"""A report whose ``items`` is text: the summary indexed into it (TypeError)."""


@fuzz(300)
@given(data=st.data())
@example(data=None)
def test_any_run_json_loads_to_a_report_or_a_value_error(
    valid: dict[str, Any], write: Any, data: st.DataObject | None
) -> None:
    content = ITEMS_AS_TEXT if data is None else data.draw(documents(valid), label="run.json")
    outcome("run.json", lambda: read(write(content)), allowed=READ_ERRORS)


@fuzz(15)
@given(data=st.data())
@example(data=None)
def test_plait_report_draws_any_run_json_or_exits_with_a_usage_error(
    valid: dict[str, Any], write: Any, tmp_path: Path, data: st.DataObject | None
) -> None:
    content = ITEMS_AS_TEXT if data is None else data.draw(documents(valid), label="run.json")
    path = write(content)
    page = tmp_path / "report.html"
    result = outcome(
        "plait report",
        lambda: CliRunner().invoke(cli, ["report", str(path), "-o", str(page)]),
    )
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    if result.exit_code == 2:
        assert result.stderr.startswith("plait: error: "), result.stderr


def test_the_valid_report_draws(valid: dict[str, Any], write: Any, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["report", str(write(json_text(valid))), "-o", str(page)])
    assert result.exit_code == 0, result.output
    assert page.stat().st_size > 0
