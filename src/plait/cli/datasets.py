"""Rows in and out of files: JSON Lines and CSV always, Parquet with pyarrow.

Readers yield ``(row_number, row)`` one row at a time and writers take rows
one at a time, so a file of any size streams through in bounded memory.
Errors name the file and the line (or row) that is wrong.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from plait import _files

__all__ = [
    "FORMATS",
    "DatasetError",
    "RowWriter",
    "count_rows",
    "format_of",
    "open_writer",
    "read_rows",
]

FORMATS = ("jsonl", "csv", "parquet")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}


class DatasetError(Exception):
    """A data file cannot be read or written as asked; the message names the file and row."""


def format_of(path: str | os.PathLike[str], given: str | None = None) -> str:
    """Returns the format of ``path`` (``given``, or from its suffix).

    Raises:
        DatasetError: the suffix is unknown and no format was given.
    """
    if given:
        return given
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIXES:
        raise DatasetError(
            f"{path}: cannot tell the format from the suffix {suffix or '(none)'!r}; "
            f"use .jsonl, .csv or .parquet, or pass --format {'/'.join(FORMATS)}"
        )
    return _SUFFIXES[suffix]


def _pyarrow() -> Any:
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise DatasetError(
            "Parquet needs pyarrow: pip install 'plait[parquet]' (JSON Lines and CSV need nothing)"
        ) from None
    return pq


# ------------------------------------------------------------------ reading
def read_rows(path: str | os.PathLike[str], fmt: str | None = None) -> Iterator[tuple[int, dict]]:
    """Yields ``(row_number, row)`` for every row of a file, row numbers from 0.

    Raises:
        DatasetError: the file is missing, or a row is not an object / not
            valid; the message names the file and the line.
    """
    fmt = format_of(path, fmt)
    if not Path(path).is_file():
        raise DatasetError(f"{path}: no such file")
    if fmt == "jsonl":
        yield from _read_jsonl(path)
    elif fmt == "csv":
        yield from _read_csv(path)
    else:
        yield from _read_parquet(path)


def _read_jsonl(path: Any) -> Iterator[tuple[int, dict]]:
    row = 0
    with open(path, encoding="utf-8") as file:
        for line_number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError as exc:
                raise DatasetError(
                    f"{path}:{line_number}: row {row} is not valid JSON ({exc})"
                ) from None
            if not isinstance(data, dict):
                raise DatasetError(
                    f"{path}:{line_number}: row {row} is a JSON {type(data).__name__}; each "
                    'line must be an object whose keys are column names, e.g. {"text": "..."}'
                )
            yield row, data
            row += 1


def _read_csv(path: Any) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8", newline="") as file:
        reader = csv.DictReader(file)
        for row, data in enumerate(reader):
            if None in data:
                raise DatasetError(
                    f"{path}:{reader.line_num}: row {row} has more fields than the header "
                    f"({len(reader.fieldnames or [])} columns)"
                )
            yield row, dict(data)


def _read_parquet(path: Any) -> Iterator[tuple[int, dict]]:
    pq = _pyarrow()
    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for data in batch.to_pylist():
            yield row, data
            row += 1


def count_rows(path: str | os.PathLike[str], fmt: str | None = None) -> int:
    """Returns how many rows ``read_rows`` will yield, reading as little as it can."""
    fmt = format_of(path, fmt)
    if fmt == "parquet":
        return int(_pyarrow().ParquetFile(path).metadata.num_rows)
    if fmt == "csv":
        with open(path, encoding="utf-8", newline="") as file:
            return max(0, sum(1 for _ in csv.reader(file)) - 1)
    count = 0
    with open(path, "rb") as file:
        for line in file:
            if line.strip():
                count += 1
    return count


# ------------------------------------------------------------------ writing
class RowWriter:
    """Writes rows to a file as they come; `close` finishes it."""

    def write(self, row: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _JsonlWriter(RowWriter):
    def __init__(self, path: Any) -> None:
        self.file: IO[str] = _files.open_for_writing(path, error=DatasetError)

    def write(self, row: dict[str, Any]) -> None:
        self.file.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _cell(value: Any) -> Any:
    """A CSV cell: text and numbers as they are, anything else as JSON."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


class _CsvWriter(RowWriter):
    """CSV with the columns of the first row; a later row with other columns is an error."""

    def __init__(self, path: Any) -> None:
        self.path = path
        self.file: IO[str] = _files.open_for_writing(path, newline="", error=DatasetError)
        self.writer: csv.DictWriter[str] | None = None

    def write(self, row: dict[str, Any]) -> None:
        if self.writer is None:
            self.writer = csv.DictWriter(self.file, fieldnames=list(row))
            self.writer.writeheader()
        extra = [key for key in row if key not in self.writer.fieldnames]
        if extra:
            raise DatasetError(
                f"{self.path}: row {row.get('row')} has columns {extra} that the first row "
                f"did not have ({list(self.writer.fieldnames)}); CSV needs one set of columns. "
                "Write JSON Lines (.jsonl) for outputs whose keys vary"
            )
        self.writer.writerow({key: _cell(value) for key, value in row.items()})
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class _ParquetWriter(RowWriter):
    """Parquet in row groups of ``group`` rows; the first group decides the schema."""

    def __init__(self, path: Any, group: int = 1000) -> None:
        self.pq = _pyarrow()
        self.path = path
        self.file: IO[bytes] = _files.open_for_writing(path, binary=True, error=DatasetError)
        self.group = group
        self.rows: list[dict[str, Any]] = []
        self.writer: Any = None

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.group:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if not self.rows:
            return
        try:
            if self.writer is None:
                table = pa.Table.from_pylist(self.rows)
                schema = table.schema
                for position, column in enumerate(schema):
                    if pa.types.is_null(column.type):  # all empty so far (errors): text
                        schema = schema.set(position, pa.field(column.name, pa.string()))
                table = table.cast(schema)
                self.writer = self.pq.ParquetWriter(self.file, schema)
            else:
                table = pa.Table.from_pylist(self.rows, schema=self.writer.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            first = self.rows[0].get("row")
            raise DatasetError(
                f"{self.path}: rows from {first} do not fit one Parquet schema ({exc}); "
                "write JSON Lines (.jsonl) for outputs whose types vary"
            ) from None
        self.writer.write_table(table)
        self.rows = []

    def close(self) -> None:
        try:
            self._flush()
            if self.writer is None:  # no rows: still a Parquet file, of no columns
                import pyarrow as pa

                self.writer = self.pq.ParquetWriter(self.file, pa.schema([]))
            self.writer.close()
        finally:
            self.file.close()


def open_writer(path: str | os.PathLike[str], fmt: str | None = None) -> RowWriter:
    """Opens ``path`` for writing rows (truncating it) in its format.

    Raises:
        DatasetError: the suffix is unknown, or ``path`` is a symbolic link (never
            written through), not a regular file, or cannot be opened.
    """
    fmt = format_of(path, fmt)
    if fmt == "jsonl":
        return _JsonlWriter(path)
    if fmt == "csv":
        return _CsvWriter(path)
    return _ParquetWriter(path)
