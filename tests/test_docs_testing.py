"""Every python block of docs/testing.md runs as written: the page's examples are its tests.

The blocks run in order in one namespace, as the page says (a later block uses the
signature an earlier one defines). Each block's own asserts are the checks.
"""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).parents[1] / "docs" / "testing.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_every_python_block_of_the_testing_page_runs() -> None:
    blocks = BLOCK.findall(PAGE.read_text())
    assert len(blocks) >= 7  # the page was read: one block per section
    namespace: dict[str, object] = {"__name__": "docs_testing"}
    for number, block in enumerate(blocks, 1):
        code = compile(block, f"{PAGE.name} block {number}", "exec", dont_inherit=True)
        exec(code, namespace)  # the page's own code, from the repository


def test_the_readme_links_the_testing_page() -> None:
    assert "docs/testing.md" in (PAGE.parents[1] / "README.md").read_text()
