"""The ``plait`` group and its commands as modules: each command in one module of its own,
loaded only when that command is named, and loading them all (what ``plait --help`` does)
loads none of the commands' work. What a module loads is checked by name, not timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import SRC

WORK = (
    "plait.backends",
    "plait.distributed",
    "plait.execution",
    "plait.mcp",
    "plait.optimization",
    "plait.report",
    "plait.resources",
    "plait.serve",
)
"""What a command needs only once it runs: loaded by its function, never by its module."""


OTHER_COMMANDS = tuple(
    f"plait.cli.commands.{name}"
    for name in ("eval", "graph", "mcp", "report", "serve", "state", "train")
)
"""What ``plait run`` never loads: the other commands' modules, and what they alone import
(serve's brings `plait.cli.collection`, for one)."""

NOT_FOR_HELP = (*OTHER_COMMANDS, "asyncio", "traceback")
"""What ``plait run --help`` (and a usage error found before the run) never loads: asyncio
(with ssl, subprocess and logging) only once the run starts, traceback only once a program
failed to load."""

NOT_FOR_A_PLAIN_RUN = (
    *OTHER_COMMANDS,
    "plait.signatures",
    "plait.execution.structured",
    "secrets",
    "hashlib",
)
"""What a run of a program whose ``forward`` names its inputs and returns text never loads:
signatures (their parser and adapters) only for a program driven by one, such as
``Predict``; structured output only for a typed reply or a checkpointed class; hashlib
(OpenSSL's load) only for a checkpoint holding media, a response cache and the like."""

LOADED_BY = """
import json, sys
import plait.cli

try:
    plait.cli.main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""

PLAIN = """
from plait import LLMInference, Module

class Summarize(Module):
    def __init__(self):
        super().__init__()
        self.summary = LLMInference("llm", "Summarize in one line.")

    def forward(self, text):
        return self.summary(text)
"""


def loaded_by_plait(*args: str, cwd: Path | None = None) -> list[str]:
    """Returns the modules a fresh interpreter has loaded once ``plait ARGS`` is done."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, "-c", LOADED_BY, *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120, check=True)  # fmt: skip
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_plait_run_help_loads_no_other_commands_module_nor_asyncio() -> None:
    loaded = loaded_by_plait("run", "--help")

    assert "plait.cli.commands.run" in loaded
    assert [m for m in loaded if m.startswith(NOT_FOR_HELP)] == []


def test_a_plain_plait_run_loads_no_other_command_nor_signatures(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text(PLAIN)
    (tmp_path / "res.toml").write_text('["*"]\nprovider = "test"\n')
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')

    loaded = loaded_by_plait("run", "plain.py:Summarize", "-i", "in.jsonl", "-o", "out.jsonl",
                             "-r", "res.toml", "--no-progress", cwd=tmp_path)  # fmt: skip

    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2  # it ran
    assert [m for m in loaded if m.startswith(NOT_FOR_A_PLAIN_RUN)] == []


def test_loading_every_command_loads_click_and_none_of_their_work() -> None:
    code = (
        "import json, sys, click, plait.cli.app; "
        "group = plait.cli.app.cli; context = click.Context(group); "
        "[group.get_command(context, name) for name in group.list_commands(context)]; "
        "print(json.dumps([sorted({m.split('.')[0] for m in sys.modules} "
        "- set(sys.stdlib_module_names) - {'__main__', '_distutils_hack'} "
        "- {m for m in sys.modules if m.startswith('_sysconfigdata')}), "
        "sorted(m for m in sys.modules if m.startswith('plait.'))]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(SRC)}, timeout=60, check=True)  # fmt: skip
    outside, loaded = json.loads(done.stdout)

    assert outside == ["click", "plait"]
    assert [m for m in loaded if m.startswith(WORK)] == []


def test_each_command_is_one_module_of_plait_cli_commands() -> None:
    import click

    from plait.cli.app import cli

    context = click.Context(cli)
    commands = {name: cli.get_command(context, name) for name in cli.list_commands(context)}
    homes = {name: command.callback.__module__ for name, command in commands.items()}

    assert sorted(homes) == ["eval", "graph", "mcp", "report", "run", "serve", "state", "train"]
    assert homes == {name: f"plait.cli.commands.{name}" for name in homes}
