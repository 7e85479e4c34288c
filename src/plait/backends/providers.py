"""The provider registry: every provider's `ProviderSpec`, by name.

Adding a provider is its folder in ``backends/`` (its backend, and a
``spec.py`` declaring ``SPEC``) plus its line in `_BUILT_IN`; a program or
plugin adds one of its own with `register`. Everything else that depends on
a provider (the keys its configuration takes, model strings, list prices,
how its backend is built, its credential check, the Batch API) reads the
spec from here.

Only the spec modules are imported, never a backend or an SDK, so the
registry costs ``import plait`` nothing it can feel.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from plait.backends.spec import ProviderSpec
from plait.backends.types import Price

__all__ = ["FREE", "PRICES", "get", "names", "price_for", "register", "specs", "spellings"]

_BUILT_IN = (
    "plait.backends.openai.spec",
    "plait.backends.anthropic.spec",
    "plait.backends.local.spec",
    "plait.backends.test.spec",
)
"""The spec module of each built-in provider: one line per provider."""

FREE = Price(0.0, 0.0)

_SPECS: dict[str, ProviderSpec] = {}
_SPELLINGS: dict[str, str] = {}
_PRICE_ORDER: list[tuple[str, Price]] = []
"""Every listed price, longest model name first, so that ``gpt-4o-mini-2024-07-18``
matches ``gpt-4o-mini``, not ``gpt-4o``."""


def register(spec: ProviderSpec) -> None:
    """Adds a provider: ``{"provider": spec.name}`` and its model strings then work anywhere.

    Registering the same spec again does nothing, so a plugin may do it on import.

    Raises:
        TypeError: ``spec`` is not a `ProviderSpec`.
        ValueError: its name or one of its model-string prefixes already
            belongs to another provider.
    """
    if not isinstance(spec, ProviderSpec):
        raise TypeError(f"register needs a plait.backends.spec.ProviderSpec, got {spec!r}")
    if _SPECS.get(spec.name) is spec:
        return
    if not spec.name or spec.name in _SPECS:
        raise ValueError(
            f"register: provider name {spec.name!r} is empty or already taken; taken: "
            f"{', '.join(repr(n) for n in names())}"
        )
    spellings = (spec.name, *spec.prefixes)
    for prefix in spellings:
        if prefix in _SPELLINGS:
            raise ValueError(
                f"register: model-string prefix {prefix!r} of provider {spec.name!r} already "
                f"names provider {_SPELLINGS[prefix]!r}; choose another"
            )
    _SPECS[spec.name] = spec
    _SPELLINGS.update(dict.fromkeys(spellings, spec.name))
    _PRICE_ORDER.extend((model, price) for model, price in spec.prices.items())
    _PRICE_ORDER.sort(key=lambda item: len(item[0]), reverse=True)


def get(name: object) -> ProviderSpec | None:
    """Returns the spec of the provider called ``name``, or None when there is none."""
    return _SPECS.get(name) if isinstance(name, str) else None


def names() -> list[str]:
    """Returns the names of every provider, sorted."""
    return sorted(_SPECS)


def specs() -> list[ProviderSpec]:
    """Returns every provider's spec, in the order they were registered (built-in ones first)."""
    return list(_SPECS.values())


def spellings() -> dict[str, str]:
    """Returns the model-string prefixes, each with the provider it names."""
    return dict(_SPELLINGS)


def price_for(provider: str, model: str | None) -> Price | None:
    """Returns the list price of a model, or None when it is not known.

    A dated or suffixed name (``claude-3-5-sonnet-20241022``, ``openai/gpt-4o``)
    matches the longest listed name it starts with, after any ``vendor/``
    prefix; the provider's own prices are looked at first, then every other
    provider's (an OpenAI-compatible proxy serving a Claude model). A free
    provider's calls (``local``) cost nothing.
    """
    spec = _SPECS.get(provider)
    if spec is not None and spec.free:
        return FREE
    if not model:
        return None
    name = model.rsplit("/", 1)[-1].lower()
    if spec is not None:
        for known in sorted(spec.prices, key=len, reverse=True):
            if name.startswith(known):
                return spec.prices[known]
    for known, price in _PRICE_ORDER:
        if name.startswith(known):
            return price
    return None


class _PriceTable(Mapping[str, Price]):
    """Every provider's list prices by model name, as the registry holds them now."""

    def __getitem__(self, model: str) -> Price:
        for spec in _SPECS.values():
            if model in spec.prices:
                return spec.prices[model]
        raise KeyError(model)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(m for spec in _SPECS.values() for m in spec.prices))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"PRICES({dict(self)!r})"


PRICES: Mapping[str, Price] = _PriceTable()
"""Public list prices (standard tier, no caching or batch discounts), each from its
provider's spec. They drift: an endpoint's ``price`` setting always wins."""

for _module in _BUILT_IN:
    register(importlib.import_module(_module).SPEC)
