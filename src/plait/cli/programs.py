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
from typing import Any, NamedTuple

from plait.module import Module

__all__ = [
    "Columns",
    "Inputs",
    "ProgramError",
    "inputs_of",
    "load_metric",
    "load_object",
    "load_program",
]


class ProgramError(Exception):
    """The program, metric or column mapping named on the command line cannot be used."""


def load_object(spec: str, what: str = "program") -> Any:
    """Returns the object ``spec`` names: ``pkg.module:attr`` or ``file.py:attr``.

    The current directory is importable, as with ``python -m``; so is the folder
    of a ``file.py``, as with ``python file.py``, so it can import its siblings.
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
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
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


class Inputs(NamedTuple):
    """What a program takes from each row."""

    names: list[str]
    """Every input, in order."""
    required: list[str]
    """The inputs a row must fill."""
    owner: str
    """What declares them, for messages: ``Answer.forward(question, context)`` or
    ``Predict(text -> answer)``."""


def inputs_of(program: Module) -> Inputs:
    """Returns the program's inputs, which columns fill.

    They are ``forward``'s named parameters, unless ``forward`` takes ``**inputs``:
    then a module driven by a `Signature` (`Predict`, `ChainOfThought`, `ReAct` …)
    takes the signature's input fields, all required (its ``history=`` keyword is not
    an input), and a module that wraps another (`BestOfN`, `Refine`,
    `ValidateAndRepair`) takes the inputs of the module it wraps.
    """
    from plait.signatures import Signature  # pydantic: only once a program is named

    parameters = inspect.signature(program.forward).parameters.values()
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
        signature = getattr(program, "signature", None)
        if isinstance(signature, type) and issubclass(signature, Signature):
            names = list(signature.input_fields)
            owner = f"{type(program).__name__}({signature.signature_text()})"
            return Inputs(names, names, owner)
        wrapped = getattr(program, "module", None)
        if isinstance(wrapped, Module):
            return inputs_of(wrapped)
    names, required = [], []
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        names.append(parameter.name)
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    return Inputs(names, required, f"{type(program).__name__}.forward({', '.join(names)})")


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
        rename: ``{input: column}`` for inputs whose column has another name.
    """

    def __init__(self, program: Module, rename: Mapping[str, str] | None = None) -> None:
        self.names, self.required, owner = self.inputs = inputs_of(program)
        self.rename = dict(rename or {})
        unknown = [name for name in self.rename if name not in self.names]
        if unknown:
            raise ProgramError(
                f"--column {unknown[0]}=...: {owner} has no input {unknown[0]!r}; its inputs: "
                f"{', '.join(self.names) or '(none)'}"
            )
        if not self.names:
            raise ProgramError(f"{owner} takes no inputs, so rows have nothing to fill")
        self.single = len(self.names) == 1
        self.module = program if self.single else Columns(program, self.names)

    def column(self, name: str) -> str:
        return self.rename.get(name, name)

    def item(self, row_number: int, row: Mapping[str, Any], source: str) -> Any:
        """Returns the batch item of a row.

        Raises:
            ProgramError: a required input has no column; names the row.
        """
        missing = [n for n in self.required if row.get(self.column(n)) is None]
        if missing:
            name = missing[0]
            if self.column(name) in row:  # columnar data (Parquet, Ray) has null, not absent
                raise ProgramError(
                    f"{source}: row {row_number} has null in column {self.column(name)!r}, "
                    f"which fills the required input {name!r}"
                )
            raise ProgramError(
                f"{source}: row {row_number} has no column {self.column(name)!r} for the input "
                f"{name!r} of {self.inputs.owner}; its columns: "
                f"{', '.join(map(str, row)) or '(none)'}. Rename with --column {name}=COLUMN"
            )
        if self.single:
            return row[self.column(self.names[0])]
        return {n: row[self.column(n)] for n in self.names if self.column(n) in row}
