"""plait.settings: defaults for every run, set globally or for a block.

One mechanism, three scopes, highest first for a given call:

1. the call's own keyword arguments (``await program(x, timeout=5)``);
2. the module's `bind(resources, ...)`;
3. the innermost ``with plait.settings.context(...)`` — an `ExecutionSettings`
   block, task- and thread-safe (it lives in a ContextVar), nestable;
4. ``plait.settings.configure(...)`` — process-wide;
5. plait's defaults.

``context(...)`` *is* ``ExecutionSettings(...)``: the two names exist for
code that says "settings context" and for plait's own docs. Both take the
execution options (``max_concurrent``, ``timeout``, ``deadline``, ``cache``,
``checkpoint_dir`` …), ``resources`` and ``callbacks``, and ``lm=`` as a
synonym of resources serving every alias (``LM(model=...,
api_key=...)`` and ``OpenAILM(client, ...)`` from `plait.porting` give one).
``configure()`` with no options reads ``UDSPY_LM_MODEL``,
``UDSPY_LM_API_KEY`` and ``UDSPY_LM_BASE_URL``::

    import plait
    plait.settings.configure(lm={"provider": "local"}, callbacks=[Log()])
    with plait.settings.context(lm=MyBackend(), timeout=30):
        await program(x)                 # MyBackend, Log, 30 s per attempt
    plait.settings.resources             # what applies here, as a call would see it
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from plait import _context
from plait.errors import ConfigError
from plait.execution.settings import ExecutionSettings
from plait.porting import environment_lm, is_openai_client

__all__ = ["configure", "context", "reset"]

_NAMES = frozenset(f.name for f in fields(ExecutionSettings))


def configure(**options: Any) -> None:
    """Sets process-wide defaults; later calls change only the options they name.

    Args:
        **options: `ExecutionSettings` fields (``resources``, ``callbacks``,
            ``timeout`` …) and ``lm`` (what serves every alias: a provider
            mapping such as ``{"provider": "local"}`` or
            ``plait.porting.LM(model=...)``, a `Backend` instance or class, a
            ResourceConfig or a ResourceManager). With none, ``lm`` comes from
            the ``UDSPY_LM_*`` environment variables, so ported scripts need no edit.

    Raises:
        TypeError: an option that is not a setting (all are listed).
        ConfigError: ``lm=`` is an OpenAI client (the message says what to
            write), or no option was given and ``UDSPY_LM_MODEL`` is not set.
    """
    if not options:
        options = {"lm": environment_lm()}
    layer = ExecutionSettings(**_settings_of(options))
    _context.GLOBAL_SETTINGS[0] = layer.merged_over(_context.GLOBAL_SETTINGS[0])


def context(**options: Any) -> ExecutionSettings:
    """Returns a block that overrides the settings inside it (``with`` or ``async with``).

    Takes the same options as `configure`.
    """
    return ExecutionSettings(**_settings_of(options))


def reset() -> None:
    """Forgets everything `configure` set (the defaults apply again)."""
    _context.GLOBAL_SETTINGS[0] = None


def __getattr__(name: str) -> Any:
    """``plait.settings.resources``, ``.callbacks``, ``.timeout`` …: the value in effect here."""
    if name == "lm":
        name = "resources"
    if name not in _NAMES:
        raise AttributeError(f"plait.settings has no setting {name!r}; settings: {_listing()}")
    return _context.setting(name)


def _settings_of(options: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - _NAMES - {"lm"})
    if unknown:
        raise TypeError(f"unknown setting(s) {', '.join(map(repr, unknown))}; known: {_listing()}")
    if "lm" in options:
        if options.get("resources") is not None:
            raise TypeError("pass lm= or resources=, not both (lm= is resources for every alias)")
        options = dict(options)
        options["resources"] = _resources_for_lm(options.pop("lm"))
    return options


def _resources_for_lm(lm: Any) -> Any:
    """Returns the resources of ``lm=``: one endpoint that serves every alias (``"*"``)."""
    # import time: the resource layer loads with the first `lm=`
    from plait.resources import ResourceConfig, ResourceManager

    if lm is None or isinstance(lm, ResourceConfig | ResourceManager):
        return lm
    if is_openai_client(lm):
        raise ConfigError(
            f"lm= got an openai.{type(lm).__name__} client, which names no model; write "
            'lm=OpenAILM(client, model="gpt-4o-mini") (from plait.porting), or '
            'lm={"provider": "openai", "model": ..., "base_url": ..., "api_key_env": ...}'
        )
    # A string is a model string ("openai:gpt-4o-mini", "local"), read by ResourceConfig.
    endpoint = dict(lm) if isinstance(lm, dict) else lm if isinstance(lm, str) else {"provider": lm}
    return ResourceConfig({"*": endpoint})


def _listing() -> str:
    return ", ".join(sorted(_NAMES | {"lm"}))
