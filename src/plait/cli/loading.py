"""The program a command names, with ``--load``'s parameters and ``--column``'s row mapper,
and rows paired with their targets (``eval``'s estimate, ``train``).

The names are the ``plait.cli`` package's own, for its commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plait.cli.datasets import read_rows
from plait.cli.exits import _fail
from plait.cli.programs import ProgramError, RowMapper, load_program


def _renames(pairs: tuple[str, ...]) -> dict[str, str]:
    renames = {}
    for pair in pairs:
        argument, sep, column = pair.partition("=")
        if not sep or not argument or not column:
            _fail(f"--column {pair!r} must look like ARGUMENT=COLUMN")
        renames[argument] = column
    return renames


def _prepare(spec: str, load: Path | None, columns: tuple[str, ...]) -> tuple[Any, RowMapper]:
    """Returns the program ``spec`` names, with ``--load``'s parameters, and its row mapper.

    Raises:
        ProgramError: the program, the parameter file or the columns cannot be used.
    """
    program = load_program(spec)
    if load is not None:
        try:
            program.load(load)
        except (KeyError, TypeError, ValueError, OSError) as exc:
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            raise ProgramError(f"--load {load}: {text}") from None
    program.eval()
    return program, RowMapper(program, _renames(columns))


def _pairs(path: Path, fmt: str | None, mapper: RowMapper, target: str) -> list[tuple[Any, Any]]:
    pairs = []
    for number, row in read_rows(path, fmt):
        if target not in row:
            raise ProgramError(
                f"{path}: row {number} has no target column {target!r}; its columns: "
                f"{', '.join(row) or 'none'}. Name the target with --target COLUMN"
            )
        pairs.append((mapper.item(number, row, str(path)), row[target]))
    if not pairs:
        raise ProgramError(f"{path} has no rows")
    return pairs
