"""What the command line names: the program, its metric, and how rows become its arguments.

Only code named on the command line runs: ``pkg.module:Program`` (or
``path/to/file.py:Program``) and ``--metric pkg.module:function``. Nothing read
from a data file, a resources file or a checkpoint chooses code.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from plait.errors import PlaitError, TracingError
from plait.module import LLMInference, Module

__all__ = [
    "Columns",
    "Inputs",
    "ProgramError",
    "describe",
    "inputs_of",
    "load_metric",
    "load_object",
    "load_program",
    "one_line",
    "program_of",
    "trace_program",
]


class ProgramError(PlaitError):
    """The program, metric or column mapping named on the command line cannot be used;
    the message is one line saying what is wrong and what to do."""


def load_object(spec: str, what: str = "program") -> Any:
    """Returns the object ``spec`` names: ``pkg.module:attr`` or ``file.py:attr``.

    The current directory is importable, as with ``python -m``; so is the folder
    of a ``file.py``, as with ``python file.py``, so it can import its siblings.

    Raises:
        ProgramError: ``spec`` is malformed, names nothing, or its module fails
            to import (the error is named with the file and line that raised it).
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ProgramError(
            f"{what} {spec!r} must look like pkg.module:Name or path/to/file.py:Name"
        )
    try:
        if module_name.endswith(".py"):
            module = _import_file(Path(module_name), what)
        else:
            module = _import_module(module_name, spec, what)
    except ProgramError:
        raise
    except Exception as exc:  # the user's module failed while it was imported
        fix = (
            f"install {exc.name}, or put it beside {module_name}"
            if isinstance(exc, ModuleNotFoundError) and exc.name
            else "fix the error there"
        )
        raise ProgramError(
            f"{what} {spec!r}: importing {module_name} failed: {describe(exc)}; {fix}"
        ) from None
    obj = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            defined = ", ".join(_defined(module, what)) or "nothing of the kind"
            raise ProgramError(
                f"{what} {spec!r}: {module_name} has no {attribute!r}; it defines: {defined}"
            ) from None
    return obj


def _import_module(module_name: str, spec: str, what: str) -> Any:
    if "/" in module_name or "\\" in module_name or Path(module_name).is_file():
        raise ProgramError(
            f"{what} {spec!r}: {module_name} is not a .py file nor a module name; name a "
            "Python file (path/to/file.py:Name) or a module (pkg.module:Name)"
        )
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ProgramError(
                f"{what} {spec!r}: no module named {exc.name!r}; run from the directory that "
                "holds it, or install its package"
            ) from None
        raise


def _import_file(path: Path, what: str) -> Any:
    if not path.is_file():
        raise ProgramError(
            f"{what} file {path} does not exist; check the path (it is read from {Path.cwd()})"
        )
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = f"_plait_cli_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProgramError(f"{what} file {path} cannot be imported; name a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _defined(module: Any, what: str) -> list[str]:
    """Returns the names in ``module`` that could be a program (Module classes, instances,
    functions) or a metric (functions), defined there rather than imported."""

    def fits(value: Any) -> bool:
        if isinstance(value, Module):
            return what == "program"
        if getattr(value, "__module__", None) != module.__name__:
            return False
        if inspect.isclass(value):
            return what == "program" and issubclass(value, Module)
        return inspect.isfunction(value)

    return [name for name, value in vars(module).items() if name[0] != "_" and fits(value)]


def load_program(spec: str) -> Module:
    """Returns the `Module` ``spec`` names: a Module class (built with no arguments),
    a Module instance, or a function that returns one.

    Raises:
        ProgramError: as `load_object`, or it is none of those, needs arguments,
            or fails while it is built.
    """
    return program_of(load_object(spec), spec)


def program_of(obj: Any, spec: str) -> Module:
    """Returns the `Module` that ``obj``, found at ``spec``, gives: itself, or what it builds.

    Raises:
        ProgramError: as `load_program`.
    """
    if isinstance(obj, Module):
        return obj
    if callable(obj):
        built = _build(obj, spec)
        if isinstance(built, Module):
            return built
        obj = built
    raise ProgramError(
        f"program {spec!r} is a {type(obj).__name__}, not a plait Module, a Module class or "
        "a function returning one"
    )


def _build(factory: Callable[[], Any], spec: str) -> Any:
    try:
        inspect.signature(factory).bind()
    except TypeError as exc:
        raise ProgramError(
            f"program {spec!r} could not be built with no arguments ({exc}); name a "
            "function that builds it, e.g. pkg.module:make_program"
        ) from None
    except ValueError:  # no signature to check (a builtin): calling it will tell
        pass
    try:
        return factory()
    except Exception as exc:  # the user's constructor failed
        raise ProgramError(
            f"program {spec!r}: building it failed: {describe(exc)}; fix the program"
        ) from None


def load_metric(spec: str) -> Callable[[Any, Any], Any]:
    """Returns a metric: ``exact_match``, ``contains``, or ``pkg.module:function``.

    Raises:
        ProgramError: as `load_object`, or the metric does not take ``(output, target)``.
    """
    # import time: `plait --help` loads none of this, the command does
    from plait.optimization.evaluation import exact_match

    builtin = {"exact_match": exact_match, "contains": contains}
    if spec in builtin:
        return builtin[spec]
    if ":" not in spec:
        raise ProgramError(
            f"metric {spec!r} is neither exact_match nor contains; name your own as "
            "pkg.module:function or path/to/file.py:function"
        )
    metric = load_object(spec, "metric")
    if not callable(metric):
        raise ProgramError(f"metric {spec!r} is not callable; name a function(output, target)")
    try:
        inspect.signature(metric).bind(None, None)
    except TypeError:
        raise ProgramError(
            f"metric {spec!r} must take (output, target); it takes {_parameters(metric)}"
        ) from None
    except ValueError:  # no signature to check: calling it will tell
        pass
    return metric


def _parameters(function: Callable[..., Any]) -> str:
    return f"({', '.join(inspect.signature(function).parameters)})"


def describe(exc: BaseException) -> str:
    """Returns an error raised by the user's code on one line: its type, the first line
    of its message, and the file and line of the user's code that raised it."""
    message = exc.msg if isinstance(exc, SyntaxError) else (str(exc).splitlines() or [""])[0]
    where = _user_line(exc)
    return f"{type(exc).__name__}: {message}" + (f" ({where})" if where else "")


def _user_line(exc: BaseException) -> str | None:
    """Returns ``file.py:line`` of the innermost frame of the user's code in a traceback."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{os.path.basename(exc.filename)}:{exc.lineno}"
    import traceback  # import time: only a program that failed to load needs it

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_users(f.filename)]
    if not frames:
        return None
    return f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}"


_NOT_USERS = tuple(
    os.path.join(folder, "")  # so that a folder named plait_tools is the user's
    for folder in {
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # plait itself
        *(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
)
"""Where frames are not the user's code: plait, the standard library, installed packages."""


def _is_users(filename: str) -> bool:
    return not filename.startswith("<") and not filename.startswith(_NOT_USERS)


def one_line(message: str) -> str:
    """Returns a message on one line: a line ending in ``:`` runs on into the next, the
    others are joined with ``;``."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    joined = lines[0] if lines else ""
    for line in lines[1:]:
        joined += (" " if joined.endswith(":") else "; ") + line
    return joined


def trace_program(
    module: Module,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    graphs: Any = None,
) -> Any:
    """Returns the graph of ``module`` traced with these arguments (cached for the run).

    ``graphs`` is the `RunGraphs` of a run that will call the program on
    inputs of this shape, so the run finds this graph instead of tracing again.

    Raises:
        ProgramError: ``forward`` cannot be traced, or fails while it is; names the
            file and line.
    """
    # import time: `plait --help` loads none of this, the command does
    from plait.execution.graph_cache import trace_cached

    try:
        if graphs is not None:
            return graphs.graph_for(args, kwargs or {})
        return trace_cached(module, args, kwargs or {})
    except TracingError as exc:  # its next line quotes the code its first line places
        raise ProgramError(str(exc).splitlines()[0]) from None
    except Exception as exc:  # the user's forward failed on traced values
        raise ProgramError(
            f"tracing {type(module).__name__} failed: {describe(exc)}; fix its forward"
        ) from None


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
    parameters = inspect.signature(program.forward).parameters.values()
    if any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
        # import time: a program whose forward names its inputs never needs signatures
        from plait.signatures import Signature

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


def output_type_of(program: Module) -> Any:
    """Returns the type of the program's output, which ``plait serve`` and ``plait mcp``
    describe: a `Signature` module's output fields (its `Prediction` holds them), else the
    declared return type, else text for an `LLMInference`, else ``Any``."""
    # import time: the module library and pydantic load once a program is named
    from plait.modules import Prediction
    from plait.signatures import Signature

    declared = program.declared_return_type()
    signature = getattr(program, "signature", None)
    holds_fields = declared is None or (
        isinstance(declared, type) and issubclass(declared, Prediction)
    )
    if isinstance(signature, type) and issubclass(signature, Signature) and holds_fields:
        return signature.output_model()
    if declared is not None:
        return declared
    return str if isinstance(program, LLMInference) else Any


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
