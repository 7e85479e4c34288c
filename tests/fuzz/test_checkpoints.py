"""Checkpoint directories edited by a crash or a hand: ``items.jsonl`` lines and ``manifest.json``.

A batch runs once with ``checkpoint_dir``; each input then puts an edited
copy of its files in a fresh directory and runs the same batch again through
`plait.run`, which resumes from it. The rerun gives the program's outputs,
each of the type ``forward`` declares, or a `CheckpointError` naming the file.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel

from plait import Module, run
from plait.execution.checkpoint import input_hash

from .support import documents, fuzz, mutated_bytes, outcome

# The endpoint is never called: the program makes no LLM call.
RESOURCES = {"*": {"provider": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}}
ITEMS = ["a", "bb", "ccc"]


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


class Verdict(BaseModel):
    label: str
    score: float


class Judge(Module):
    """A program whose outputs need every kind of shape: a model, an enum, a tuple, a list."""

    def forward(self, text: str) -> tuple[Verdict, list[Mood]]:
        moods = [Mood.HAPPY if len(text) % 2 else Mood.SAD] * len(text)
        return Verdict(label=text.upper(), score=len(text) / 2), moods


def is_declared(output: Any) -> bool:
    verdict, moods = output
    return isinstance(verdict, Verdict) and all(isinstance(m, Mood) for m in moods)


@functools.cache
def valid_files() -> dict[str, bytes]:
    """The files of a finished checkpoint of ITEMS (made on first use)."""
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(run(Judge(), ITEMS, checkpoint_dir=directory, resources=RESOURCES))
        return {name: (Path(directory) / name).read_bytes() for name in FILES}


FILES = ("manifest.json", "items.jsonl")


@pytest.fixture
def resume(tmp_path: Path) -> Iterator[Any]:
    """Returns a function that resumes the batch from the valid files with some replaced."""
    counter = itertools.count()
    with asyncio.Runner() as runner:

        def from_files(**replaced: bytes) -> Any:
            directory = tmp_path / str(next(counter))
            directory.mkdir()
            files = {**valid_files(), **{name.replace("_", "."): v for name, v in replaced.items()}}
            for name, content in files.items():
                (directory / name).write_bytes(content)
            batch = run(Judge(), ITEMS, checkpoint_dir=directory, resources=RESOURCES)
            return runner.run(batch)

        yield from_files


@st.composite
def _items_files(draw: st.DrawFn) -> bytes:
    """``items.jsonl`` near the valid one: one line edited, the bytes edited, or noise."""
    valid = valid_files()["items.jsonl"]
    lines = valid.splitlines(keepends=True)
    kind = draw(st.sampled_from(["line", "bytes", "noise"]))
    if kind == "line":
        position = draw(st.integers(0, len(lines) - 1))
        edited = draw(documents(json.loads(lines[position]))).replace(b"\n", b" ")
        lines[position] = edited + b"\n"
        return b"".join(lines)
    if kind == "bytes":
        return draw(mutated_bytes(valid, (b"\n", b'"shape": ', b'"type": ')))
    return draw(st.binary(max_size=300))


ITEMS_FILES = st.deferred(_items_files)
MANIFESTS = st.deferred(lambda: documents(json.loads(valid_files()["manifest.json"])))

DEEP = b"[" * 100_000
"""A line (or a manifest) nested far past the interpreter's recursion limit."""
WITHOUT_SHAPE = json.dumps(
    {"index": 0, "input_hash": input_hash("a"), "output": [{"label": "A", "score": 0.5}, ["sad"]]}
).encode()
"""Item 0's line with its shape removed: its output would come back as plain JSON data."""


@fuzz(200)
@given(items=ITEMS_FILES)
@example(items=DEEP)
@example(items=WITHOUT_SHAPE)
def test_any_items_file_resumes_to_declared_outputs_or_a_checkpoint_error(
    resume: Any, items: bytes
) -> None:
    outputs = outcome("checkpoint items.jsonl", lambda: resume(items_jsonl=items))
    if isinstance(outputs, list):
        assert all(is_declared(output) for output in outputs)


@fuzz(100)
@given(manifest=MANIFESTS)
@example(manifest=DEEP)
def test_any_manifest_resumes_or_is_a_checkpoint_error(resume: Any, manifest: bytes) -> None:
    outcome("checkpoint manifest", lambda: resume(manifest_json=manifest))
