"""The ``plait`` group and its commands as modules: each command in one module of its own,
and loading them all (what ``plait --help`` does) loads none of the commands' work."""

from __future__ import annotations

import json
import subprocess
import sys

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


def test_loading_every_command_loads_click_and_none_of_their_work() -> None:
    code = (
        "import json, sys, plait.cli.app; "
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
    from plait.cli.app import cli

    homes = {name: command.callback.__module__ for name, command in cli.commands.items()}

    assert sorted(homes) == ["eval", "graph", "mcp", "report", "run", "serve", "state", "train"]
    assert homes == {name: f"plait.cli.commands.{name}" for name in homes}
