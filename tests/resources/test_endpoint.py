"""Endpoint helpers: building each provider's backend, and the tpm estimate."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from plait import LLMInference, Module
from plait.backends.types import Message, Request, SamplingOptions
from plait.errors import ConfigError
from plait.report.profiling import Profiler
from plait.resources import ResourceConfig, ResourceManager, RetryPolicy
from plait.resources.endpoint import (
    Endpoint,
    create_backend,
    estimate_tokens,
    missing_credential,
)
from plait.testing import ScriptedServer


def test_estimate_counts_prompt_characters_and_the_reply_budget() -> None:
    request = Request(messages=(Message("system", "x" * 40), Message("user", "y" * 80)))
    assert estimate_tokens(request) == 30 + 2 * 4 + 256
    limited = Request(messages=request.messages, options=SamplingOptions(max_tokens=10))
    assert estimate_tokens(limited) == 30 + 8 + 10


def test_each_provider_gets_its_backend_with_the_endpoint_settings() -> None:
    config = ResourceConfig(
        {
            "o": {
                "provider": "openai",
                "model": "gpt-4o-mini",
                "base_url": "http://127.0.0.1:9/v1/",
                "timeout": 12,
            },
            "a": {"provider": "anthropic", "model": "claude-3-5-haiku", "api_key": "k"},
            "l": {"provider": "local"},
        }
    )
    openai = create_backend(config.resolve("o"))
    assert (openai.provider, openai.model, openai.timeout) == ("openai", "gpt-4o-mini", 12.0)
    assert openai.base_url == "http://127.0.0.1:9/v1"
    assert create_backend(config.resolve("a")).provider == "anthropic"
    assert create_backend(config.resolve("l")).provider == "local"


def test_backend_options_reach_the_backend_constructor() -> None:
    entry = {"provider": "anthropic", "model": "c", "api_key": "k"}
    entry["backend_options"] = {"max_tokens_default": 9}
    backend = create_backend(ResourceConfig({"a": entry}).resolve("a"))
    assert backend.max_tokens_default == 9  # type: ignore[attr-defined]


def test_retry_settings_reach_the_endpoint_policy() -> None:
    def policy_of(**options: object) -> RetryPolicy:
        config = ResourceConfig({"o": {"provider": "openai", "model": "m", **options}})
        return Endpoint(
            config.resolve("o"), clock=time.monotonic, sleep=asyncio.sleep, seed=1
        ).retry

    policy = policy_of(max_retries=2, retry_base_delay=0.1, retry_max_delay=2, max_retry_after=12)
    assert (policy.max_retries, policy.base_delay, policy.max_delay) == (2, 0.1, 2.0)
    assert policy.max_retry_after == 12.0
    assert policy_of().max_retry_after == 60.0 == RetryPolicy().max_retry_after


def test_building_a_manager_imports_no_provider_module() -> None:
    # A provider's package may load (its spec is what the configuration reads); its backend not.
    code = (
        "import sys\n"
        "from plait.resources import ResourceManager\n"
        "ResourceManager({'o': {'provider': 'openai', 'model': 'm'}, '*': {'provider': 'local'}})\n"
        "heavy = ('aiohttp', 'openai', 'anthropic', 'llama_cpp', 'plait.backends.openai.backend',\n"
        "         'plait.backends.local.backend', 'httptools', 'orjson')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]"


# -- credentials: a missing key is found before anything is counted or sent ----------------


class _Cloud(Module):
    def __init__(self, alias: str) -> None:
        super().__init__()
        self.llm = LLMInference(alias, "Answer.")

    def forward(self, text: str) -> str:
        return self.llm(text)


def test_missing_credential_names_the_endpoint_and_the_variable(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    config = ResourceConfig(
        {
            "fast": "openai:gpt-4o-mini",
            "smart": {"provider": "anthropic", "model": "claude-x", "api_key_env": "MY_API_KEY"},
            "mine": {"provider": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"},
            "l": {"provider": "local"},
        }
    )
    monkeypatch.delenv("MY_API_KEY", raising=False)
    assert missing_credential(config.resolve("fast")) == (
        "endpoint 'fast' (openai gpt-4o-mini) needs an API key: set the environment variable "
        "OPENAI_API_KEY, or give api_key"
    )
    assert "MY_API_KEY" in (missing_credential(config.resolve("smart")) or "")
    assert missing_credential(config.resolve("mine")) is None
    assert missing_credential(config.resolve("l")) is None
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # read when asked, not when configured
    assert missing_credential(config.resolve("fast")) is None


async def test_a_call_without_its_key_fails_once_unsent_and_other_aliases_still_run(
    monkeypatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with ScriptedServer() as server:
        mine = server.endpoint()
        del mine["api_key"]  # a server of your own: no key needed
        config = ResourceConfig({"mine": mine, "*": "openai:gpt-4o-mini"})
        assert await _Cloud("mine").bind(config)("hi") == "echo: hi"
        refused = pytest.raises(
            ConfigError, match=r"alias 'cloud': endpoint '\*' \(openai gpt-4o-mini\) needs an "
        )
        with Profiler() as profiler, refused:
            await _Cloud("cloud").bind(config)("hi")
        stats = ResourceManager.shared(config).stats()["*"]
    assert (stats.requests, stats.failures) == (0, 0)
    assert profiler.requests == []
    assert "0 requests" in profiler.report(program="p", kind="run").summary()
