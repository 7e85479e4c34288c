"""A data file's column for an image field: data: URIs are sent as images, a path is
refused in the row's error and never read (a data row must not make plait read files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plait import Image

from .conftest import plait_cli, program
from .test_cli import read_jsonl, write_jsonl

PNG = b"\x89PNG\r\n\x1a\n" + bytes(24)  # the magic number is what plait reads


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_plait_run_sends_a_column_of_data_uris_as_image_parts(
    server, resources, tmp_path: Path, kind: str
):
    uri = Image(PNG).data_uri()
    source = tmp_path / f"in.{kind}"
    if kind == "csv":
        source.write_text(f'picture\n"{uri}"\n')  # the URI holds a comma
    else:
        write_jsonl(source, [{"picture": uri}])
    out = tmp_path / "out.jsonl"
    done = plait_cli("run", program("describe"), "-i", str(source), "-o", str(out),
                     "-r", str(resources))  # fmt: skip
    assert done.code == 0, done.stderr
    [row] = read_jsonl(out)
    content = server.stats.log[0].body["messages"][-1]["content"]
    assert {"type": "image_url", "image_url": {"url": uri}} in content, row


def test_plait_run_refuses_a_path_in_a_column_and_reads_no_file(server, resources, tmp_path: Path):
    (tmp_path / "shape.png").write_bytes(PNG)
    source = write_jsonl(tmp_path / "in.jsonl", [{"picture": "shape.png"}])
    out = tmp_path / "out.jsonl"
    done = plait_cli("run", program("describe"), "-i", str(source), "-o", str(out),
                     "-r", str(resources), cwd=tmp_path)  # fmt: skip
    [row] = read_jsonl(out)
    assert "picture" in row["error"] and "data:" in row["error"], (done.stderr, row)
    assert server.stats.log == []
