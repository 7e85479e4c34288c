"""Model strings where an entry is expected, and fallback chains: their meaning and errors."""

from __future__ import annotations

import json

import pytest

import plait
from plait import ResourceConfig
from plait.errors import ConfigError, UnknownAliasError
from plait.porting import LM
from plait.resources import register_provider

from .test_user_providers import Reverser


@pytest.mark.parametrize(
    ("text", "same_as"),
    [
        ("openai:gpt-4o-mini", {"provider": "openai", "model": "gpt-4o-mini"}),
        ("openai/gpt-4o-mini", {"provider": "openai", "model": "gpt-4o-mini"}),
        ("openai-chat:gpt-4o", {"provider": "openai", "model": "gpt-4o"}),
        ("openai:ft:gpt-4o-mini:acme::x1", {"provider": "openai", "model": "ft:gpt-4o-mini:acme::x1"}),  # noqa: E501
        ("anthropic:claude-3-5-haiku", {"provider": "anthropic", "model": "claude-3-5-haiku"}),
        ("anthropic/claude-sonnet-4-0", {"provider": "anthropic", "model": "claude-sonnet-4-0"}),
        ("local", {"provider": "local"}),
        ("local:/models/qwen.gguf", {"provider": "local", "model_path": "/models/qwen.gguf"}),
    ],
)  # fmt: skip
def test_a_model_string_is_the_entry_it_abbreviates(text: str, same_as: dict) -> None:
    assert ResourceConfig({"x": text}).resolve("x") == ResourceConfig({"x": same_as}).resolve("x")


def test_a_model_string_gets_the_providers_defaults_and_price() -> None:
    endpoint = ResourceConfig({"fast": "openai:gpt-4o-mini"}).resolve("fast")
    assert endpoint.effective_price is not None
    assert endpoint.base_url is None and endpoint.api_key_env is None  # the backend's own
    local = ResourceConfig({"x": "local"}).resolve("x")
    assert (local.max_concurrent, local.timeout) == (4, None)  # it decodes 4 calls together


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("openrouter/gpt-4o", "string 'openrouter/gpt-4o' does not start with a known provider"),
        ("opnai:gpt-4o", "known provider; did you mean 'openai'?"),
        ("gpt-4o-mini", "'anthropic', 'local', 'openai', 'openai-chat', 'test'"),
        ("openai", "model string 'openai' names no model; write 'openai:<model>'"),
        ("anthropic:", "names no model"),
        ("", "does not start with a known provider"),
    ],
)  # fmt: skip
def test_a_model_string_that_names_no_known_provider_or_model_is_refused(
    text: str, expected: str
) -> None:
    with pytest.raises(ConfigError, match="alias 'x'") as info:
        ResourceConfig({"x": text})
    assert expected in str(info.value)


def test_a_registered_provider_may_be_written_as_a_model_string() -> None:
    register_provider("reverser-models", Reverser)
    endpoint = ResourceConfig({"x": "reverser-models:tiny"}).resolve("x")
    assert (endpoint.provider, endpoint.model) == ("reverser-models", "tiny")
    assert endpoint.backend is Reverser
    assert ResourceConfig({"x": "reverser-models"}).resolve("x").model is None


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("resources.toml", 'fast = "openai:gpt-4o-mini"\n[smart]\nfallback = ["fast", "spare"]\n'
         '[spare]\nprovider = "local"\n'),
        ("resources.json", json.dumps({"fast": "openai:gpt-4o-mini", "spare": {"provider": "local"},
                                       "smart": {"fallback": ["fast", "spare"]}})),
        ("resources.yaml", "fast: openai:gpt-4o-mini\nspare: {provider: local}\n"
         "smart: {fallback: [fast, spare]}\n"),
    ],
)  # fmt: skip
def test_files_hold_model_strings_and_chains(tmp_path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    config = ResourceConfig.from_file(path)
    written_out = ResourceConfig({"fast": {"provider": "openai", "model": "gpt-4o-mini"}})
    assert config.resolve("fast") == written_out.resolve("fast")
    assert [e.name for e in config.fallbacks("smart")] == ["fast", "spare"]
    assert config.resolve("smart").name == "fast"  # the chain's first endpoint


def test_a_chain_is_listed_and_shown_with_the_aliases() -> None:
    config = ResourceConfig(
        {"a": "local", "b": "openai:gpt-4o-mini", "smart": {"fallback": ["a", "b"]}}
    )
    assert config.aliases() == ["a", "b", "smart"] and len(config) == 3 and "smart" in config
    assert [e.name for e in config.endpoints()] == ["a", "b"]
    assert "'smart': fallback a -> b" in repr(config)
    other = ResourceConfig(
        {"a": "local", "b": "openai:gpt-4o-mini", "smart": {"fallback": ["b", "a"]}}
    )
    assert config.identity != other.identity  # another order is another configuration
    with pytest.raises(UnknownAliasError, match="known: 'a', 'b', 'smart'"):
        config.fallbacks("judge")


def test_the_wildcard_may_be_a_chain() -> None:
    config = ResourceConfig(
        {"a": "local", "b": "openai:gpt-4o-mini", "*": {"fallback": ["a", "b"]}}
    )
    assert [e.name for e in config.fallbacks("anything")] == ["a", "b"]


@pytest.mark.parametrize(
    ("chains", "expected"),
    [
        ({"s": {"fallback": ["a"]}}, "alias 's': key 'fallback' lists 1 alias(es); a chain needs"),
        ({"s": {"fallback": []}}, "a chain needs at least two"),
        ({"s": {"fallback": ["a", "zz"]}}, "alias 's': key 'fallback' names 'zz', which is not"),
        ({"s": {"fallback": ["a", "s"]}}, "names 's' itself: a chain that contains itself is"),
        ({"s": {"fallback": ["a", "t"]}, "t": {"fallback": ["b", "s"]}},
         "alias 's': key 'fallback' names 't', whose own chain names 's' back: a cycle"),
        ({"s": {"fallback": ["a", "t"]}, "t": {"fallback": ["a", "b"]}},
         "names 't', which is itself a fallback chain; chains do not nest"),
        ({"s": {"fallback": ["a", "b", "a"]}}, "key 'fallback' lists 'a' more than once"),
        ({"s": {"fallback": "a,b"}}, "key 'fallback' must be a list of aliases"),
        ({"s": {"fallback": ["a", 3]}}, "key 'fallback' must be a list of aliases"),
        ({"s": {"fallback": ["a", "b"], "rpm": 5}},
         "alias 's': a fallback chain takes only the key 'fallback', not 'rpm'"),
    ],
)  # fmt: skip
def test_a_malformed_chain_is_a_config_error_naming_its_alias(chains: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        ResourceConfig({"a": "local", "b": "openai:gpt-4o-mini", **chains})
    assert expected in str(info.value)


def test_a_chain_over_an_invalid_entry_reports_only_that_entry() -> None:
    with pytest.raises(ConfigError) as info:
        ResourceConfig({"a": "local", "b": "openia:gpt-4o", "s": {"fallback": ["a", "b"]}})
    (problem,) = info.value.problems  # type: ignore[attr-defined]
    assert problem.startswith("alias 'b': model string 'openia:gpt-4o' does not start with")
    assert "write '<provider>:<model>' or '<provider>/<model>' with one of 'anthropic'" in problem


def test_settings_lm_takes_a_model_string() -> None:
    resources = plait.settings.context(lm="openai:gpt-4o-mini").resources
    endpoint = resources.resolve("any alias")
    assert (endpoint.provider, endpoint.model) == ("openai", "gpt-4o-mini")
    with pytest.raises(ConfigError, match="model string 'gemini:pro' does not start"):
        plait.settings.configure(lm="gemini:pro")


def test_porting_lm_reads_a_provider_prefix_and_keeps_other_names() -> None:
    assert LM("openai/gpt-4o-mini") == {"provider": "openai", "model": "gpt-4o-mini"}
    assert LM("anthropic:claude-3-5-haiku-latest", api_key="k") == {
        "provider": "anthropic",
        "model": "claude-3-5-haiku-latest",
        "api_key": "k",
    }
    # a Hugging Face name on an OpenAI-compatible server is the model's own name
    assert LM("Qwen/Qwen2.5-7B-Instruct")["model"] == "Qwen/Qwen2.5-7B-Instruct"
