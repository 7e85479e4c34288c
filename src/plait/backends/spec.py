"""`ProviderSpec`: every fact plait knows about a provider, declared once in its folder.

A provider's folder (``backends/openai/``, ``backends/anthropic/``,
``backends/local/``) holds a ``spec.py`` whose ``SPEC`` says what the rest
of plait needs without importing the backend: its name, where its backend
class lives, its default API root, which credential it needs, its list
prices, its Batch API, the model-string prefixes that name it and the
endpoint keys it takes. `plait.backends.providers` collects them, and the
configuration, model strings, prices, the endpoint builder and the Batch API
path all read them from there. A spec module imports neither its backend nor
an SDK, so ``import plait`` stays fast.

Example (a hosted OpenAI-compatible service)::

    SPEC = ProviderSpec(
        name="acme",
        backend="acme_provider.backend:AcmeBackend",
        default_url="https://api.acme.example/v1",
        keys=("base_url", "api_key", "api_key_env"),
        example_model="acme-small",
        prices={"acme-small": Price(0.10, 0.40)},
    )
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from plait.backends.types import Price

if TYPE_CHECKING:
    from plait.backends.base import Backend

__all__ = ["ProviderSpec", "endpoint_settings", "needs_nothing"]


def needs_nothing(**settings: Any) -> str | None:
    """The credential rule of a provider that needs none: always None."""
    return None


def endpoint_settings(config: Any, keys: Iterable[str]) -> dict[str, Any]:
    """Returns the usual constructor arguments of an endpoint's backend.

    The model and the timeout when they are set, then each of ``keys`` whose
    value is set (``headers`` as a plain dict when it holds any). A setting
    left unset is not passed, so the backend's own default applies.
    """
    kwargs: dict[str, Any] = {}
    if config.model is not None:
        kwargs["model"] = config.model
    if config.timeout is not None:
        kwargs["timeout"] = config.timeout
    for key in keys:
        value = getattr(config, key)
        if key == "headers":
            if value:
                kwargs[key] = dict(value)
        elif value is not None:
            kwargs[key] = value
    return kwargs


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderSpec:
    """One provider's facts; its folder's ``spec.py`` declares one as ``SPEC``."""

    name: str
    """What ``{"provider": ...}`` says, e.g. ``"openai"``."""
    backend: str
    """Where the backend class lives, as ``"module:Class"``; imported on first use
    (`backend_class`), never by ``import plait``."""
    default_url: str | None = None
    """The API root a call goes to when the endpoint sets no ``base_url``; None
    when there is none (an in-process model) or the SDK chooses it."""
    missing_credential: Callable[..., str | None] = needs_nothing
    """The credential rule: given the backend's constructor arguments, what it
    lacks to make any call ("needs an API key: ..."), or None; the backend
    class's own ``missing_credential`` gives the same answer."""
    prices: Mapping[str, Price] = field(default_factory=lambda: MappingProxyType({}))
    """List prices of its models (standard tier, no caching or batch discounts), by
    the name a model's name starts with (`plait.resources.usage.price_for`)."""
    free: bool = False
    """Every call costs nothing (a model run in-process)."""
    in_process: bool = False
    """Its model runs inside the process that calls it, so each process has its own and
    nothing is shared between them: ``plait serve --workers N`` gives every worker an
    endpoint's whole limits (its own copy of the model), not one N-th of them."""
    batch_api: str | None = None
    """Where its Batch API client lives, as ``"module:Class"`` with a class method
    ``from_endpoint(config)``; None when ``run(..., batch_api=True)`` cannot use it."""
    prefixes: tuple[str, ...] = ()
    """Model-string prefixes that name it (``"openai:gpt-4o-mini"``); its name is
    always one and need not be listed."""
    model_string_key: str = "model"
    """The entry key that what follows the prefix fills (``"model_path"`` for
    ``"local:/models/x.gguf"``)."""
    example_model: str | None = None
    """A model name shown in error messages; None means the provider needs no
    ``model`` key (the embedded model)."""
    keys: tuple[str, ...] = ()
    """The endpoint keys it takes beyond every endpoint's (`EndpointConfig` fields)."""
    defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Settings its endpoints get unless their entry sets them."""
    arguments: Callable[[Any], dict[str, Any]] | None = None
    """Builds its backend's constructor arguments from an `EndpointConfig`; None
    passes `endpoint_settings` of its ``keys``."""
    cache_keys: tuple[str, ...] = ()
    """Endpoint settings that, besides the model, decide a reply (``model_path``),
    so the response cache keys on them."""

    def backend_class(self) -> type[Backend]:
        """Returns the backend class, importing its module only now."""
        cls: type[Backend] = _load(self.backend)
        return cls

    def batch_client(self, config: Any) -> Any:
        """Returns a Batch API client for an endpoint (`batch_api` must be set)."""
        assert self.batch_api is not None  # the caller checked
        return _load(self.batch_api).from_endpoint(config)

    def backend_arguments(self, config: Any) -> dict[str, Any]:
        """Returns the arguments its backend is built with (``backend_options`` come after)."""
        if self.arguments is not None:
            return self.arguments(config)
        return endpoint_settings(config, self.keys)


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
