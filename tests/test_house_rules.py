"""Rules of the house, as checks: long code, and an import inside a function, say why.

A file over 800 lines, a function over 80 (its docstring not counted) or a class over 400
fails this test unless it carries a written reason: a comment ``# size: <why>`` among the
first 40 lines of the file, or on the lines just above the ``def`` / ``class`` (its
decorators may stand between). The reason is for the next reader: it says why the piece
is whole, or what splits it. The figures are the brief's.

An import inside a function hides an edge between modules from the reader of the file's
top, so it needs one of the reasons the brief allows, named in a comment on the import or
on the line just above its run of adjacent imports (one comment may explain a group):
``import time`` (a heavy or rarely needed module loaded on first use), ``optional extra``
(a dependency plait may run without), ``late-bound`` (an upward call listed in
ARCHITECTURE.md), or ``cycle`` (two modules that import each other; a debt to pay).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "plait"
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 400
REASON = "# size:"
IMPORT_REASON = re.compile(r"#.*\b(import time|optional extra|late-bound|cycle)\b")


@dataclass(frozen=True)
class Oversize:
    """One piece of code past its size, and where it is."""

    path: str
    what: str
    lines: int
    limit: int

    def __str__(self) -> str:
        return f"{self.path}: {self.what} has {self.lines} lines (limit {self.limit})"


def _docstring_lines(node: ast.AST) -> int:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr):
        value = body[0].value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return (body[0].end_lineno or body[0].lineno) - body[0].lineno + 1
    return 0


def _has_reason_above(
    lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
) -> bool:
    """Whether a ``# size:`` comment stands on the definition's line or just above it."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
    if any(REASON in line for line in lines[first : node.lineno]):
        return True
    index = first - 1
    while index >= 0 and lines[index].strip().startswith("#"):
        if REASON in lines[index]:
            return True
        index -= 1
    return False


def oversized(path: Path, root: Path = SRC.parent) -> list[Oversize]:
    """Returns what in one source file passes its size without a written reason."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    name = str(path.relative_to(root))
    found = []
    if len(lines) > MAX_FILE_LINES and not any(REASON in line for line in lines[:40]):
        found.append(Oversize(name, "the file", len(lines), MAX_FILE_LINES))
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1 - _docstring_lines(node)
        limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
        if length > limit and not _has_reason_above(lines, node):
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            found.append(Oversize(name, f"{kind} {node.name} (line {node.lineno})", length, limit))
    return found


def test_every_long_file_function_and_class_says_why() -> None:
    found = [o for path in sorted(SRC.rglob("*.py")) for o in oversized(path)]
    assert not found, (
        "split these, or write why they are whole in a '# size: <why>' comment "
        "(top of the file, or just above the def/class):\n" + "\n".join(map(str, found))
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n" + "    x = 1\n" * 81, ["function f (line 1) has 82 lines (limit 80)"]),
        ("def f():\n" + "    x = 1\n" * 79, []),
        ('def f():\n    """doc\n\n    more\n    """\n' + "    x = 1\n" * 79, []),
        ("# size: one state machine, read top to bottom\ndef f():\n" + "    x = 1\n" * 81, []),
        ("@staticmethod\n# size: whole\ndef f():\n" + "    x = 1\n" * 81, []),
        ("class C:\n" + "    x = 1\n" * 401, ["class C (line 1) has 402 lines (limit 400)"]),
    ],
)
def test_the_rule_itself(tmp_path: Path, source: str, expected: list[str]) -> None:
    """The check finds what it should, and takes a written reason."""
    path = tmp_path / "probe.py"
    path.write_text(source, encoding="utf-8")
    assert [str(o).split(": ", 1)[1] for o in oversized(path, tmp_path)] == expected


def unexplained_imports(path: Path, root: Path = SRC.parent) -> list[str]:
    """Returns ``path:line`` of each import inside a function that gives no reason."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    name = str(path.relative_to(root))
    found: list[str] = []

    def explained(node: ast.stmt, run_start: int) -> bool:
        own = lines[node.lineno - 1 : node.end_lineno]
        above = lines[run_start - 2].strip() if run_start > 1 else ""
        return any(IMPORT_REASON.search(line) for line in own) or (
            above.startswith("#") and IMPORT_REASON.search(above) is not None
        )

    def visit(node: ast.AST, in_function: bool) -> None:
        for field in ("body", "orelse", "finalbody", "handlers"):
            statements = getattr(node, field, None)
            if not isinstance(statements, list):
                continue
            run_start = end = 0
            for statement in statements:
                if not isinstance(statement, ast.Import | ast.ImportFrom):
                    run_start = 0
                    continue
                if not run_start or statement.lineno != end + 1:
                    run_start = statement.lineno
                end = statement.end_lineno or statement.lineno
                if in_function and not explained(statement, run_start):
                    found.append(f"{name}:{statement.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(ast.parse(text), False)
    return found


def test_every_import_inside_a_function_says_why() -> None:
    found = [line for path in sorted(SRC.rglob("*.py")) for line in unexplained_imports(path)]
    assert not found, (
        "import these at the top of the file, or say why not in a comment on the import "
        "(or just above its group): 'import time: ...', 'optional extra (plait[...])', "
        "'late-bound upward call (ARCHITECTURE.md)' or 'cycle: ...':\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import json\ndef f():\n    return json\n", []),
        ("def f():\n    import json\n", ["probe.py:2"]),
        ("def f():\n    import json  # the parser\n", ["probe.py:2"]),
        ("def f():\n    import json  # import time: only an error needs it\n", []),
        ("def f():\n    # optional extra (plait[yaml])\n    import yaml\n    import json\n", []),
        (
            "def f():\n    # optional extra (plait[yaml])\n    import yaml\n\n    import json\n",
            ["probe.py:5"],
        ),
        ("class C:\n    def m(self):\n        if self:\n            import json\n", ["probe.py:4"]),
        (
            "def f():\n    try:\n        import pg  # optional extra\n    finally:\n        pass\n",
            [],
        ),
        ("def f():\n    from a import (  # cycle: a imports this module\n        b,\n    )\n", []),
    ],
)
def test_the_import_rule_itself(tmp_path: Path, source: str, expected: list[str]) -> None:
    """The check finds an import inside a function without a reason, and takes one given."""
    path = tmp_path / "probe.py"
    path.write_text(source, encoding="utf-8")
    assert unexplained_imports(path, tmp_path) == expected
