"""What plait knows about the ``anthropic`` provider without loading its backend or SDK."""

from __future__ import annotations

import os
from typing import Any

from plait.backends.spec import ProviderSpec
from plait.backends.types import Price

__all__ = ["SPEC"]


def _missing_credential(**settings: Any) -> str | None:
    """`AnthropicBackend.missing_credential`: every endpoint needs a key, a proxy's too
    (the SDK sends it on every call)."""
    variable = settings.get("api_key_env", "ANTHROPIC_API_KEY")
    if settings.get("api_key") or os.environ.get(variable):
        return None
    return f"needs an API key: set the environment variable {variable}, or give api_key"


SPEC = ProviderSpec(
    name="anthropic",
    backend="plait.backends.anthropic.backend:AnthropicBackend",
    default_url=None,  # the SDK's own (https://api.anthropic.com, or ANTHROPIC_BASE_URL)
    missing_credential=_missing_credential,
    # Public list prices (standard tier, no caching or batch discounts), checked
    # against Anthropic's pricing page when written; an endpoint's ``price`` wins.
    prices={
        "claude-3-haiku": Price(0.25, 1.25),
        "claude-3-5-haiku": Price(0.80, 4.00),
        "claude-3-5-sonnet": Price(3.00, 15.00),
        "claude-3-7-sonnet": Price(3.00, 15.00),
        "claude-sonnet-4": Price(3.00, 15.00),
        "claude-3-opus": Price(15.00, 75.00),
        "claude-opus-4": Price(15.00, 75.00),
    },
    batch_api="plait.backends.anthropic.batch:AnthropicBatchClient",
    example_model="claude-3-5-haiku-latest",
    keys=("base_url", "api_key", "api_key_env"),
)
