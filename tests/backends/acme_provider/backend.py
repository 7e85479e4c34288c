"""`AcmeBackend`: acme speaks OpenAI's protocol, so its backend is the OpenAI-compatible one
with acme's default URL and key."""

from __future__ import annotations

import os
from typing import Any

from plait.backends.openai import OpenAICompatBackend
from plait.errors import ConfigError

from .spec import KEY_ENV, SPEC


class AcmeBackend(OpenAICompatBackend):
    provider = "acme"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = KEY_ENV,
        timeout: float | None = 60.0,
    ) -> None:
        missing = self.missing_credential(api_key=api_key, api_key_env=api_key_env)
        if missing is not None:
            raise ConfigError(f"AcmeBackend(model={model!r}) {missing}")
        super().__init__(
            model,
            base_url=base_url or SPEC.default_url or "",
            api_key=api_key or os.environ[api_key_env],
            api_key_env=None,
            timeout=timeout,
        )

    @classmethod
    def missing_credential(cls, **settings: Any) -> str | None:
        return SPEC.missing_credential(**settings)
