"""What the command line names: the program, its metric, and how rows become its arguments.

Only code named on the command line runs: ``pkg.module:Program`` (or
``path/to/file.py:Program``) and ``--metric pkg.module:function``. Nothing read
from a data file, a resources file or a checkpoint chooses code.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from plait.module import Module

__all__ = ["Columns", "ProgramError", "arguments_of", "load_metric", "load_object", "load_program"]


class ProgramError(Exception):
    """The program, metric or column mapping named on the command line cannot be used."""


def load_object(spec: str, what: str = "program") -> Any:
    """Returns the object ``spec`` names: ``pkg.module:attr`` or ``file.py:attr``.

    The current directory is importable, as with ``python -m``.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ProgramError(
            f"{what} {spec!r} must look like pkg.module:Name or path/to/file.py:Name"
        )
    if module_name.endswith(".py"):
        module = _import_file(Path(module_name), what)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                raise ProgramError(
                    f"{what} {spec!r}: no module named {exc.name!r} (run from the directory "
                    "that holds it, or install its package)"
                ) from None
            raise
    obj = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ProgramError(f"{what} {spec!r}: {module_name} has no {attribute!r}") from None
    return obj


def _import_file(path: Path, what: str) -> Any:
    if not path.is_file():
        raise ProgramError(f"{what} file {path} does not exist")
    name = f"_plait_cli_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProgramError(f"{what} file {path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_program(spec: str) -> Module:
    """Returns the `Module` ``spec`` names: a Module class (built with no arguments),
    a Module instance, or a function that returns one."""
    obj = load_object(spec)
    if isinstance(obj, Module):
        return obj
    if callable(obj):
        try:
            built = obj()
        except TypeError as exc:
            raise ProgramError(
                f"program {spec!r} could not be built with no arguments ({exc}); name a "
                "function that builds it, e.g. pkg.module:make_program"
            ) from None
        if isinstance(built, Module):
            return built
        obj = built
    raise ProgramError(
        f"program {spec!r} is a {type(obj).__name__}, not a plait Module, a Module class or "
        "a function returning one"
    )


def load_metric(spec: str) -> Callable[[Any, Any], Any]:
    """Returns a metric: ``exact_match``, ``contains``, or ``pkg.module:function``."""
    from plait.evaluation import exact_match

    builtin = {"exact_match": exact_match, "contains": contains}
    if spec in builtin:
        return builtin[spec]
    metric = load_object(spec, "metric")
    if not callable(metric):
        raise ProgramError(f"metric {spec!r} is not callable")
    return metric


def contains(output: Any, target: Any) -> bool:
    """Whether the target text appears in the output, ignoring case."""
    return str(target).strip().lower() in str(output).lower()


def arguments_of(program: Module) -> tuple[list[str], list[str]]:
    """Returns the names of ``forward``'s parameters: (all, required)."""
    signature = inspect.signature(program.forward)
    names, required = [], []
    for name, parameter in signature.parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        names.append(name)
        if parameter.default is parameter.empty:
            required.append(name)
    return names, required


class Columns(Module):
    """Calls a program with the columns of a row as keyword arguments of its ``forward``.

    Used when ``forward`` takes more than one argument; a batch item is then
    the row (a dict), which traces as one input per column.
    """

    def __init__(self, program: Module, names: Sequence[str]) -> None:
        super().__init__()
        self.program = program
        self.names = list(names)

    def forward(self, row: Mapping[str, Any]) -> Any:
        return self.program(**{name: row[name] for name in self.names if name in row})


class RowMapper:
    """Turns rows into batch items for a program, by column name.

    Args:
        program: the program.
        rename: ``{argument: column}`` for arguments whose column has another name.
    """

    def __init__(self, program: Module, rename: Mapping[str, str] | None = None) -> None:
        self.names, self.required = arguments_of(program)
        self.rename = dict(rename or {})
        unknown = [name for name in self.rename if name not in self.names]
        if unknown:
            raise ProgramError(
                f"--column {unknown[0]}=...: {type(program).__name__}.forward has no argument "
                f"{unknown[0]!r}; its arguments: {', '.join(self.names) or '(none)'}"
            )
        if not self.names:
            raise ProgramError(
                f"{type(program).__name__}.forward takes no arguments, so rows have nothing to fill"
            )
        self.single = len(self.names) == 1
        self.module = program if self.single else Columns(program, self.names)

    def column(self, name: str) -> str:
        return self.rename.get(name, name)

    def item(self, row_number: int, row: Mapping[str, Any], source: str) -> Any:
        """Returns the batch item of a row.

        Raises:
            ProgramError: a required argument has no column; names the row.
        """
        missing = [n for n in self.required if row.get(self.column(n)) is None]
        if missing:
            name = missing[0]
            if self.column(name) in row:  # columnar data (Parquet, Ray) has null, not absent
                raise ProgramError(
                    f"{source}: row {row_number} has null in column {self.column(name)!r}, "
                    f"which fills the required argument {name!r}"
                )
            raise ProgramError(
                f"{source}: row {row_number} has no column {self.column(name)!r} for argument "
                f"{name!r} of forward({', '.join(self.names)}); its columns: "
                f"{', '.join(map(str, row)) or '(none)'}. Rename with --column {name}=COLUMN"
            )
        if self.single:
            return row[self.column(self.names[0])]
        return {n: row[self.column(n)] for n in self.names if self.column(n) in row}
