"""The code blocks of a Markdown page, and how each one runs in the docs' tests.

A page's fenced blocks run top to bottom in one folder of their own and one Python
namespace, as a reader follows the page:

* ```` ```python ```` runs as written; a top-level ``await`` runs on the page's event loop;
* ```` ```bash ```` / ```` ```sh ```` runs under ``bash -e`` in the folder, with this
  checkout's ``plait`` command first on the PATH;
* ```` ```toml ````, ```` ```json ```` and ```` ```yaml ```` must parse;
* a block with ``title="NAME"`` in its info string is a file the reader saves: it is
  written to NAME in the folder (later blocks use it) and, for data, parsed;
* ```` ```text ```` is what a command prints, not code, and is not run.

A command that runs until stopped (``plait serve``) has ``<!-- docs: background URL -->``
right above it: it starts in the background, the next block runs once URL answers, and it
is stopped when the page ends. A block that cannot run here (it needs a key, a network
service, another program) has the line ``<!-- docs: skip REASON -->`` right above it, and
the reason is shown in the test's output. Nothing else is skipped silently: a block of any other
language fails the test until it is given a runner or a reason.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[1]
FENCE = re.compile(
    r"^(?P<indent> *)```(?P<lang>[\w-]*)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
MARK = re.compile(r"<!-- docs: (?P<kind>skip|background) (?P<argument>[^>]*?) ?-->\s*$")
TITLE = re.compile(r'title="(?P<name>[^"]+)"')
PYTHON, SHELL, DATA, OUTPUT = {"python", "py"}, {"bash", "sh"}, {"toml", "json", "yaml"}, {"text"}


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, the file it is saved as, why it is skipped, where."""

    page: Path
    line: int
    language: str
    body: str
    title: str | None
    skip: str | None
    background: str | None

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """Returns the page's fenced blocks in order, each with its skip reason if marked."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        indent = len(match["indent"])
        body = "".join(line[indent:] + "\n" for line in match["body"].splitlines())
        title = TITLE.search(match["info"])
        found.append(
            Block(
                page=page,
                line=text.count("\n", 0, match.start()) + 1,
                language=match["lang"],
                body=body,
                title=title["name"] if title else None,
                skip=mark["argument"] if mark and mark["kind"] == "skip" else None,
                background=mark["argument"] if mark and mark["kind"] == "background" else None,
            )
        )
    return found


def parse_data(language: str, text: str, where: str) -> None:
    """Parses a data block (or each line of a .jsonl file); raises naming the block."""
    try:
        if language == "toml":
            tomllib.loads(text)
        elif language == "yaml":
            yaml.safe_load(text)
        elif where.endswith(".jsonl"):
            for line in text.splitlines():
                json.loads(line)
        else:
            json.loads(text)
    except ValueError as error:
        raise AssertionError(f"{where}: the {language} block does not parse: {error}") from None


class PageRun:
    """Runs a page's blocks in order in ``folder``, sharing one namespace and event loop."""

    def __init__(self, page: Path, folder: Path) -> None:
        self.page = page
        self.folder = folder
        self.namespace: dict[str, object] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
        self.loop = asyncio.new_event_loop()
        self.skipped: list[str] = []
        self.background: list[subprocess.Popen[str]] = []

    def run(self, block: Block) -> None:
        if block.skip is not None:
            assert len(block.skip.split()) >= 2, f"{block.where}: a skip needs its reason"
            self.skipped.append(f"{block.where}: {block.skip}")
        elif block.background is not None:
            self.start(block, block.background)
        elif block.title is not None:
            path = self.folder / block.title
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body, encoding="utf-8")
            if block.language in DATA:
                parse_data(block.language, block.body, block.title)
        elif block.language in PYTHON:
            self.python(block)
        elif block.language in SHELL:
            self.shell(block)
        elif block.language in DATA:
            parse_data(block.language, block.body, block.where)
        elif block.language not in OUTPUT:
            raise AssertionError(
                f"{block.where}: a ```{block.language} block has no runner: "
                "give it one of the runners, or mark it <!-- docs: skip REASON -->"
            )

    def python(self, block: Block) -> None:
        code = compile(
            block.body,
            block.where,
            "exec",
            flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
            dont_inherit=True,
        )
        result = eval(code, self.namespace)  # the page's own code, from the repository
        if asyncio.iscoroutine(result):
            self.loop.run_until_complete(result)

    def environment(self) -> dict[str, str]:
        """This checkout's plait first: its ``plait`` command and its source."""
        bin_dir = str(Path(sys.executable).parent)
        return {
            **os.environ,
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(self.folder)]),
        }

    def start(self, block: Block, url: str) -> None:
        """Starts a long-running block and waits until ``url`` answers (at most 120 s)."""
        log = self.folder / f"background-{len(self.background)}.log"
        with log.open("w") as output:  # a file, not a pipe: a chatty server never blocks
            process = subprocess.Popen(
                ["bash", "-e", "-c", block.body],
                cwd=self.folder,
                env=self.environment(),
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # its own group: stopping it stops what it started
            )
        self.background.append(process)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert process.poll() is None, (
                f"{block.where}: the background block exited {process.returncode}:\n"
                f"{log.read_text()[-3000:]}"
            )
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        raise AssertionError(f"{block.where}: {url} did not answer within 120 s")

    def shell(self, block: Block) -> None:
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.body],
            cwd=self.folder,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (
            f"{block.where}: the shell block exited {done.returncode}:\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )

    def close(self) -> None:
        for process in self.background:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)  # a Ctrl-C, as the reader stops it
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
