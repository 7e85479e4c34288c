"""One spec per provider: a provider added as a folder (``acme_provider/``) plus one line
works everywhere a built-in one does, and the built-in ones are declared the same way."""

from __future__ import annotations

import subprocess
import sys

import pytest

from plait import LLMInference, ResourceConfig, ResourceManager, run
from plait.backends import providers
from plait.backends.spec import ProviderSpec
from plait.backends.types import Price
from plait.errors import ConfigError
from plait.resources.endpoint import missing_credential
from plait.resources.usage import PRICES, price_for
from plait.testing import ScriptedServer

from .acme_provider.spec import SPEC as ACME


@pytest.fixture(autouse=True)
def _acme(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adds acme for one test: the registry is as it was afterwards, for the other tests."""
    for name in ("_SPECS", "_SPELLINGS", "_PRICE_ORDER"):
        monkeypatch.setattr(
            providers, name, type(getattr(providers, name))(getattr(providers, name))
        )
    providers.register(ACME)  # the one line that adds the provider


@pytest.fixture
def acme_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ACME_API_KEY", "acme-secret")
    return "acme-secret"


async def test_an_added_provider_serves_a_program_end_to_end(acme_key: str) -> None:
    async with ScriptedServer(api_key=acme_key) as server:
        config = ResourceConfig(
            {"llm": {"provider": "acme", "model": "acme-small", "base_url": server.base_url}}
        )
        async with ResourceManager(config) as manager:
            outputs = await run(LLMInference("llm"), ["hello", "world"], resources=manager)
            usage = manager.total_usage()
        assert outputs == ["echo: hello", "echo: world"]
        # the spec's key variable reached the wire, and its list price made the cost
        assert all(r.headers["authorization"] == "Bearer acme-secret" for r in server.stats.log)
        assert usage.input_tokens > 0
        assert usage.cost == pytest.approx(
            Price(1.0, 2.0).cost(usage.input_tokens, usage.output_tokens)
        )


def test_an_added_provider_is_read_from_its_spec_everywhere(acme_key: str) -> None:
    # model strings: its name and its extra prefix; the model is required (example_model)
    config = ResourceConfig({"a": "acme:acme-large", "b": "acme-chat/acme-small"})
    assert (config["a"].provider, config["a"].model) == ("acme", "acme-large")
    assert (config["b"].provider, config["b"].model) == ("acme", "acme-small")
    with pytest.raises(ConfigError, match=r'names no model.*"acme:acme-small"'):
        ResourceConfig({"a": "acme"})
    # prices: a dated name matches, the public table lists them, a budget needs no price
    assert price_for("acme", "acme-large-2026-01") == Price(10.0, 20.0)
    assert PRICES["acme-small"] == Price(1.0, 2.0)
    assert ResourceConfig({"a": {"provider": "acme", "model": "acme-small", "budget": 1.0}})
    # its keys: one of another provider's is refused, naming whose it is
    with pytest.raises(ConfigError, match=r"'transport' does not apply to provider 'acme'"):
        ResourceConfig({"a": {"provider": "acme", "model": "acme-small", "transport": "sdk"}})
    # the credential rule, asked without building the backend
    assert missing_credential(config["a"]) is None


def test_an_added_providers_credential_rule_names_the_endpoint() -> None:
    config = ResourceConfig({"judge": {"provider": "acme", "model": "acme-small"}})
    assert missing_credential(config["judge"]) == (
        "endpoint 'judge' (acme acme-small) needs an API key: set the environment variable "
        "ACME_API_KEY, or give api_key"
    )


async def test_an_added_provider_without_a_batch_api_is_refused_by_batch_api(
    acme_key: str,
) -> None:
    config = ResourceConfig({"llm": {"provider": "acme", "model": "acme-small"}})
    with pytest.raises(
        ConfigError,
        match=r"'acme' endpoint; .* needs an 'openai' endpoint .*, or an 'anthropic' one$",
    ):
        await run(LLMInference("llm"), ["x"], resources=config, batch_api=True)


def test_register_refuses_a_taken_name_or_prefix_and_accepts_the_same_spec_again() -> None:
    providers.register(ACME)  # again: nothing happens
    with pytest.raises(ValueError, match="'openai' is empty or already taken"):
        providers.register(ProviderSpec(name="openai", backend="x:Y"))
    with pytest.raises(
        ValueError, match=r"prefix 'openai-chat' .* already names provider 'openai'"
    ):
        providers.register(ProviderSpec(name="other", backend="x:Y", prefixes=("openai-chat",)))
    with pytest.raises(TypeError, match="ProviderSpec"):
        providers.register({"name": "dict"})  # type: ignore[arg-type]
    assert "other" not in providers.names()


def test_a_spec_listing_a_key_no_endpoint_has_is_refused_by_name() -> None:
    providers.register(ProviderSpec(name="typo", backend="x:Y", keys=("base_ulr",)))
    with pytest.raises(ConfigError, match=r"'typo': its ProviderSpec lists key\(s\) 'base_ulr'"):
        ResourceConfig({"a": {"provider": "typo"}})


def test_built_in_providers_are_specs_in_their_folders() -> None:
    for name in ("openai", "anthropic", "local"):
        spec = providers.get(name)
        assert spec is not None and spec.name == name
        assert spec.backend.startswith(f"plait.backends.{name}.backend:")
    assert providers.get("local").free  # type: ignore[union-attr]
    assert [s.name for s in providers.specs() if s.batch_api] == ["openai", "anthropic"]


def test_the_registry_imports_no_backend() -> None:
    code = (
        "import sys; from plait.backends import providers; from plait import ResourceConfig; "
        "ResourceConfig({'a': 'openai:gpt-4o-mini', 'b': 'anthropic:claude-3-5-haiku', "
        "'c': 'local'}); "
        "print(sorted(m for m in sys.modules if m.endswith('.backend') or m in "
        "('openai', 'anthropic', 'llama_cpp', 'httptools')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
