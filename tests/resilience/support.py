"""Programs and helpers of the resilience tests.

Every endpoint points at a scripted server on loopback; what a test asserts
about requests, retries and spacing is what that server observed.
"""

from __future__ import annotations

from typing import Any

from plait import LLMInference, Module
from plait.testing import RequestRecord, ScriptedServer

FAST_RETRY = {"retry_base_delay": 0.01, "retry_max_delay": 0.05}


def endpoint(server: ScriptedServer | str, **options: Any) -> dict[str, Any]:
    """Returns an OpenAI-compatible endpoint on ``server`` (a server or its base URL)."""
    base_url = server if isinstance(server, str) else server.base_url
    return {
        "provider": "openai",
        "model": "gpt-4o-mini",  # priced in the built-in table
        "base_url": base_url,
        "api_key": "test-key",
        **FAST_RETRY,
        **options,
    }


def user_of(record: RequestRecord) -> str:
    """Returns the last user message a request carried."""
    return [m for m in record.body["messages"] if m["role"] == "user"][-1]["content"]


def system_of(record: RequestRecord) -> str:
    """Returns the system message a request carried ("" when none)."""
    return next((m["content"] for m in record.body["messages"] if m["role"] == "system"), "")


class TwoStep(Module):
    """Two calls in a chain; with the echo server ``x`` becomes ``echo: echo: x``."""

    def __init__(self, alias: str = "llm") -> None:
        super().__init__()
        self.first = LLMInference(alias, system_prompt="first", temperature=0.0)
        self.second = LLMInference(alias, system_prompt="second", temperature=0.0)

    def forward(self, text: str) -> str:
        return self.second(self.first(text))
