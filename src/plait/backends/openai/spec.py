"""What plait knows about the ``openai`` provider without loading its backend (`ProviderSpec`).

Any server of the chat-completions protocol: OpenAI itself by default, Azure,
or a server of your own (llama.cpp, vLLM, Ollama) at its ``base_url``. Only
OpenAI's and Azure's hosts are known to need a key (`missing_key`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from plait.backends._urls import split_credentials
from plait.backends.spec import ProviderSpec, endpoint_settings
from plait.backends.types import Price

__all__ = [
    "CREDENTIAL_HEADERS",
    "DEFAULT_KEY_ENV",
    "DEFAULT_URL",
    "SPEC",
    "is_openai_host",
    "missing_key",
]

DEFAULT_URL = "https://api.openai.com/v1"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
CREDENTIAL_HEADERS = frozenset({"authorization", "api-key"})
"""Headers that carry a credential (Azure's ``api-key``), lower-case."""


def missing_key(
    base_url: str, api_key: str | None, api_key_env: str | None, headers: Mapping[str, str] | None
) -> str | None:
    """Returns why a call to ``base_url`` would go without the key it needs, or None.

    Only OpenAI's and Azure's hosts are known to need one: a server of your
    own (llama.cpp, Ollama, vLLM) often takes none, and would say so itself.
    A key, ``user:password@`` in the URL or a credential header (Azure's
    ``api-key``) counts; an empty key or variable does not.
    """
    if api_key or split_credentials(base_url)[1] is not None:
        return None
    if {name.lower() for name in headers or {}} & CREDENTIAL_HEADERS:
        return None
    if not is_openai_host(base_url) or (api_key_env and os.environ.get(api_key_env)):
        return None
    if api_key_env:
        return f"needs an API key: set the environment variable {api_key_env}, or give api_key"
    return "needs an API key: give api_key, or name the variable that holds it with api_key_env"


def is_openai_host(base_url: str) -> bool:
    """Whether ``base_url`` is OpenAI's or Azure's (which need a key and speak OpenAI's dialect)."""
    try:
        host = (urlsplit(base_url).hostname or "").lower()
    except ValueError:  # unparseable: the first call says so (HttpTransport._open)
        return False
    return host == "api.openai.com" or host.endswith((".openai.azure.com", ".azure.com"))


def _missing_credential(**settings: Any) -> str | None:
    """`OpenAICompatBackend.missing_credential`: a key for OpenAI's or Azure's host."""
    return missing_key(
        settings.get("base_url", DEFAULT_URL),
        settings.get("api_key"),
        settings.get("api_key_env", DEFAULT_KEY_ENV),
        settings.get("headers"),
    )


_KEYS = (
    "base_url",
    "api_key",
    "api_key_env",
    "transport",
    "headers",
    "max_connections",
    "dialect",
    "max_response_bytes",
    "max_event_bytes",
)


def _arguments(config: Any) -> dict[str, Any]:
    """The usual arguments, with the timeout passed even when None (wait forever) and a
    connection pool as large as ``max_concurrent`` unless ``max_connections`` says."""
    kwargs = endpoint_settings(config, _KEYS)
    kwargs["timeout"] = config.timeout
    pool = config.max_connections or config.max_concurrent
    if pool is not None:
        kwargs["max_connections"] = pool
    return kwargs


SPEC = ProviderSpec(
    name="openai",
    backend="plait.backends.openai.backend:OpenAICompatBackend",
    default_url=DEFAULT_URL,
    missing_credential=_missing_credential,
    # Public list prices (standard tier, no caching or batch discounts), checked
    # against OpenAI's pricing page when written; an endpoint's ``price`` wins.
    prices={
        "gpt-4o-mini": Price(0.15, 0.60),
        "gpt-4o": Price(2.50, 10.00),
        "gpt-4.1-nano": Price(0.10, 0.40),
        "gpt-4.1-mini": Price(0.40, 1.60),
        "gpt-4.1": Price(2.00, 8.00),
        "gpt-3.5-turbo": Price(0.50, 1.50),
        "o3-mini": Price(1.10, 4.40),
        "o4-mini": Price(1.10, 4.40),
    },
    batch_api="plait.backends.openai.batch:OpenAIBatchClient",
    prefixes=("openai-chat",),  # pydantic-ai's name for the chat-completions API
    example_model="gpt-4o-mini",
    keys=_KEYS,
    arguments=_arguments,
)
