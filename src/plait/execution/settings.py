"""ExecutionSettings: scoped execution options, as an async or a sync context manager.

Settings nest: an inner block overrides only the fields it sets. Priority of
an option for one call, highest first: keyword arguments of the call, the
module's `bind(...)`, the innermost ``ExecutionSettings``, the process-wide
settings of ``plait.settings.configure``, the defaults. ``plait.settings``
is the seed-style façade over this one mechanism: ``context(...)`` *is* an
``ExecutionSettings`` block, and ``configure(...)`` sets the global layer.
`find_resources` is the one rule by which every caller (a bound call,
``plait.run``, backward, an optimizer) finds the resources to use.

Example::

    async with ExecutionSettings(resources=config, streaming=True):
        async for result in pipeline(batch):
            ...
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from plait import _context
from plait.errors import PlaitError, UnknownAliasError
from plait.module import bound_resources

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "DEFAULTS",
    "OPTION_NAMES",
    "ExecutionSettings",
    "check_served",
    "effective_options",
    "find_resources",
    "resources_of",
]


@dataclass
class ExecutionSettings:
    """Options for every bound call made inside the block. None means "not set here"."""

    resources: Any = None
    """A ResourceConfig, ResourceManager or mapping used by modules that are not bound."""
    max_concurrent: int | None = None
    """Most LLM calls in flight at once for one call or batch (endpoint limits apply too)."""
    checkpoint_dir: str | Path | None = None
    """Directory where finished batch items are written, so a rerun resumes."""
    streaming: bool | None = None
    """Batches yield `BatchResult`s as items finish instead of returning a list."""
    preserve_order: bool | None = None
    """Streaming yields results in input order instead of completion order."""
    timeout: float | None = None
    """Seconds one attempt of an LLM call may take: one request to the provider, from
    sending it to the whole reply (overrides the endpoint's ``timeout``). Waiting for
    a slot, for rate limits, for a ``Retry-After`` pause and the backoff between
    retries are not included: bound those with ``deadline``."""
    deadline: float | None = None
    """Seconds the whole call or batch may take, waits and retries included. When it
    passes, the work still running is cancelled: a single call raises
    `DeadlineExceededError`; in a batch each unfinished item fails with it (items that
    finished keep their results, and their checkpoint records)."""
    progress: bool | None = None
    """Show a progress bar for batches (default: when stderr is a terminal)."""
    on_error: str | None = None
    """``raise`` (default): a failed item fails the batch; ``collect``: it becomes its error."""
    cache: bool | None = None
    """False skips the endpoints' response caches (no lookup, no store) for these calls."""
    callbacks: Sequence[Any] | None = None
    """`plait.callbacks.BaseCallback` objects told about every module, LLM, tool and
    adapter call inside (a module's own ``callbacks`` are added for its calls)."""

    def __post_init__(self) -> None:
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {self.max_concurrent}")
        for name in ("timeout", "deadline"):
            seconds = getattr(self, name)
            if seconds is not None and not (
                isinstance(seconds, int | float) and 0 < seconds < math.inf
            ):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {seconds!r}")
        if self.on_error not in (None, "raise", "collect"):
            raise ValueError(f"on_error must be 'raise' or 'collect', got {self.on_error!r}")
        self._tokens: list[contextvars.Token[Any]] = []

    def merged_over(self, outer: ExecutionSettings | None) -> ExecutionSettings:
        """Returns these settings with unset fields taken from ``outer``."""
        if outer is None:
            return self
        values = {
            f.name: getattr(self, f.name)
            if getattr(self, f.name) is not None
            else getattr(outer, f.name)
            for f in fields(self)
        }
        return ExecutionSettings(**values)

    def __enter__(self) -> ExecutionSettings:
        self._tokens.append(_context.SETTINGS.set(self.merged_over(_context.SETTINGS.get())))
        return self

    def __exit__(self, *exc_info: object) -> None:
        _context.SETTINGS.reset(self._tokens.pop())

    async def __aenter__(self) -> ExecutionSettings:
        return self.__enter__()

    async def __aexit__(self, *exc_info: object) -> None:
        self.__exit__(*exc_info)


DEFAULTS: dict[str, Any] = {
    "max_concurrent": 100,
    "checkpoint_dir": None,
    "streaming": False,
    "preserve_order": False,
    "timeout": None,
    "deadline": None,
    "progress": None,
    "on_error": "raise",
    "cache": True,
}
OPTION_NAMES = frozenset(DEFAULTS)
"""Keyword arguments of a call that are execution options, not forward() arguments."""


def effective_options(bound: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
    """Returns the options of one call.

    Priority: call kwargs > bind > the innermost ``ExecutionSettings`` (a
    ``plait.settings.context``) > ``plait.settings.configure`` > defaults.
    """
    options = dict(DEFAULTS)
    for name in OPTION_NAMES:
        value = _context.setting(name)
        if value is not None:
            options[name] = value
    for layer in (bound, call):
        for name, value in layer.items():
            if value is not None:
                options[name] = value
    return options


def find_resources(explicit: Any = None, *, bound: Any = None, module: Any = None) -> Any:
    """Returns the resources a call should use, or None when there are none.

    The one rule, in order: ``explicit`` (a ``resources=`` argument); ``bound``
    (what the caller was bound to: `Module.bind`, ``Optimizer.bind``); the one
    set of resources that every bound module below ``module`` shares (so a
    `TrainingStep` or a wrapper around a bound program finds the program's);
    the resources of ``module``'s nearest bound ancestor (so a child of a bound
    pipeline can be called alone); the innermost ``ExecutionSettings``
    (``plait.settings.context``); the global ``plait.settings.configure``.
    The module part is `plait.module.bound_resources`.
    """
    if explicit is not None:
        return explicit
    if bound is not None:
        return bound
    if module is not None:
        found = bound_resources(module)
        if found is not None:
            return found
    return _context.setting("resources")


def check_served(resources: Any, alias: str, *, who: str, setting: str) -> None:
    """Raises before any call when ``resources`` do not serve ``alias``, which ``who`` calls.

    For the calls a search or a Trainer makes outside the program (proposals,
    rewrites, optimizer updates): found only when the first of them is made, the
    error would come after the program's own calls were paid for.

    Args:
        who: the calls, in words ("RandomSearch's instruction proposals").
        setting: how to name another alias ("RandomSearch(..., alias=...)").

    Raises:
        UnknownAliasError: no entry and no ``"*"``; says who calls it and how to fix it.
    """
    # import time: `import plait.execution` stays without the resource layer
    from plait.resources import ResourceConfig, ResourceManager

    config = resources.config if isinstance(resources, ResourceManager) else resources
    if isinstance(config, Mapping):
        config = ResourceConfig(config)
    if not isinstance(config, ResourceConfig) or alias in config:
        return
    error = UnknownAliasError(alias, config.aliases())
    served = ", ".join(repr(name) for name in config.aliases()) or "none"
    error.args = (
        f"{who} call the alias {alias!r}, which the resources do not serve (they serve: "
        f"{served}); set {setting} to one of those, or add an entry {alias!r} (or '*') to "
        "the resources",
    )
    raise error


def resources_of(program: Any, explicit: Any = None, *, who: str, takes: str) -> Any:
    """Returns the resources a run of ``program`` uses (`find_resources`), or says how to give some.

    ``who`` names what needs them in the message (the program, or a search
    compiling it) and ``takes`` what accepts ``resources=`` there
    (``plait.run``, ``compile()``).

    Raises:
        PlaitError: there are none; the message lists every way to give them.
    """
    found = find_resources(explicit, bound=program._bound_resources, module=program)
    if found is None:
        raise PlaitError(
            f"{who} has no resources: bind them with program.bind(config), use "
            f"`async with ExecutionSettings(resources=config)`, or pass resources= to {takes}"
        )
    return found
