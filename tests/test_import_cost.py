"""``import plait`` stays cheap: what it loads is checked by name, not timed.

A program that only imports plait, defines modules (``async def forward``
too) and calls one without an LLM inside needs the core package and `typing`,
nothing heavier. Each module named below costs milliseconds that such a
program would pay for nothing (`inspect` alone brings ast, dis and tokenize,
a fifth of the import); a change that loads one at import fails here, and the
fix is to load it where it is first needed, with its ``# import time:`` reason.
"""

from __future__ import annotations

import subprocess
import sys

NOT_LOADED = (
    # the runtime and the layers above the core: loaded by the first run
    "asyncio",
    "concurrent",
    "threading",
    "socket",
    "ssl",
    "http",
    "json",
    "logging",
    "pydantic",
    "pydantic_core",
    "plait.execution",
    "plait.resources",
    "plait.tracing",
    "plait.optimization",
    # what dataclasses and inspect bring (Value, ValueRef and the core are plain classes)
    "dataclasses",
    "inspect",
    "ast",
    "dis",
    "tokenize",
    "linecache",
    "copy",
    # loaded only once something failed, or on first use
    "traceback",
    "textwrap",
    "plait.feedback",
    "plait.module_state",
)

CORE = {
    "plait",
    "plait._context",
    "plait._lazy",
    "plait._sync_entry",
    "plait.containers",
    "plait.errors",
    "plait.module",
    "plait.parameter",
    "plait.values",
}
"""The plait modules ``import plait`` loads; a new one here is a decision, not an accident."""

PROGRAM = """
import sys

before = set(sys.modules)
import plait


class Echo(plait.Module):
    def forward(self, text):
        return text


class Later(plait.Module):
    async def forward(self, text):
        return text


llm = plait.LLMInference("fast", system_prompt="Answer briefly.")
Echo()("hi")
loaded = sorted(set(sys.modules) - before)
print(" ".join(loaded))
"""


def loaded_by_import() -> list[str]:
    """Returns the modules a fresh interpreter loads for `PROGRAM`."""
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_import_and_defining_modules_load_nothing_heavy() -> None:
    loaded = loaded_by_import()
    heavy = [
        name
        for name in NOT_LOADED
        if any(module == name or module.startswith(name + ".") for module in loaded)
    ]
    assert heavy == [], f"`import plait` now loads {heavy}: load them where first needed"


def test_import_loads_only_the_core_of_plait() -> None:
    ours = {name for name in loaded_by_import() if name.split(".")[0] == "plait"}
    assert ours == CORE
