"""Saving and loading learned parameters (and optimizer state) as JSON, never pickle.

A file written by `save` reads like this::

    {
      "format": 1,
      "parameters": {
        "summarizer.system_prompt": {
          "value": "You are a concise summarizer.",
          "description": "How the summarizer writes.",
          "requires_grad": true
        }
      },
      "optimizer": {...}          # optimizer.state_dict(), or null
    }

JSON keeps the file readable, diffable and safe to open: loading never runs
code, unlike a pickle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plait import _files
from plait import _jsontext as jsontext

if TYPE_CHECKING:
    from plait.module import Module

__all__ = ["FORMAT", "load_module", "load_state", "save_module"]

FORMAT = 1
"""The version of the file layout written by `save_module`."""


def save_module(module: Module, path: str | os.PathLike[str], optimizer: Any = None) -> Path:
    """Writes ``module``'s parameters (and ``optimizer.state_dict()``) to ``path`` as JSON.

    The file is written to a temporary name next to ``path`` and then
    renamed, so a crash mid-write never leaves a half-written file behind;
    a symbolic link at ``path`` is refused, never written through.

    Args:
        module: the program whose parameters are saved (by dotted name).
        path: where to write; parent folders must exist.
        optimizer: anything with ``state_dict()`` returning JSON-compatible data.

    Returns:
        The path written.

    Raises:
        TypeError: a parameter value or the optimizer state is not JSON-compatible.
        FileError: ``path`` is a symbolic link or not a regular file, or cannot
            be written.
    """
    parameters = {}
    for name, param in module.named_parameters():
        parameters[name] = {
            "value": _checked(param.value, f"parameter {name!r}"),
            "description": param.description,
            "requires_grad": param.requires_grad,
        }
    state = None
    if optimizer is not None:
        state = _checked(optimizer.state_dict(), f"{type(optimizer).__name__}.state_dict()")
    document = {"format": FORMAT, "parameters": parameters, "optimizer": state}
    target = Path(path)
    with _files.replacing(target) as file:
        json.dump(document, file, indent=2, ensure_ascii=False)
        file.write("\n")
    return target


def _checked(data: Any, what: str) -> Any:
    try:
        json.dumps(data)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} cannot be saved as JSON: {exc}") from None
    return data


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Returns the contents of a file written by `save_module`, checked.

    Returns:
        ``{"format": 1, "parameters": {name: {"value", "description",
        "requires_grad"}}, "optimizer": state or None}``.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        ValueError: the file is not JSON (a pickle, say) or not in this layout.
    """
    where = os.fspath(path)
    try:
        text = Path(where).read_text(encoding="utf-8")
        document = jsontext.loads(text)
    except ValueError as exc:  # not UTF-8, not JSON, or nested past any parameter file
        raise ValueError(
            f"{where} is not a plait parameter file (JSON written by module.save()): {exc}"
        ) from None
    problems = _problems(document)
    if problems:
        lines = "\n".join(f"  {problem}" for problem in problems)
        raise ValueError(f"{where} is not a plait parameter file of format {FORMAT}:\n{lines}")
    document.setdefault("optimizer", None)
    return document


def _problems(document: Any) -> list[str]:
    if not isinstance(document, dict):
        return [f"expected a JSON object at the top, got {type(document).__name__}"]
    problems = []
    if document.get("format") != FORMAT:
        problems.append(f"'format' is {document.get('format')!r}, expected {FORMAT}")
    parameters = document.get("parameters")
    if not isinstance(parameters, dict):
        problems.append("'parameters' is missing or not an object")
        return problems
    for name, entry in parameters.items():
        if not isinstance(entry, dict) or "value" not in entry:
            problems.append(f"parameter {name!r} has no 'value'")
    return problems


def load_module(module: Module, path: str | os.PathLike[str]) -> Any:
    """Loads parameter values from ``path`` into ``module``; returns the optimizer state.

    Parameters the file does not name keep their values. Descriptions and
    ``requires_grad`` in the file are informative: the module's own are kept.

    Returns:
        The saved ``optimizer.state_dict()``, or None when none was saved;
        pass it to ``optimizer.load_state_dict``.

    Raises:
        KeyError: the file names parameters ``module`` does not have (all are
            listed, and nothing is changed).
        TypeError: values in the file have another type than the parameters'
            current values, e.g. a dict for a prompt (all are listed, with the
            file's name, and nothing is changed).
        ValueError: the file is not a plait parameter file.
    """
    document = load_state(path)
    values = {name: entry["value"] for name, entry in document["parameters"].items()}
    try:
        module.load_state_dict(values)
    except TypeError as exc:
        raise TypeError(f"cannot load {os.fspath(path)}: {exc}") from None
    return document["optimizer"]
