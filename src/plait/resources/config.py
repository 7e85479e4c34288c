# size: the checker of every endpoint key, fallback chains, and the file readers.
"""`ResourceConfig`: which endpoint serves each alias, and with what limits.

A program names the models it uses by alias (``"fast"``, ``"judge"``); the
configuration maps each alias to an endpoint: a provider, a model and the
limits, retries, prices and budget that apply to it. It is validated when it
is built, and every problem is reported at once, each naming its alias and
key, so a malformed file is fixed in one pass.

Example::

    config = ResourceConfig({
        "fast": {"provider": "openai", "model": "gpt-4o-mini", "max_concurrent": 10},
        "judge": {"provider": "anthropic", "model": "claude-3-5-haiku", "rpm": 50},
        "*": {"provider": "local"},       # every other alias: the embedded model
    })
    config.resolve("fast").max_concurrent   # 10
    config.resolve("summarise").provider    # 'local' (through "*")

An entry may also be a model string (``"fast": "openai:gpt-4o-mini"``, see
`plait.resources.model_strings`), or a fallback chain of other aliases
(``"smart": {"fallback": ["primary", "backup"]}``): a call that fails on one
endpoint of the chain after its retries goes to the next (`ResourceManager`).
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import re
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from plait._jsontext import loads
from plait.backends import providers
from plait.backends._bounded import DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_RESPONSE_BYTES
from plait.backends._urls import redact_url
from plait.backends.base import Backend
from plait.errors import ConfigError, UnknownAliasError
from plait.resources import validation as check
from plait.resources.model_strings import entry_for
from plait.resources.state.url import StateURL
from plait.resources.usage import Price, price_for
from plait.resources.validation import suggestion as _suggest

if TYPE_CHECKING:
    from pathlib import Path

    from plait.backends.spec import ProviderSpec

__all__ = [
    "PROVIDERS",
    "WILDCARD",
    "EndpointConfig",
    "ResourceConfig",
    "allow_api_key_env",
    "register_provider",
]

WILDCARD = "*"
"""The alias that serves every alias not listed explicitly."""

PROVIDERS = tuple(providers.names())
"""The built-in providers' names; `plait.backends.providers.names` lists every
provider an endpoint may use, those added with `providers.register` too."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointConfig:
    """The validated settings of one endpoint; built by `ResourceConfig`, never by hand.

    Unset limits are None and mean "no limit". Secrets (``api_key``,
    ``headers``, ``backend_options``) are left out of the repr, and
    ``base_url`` is shown with any credentials inside it masked.
    """

    name: str
    """The alias this entry is listed under in the configuration (may be ``"*"``)."""
    provider: str
    """``openai``, ``anthropic``, ``local``, another provider's (`plait.backends.providers`), a
    name given to `register_provider`, or the ``module.Class`` name of a user-written backend."""
    model: str | None = None
    """Model name sent to the provider; optional for ``local``."""
    max_concurrent: int | None = None
    """Calls in flight at once on this endpoint."""
    rpm: float | None = None
    """Requests per minute."""
    tpm: float | None = None
    """Tokens (prompt + completion) per minute."""
    timeout: float | None = 60.0
    """Seconds for one attempt of a call; None waits forever."""
    max_retries: int = 3
    """Retries after the first attempt for retryable failures (429, 5xx, timeouts)."""
    retry_base_delay: float = 0.5
    """First backoff delay in seconds; it doubles on each retry."""
    retry_max_delay: float = 30.0
    """Upper bound of one backoff delay, in seconds."""
    max_retry_after: float = 60.0
    """The longest wait, in seconds, a provider's ``Retry-After`` may ask for: a
    longer one means a quota that will not come back within the run, so that
    call fails at once instead of sleeping, and the endpoint is not paused for
    it (an ``inf`` or absurd header cannot stall the program)."""
    adaptive: bool = True
    """Lower the endpoint's rate on repeated 429s and recover it on success."""
    price: Price | None = None
    """Dollars per million tokens; None uses the built-in table (`price_for`)."""
    budget: float | None = None
    """Dollars this endpoint may spend; later calls raise `BudgetExceededError`."""
    cache: bool | str | Mapping[str, Any] = False
    """Response cache: False, True (default file), a path to the SQLite file, or
    ``{"path": ..., "memory_entries": ...}``; see `plait.resources.cache`."""
    base_url: str | None = None
    """API root of a remote provider, e.g. ``https://api.openai.com/v1``; may hold a
    credential (``user:key@`` or ``?api-key=``), which reprs and errors mask."""
    api_key: str | None = field(default=None, repr=False)
    api_key_env: str | None = None
    """Environment variable the key is read from when ``api_key`` is not given. A
    configuration file may only name one that looks like a credential (see
    `allow_api_key_env`)."""
    transport: str | None = None
    """OpenAI-compatible transport: ``http`` (plait's own client, default) or ``sdk``."""
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY, repr=False)
    """Extra HTTP headers sent with every request (may hold secrets)."""
    max_connections: int | None = None
    """Connection pool size; defaults to ``max_concurrent``."""
    dialect: str | None = None
    """OpenAI-compatible server variant: ``openai`` or ``llama_cpp``; None detects it."""
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    """The largest reply body read from an ``openai`` endpoint, and the longest line of
    its Batch API result files (64 MiB); a larger one fails its call, not retried."""
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    """The most data one event of an ``openai`` endpoint's stream may hold (16 MiB)."""
    circuit_failures: int = 5
    """Consecutive failed calls after which a fallback chain skips this endpoint
    for ``circuit_cooldown`` seconds (its circuit opens); only chains keep it."""
    circuit_cooldown: float = 30.0
    """Seconds an open circuit skips the endpoint; then one call probes it, and
    its success closes the circuit (a failure opens it for another cool-down)."""
    model_path: str | None = None
    """GGUF file for the ``local`` provider; None uses the embedded model."""
    n_ctx: int | None = None
    """Context window for the ``local`` provider."""
    backend_options: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, repr=False)
    """Extra keyword arguments passed to the backend's constructor as they are
    (e.g. ``n_threads`` for ``local``); only parameters the endpoint has no key for."""
    backend: Any = field(default=None, repr=False)
    """A user-written backend: its class (built per manager, with ``backend_options``)
    or an instance (used as it is); None for the built-in providers."""

    @property
    def effective_price(self) -> Price | None:
        """The configured price, else the built-in one for the model, else None."""
        return self.price if self.price is not None else price_for(self.provider, self.model)

    def describe(self) -> str:
        """Returns a one-line summary of the settings that differ from the defaults."""
        parts = [self.provider if self.model is None else f"{self.provider}:{self.model}"]
        for f in fields(self):
            if f.name in _NOT_DESCRIBED:
                continue
            value = getattr(self, f.name)
            if value != f.default:
                parts.append(f"{f.name}={_shown(f.name, value)!r}")
        return " ".join(parts)

    def __repr__(self) -> str:
        shown = (
            f"{f.name}={_shown(f.name, getattr(self, f.name))!r}" for f in fields(self) if f.repr
        )
        return f"EndpointConfig({', '.join(shown)})"


def _shown(name: str, value: Any) -> Any:
    """Returns a setting as reprs and messages may show it: a URL without its credentials."""
    return redact_url(value) if name == "base_url" and isinstance(value, str) else value


_NOT_DESCRIBED = frozenset(
    {"name", "provider", "model", "api_key", "headers", "backend_options", "backend"}
)


# -- validation -----------------------------------------------------------------------
# The keys each provider takes, each with its checker (`plait.resources.validation`).

_COMMON: dict[str, check.Checker] = {
    "model": check.text,
    "max_concurrent": check.positive_int,
    "rpm": check.positive_number,
    "tpm": check.positive_number,
    "timeout": check.positive_number,
    "max_retries": check.non_negative_int,
    "retry_base_delay": check.non_negative_number,
    "retry_max_delay": check.positive_number,
    "max_retry_after": check.positive_number,
    "adaptive": check.flag,
    "price": check.price,
    "budget": check.non_negative_number,
    "cache": check.cache,
    "backend_options": check.options,
    "circuit_failures": check.positive_int,
    "circuit_cooldown": check.positive_number,
}
_OWN: dict[str, check.Checker] = {
    "base_url": check.base_url,
    "api_key": check.secret,
    "api_key_env": check.text,
    "transport": check.transport,
    "headers": check.headers,
    "max_connections": check.positive_int,
    "dialect": check.dialect,
    "max_response_bytes": check.positive_int,
    "max_event_bytes": check.positive_int,
    "model_path": check.path,
    "n_ctx": check.positive_int,
}
"""The keys a provider takes when its spec lists them (`ProviderSpec.keys`)."""
_CHECKERS: dict[str, tuple[ProviderSpec, dict[str, check.Checker]]] = {}


def _checkers(provider: str) -> dict[str, check.Checker]:
    """Returns the keys an endpoint of ``provider`` takes, each with its checker."""
    spec = providers.get(provider)
    assert spec is not None  # the caller checked
    cached = _CHECKERS.get(provider)
    if cached is not None and cached[0] is spec:
        return cached[1]
    unknown = [key for key in spec.keys if key not in _OWN]
    if unknown:
        raise ConfigError(
            f"provider {provider!r}: its ProviderSpec lists key(s) {_quote_list(unknown)}, "
            f"which no endpoint has; the keys it may list: {_quote_list(sorted(_OWN))}"
        )
    checkers = {**_COMMON, **{key: _OWN[key] for key in spec.keys}}
    _CHECKERS[provider] = (spec, checkers)
    return checkers


def _quote_list(names: list[str] | tuple[str, ...]) -> str:
    return ", ".join(repr(n) for n in names)


def _check_key(
    where: str,
    key: str,
    value: Any,
    checker: check.Checker,
    problems: list[str],
    values: dict[str, Any],
) -> None:
    """Stores the checked ``value`` of ``key`` in ``values``, or notes its problem."""
    error, clean = checker(value)
    if error is not None:
        problems.append(f"{where}: key {key!r} {error}")
    else:
        values[key] = clean


def _validate_entry(
    alias: str, entry: Any, problems: list[str], from_file: bool
) -> EndpointConfig | None:
    """Checks one alias entry, appending a line per problem; returns it when valid."""
    where = f"alias {alias!r}"
    if isinstance(entry, str):
        error, entry = entry_for(entry, _REGISTERED)
        if error is not None:
            problems.append(f"{where}: {error}")
            return None
    if not isinstance(entry, Mapping):
        problems.append(
            f'{where}: expected a mapping like {{"provider": "openai", "model": ...}} '
            f'or a model string like "openai:gpt-4o-mini", got {type(entry).__name__}'
        )
        return None
    provider = entry.get("provider")
    if provider is None:
        problems.append(f"{where}: missing key 'provider'; one of {_quote_list(providers.names())}")
        return None
    if _user_backend(provider) is not None:
        return _validate_user_entry(alias, entry, problems)
    spec = providers.get(provider)
    if spec is None:
        problems.append(
            f"{where}: unknown provider {provider!r} in key 'provider'; known: "
            f"{_quote_list(_known_providers())}{_suggest(str(provider), _known_providers())} "
            "(or a Backend subclass, an instance of one, or a name given to register_provider)"
        )
        return None
    checkers = _checkers(spec.name)
    before = len(problems)
    values: dict[str, Any] = dict(spec.defaults)
    for key, value in entry.items():
        if key == "provider":
            continue
        checker = checkers.get(key) if isinstance(key, str) else None
        if checker is None:
            problems.append(f"{where}: {_unknown_key_text(key, provider)}")
            continue
        if value is None:  # an explicit null means "not set" (YAML ``rpm: null``)
            continue
        _check_key(where, key, value, checker, problems, values)
    variable = values.get("api_key_env")
    if from_file and variable is not None and not _may_send(variable):
        problems.append(f"{where}: key 'api_key_env' {_not_a_credential(variable)}")
    if spec.example_model is not None and entry.get("model") is None:
        problems.append(
            f"{where}: missing key 'model' (required for provider {spec.name!r}), "
            f'e.g. "model": "{spec.example_model}"'
        )
    if values.get("backend_options"):
        for problem in _backend_option_problems(spec.name, values["backend_options"]):
            problems.append(f"{where}: key 'backend_options' {problem}")
    if len(problems) > before:
        return None
    endpoint = EndpointConfig(name=alias, provider=spec.name, **values)
    if endpoint.budget is not None and endpoint.effective_price is None:
        problems.append(
            f"{where}: key 'budget' is set but the price of model {endpoint.model!r} is "
            'unknown; add "price": {"input": <$ per Mtok>, "output": <$ per Mtok>}'
        )
        return None
    return endpoint


def _backend_option_problems(provider: str, options: Mapping[str, Any]) -> list[str]:
    """Returns a line per backend option the provider's backend would refuse.

    Checked now rather than at the first call, which may come an hour into a
    run. The backend's module is imported here, and only for a configuration
    that sets ``backend_options``, so ``import plait`` stays light.
    """
    from plait.resources.endpoint import backend_class  # cycle: endpoint.py imports this module

    return _option_problems(backend_class(provider), _checkers(provider), options)


def _option_problems(cls: type, own: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
    """Returns a line per option that ``cls``'s constructor would refuse or that ``own`` sets."""
    parameters = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    accepted = [
        name
        for name, p in parameters.items()
        if name not in own and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    problems = []
    for name in options:
        if name in own or name == "provider":
            problems.append(
                f"sets {name!r}, which is a key of the endpoint itself; "
                f"write {name!r} next to 'provider' instead"
            )
        elif name not in accepted and not takes_any:
            known = _quote_list(accepted) if accepted else "none besides the endpoint's own keys"
            problems.append(
                f"has {name!r}, which {cls.__name__} does not take{_suggest(name, accepted)} "
                f"(it takes: {known})"
            )
    return problems


# -- which environment variables a file may send as a key ---------------------------------
# A configuration file chooses both where requests go (base_url) and which variable's
# value rides along as the Bearer key (api_key_env). Read from an untrusted place, it
# could otherwise send any variable of the environment (a database URL, another
# service's password) to a server of its choosing. So a file may only name variables
# that are meant to be keys; the program can allow others by name, and a mapping
# built in code, written by the program itself, may name any.

_CREDENTIAL_NAME = re.compile(r"(?:^|_)API_?(?:KEY|TOKEN)$", re.IGNORECASE)
"""An API key's name (``OPENAI_API_KEY``, ``GROQ_APIKEY``, ``MY_API_TOKEN``); names such as
``AWS_SECRET_ACCESS_KEY`` or ``GITHUB_TOKEN`` hold other services' secrets, so they need
`allow_api_key_env`."""
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ALLOWED_KEY_VARIABLES: set[str] = set()
"""Further variables a configuration file may name, allowed by the program (never a file)."""


def allow_api_key_env(name: str) -> None:
    """Lets configuration files name the environment variable ``name`` as ``api_key_env``.

    A file may name, as the variable its key is read from, only one that
    names an API key: ``API_KEY``, ``APIKEY`` or ``API_TOKEN``, alone or after an
    underscore (``OPENAI_API_KEY``, ``GROQ_APIKEY``), so it cannot send another
    variable (``AWS_SECRET_ACCESS_KEY``, ``GITHUB_TOKEN``, a database URL) to
    the server it names.
    A program whose key lives elsewhere allows that variable here; a mapping
    given to `ResourceConfig` in code may name any variable.

    Raises:
        ValueError: ``name`` is not an environment variable name.
    """
    if not isinstance(name, str) or not _VARIABLE_NAME.fullmatch(name):
        raise ValueError(
            f"allow_api_key_env needs an environment variable name (letters, digits and "
            f"underscores, not starting with a digit); got {name!r}"
        )
    _ALLOWED_KEY_VARIABLES.add(name)


def _may_send(variable: str) -> bool:
    return variable in _ALLOWED_KEY_VARIABLES or bool(_CREDENTIAL_NAME.search(variable))


def _not_a_credential(variable: str) -> str:
    return (
        f"names {variable!r}, which does not look like an API key variable; a configuration "
        "file may only name variables whose name ends in API_KEY, APIKEY or API_TOKEN (its "
        "key is sent to its base_url), so that it cannot send any other. Rename the variable, or "
        f"allow it in the program with plait.resources.allow_api_key_env({variable!r})"
    )


# -- user-written providers -------------------------------------------------------------
_REGISTERED: dict[str, type] = {}
"""Backend classes registered by name with `register_provider` (by the program, never a file)."""


def register_provider(name: str, backend: type) -> None:
    """Makes ``{"provider": name}`` in any configuration mean the backend class ``backend``.

    A user-written provider is a subclass of `plait.backends.base.Backend`
    (``complete``, and ``stream`` for real token streaming). It gets what the
    built-in ones get: limits, retries, the response cache, usage and cost,
    streaming. A configuration may also name the class or an instance directly
    (``{"provider": MyBackend}``); a name lets a TOML or JSON file choose it,
    among the classes the program registered (a file never imports code).

    Raises:
        ValueError: ``name`` is empty or a provider's (`plait.backends.providers`).
        TypeError: ``backend`` is not a Backend class.
    """
    if not isinstance(name, str) or not name or providers.get(name) is not None:
        raise ValueError(
            "register_provider needs a new, non-empty name (not one of "
            f"{_quote_list(providers.names())}); got {name!r}"
        )
    if not _is_backend_class(backend):
        raise TypeError(
            "register_provider needs a Backend subclass (with async complete() and stream()), "
            f"got {backend!r}"
        )
    _REGISTERED[name] = backend


def _known_providers() -> list[str]:
    return [*providers.names(), *sorted(_REGISTERED)]


def _is_backend_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, Backend)


def _user_backend(provider: Any) -> tuple[str, Any] | None:
    """Returns (name, class or instance) when ``provider`` names a user-written backend."""
    if isinstance(provider, str):
        registered = _REGISTERED.get(provider)
        return None if registered is None else (provider, registered)
    if _is_backend_class(provider):
        return f"{provider.__module__}.{provider.__qualname__}", provider
    if isinstance(provider, Backend):
        cls = type(provider)
        return f"{cls.__module__}.{cls.__qualname__}", provider
    return None


def _validate_user_entry(alias: str, entry: Mapping[str, Any], problems: list[str]) -> Any:
    """Checks a user-written backend's entry: the common keys, and its constructor's options."""
    where = f"alias {alias!r}"
    found = _user_backend(entry["provider"])
    assert found is not None
    name, backend = found
    before = len(problems)
    values: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "provider" or value is None:
            continue
        checker = _COMMON.get(key) if isinstance(key, str) else None
        if checker is None:
            problems.append(
                f"{where}: key {key!r} does not apply to a user-written backend; its keys: "
                f"{_quote_list(sorted(_COMMON))} (constructor arguments go in backend_options)"
            )
            continue
        _check_key(where, key, value, checker, problems, values)
    options = values.get("backend_options")
    if options and not isinstance(backend, type):
        problems.append(
            f"{where}: key 'backend_options' is set, but the provider is a backend instance, "
            "which is used as it is; pass the class to have it built with these options"
        )
    elif options:
        for problem in _option_problems(backend, _COMMON, options):
            problems.append(f"{where}: key 'backend_options' {problem}")
    if len(problems) > before:
        return None
    if "price" not in values and _free_backend(backend):
        values["price"] = providers.FREE  # a TestBackend given as it is costs nothing, as "test"
    return EndpointConfig(name=alias, provider=name, backend=backend, **values)


def _free_backend(backend: Any) -> bool:
    """Whether ``backend`` (a class or an instance) is a free provider's backend, or a subclass."""
    cls = backend if isinstance(backend, type) else type(backend)
    spec = providers.get(getattr(cls, "provider", None))
    return spec is not None and spec.free and issubclass(cls, spec.backend_class())


def _unknown_key_text(key: Any, provider: str) -> str:
    for other in (spec.name for spec in providers.specs()):
        if other != provider and key in _checkers(other):
            return f"key {key!r} does not apply to provider {provider!r} (it is for {other!r})"
    valid = ["provider", *_checkers(provider)]
    return f"unknown key {key!r}{_suggest(str(key), valid)}"


class ResourceConfig:
    """Maps aliases to validated endpoints.

    Args:
        mapping: ``{alias: {"provider": ..., "model": ..., <options>}}``. The
            alias ``"*"`` serves every alias not listed. An entry may be a
            model string (``"openai:gpt-4o-mini"``, ``"local"``; see
            `plait.resources.model_strings`) or a fallback chain of other
            aliases' endpoints (``{"fallback": ["primary", "backup"]}``).
        source: the file the mapping was read from (`from_file` sets it).
            Errors name it, and it is trusted less than code: its
            ``api_key_env`` may only name a variable that looks like a
            credential (see `allow_api_key_env`).
        state: the state store (`plait.resources.state`): a
            ``postgresql://`` URL or an SQLite path. Endpoints with
            ``cache = true`` keep their replies there, shared by every process
            that names it. In a file, a ``[state]`` table with ``url``.

    Raises:
        ConfigError: listing every problem found, one per line, each naming
            the alias and the key (``problems`` holds the lines).

    Example::

        config = ResourceConfig({"fast": {"provider": "openai", "model": "gpt-4o-mini",
                                          "max_concurrent": 10, "rpm": 500}})
        "fast" in config            # True
        config.resolve("slow")      # UnknownAliasError: unknown alias 'slow' ...; known: 'fast'

    Options of every endpoint: ``model``, ``max_concurrent``, ``rpm``, ``tpm``,
    ``timeout``, ``max_retries``, ``retry_base_delay``, ``retry_max_delay``,
    ``max_retry_after``, ``adaptive``, ``price``, ``budget``, ``cache``,
    ``circuit_failures``, ``circuit_cooldown`` (used when a fallback chain
    lists the endpoint), ``backend_options`` (checked against the backend's
    constructor); for
    ``openai`` also ``base_url``, ``api_key``, ``api_key_env``, ``transport``,
    ``headers``, ``max_connections``, ``dialect``, ``max_response_bytes``,
    ``max_event_bytes``; for ``anthropic``
    ``base_url``, ``api_key``, ``api_key_env``; for ``local`` ``model_path``
    and ``n_ctx``; ``test`` takes none of its own (its replies go in
    ``backend_options``). See `EndpointConfig` for what each means.
    """

    def __init__(
        self,
        mapping: Mapping[str, Any],
        *,
        source: str | None = None,
        state: str | os.PathLike[str] | StateURL | None = None,
    ) -> None:
        prefix = f"in {source}: " if source else ""
        if not isinstance(mapping, Mapping):
            raise ConfigError(
                f"{prefix}ResourceConfig expects a mapping of alias -> endpoint settings, "
                f"got {type(mapping).__name__}"
            )
        problems: list[str] = []
        endpoints: dict[str, EndpointConfig] = {}
        chains: dict[str, Any] = {}
        for alias, entry in mapping.items():
            if not isinstance(alias, str) or not alias:
                problems.append(f"alias {alias!r}: aliases must be non-empty strings")
            elif isinstance(entry, Mapping) and _CHAIN_KEY in entry:
                chains[alias] = entry
            else:
                endpoint = _validate_entry(alias, entry, problems, from_file=source is not None)
                if endpoint is not None:
                    endpoints[alias] = endpoint
        valid_chains = _validate_chains(chains, mapping, endpoints, problems)
        if not mapping:
            problems.append('no aliases; add at least one, e.g. {"*": {"provider": "local"}}')
        if problems:
            raise _config_error(problems, prefix)
        self._endpoints = endpoints
        self._chains = valid_chains
        self._order = [alias for alias in mapping if alias in endpoints or alias in valid_chains]
        self._wildcard = endpoints.get(WILDCARD) or valid_chains.get(WILDCARD)
        self.source = source
        """The file the configuration was read from, if any."""
        self.state = None if state is None else StateURL.parse(state)
        """The state store's URL (password masked when shown), or None: caches stay local."""
        # ResourceManager.shared() keeps one manager per running loop here, so
        # the managers live exactly as long as this configuration.
        self._shared: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self._identity: tuple[Any, ...] | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ResourceConfig:
        """Reads a configuration from a ``.json``, ``.toml``, ``.yaml`` or ``.yml`` file.

        The file holds the same mapping the constructor takes (in TOML, one
        table per alias; quote the wildcard as ``["*"]``).

        Raises:
            ConfigError: when the file is missing, is not UTF-8, cannot be
                parsed, has an unknown extension, nests more than 100 levels
                deep or holds more than 100,000 values (YAML aliases
                expanded), or its content is invalid; the message names the
                file (and the offending byte).
        """
        from pathlib import Path  # import time: only a configuration read from a file

        file = Path(path)
        suffix = file.suffix.lower()
        if suffix not in _READERS:
            raise ConfigError(
                f"{file}: unknown config file type {suffix or '(none)'!r}; "
                f"use one of {_quote_list(sorted(_READERS))}"
            )
        try:
            raw = file.read_bytes()
        except FileNotFoundError:
            raise ConfigError(
                f"{file}: no such file; check the path (it is read from {Path.cwd()})"
            ) from None
        except IsADirectoryError:
            raise ConfigError(f"{file} is a folder; name the config file in it") from None
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read config file: {exc.strerror or exc}") from exc
        try:
            text = raw.decode("utf-8")  # whole: the error's offset is then the file's
        except UnicodeDecodeError as exc:
            raise _not_utf8(file, exc) from exc
        data = _READERS[suffix](text, file)
        _check_size(data, file)
        data, state = _state_table(data, file)
        return cls(data, source=str(file), state=state)

    @property
    def identity(self) -> tuple[Any, ...]:
        """A hashable value equal for equal configurations (same aliases, same settings).

        `ResourceManager.shared` gives equal configurations one manager per
        event loop, so a configuration rebuilt for every call (a dict, or a new
        ``ResourceConfig`` in each notebook cell) reuses one set of connections
        and limits instead of leaking a new one each time.
        """
        if self._identity is None:
            endpoints = tuple(
                (alias, tuple((f.name, _frozen(getattr(e, f.name))) for f in fields(e)))
                for alias, e in sorted(self._endpoints.items())
            )
            chains = tuple(
                (alias, tuple(e.name for e in chain))
                for alias, chain in sorted(self._chains.items())
            )
            self._identity = (endpoints, chains, self.state)
        return self._identity

    def with_state(self, state: str | os.PathLike[str] | StateURL | None) -> ResourceConfig:
        """Returns this configuration with ``state`` as its state store (itself when equal)."""
        url = None if state is None else StateURL.parse(state)
        if url == self.state:
            return self
        other = copy.copy(self)
        other.state = url
        other._shared = weakref.WeakKeyDictionary()
        other._identity = None
        return other

    def resolve(self, alias: str) -> EndpointConfig:
        """Returns the endpoint that serves ``alias`` (its own entry, else ``"*"``).

        For an alias that names a fallback chain, that is the chain's first
        endpoint (what a provider Batch API or a checkpoint's fingerprint
        uses); `fallbacks` gives the whole chain.

        Raises:
            UnknownAliasError: no entry and no ``"*"``; names the known aliases.
        """
        return self.fallbacks(alias)[0]

    __getitem__ = resolve

    def fallbacks(self, alias: str) -> tuple[EndpointConfig, ...]:
        """Returns the endpoints that serve ``alias``, in the order a call tries them.

        One endpoint for an ordinary alias; the members of its chain for an
        alias whose entry is ``{"fallback": [...]}``.

        Raises:
            UnknownAliasError: no entry and no ``"*"``; names the known aliases.
        """
        served = self._endpoints.get(alias) or self._chains.get(alias) or self._wildcard
        if served is None:
            raise UnknownAliasError(alias, self.aliases())
        return served if isinstance(served, tuple) else (served,)

    def aliases(self) -> list[str]:
        """Returns the aliases listed in the configuration, in order (with ``"*"`` if set)."""
        return list(self._order)

    def endpoints(self) -> list[EndpointConfig]:
        """Returns every listed endpoint, in order (fallback chains are not endpoints)."""
        return list(self._endpoints.values())

    def __contains__(self, alias: object) -> bool:
        """Whether `resolve(alias)` succeeds (always true when ``"*"`` is listed)."""
        return self._wildcard is not None or alias in self._endpoints or alias in self._chains

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __repr__(self) -> str:
        inner = ", ".join(f"{a!r}: {self._described(a)}" for a in self._order)
        return f"ResourceConfig({{{inner}}})"

    def _described(self, alias: str) -> str:
        chain = self._chains.get(alias)
        if chain is None:
            return self._endpoints[alias].describe()
        return "fallback " + " -> ".join(endpoint.name for endpoint in chain)


# -- fallback chains ---------------------------------------------------------------------

_CHAIN_KEY = "fallback"


def _validate_chains(
    chains: Mapping[str, Mapping[str, Any]],
    mapping: Mapping[str, Any],
    endpoints: Mapping[str, EndpointConfig],
    problems: list[str],
) -> dict[str, tuple[EndpointConfig, ...]]:
    """Checks every ``{"fallback": [...]}`` entry; returns each valid chain's endpoints."""
    valid = {}
    for alias, entry in chains.items():
        before = len(problems)
        members = _chain_members(alias, entry, problems)
        for member in members:
            problem = _member_problem(alias, member, chains, mapping)
            if problem is not None:
                problems.append(f"alias {alias!r}: key 'fallback' {problem}")
        if len(problems) == before and all(m in endpoints for m in members):
            valid[alias] = tuple(endpoints[m] for m in members)
    return valid


def _chain_members(alias: str, entry: Mapping[str, Any], problems: list[str]) -> list[str]:
    """Returns the aliases a chain lists, after noting a problem with its shape."""
    where = f"alias {alias!r}"
    others = sorted(str(key) for key in entry if key != _CHAIN_KEY)
    if others:
        problems.append(
            f"{where}: a fallback chain takes only the key 'fallback', not "
            f"{_quote_list(others)}; settings belong in the entries of the endpoints it lists"
        )
    members = entry[_CHAIN_KEY]
    if not isinstance(members, list | tuple) or not all(isinstance(m, str) and m for m in members):
        problems.append(
            f"{where}: key 'fallback' must be a list of aliases, e.g. "
            f'["primary", "backup"], got {members!r}'
        )
        return []
    if len(members) < 2:
        problems.append(
            f"{where}: key 'fallback' lists {len(members)} alias(es); a chain needs at least "
            "two (for one endpoint, write its entry under this alias instead)"
        )
    repeated = sorted({m for m in members if members.count(m) > 1})
    if repeated:
        problems.append(f"{where}: key 'fallback' lists {_quote_list(repeated)} more than once")
    return list(members)


def _member_problem(
    alias: str, member: str, chains: Mapping[str, Any], mapping: Mapping[str, Any]
) -> str | None:
    """Returns why ``member`` cannot be in ``alias``'s chain, or None when it can."""
    if member == alias:
        return f"names {alias!r} itself: a chain that contains itself is a cycle"
    if member in chains:
        inner = chains[member].get(_CHAIN_KEY)
        if isinstance(inner, list | tuple) and alias in inner:
            return (
                f"names {member!r}, whose own chain names {alias!r} back: a cycle; "
                "list endpoints, not chains"
            )
        return (
            f"names {member!r}, which is itself a fallback chain; chains do not nest, "
            f"so list its endpoints here instead"
        )
    if member not in mapping:
        known = [a for a in mapping if isinstance(a, str) and a not in chains]
        return (
            f"names {member!r}, which is not an alias of this configuration"
            f"{_suggest(member, known)}; known endpoints: {_quote_list(known) or 'none'}"
        )
    return None  # an endpoint (if its own entry is invalid, that is reported there)


def _frozen(value: Any) -> Any:
    """Returns a hashable stand-in for a setting (mappings and lists become sorted tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple | set | frozenset):
        return tuple(_frozen(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _config_error(problems: list[str], prefix: str) -> ConfigError:
    if len(problems) == 1:
        message = f"{prefix}invalid ResourceConfig: {problems[0]}"
    else:
        lines = "\n".join(f"  - {p}" for p in problems)
        message = f"{prefix}invalid ResourceConfig, {len(problems)} problems:\n{lines}"
    error = ConfigError(message)
    error.problems = problems  # type: ignore[attr-defined]
    return error


def _not_utf8(file: Path, exc: UnicodeDecodeError) -> ConfigError:
    data = exc.object
    line = data.count(b"\n", 0, exc.start) + 1
    return ConfigError(
        f"{file}: config files must be UTF-8 text, but byte 0x{data[exc.start]:02x} at offset "
        f"{exc.start} (line {line}) is not; save the file as UTF-8"
    )


_FIX_THERE = "correct the file there"
"""What to do about a file that does not parse: its message says where."""


def _read_json(text: str, file: Path) -> Any:
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{file}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}; {_FIX_THERE}"
        ) from exc
    except ValueError as exc:  # nested too deeply, or an integer of too many digits
        raise ConfigError(f"{file}: invalid JSON: {exc}") from None


def _read_toml(text: str, file: Path) -> Any:
    import tomllib  # import time: only a TOML file

    try:
        return tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, or an integer of too many digits
        raise ConfigError(f"{file}: invalid TOML: {exc}; {_FIX_THERE}") from exc
    except RecursionError:
        raise ConfigError(f"{file}: invalid TOML: it is nested too deeply to read") from None


def _read_yaml(text: str, file: Path) -> Any:
    try:
        import yaml  # optional extra (plait[yaml])
    except ImportError as exc:
        raise ConfigError(
            f"{file}: reading YAML needs PyYAML; install it with pip install 'plait[yaml]' "
            "or use a .json or .toml file"
        ) from exc
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise ConfigError(f"{file}: invalid YAML: it is nested too deeply to read") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: invalid YAML: {exc}; {_FIX_THERE}") from exc
    # PyYAML lets a value it cannot build raise whatever Python raised (``2020-13-45``
    # or ``!!float x``: ValueError; ``!!timestamp x``: AttributeError). safe_load runs
    # no code of ours, so anything it raises means the file is not YAML it can read.
    except Exception as exc:
        raise ConfigError(f"{file}: invalid YAML: {type(exc).__name__}: {exc}") from exc


_MAX_DEPTH = 100
_MAX_VALUES = 100_000


def _check_size(data: Any, file: Path) -> None:
    """Refuses data nested more than `_MAX_DEPTH` deep or of more than `_MAX_VALUES` values.

    Counted with YAML aliases expanded: an alias inside its own anchor makes
    a structure without end, and anchors nested a few levels multiply, and
    comparing or copying such a configuration would never finish. No real
    configuration comes near either limit.
    """
    pending = [(data, 1)]
    count = 0
    while pending:
        value, depth = pending.pop()
        count += 1
        if count > _MAX_VALUES:
            raise ConfigError(
                f"{file}: holds more than {_MAX_VALUES:,} values once YAML aliases are "
                "expanded (anchors nested to multiply?); write the settings out plainly"
            )
        if depth > _MAX_DEPTH:
            raise ConfigError(
                f"{file}: a value is nested more than {_MAX_DEPTH} levels deep (a YAML alias "
                "inside its own anchor?); a configuration needs a few levels at most"
            )
        if isinstance(value, dict):
            pending.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value)


def resources_with_state(resources: Any, state: str | os.PathLike[str] | StateURL) -> Any:
    """Returns ``resources`` (a `ResourceConfig` or a mapping) keeping their state in ``state``.

    What ``plait.run(..., state=...)`` and ``--state`` use.

    Raises:
        TypeError: ``resources`` is a manager (or anything else), which keeps its own state.
        ConfigError: ``state`` is not a state URL.
    """
    if isinstance(resources, Mapping):
        resources = ResourceConfig(resources)
    if not isinstance(resources, ResourceConfig):
        raise TypeError(
            "state applies to resources given as a ResourceConfig or a mapping, not a "
            f"{type(resources).__name__}, which keeps its own; build it from "
            "ResourceConfig(..., state=URL)"
        )
    return resources.with_state(state)


def _state_table(data: Any, file: Path) -> tuple[Any, str | None]:
    """Returns the file's aliases and the ``url`` of its ``[state]`` table, if it has one.

    A top-level ``state`` entry with a ``url`` and no ``provider`` is the
    table (an alias named ``state`` keeps working: it has a provider).
    """
    table = data.get("state") if isinstance(data, Mapping) else None
    if not isinstance(table, Mapping) or "url" not in table or "provider" in table:
        return data, None
    unknown = sorted(str(key) for key in table if key != "url")
    if unknown:
        raise ConfigError(
            f"{file}: table 'state': unknown key(s) {_quote_list(unknown)}; it takes 'url' "
            "(a postgresql:// URL or an SQLite path; put the schema in it as ?schema=NAME)"
        )
    url = table["url"]
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{file}: table 'state': 'url' must be a non-empty string")
    try:
        StateURL.parse(url)
    except ConfigError as exc:
        raise ConfigError(f"{file}: table 'state': {exc}") from None
    return {alias: entry for alias, entry in data.items() if alias != "state"}, url


_READERS: dict[str, Callable[[str, Path], Any]] = {
    ".json": _read_json,
    ".toml": _read_toml,
    ".yaml": _read_yaml,
    ".yml": _read_yaml,
}
