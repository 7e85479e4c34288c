"""Model strings: the one-line names of a model that users of other libraries already write.

``"openai:gpt-4o-mini"`` (pydantic-ai), ``"openai/gpt-4o-mini"`` (DSPy and
LiteLLM), ``"anthropic:claude-3-5-haiku-latest"``, ``"local"`` (the embedded
model) or ``"local:/models/qwen.gguf"`` (a GGUF file) stand for the endpoint
entry they abbreviate, so ``ResourceConfig({"fast": "openai:gpt-4o-mini"})``
is ``ResourceConfig({"fast": {"provider": "openai", "model": "gpt-4o-mini"}})``
and gets the same validation and the provider's own defaults (its API root,
and its key from ``OPENAI_API_KEY`` or ``ANTHROPIC_API_KEY``).

`entry_for` is the only parser: `ResourceConfig` entries, configuration files,
``plait.settings.configure(lm=...)`` and ``plait.porting.LM(...)`` all read
model strings through it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from plait.backends import providers
from plait.resources.validation import suggestion

__all__ = ["PROVIDER_SPELLINGS", "entry_for", "names_provider"]

PROVIDER_SPELLINGS: dict[str, str] = providers.spellings()
"""The built-in providers' model-string prefixes, and the provider each means (each
`ProviderSpec` lists its own; `providers.spellings` has those of providers added later)."""

_SEPARATORS = (":", "/")


def entry_for(text: str, registered: Collection[str] = ()) -> tuple[str | None, dict[str, Any]]:
    """Returns ``(error, entry)``: the endpoint entry a model string stands for, or why none.

    The string is split at its first ``:`` or ``/``, so the model name keeps any
    later ones (``openai:ft:gpt-4o-mini:acme::abc``, ``openai/org/model``).
    ``"local"`` alone is the embedded model and ``"local:<path>"`` a GGUF
    file. A provider registered with `plait.resources.register_provider`
    (named in ``registered``) may be written the same way.

    The error text follows "alias 'x': " and lists the known prefixes.
    """
    known = {**providers.spellings(), **{name: name for name in registered}}
    prefix, model = _split(text)
    provider = known.get(prefix)
    if provider is None:
        listing = ", ".join(repr(name) for name in sorted(known))
        hint = suggestion(prefix, known)
        return (
            f"model string {text!r} does not start with a known provider{hint}; write "
            f"'<provider>:<model>' or '<provider>/<model>' with one of {listing} "
            '(e.g. "openai:gpt-4o-mini"), or an entry like {"provider": ..., "model": ...}'
        ), {}
    spec = providers.get(provider)
    if model is None and spec is not None and spec.example_model is not None:
        return (
            f"model string {text!r} names no model; write '{prefix}:<model>', "
            f'e.g. "{prefix}:{spec.example_model}"'
        ), {}
    if model is None:
        return None, {"provider": provider}
    # What follows the prefix is the model, or what the spec says ("local:" a GGUF file).
    return None, {"provider": provider, "model" if spec is None else spec.model_string_key: model}


def names_provider(text: str) -> bool:
    """Whether ``text`` starts with a provider's prefix and a separator.

    For places where a bare model name is also valid: a Hugging Face name such
    as ``Qwen/Qwen2.5-7B-Instruct`` sent to an OpenAI-compatible server stays
    the model's name.
    """
    prefix, model = _split(text)
    return model is not None and prefix in providers.spellings()


def _split(text: str) -> tuple[str, str | None]:
    """Returns the prefix before the first separator and the rest (None when there is none)."""
    cut = min((i for i in (text.find(s) for s in _SEPARATORS) if i >= 0), default=-1)
    if cut < 0:
        return text, None
    return text[:cut], text[cut + 1 :] or None
