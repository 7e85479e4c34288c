"""The porting pages claim only what a test shows, and name only files that exist.

`docs/how-to/porting.md` says, row by row, which names of the seeds work in plait; a row
that says something works names the test files that show it. These checks keep
the page from drifting: a renamed or deleted test file, a row claiming to work
with no test named, or a path into someone's machine fail here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "docs" / "how-to" / "porting.md", ROOT / "docs" / "how-to" / "coming_from_dspy.md"]
REPO_PATH = re.compile(r"`((?:tests|docs|examples|src)/[\w./-]+)`")
TEST_FILE = re.compile(r"`(tests/[\w/]+\.py)`")


def table_rows(text: str) -> list[str]:
    """Returns the body rows of the page's tables (not the header or its rule)."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [row for row in rows if not row.startswith(("| seed |", "| you write |"))]


def claim_of(row: str) -> str:
    """Returns what a row says plait does: the cells after the first."""
    return "|".join(row.split(" | ")[1:])


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_file_a_page_names_is_in_the_repository(page: Path) -> None:
    missing = sorted({p for p in REPO_PATH.findall(page.read_text()) if not (ROOT / p).exists()})
    assert not missing, f"{page.name} names files that are not in the repository: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_a_page_points_nowhere_outside_the_repository(page: Path) -> None:
    text = page.read_text()
    assert "/work/" not in text and "SPEC" not in text  # design documents are not shipped


def test_every_row_of_porting_that_says_it_works_names_its_tests() -> None:
    rows = table_rows((ROOT / "docs" / "how-to" / "porting.md").read_text())
    assert len(rows) > 60  # the tables were read
    unbacked = [row[:100] for row in rows if "works" in claim_of(row) and not TEST_FILE.search(row)]
    assert not unbacked, "rows that say they work without naming a test:\n" + "\n".join(unbacked)


def test_porting_says_nothing_that_ships_is_not_there_yet() -> None:
    text = (ROOT / "docs" / "how-to" / "porting.md").read_text().lower()
    assert "not yet" not in text and "does not exist" not in text
