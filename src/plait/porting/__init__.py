"""Thin adapters for code written against the seeds' spellings (see ``docs/how-to/porting.md``).

plait's own API is the primary one; where a seed spells a thing differently
and no alias on plait's own objects can carry the spelling, the adapter lives
here. Each is a few lines over plait's API and says which seed it serves:
seed 000's ``get_execution_settings`` and ``get_trace_context``; dsprrr's
``signature`` (seed 002); udspy's ``LM``, ``OpenAILM``, its ``UDSPY_LM_*``
variables and ``with_callbacks`` (seed 003, whose module paths ``udspy.callback``
and ``udspy.adapter`` are `plait.callback` and `plait.adapter`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from plait import _context
from plait.errors import ConfigError

__all__ = [
    "LM",
    "OpenAILM",
    "environment_lm",
    "get_execution_settings",
    "get_trace_context",
    "is_openai_client",
    "signature",
    "with_callbacks",
]

# udspy's variables for ``settings.configure()`` with no arguments (seed 003).
MODEL_ENV = "UDSPY_LM_MODEL"
API_KEY_ENV = "UDSPY_LM_API_KEY"
BASE_URL_ENV = "UDSPY_LM_BASE_URL"


def get_execution_settings() -> Any:
    """Returns the `ExecutionSettings` in effect here, or None when none are (seed 000).

    The innermost ``ExecutionSettings`` block (``plait.settings.context``)
    with what it leaves unset taken from ``plait.settings.configure``: the
    values every call made here starts from (a ``bind`` and the call's own
    options still come first). Reading it changes nothing.
    """
    scoped = _context.SETTINGS.get()
    configured = _context.GLOBAL_SETTINGS[0]
    return configured if scoped is None else scoped.merged_over(configured)


def get_trace_context() -> Any:
    """Returns the trace being recorded here, or None outside tracing (seed 000).

    While a program is traced, a module call is recorded on it
    (``record_call(module, args, kwargs)``) instead of running.
    """
    return _context.current_trace()


def signature(text: str, instructions: str | None = None) -> Any:
    """Returns the signature a string describes: dsprrr's ``signature("question -> answer")``.

    The same as `plait.Signature.from_string`; dsprrr's type words are
    understood too (``string``, ``integer``, ``number``, ``boolean``,
    ``enum('a', 'b')``)::

        sig = signature("text -> sentiment: enum('positive', 'negative', 'neutral')")

    Raises:
        SignatureSyntaxError: the text is malformed (the message shows where).
    """
    from plait.signatures import Signature  # import time: signatures only for a signature string

    return Signature.from_string(text, instructions=instructions)


# ------------------------------------------------------------------ seed 003's LM layer
def LM(
    model: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    **endpoint: Any,
) -> dict[str, Any]:
    """Returns the endpoint udspy's ``LM(model=..., api_key=...)`` names, for ``lm=`` (seed 003).

    plait has no LM objects: what serves a module is an endpoint of the
    resources, which brings limits, retries, the cache and usage. So this
    returns its settings, an OpenAI-compatible endpoint, for
    ``plait.settings.configure(lm=LM(...))``, ``settings.context(lm=...)`` or
    an entry of a `ResourceConfig`::

        plait.settings.configure(lm=LM(model="gpt-4o-mini", api_key="sk-..."))

    Like udspy, what is not given comes from the environment: the model from
    ``UDSPY_LM_MODEL``, the server from ``UDSPY_LM_BASE_URL`` (else OpenAI's),
    and the key, read when the endpoint is built (never copied into the
    settings), from ``OPENAI_API_KEY``, else ``UDSPY_LM_API_KEY``. The model
    name is sent as it is, unless it starts with a provider as DSPy and
    pydantic-ai write it (``"openai/gpt-4o-mini"``, ``"anthropic:claude-…"``;
    see `plait.resources.model_strings`); for another provider's
    OpenAI-compatible API, give its ``base_url``.

    Args:
        model: the model name.
        api_key: the key (kept out of every repr).
        base_url: the API root, e.g. ``http://localhost:11434/v1``.
        **endpoint: other endpoint settings (``max_concurrent``, ``rpm``,
            ``timeout`` …; see `plait.resources.ResourceConfig`).

    Raises:
        ConfigError: no model was given and ``UDSPY_LM_MODEL`` is not set.
    """
    model = model or os.environ.get(MODEL_ENV)
    if not model:
        raise ConfigError(
            f"LM() needs a model: pass LM(model='gpt-4o-mini', ...) or set {MODEL_ENV}"
        )
    settings = _model_entry(model)
    base_url = base_url or os.environ.get(BASE_URL_ENV)
    if base_url:
        settings["base_url"] = base_url
    if api_key is not None:
        settings["api_key"] = api_key
    elif os.environ.get(API_KEY_ENV) and not os.environ.get("OPENAI_API_KEY"):
        settings["api_key_env"] = API_KEY_ENV
    return {**settings, **endpoint}


def _model_entry(model: str) -> dict[str, Any]:
    """Returns the endpoint a model name stands for: a provider's it names, else OpenAI's."""
    # import time: the resource layer only for a model name
    from plait.resources.model_strings import entry_for, names_provider

    if not names_provider(model):
        return {"provider": "openai", "model": model}
    return entry_for(model)[1]  # a known provider and a model: nothing to refuse


def OpenAILM(
    client: Any, model: str | None = None, *, default_model: str | None = None, **endpoint: Any
) -> dict[str, Any]:
    """Returns the endpoint of udspy's ``OpenAILM(client, default_model=...)``, for ``lm=``.

    The client's server and key (and organization and project, when set)
    become an OpenAI-compatible endpoint of the resources; plait makes the
    calls itself, with the endpoint's timeouts and retries, not the client's::

        client = AsyncOpenAI(api_key="sk-...")
        plait.settings.configure(lm=OpenAILM(client, default_model="gpt-4o"))

    Args:
        client: an ``openai.AsyncOpenAI`` (or ``OpenAI``) client.
        model: the model name (seed 003 also writes it ``default_model=``).
        **endpoint: other endpoint settings, as for `LM`.

    Raises:
        ConfigError: ``client`` is not an OpenAI client, or no model is given.
    """
    if not is_openai_client(client):
        raise ConfigError(
            f"OpenAILM(client, model) takes an openai.AsyncOpenAI client, got "
            f"{type(client).__name__}; for settings alone write LM(model=..., base_url=...)"
        )
    model = model or default_model
    if not model:
        raise ConfigError("OpenAILM needs a model: OpenAILM(client, default_model='gpt-4o-mini')")
    headers = {
        name: value
        for name, value in (
            ("OpenAI-Organization", getattr(client, "organization", None)),
            ("OpenAI-Project", getattr(client, "project", None)),
        )
        if value
    }
    settings: dict[str, Any] = {
        "provider": "openai",
        "model": model,
        "base_url": str(client.base_url).rstrip("/"),
    }
    if client.api_key:
        settings["api_key"] = client.api_key
    if headers:
        settings["headers"] = headers
    return {**settings, **endpoint}


def environment_lm() -> dict[str, Any]:
    """Returns the endpoint udspy's ``settings.configure()`` reads from ``UDSPY_LM_*`` variables.

    Raises:
        ConfigError: ``UDSPY_LM_MODEL`` is not set (there is nothing to configure).
    """
    if not os.environ.get(MODEL_ENV):
        raise ConfigError(
            f"plait.settings.configure() was called with no settings, and {MODEL_ENV} is not "
            f"set; pass what to set (e.g. lm={{'provider': 'openai', 'model': ...}}) or set "
            f"{MODEL_ENV} (with {API_KEY_ENV} and {BASE_URL_ENV}) to configure from the "
            "environment"
        )
    return LM()


def is_openai_client(value: Any) -> bool:
    """Whether ``value`` is a client of the ``openai`` package (checked without importing it)."""
    return type(value).__module__.split(".")[0] == "openai" and hasattr(value, "chat")


def with_callbacks(method: Callable[..., Any]) -> Callable[..., Any]:
    """udspy's decorator that reports a module's calls to callbacks; plait does it itself.

    plait tells callbacks about every module call (the program, each node,
    each child a module calls), so on ``forward`` this changes nothing and
    the seed's code runs as written.

    Raises:
        TypeError: the method is not ``forward``: plait calls no other method
            as a module call, so the decorator would report nothing.
    """
    name = getattr(method, "__name__", repr(method))
    if name != "forward":
        raise TypeError(
            f"@with_callbacks on {name!r}: plait reports every module call (its forward) to "
            "callbacks itself, so the decorator belongs on forward, where it changes nothing; "
            "rename the seed's aexecute to forward, or remove it (report a call of your own "
            "with plait.callbacks.ReportedCall)"
        )
    return method
