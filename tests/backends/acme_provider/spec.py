"""The ``acme`` provider's facts: imports neither its backend nor an HTTP client."""

from __future__ import annotations

import os
from typing import Any

from plait.backends.spec import ProviderSpec
from plait.backends.types import Price

KEY_ENV = "ACME_API_KEY"


def missing_credential(**settings: Any) -> str | None:
    """Every acme endpoint needs a key, whatever its URL."""
    variable = settings.get("api_key_env") or KEY_ENV
    if settings.get("api_key") or os.environ.get(variable):
        return None
    return f"needs an API key: set the environment variable {variable}, or give api_key"


SPEC = ProviderSpec(
    name="acme",
    backend=f"{__package__}.backend:AcmeBackend",
    default_url="https://api.acme.invalid/v1",
    missing_credential=missing_credential,
    prices={"acme-small": Price(1.0, 2.0), "acme-large": Price(10.0, 20.0)},
    prefixes=("acme-chat",),
    example_model="acme-small",
    keys=("base_url", "api_key", "api_key_env"),
)
