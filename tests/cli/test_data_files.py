"""Hostile and awkward data files through the real ``plait`` command: each row is read
right or the run stops with ``plait: error: FILE:LINE[:COLUMN]: ...`` (exit 2) before any
model call, and the rows written never lose or overwrite a value."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from .conftest import plait_cli, program
from .test_cli import read_jsonl, write_jsonl


def strict_json(line: str) -> object:
    """Parses JSON as the standard has it: NaN and Infinity are not JSON."""

    def refuse(token: str) -> object:
        raise ValueError(f"{token} is not JSON")

    return json.loads(line, parse_constant=refuse)


def run(source: Path, out: Path, resources: Path, name: str = "Summarize", *more: str):
    return plait_cli("run", program(name), "-i", str(source), "-o", str(out),
                     "-r", str(resources), *more)  # fmt: skip


def assert_refused(done, where: str) -> None:
    """The run stopped with one line naming the place, and no traceback."""
    assert done.code == 2, done.stderr
    assert f"plait: error: {where}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------ row content
def test_columns_and_output_keys_named_like_plaits_own_columns_are_kept_beside_them(
    server, resources, tmp_path
):
    source = write_jsonl(
        tmp_path / "in.jsonl", [{"text": "a", "row": "R-7", "error": "user note", "score": 3}]
    )
    out = tmp_path / "out.jsonl"

    done = run(source, out, resources, "Clashing")

    assert done.code == 0, done.stderr
    [written] = read_jsonl(out)
    assert written == {
        "row": 0, "text": "a", "input.row": "R-7", "input.error": "user note", "score": 3,
        "output.row": "echo: a", "output.error": "none", "output.score": "a", "error": None,
    }  # fmt: skip


def test_eval_keeps_an_input_column_named_score_beside_the_score(server, resources, tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a", "target": "echo: a", "score": 9}])
    out = tmp_path / "scored.csv"

    done = plait_cli("eval", program("Summarize"), "-i", str(source), "-o", str(out),
                     "-r", str(resources))  # fmt: skip

    assert done.code == 0, done.stderr
    with out.open(newline="") as file:
        [written] = list(csv.DictReader(file))
    assert written["input.score"] == "9" and written["score"] == "1.0"
    assert written["row"] == "0" and written["output"] == "echo: a"


def test_nan_and_infinity_are_written_as_valid_json_csv_and_parquet(server, resources, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a", "measured": NaN, "limit": -Infinity}\n')

    for suffix in ("jsonl", "csv", "parquet"):
        done = run(source, tmp_path / f"out.{suffix}", resources, "NotFinite")
        assert done.code == 0, done.stderr

    [line] = (tmp_path / "out.jsonl").read_text().splitlines()
    written = strict_json(line)
    assert written["measured"] is None and written["limit"] is None
    assert written["ratio"] is None and written["spread"] == [None, 1.5]
    assert written["answer"] == "echo: a"
    with (tmp_path / "out.csv").open(newline="") as file:
        [cells] = list(csv.DictReader(file))
    assert cells["measured"] == "" and cells["ratio"] == ""
    assert strict_json(cells["spread"]) == [None, 1.5]
    [table] = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert math.isnan(table["ratio"]) and table["spread"] == [math.inf, 1.5]


def test_a_metric_that_returns_nan_fails_its_row_and_keeps_the_mean_a_number(
    server, resources, tmp_path
):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "a", "target": "x"}])
    out = tmp_path / "scored.jsonl"

    done = plait_cli("eval", program("Summarize"), "-i", str(source), "-o", str(out),
                     "-r", str(resources), "--metric", program("nan_metric"))  # fmt: skip

    assert done.code == 1, done.stderr
    [written] = [strict_json(line) for line in out.read_text().splitlines()]
    assert written["score"] == 0.0 and "returned nan" in written["error"]
    assert strict_json((tmp_path / "scored.run.json").read_text())["metrics"]["score"] == 0.0


# ------------------------------------------------------------------ CSV
def test_a_csv_field_over_128_kib_is_read_whole(server, resources, tmp_path):
    long_text = "word " * 40_000  # 200 KB, over csv's default field limit of 128 KiB
    source = tmp_path / "in.csv"
    with source.open("w", newline="") as file:
        csv.writer(file).writerows([["text"], [long_text]])
    out = tmp_path / "out.jsonl"

    done = run(source, out, resources)

    assert done.code == 0, done.stderr
    assert read_jsonl(out)[0]["output"] == f"echo: {long_text}"


def test_a_csv_field_over_the_cap_is_an_error_naming_the_line(server, resources, tmp_path):
    source = tmp_path / "in.csv"
    source.write_text('text\nfine\n"an unclosed quote ' + "x" * (17 * 1024 * 1024) + "\n")

    done = run(source, tmp_path / "out.jsonl", resources)

    assert_refused(done, f"{source}:3: ")
    assert "16 MiB" in done.stderr and "quote" in done.stderr
    assert server.stats.requests == 0


def test_a_utf8_bom_is_not_part_of_the_first_column_name(server, resources, tmp_path):
    for name, text in [("in.csv", "text,n\nhello,1\n"), ("in.jsonl", '{"text": "hello"}\n')]:
        source = tmp_path / name
        source.write_bytes(b"\xef\xbb\xbf" + text.encode())
        out = tmp_path / f"out-{name}.jsonl"

        done = run(source, out, resources)

        assert done.code == 0, done.stderr
        assert read_jsonl(out)[0]["output"] == "echo: hello"


def test_a_csv_header_that_names_a_column_twice_is_refused(server, resources, tmp_path):
    source = tmp_path / "in.csv"
    source.write_text("text,text\na,b\n")

    done = run(source, tmp_path / "out.jsonl", resources)

    assert_refused(done, f"{source}:1: ")
    assert "column 'text' appears twice" in done.stderr


# ------------------------------------------------------------------ not a data file
def test_a_binary_file_named_csv_is_an_error_naming_line_and_column(server, resources, tmp_path):
    source = tmp_path / "image.csv"
    source.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00")
    out = tmp_path / "out.jsonl"

    done = run(source, out, resources)

    assert_refused(done, f"{source}:1:1: byte 0x89 is not UTF-8")
    assert not out.exists() and server.stats.requests == 0


def test_a_line_that_is_not_utf8_is_named_by_line_and_column(server, resources, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')

    done = run(source, tmp_path / "out.jsonl", resources)

    assert_refused(done, f"{source}:2:14: byte 0xe9 is not UTF-8")


def test_a_file_that_is_not_parquet_is_an_error_naming_the_file(server, resources, tmp_path):
    pytest.importorskip("pyarrow")
    source = tmp_path / "rows.parquet"
    source.write_text("text\nhello\n")

    done = run(source, tmp_path / "out.jsonl", resources)

    assert_refused(done, f"{source}: not a Parquet file")
    assert "--input-format" in done.stderr


# ------------------------------------------------------------------ JSON Lines
def test_a_bad_json_line_is_named_by_line_and_column_before_any_call(server, resources, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a"}\n{"text": \n')

    done = run(source, tmp_path / "out.jsonl", resources)

    assert_refused(done, f"{source}:2:10: row 1 is not valid JSON")
    assert server.stats.requests == 0


@pytest.mark.parametrize("depth", [150, 5000])
def test_deeply_nested_json_is_refused_naming_line_and_column_and_nothing_is_written_twice(
    server, resources, tmp_path, depth
):
    good = [{"text": "a"}, {"text": "b"}]
    source = write_jsonl(tmp_path / "in.jsonl", good)
    with source.open("a") as file:  # the tree starts at column 23; level 101 is 99 further
        file.write('{"text": "c", "tree": ' + "[" * depth + "]" * depth + "}\n")
    out = tmp_path / "out.jsonl"
    args = ("--checkpoint-dir", str(tmp_path / "ckpt"), "--chunk-size", "1")

    refused = run(source, out, resources, "Summarize", *args)

    assert_refused(refused, f"{source}:3:122: row 2 nests lists or objects more than 100 levels")
    assert not out.exists() and server.stats.requests == 0

    write_jsonl(source, [*good, {"text": "c", "tree": [[["leaf"]]]}])
    fixed = run(source, out, resources, "Summarize", *args)

    assert fixed.code == 0, fixed.stderr
    assert [r["row"] for r in read_jsonl(out)] == [0, 1, 2]
    assert server.stats.requests == 3
