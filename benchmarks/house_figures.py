"""The house figures of a plait tree (issue 35's "Done when"), printed as markdown.

``python benchmarks/house_figures.py [TREE ...]`` reads ``TREE/src/plait`` and
``TREE/ARCHITECTURE.md`` (TREE defaults to this checkout; give two trees, e.g. a
``git worktree`` of an older commit and this one, for a before/after table) and prints:

* file sizes: lines in ``src/plait``, the files over 800 lines, the largest ten;
* the ten longest functions, counted as ``tests/test_house_rules.py`` counts them
  (the docstring not counted);
* radon's fifteen worst functions and methods by cyclomatic complexity, when radon can
  run: imported here, or the ``radon`` command (``--radon PATH``, else on ``PATH``);
  otherwise the table says it is missing (``python3 -m venv /tmp/radon-venv &&
  /tmp/radon-venv/bin/pip install radon`` then ``--radon /tmp/radon-venv/bin/radon``);
* import statements inside functions (``from __future__`` not counted);
* the largest import cycle (strongly connected set of modules), with the edges that
  imports inside functions add and without them. An edge goes to the module an
  import names (``from plait import _files`` to ``plait._files``; a name that is not a
  module, to the module holding it); imports under ``if TYPE_CHECKING:`` make none;
* ARCHITECTURE.md's length in characters.

Only the standard library (``ast``) reads the code, so any Python 3.11 runs it.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MAX_FILE_LINES = 800


@dataclass
class Figures:
    """What one tree measures."""

    tree: str
    lines: int = 0
    files: int = 0
    over_800: list[tuple[str, int]] = field(default_factory=list)
    largest: list[tuple[str, int]] = field(default_factory=list)
    longest_functions: list[tuple[str, int]] = field(default_factory=list)
    worst_complexity: list[tuple[str, int]] | None = None
    function_imports: int = 0
    function_edges: int = 0
    cycle_all: list[str] = field(default_factory=list)
    cycle_top: list[str] = field(default_factory=list)
    architecture_chars: int | None = None


def _modules(src: Path) -> dict[str, Path]:
    found = {}
    for path in sorted((src / "plait").rglob("*.py")):
        name = ".".join(path.relative_to(src).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _docstring_lines(node: ast.AST) -> int:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr):
        value = body[0].value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return (body[0].end_lineno or body[0].lineno) - body[0].lineno + 1
    return 0


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Yields each import and whether it sits inside a function; skips TYPE_CHECKING blocks."""

    def visit(
        node: ast.AST, in_function: bool
    ) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for statement in child.orelse:
                    yield from visit_one(statement, in_function)
                continue
            yield from visit_one(child, in_function)

    def visit_one(
        node: ast.AST, in_function: bool
    ) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        if isinstance(node, ast.Import | ast.ImportFrom):
            if not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
                yield node, in_function
            return
        yield from visit(
            node, in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        )

    yield from visit(tree, False)


def _targets(
    module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]
) -> set[str]:
    def owner(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        return ".".join(parts) or None

    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")[: None if is_package else -1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        names = [
            f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
            for alias in node.names
        ]
    return {target for name in names if (target := owner(name)) and target != module}


def _largest_cycle(edges: dict[str, set[str]]) -> list[str]:
    """Tarjan's strongly connected components, iteratively; returns the largest cycle.

    A module alone is a cycle only when it imports itself, which `_targets` leaves out;
    so no set of two or more modules importing each other gives an empty list.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    best: list[str] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > max(len(best), 1):
                    best = sorted(component)
    return best


def _radon_command(given: str | None) -> list[str] | None:
    if given:
        return [given]
    if importlib.util.find_spec("radon") is not None:
        return [sys.executable, "-m", "radon"]
    found = shutil.which("radon")
    return [found] if found else None


def _worst_complexity(command: list[str], package: Path, root: Path) -> list[tuple[str, int]]:
    out = subprocess.run(
        [*command, "cc", "-j", str(package)], capture_output=True, text=True, check=True
    )
    blocks = []
    for path, entries in json.loads(out.stdout).items():
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("type") == "class":
                continue  # a class's figure is its methods'; they are listed themselves
            name = (
                f"{entry['classname']}.{entry['name']}" if entry.get("classname") else entry["name"]
            )
            where = f"{Path(path).relative_to(root)}:{entry['lineno']} {name}"
            blocks.append((where, int(entry["complexity"])))
    return sorted(blocks, key=lambda block: (-block[1], block[0]))[:15]


def measure(tree: Path, radon: list[str] | None) -> Figures:
    """Reads one tree and returns its figures."""
    src = tree / "src"
    modules = _modules(src)
    known = set(modules)
    figures = Figures(str(tree))
    sizes = []
    functions = []
    edges_all: dict[str, set[str]] = {name: set() for name in modules}
    edges_top: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        text = path.read_text(encoding="utf-8")
        rel = str(path.relative_to(src))
        count = len(text.splitlines())
        sizes.append((rel, count))
        figures.lines += count
        parsed = ast.parse(text)
        for node in ast.walk(parsed):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1 - _docstring_lines(node)
                functions.append((f"{rel}:{node.lineno} {node.name}", length))
        for node, in_function in _imports(parsed):
            targets = _targets(name, path.name == "__init__.py", node, known)
            edges_all[name] |= targets
            if in_function:
                figures.function_imports += 1
            else:
                edges_top[name] |= targets
    figures.files = len(sizes)
    sizes.sort(key=lambda item: (-item[1], item[0]))
    figures.over_800 = [item for item in sizes if item[1] > MAX_FILE_LINES]
    figures.largest = sizes[:10]
    figures.longest_functions = sorted(functions, key=lambda item: (-item[1], item[0]))[:10]
    figures.function_edges = sum(len(edges_all[name] - edges_top[name]) for name in modules)
    figures.cycle_all = _largest_cycle(edges_all)
    figures.cycle_top = _largest_cycle(edges_top)
    if radon is not None:
        figures.worst_complexity = _worst_complexity(radon, src / "plait", src)
    architecture = tree / "ARCHITECTURE.md"
    if architecture.exists():
        figures.architecture_chars = len(architecture.read_text(encoding="utf-8"))
    return figures


def _listing(items: list[tuple[str, int]]) -> str:
    return "<br>".join(f"{figure} `{where}`" for where, figure in items) or "none"


def table(all_figures: list[Figures]) -> str:
    """The figures of each tree side by side, one row per figure."""
    rows = [
        ("lines in src/plait (files)", [f"{f.lines:,} ({f.files})" for f in all_figures]),
        ("files over 800 lines", [f"{len(f.over_800)}" for f in all_figures]),
        ("largest 10 files (lines)", [_listing(f.largest) for f in all_figures]),
        (
            "longest 10 functions (lines, docstring excluded)",
            [_listing(f.longest_functions) for f in all_figures],
        ),
        (
            "radon: worst 15 by cyclomatic complexity",
            [
                _listing(f.worst_complexity) if f.worst_complexity is not None else "radon missing"
                for f in all_figures
            ],
        ),
        ("import statements inside functions", [str(f.function_imports) for f in all_figures]),
        (
            "module-to-module edges only those imports make",
            [str(f.function_edges) for f in all_figures],
        ),
        (
            "largest import cycle, all imports (modules)",
            [str(len(f.cycle_all)) for f in all_figures],
        ),
        (
            "largest import cycle, module-level imports only",
            [str(len(f.cycle_top)) for f in all_figures],
        ),
        (
            "ARCHITECTURE.md (characters)",
            [
                f"{f.architecture_chars:,}" if f.architecture_chars is not None else "none"
                for f in all_figures
            ],
        ),
    ]
    lines = [
        "| figure | " + " | ".join(f.tree for f in all_figures) + " |",
        "|---|" + "---|" * len(all_figures),
    ]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", default=[str(Path(__file__).resolve().parents[1])])
    parser.add_argument(
        "--radon", help="the radon command (default: radon importable here, or on PATH)"
    )
    parser.add_argument(
        "--cycles", action="store_true", help="also list the modules of each largest cycle"
    )
    args = parser.parse_args(argv)
    radon = _radon_command(args.radon)
    all_figures = [measure(Path(tree), radon) for tree in args.trees]
    print(table(all_figures))
    if args.cycles:
        for figures in all_figures:
            for label, cycle in (
                ("all imports", figures.cycle_all),
                ("module level", figures.cycle_top),
            ):
                print(f"\n{figures.tree}: largest cycle, {label}: {', '.join(cycle) or 'none'}")


if __name__ == "__main__":
    main()
