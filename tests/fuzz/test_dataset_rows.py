"""Row files the ``plait`` command reads: JSON Lines, CSV and Parquet, edited or not data at all.

`read_rows` (what ``plait run``, ``eval``, ``train`` and ``graph`` read
rows with) gives every row or a `DatasetError` naming the file and line;
``plait graph -i FILE`` then exits 0, or 2 with one ``plait: error:`` line,
never with a traceback.
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import example, given
from hypothesis import strategies as st

from plait.cli.app import cli
from plait.cli.datasets import DatasetError, read_rows

from .support import documents, fuzz, mutated_bytes, outcome

ROWS = [
    {"text": "hello", "n": 1, "tags": ["a", "b"]},
    {"text": "tschüss", "n": 2, "tags": []},
]
VALID_JSONL = b"".join(json.dumps(row).encode() + b"\n" for row in ROWS)
VALID_CSV = 'text,n\nhello,1\n"tschüss, bye",2\n'.encode()


def valid_parquet() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(ROWS), sink)
    return sink.getvalue()


VALID_PARQUET = valid_parquet()

FILES = {
    ".jsonl": st.one_of(
        st.builds(
            lambda line, rest: line.replace(b"\n", b" ") + b"\n" + rest,
            documents(ROWS[0]),
            st.sampled_from([b"", VALID_JSONL]),
        ),
        mutated_bytes(VALID_JSONL, (b"\n", b"{}", b"[]")),
        st.binary(max_size=200),
    ),
    ".csv": st.one_of(
        mutated_bytes(VALID_CSV, (b",", b'"', b"\r\n", b"\n\n", b'""')),
        st.text(max_size=200).map(str.encode),
        st.binary(max_size=200),
    ),
    ".parquet": st.one_of(
        mutated_bytes(VALID_PARQUET, (b"PAR1",)),
        st.binary(max_size=200).map(lambda b: b"PAR1" + b + b"PAR1"),
    ),
}
"""Edited and random files of each format."""

NESTED_LINE = b'{"text": ' + b"[" * 100_000 + b"\n"
BINARY = b"text\n\x80\xff\n"
HUGE_FIELD = b"text\n" + b"x" * 200_000 + b"\n"
"""A CSV field larger than the csv module's limit (131,072 characters)."""
FAKE_PARQUET = b"PAR1 not parquet PAR1"
CUT_PARQUET = VALID_PARQUET[:4] + VALID_PARQUET[5:]
"""A Parquet file with one byte of its first page cut out: pyarrow raises OSError."""


Write = Callable[[str, bytes], Path]


@pytest.fixture
def write(tmp_path: Path) -> Iterator[Write]:
    """Returns a function that writes content to a new file with the given suffix."""
    counter = itertools.count()

    def to_file(suffix: str, content: bytes) -> Path:
        path = tmp_path / f"rows{next(counter)}{suffix}"
        path.write_bytes(content)
        return path

    yield to_file


@pytest.mark.parametrize(
    "suffix",
    [".csv", ".jsonl", ".parquet"],
)
@fuzz(150)
@given(data=st.data())
@example(data=None)
def test_any_row_file_gives_rows_or_a_dataset_error(
    write: Write, suffix: str, data: st.DataObject | None
) -> None:
    pinned = {".jsonl": NESTED_LINE, ".csv": BINARY, ".parquet": FAKE_PARQUET}
    content = pinned[suffix] if data is None else data.draw(FILES[suffix], label="file")
    path = write(suffix, content)
    outcome(
        f"row file ({suffix[1:]})",
        lambda: list(read_rows(path)),
        allowed=(DatasetError,),
    )


PROGRAM = f"{Path(__file__).with_name('cli_programs.py')}:Summarize"


@pytest.mark.parametrize(
    "suffix",
    [".csv", ".jsonl", ".parquet"],
)
@fuzz(40)
@given(data=st.data())
@example(data=None)
def test_plait_graph_reads_any_row_file_or_exits_with_a_usage_error(
    write: Write, suffix: str, data: st.DataObject | None
) -> None:
    pinned = {".jsonl": NESTED_LINE, ".csv": HUGE_FIELD, ".parquet": CUT_PARQUET}
    content = pinned[suffix] if data is None else data.draw(FILES[suffix], label="file")
    path = write(suffix, content)
    result = outcome(
        f"plait graph -i ({suffix[1:]})",
        lambda: CliRunner().invoke(cli, ["graph", PROGRAM, "-i", str(path)]),
    )
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    if result.exit_code == 2:
        assert result.stderr.startswith("plait: error: "), result.stderr
