"""Rows in and out of files: JSON Lines and CSV always, Parquet with pyarrow.

Readers yield ``(row_number, row)`` one row at a time and writers take rows
one at a time, so a file of any size streams through in bounded memory.
JSON Lines and CSV are UTF-8 text. Errors name the file, the line and, where
it can, the column that is wrong.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from plait import _files
from plait import _jsontext as jsontext
from plait.errors import PlaitError

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "FORMATS",
    "MAX_CSV_FIELD",
    "DatasetError",
    "RowWriter",
    "count_rows",
    "format_of",
    "open_writer",
    "read_rows",
]

FORMATS = ("jsonl", "csv", "parquet")
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}


class DatasetError(PlaitError):
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
            "name it .jsonl, .csv or .parquet, or give its format with --input-format / "
            "--output-format"
        )
    return _SUFFIXES[suffix]


def _pyarrow() -> Any:
    """The `pyarrow` module with its `parquet` submodule loaded, or a DatasetError saying how."""
    try:
        import pyarrow.parquet  # optional extra (plait[parquet]): only a Parquet file needs it
    except ModuleNotFoundError:
        raise DatasetError(
            "Parquet needs pyarrow: pip install 'plait[parquet]' (JSON Lines and CSV need nothing)"
        ) from None
    return pyarrow


# ------------------------------------------------------------------ reading
def read_rows(path: str | os.PathLike[str], fmt: str | None = None) -> Iterator[tuple[int, dict]]:
    """Yields ``(row_number, row)`` for every row of a file, row numbers from 0.

    JSON Lines and CSV are UTF-8 text (a byte-order mark at the start is dropped).

    Raises:
        DatasetError: the file is missing or is not of its format, or a row is
            not an object / not valid / nested too deep; the message names the
            file, the line and, where it can, the column.
    """
    fmt = format_of(path, fmt)
    if not Path(path).is_file():
        raise DatasetError(f"{path}: no such file; check the path (it is read from {Path.cwd()})")
    if fmt == "jsonl":
        yield from _read_jsonl(path)
    elif fmt == "csv":
        yield from _read_csv(path)
    else:
        yield from _read_parquet(path)


def _read_jsonl(path: Any) -> Iterator[tuple[int, dict]]:
    row = 0
    for line_number, line in _utf8_lines(path):
        if not line.strip():
            continue
        try:
            data = jsontext.loads(line.rstrip("\r\n"))  # so that columns count in this line
        except ValueError as exc:
            raise DatasetError(_json_problem(path, line_number, row, exc)) from None
        if not isinstance(data, dict):
            raise DatasetError(
                f"{path}:{line_number}: row {row} is a JSON {type(data).__name__}; each "
                'line must be an object whose keys are column names, e.g. {"text": "..."}'
            )
        yield row, data
        row += 1


def _json_problem(path: Any, line_number: int, row: int, exc: ValueError) -> str:
    if not isinstance(exc, json.JSONDecodeError):  # a number too long to convert
        return f"{path}:{line_number}: row {row} is not valid JSON ({exc})"
    where = f"{path}:{line_number}:{exc.colno}: row {row}"
    if isinstance(exc, jsontext.TooDeep):
        return (
            f"{where} nests lists or objects more than {jsontext.MAX_DEPTH} levels deep; "
            "flatten it, or keep the structure as JSON text in a string column"
        )
    return f"{where} is not valid JSON ({exc.msg}); each line must be one JSON object"


def _utf8_lines(path: Any) -> Iterator[tuple[int, str]]:
    """Yields ``(line_number, line)`` of a UTF-8 text file, lines split as in text mode."""
    try:
        with open(path, encoding="utf-8-sig") as file:
            yield from enumerate(file, 1)
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _not_utf8(path: Any) -> DatasetError:
    """Returns the error naming the first byte of ``path`` that is not UTF-8.

    Text files are decoded a block at a time, so the decoder's offset says
    nothing about lines; this second pass over the bytes finds line and column.
    """
    with open(path, "rb") as file:
        for line_number, raw in enumerate(file, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                column = len(raw[: exc.start].decode("utf-8")) + 1
                return DatasetError(
                    f"{path}:{line_number}:{column}: byte 0x{raw[exc.start]:02x} is not UTF-8 "
                    "text; plait reads CSV and JSON Lines as UTF-8, so save the file as UTF-8 "
                    "(or pass --input-format if it is Parquet)"
                )
    return DatasetError(f"{path}: is not UTF-8 text; save it as UTF-8")


MAX_CSV_FIELD = 16 * 1024 * 1024
"""Longest CSV field read (characters): far above any model's context, and a bound on what
one unclosed quote can pull into a single field."""


def _csv_records(path: Any) -> Iterator[tuple[int, list[str]]]:
    """Yields ``(line_number, fields)`` of each CSV record but blank ones; the number is the
    line the record starts on."""
    csv.field_size_limit(MAX_CSV_FIELD)
    with open(path, encoding="utf-8-sig", newline="") as file:
        reader = csv.reader(file)
        ended = 0  # the line the last record ended on
        try:
            for fields in reader:
                if fields:
                    yield ended + 1, fields
                ended = reader.line_num
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
        except csv.Error as exc:
            raise DatasetError(_csv_problem(path, ended + 1, exc)) from None


def _csv_problem(path: Any, line_number: int, exc: csv.Error) -> str:
    if "field limit" in str(exc):
        return (
            f"{path}:{line_number}: a field is longer than {MAX_CSV_FIELD // 2**20} MiB, most "
            "often a quote that is never closed; check the quotes on that line, or write "
            "long texts as JSON Lines"
        )
    return f"{path}:{line_number}: not valid CSV ({exc})"


def _read_csv(path: Any) -> Iterator[tuple[int, dict]]:
    records = _csv_records(path)
    header = next(records, None)
    if header is None:
        return
    line_number, columns = header
    _check_header(path, line_number, columns)
    for row, (line_number, fields) in enumerate(records):
        if len(fields) > len(columns):
            raise DatasetError(
                f"{path}:{line_number}: row {row} has more fields than the header "
                f"({len(columns)} columns)"
            )
        yield row, dict(itertools.zip_longest(columns, fields))  # missing fields: None


def _check_header(path: Any, line_number: int, columns: list[str]) -> None:
    seen = set()
    for column in columns:
        if column in seen:
            raise DatasetError(
                f"{path}:{line_number}: column {column!r} appears twice in the header; "
                "rename one, so that neither hides the other's values"
            )
        seen.add(column)


def _parquet_file(path: Any) -> Any:
    """Returns ``path`` opened as a `pyarrow.parquet.ParquetFile`."""
    pyarrow = _pyarrow()
    try:
        return pyarrow.parquet.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as exc:
        raise DatasetError(
            f"{path}: not a Parquet file (pyarrow: {exc}); check the file, or pass "
            "--input-format jsonl or csv if it holds text rows"
        ) from None


def _read_parquet(path: Any) -> Iterator[tuple[int, dict]]:
    parquet = _parquet_file(path)
    pyarrow = _pyarrow()

    row = 0
    try:
        for batch in parquet.iter_batches(batch_size=1024):
            for data in batch.to_pylist():
                yield row, data
                row += 1
    except (pyarrow.ArrowException, OSError) as exc:
        raise DatasetError(
            f"{path}: rows from {row} cannot be read (pyarrow: {exc}); the file is damaged"
        ) from None


def count_rows(path: str | os.PathLike[str], fmt: str | None = None) -> int:
    """Returns how many rows ``read_rows`` will yield.

    JSON Lines and CSV are read through (and so checked) whole, a row at a time,
    so a bad row stops a run before any model call; Parquet keeps the count in
    its metadata.

    Raises:
        DatasetError: as `read_rows`.
    """
    if format_of(path, fmt) == "parquet" and Path(path).is_file():  # else read_rows says why
        return int(_parquet_file(path).metadata.num_rows)
    return sum(1 for _ in read_rows(path, fmt))


# ------------------------------------------------------------------ writing
class RowWriter:
    """Writes rows to a file as they come; `close` finishes it."""

    def write(self, row: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


_FLUSH_DELAY = 0.2
"""Seconds a text row may wait in the buffer before it is in the file (all are at close)."""


class _TextWriter(RowWriter):
    """A text file whose rows are in it within `_FLUSH_DELAY` seconds of being written.

    Inside an event loop, the rows written meanwhile go out in one flush, which the
    loop calls a moment after the first of them: one system call per interval, not
    one per row. A flush that fails makes the next write or `close` fail as it would
    have. Outside a loop each row is flushed at once.
    """

    def __init__(self, file: IO[str]) -> None:
        self.file = file
        self._timer: asyncio.TimerHandle | None = None
        self._failed: OSError | None = None

    def _written(self) -> None:
        """Notes a row written to the buffer: flushes it now or soon."""
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        if self._timer is not None:
            return
        # `plait run --help` and a usage error need no asyncio (ssl, subprocess, logging …)
        import asyncio  # import time: a running loop has loaded it already

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.file.flush()
            return
        self._timer = loop.call_later(_FLUSH_DELAY, self._flush)

    def _flush(self) -> None:
        self._timer = None
        try:
            self.file.flush()
        except OSError as exc:  # raised again by the next write or close, not by the loop
            self._failed = exc

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        failed, self._failed = self._failed, None
        try:
            self.file.close()
        finally:
            if failed is not None:
                raise failed


class _JsonlWriter(_TextWriter):
    def __init__(self, path: Any) -> None:
        super().__init__(_files.open_for_writing(path, error=DatasetError))

    def write(self, row: dict[str, Any]) -> None:
        self.file.write(_json_text(row) + "\n")
        self._written()


def _json_text(value: Any) -> str:
    """Returns ``value`` as JSON text; NaN and infinities, which JSON cannot spell, as null.

    Objects JSON does not know are written as their text.
    """
    try:
        return json.dumps(value, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:  # a float JSON cannot spell, somewhere inside: rare, so walk only now
        return json.dumps(_finite(value), ensure_ascii=False, default=str, allow_nan=False)


def _finite(value: Any) -> Any:
    """Returns ``value`` with every NaN or infinity inside it replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _cell(value: Any) -> Any:
    """A CSV cell: text and numbers as they are (NaN and infinities empty, as in JSON Lines),
    anything else as JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    return _json_text(value)


class _CsvWriter(_TextWriter):
    """CSV with the columns of the first row; a later row with other columns is an error."""

    def __init__(self, path: Any) -> None:
        super().__init__(_files.open_for_writing(path, newline="", error=DatasetError))
        self.path = path
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
        self._written()


class _ParquetWriter(RowWriter):
    """Parquet in row groups of ``group`` rows; the first group decides the schema."""

    def __init__(self, path: Any, group: int = 1000) -> None:
        self.pa = _pyarrow()
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
        pa = self.pa
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
                self.writer = pa.parquet.ParquetWriter(self.file, schema)
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
                self.writer = self.pa.parquet.ParquetWriter(self.file, self.pa.schema([]))
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
