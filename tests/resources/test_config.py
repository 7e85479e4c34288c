"""ResourceConfig: validation that names alias and key, the "*" fallback, files."""

from __future__ import annotations

import json

import pytest

from plait.errors import ConfigError, UnknownAliasError
from plait.resources import EndpointConfig, Price, ResourceConfig

OPENAI = {"provider": "openai", "model": "gpt-4o-mini"}


def test_valid_config_resolves_each_alias_to_a_frozen_endpoint() -> None:
    config = ResourceConfig(
        {
            "fast": {**OPENAI, "max_concurrent": 10, "rpm": 600, "tpm": 90_000},
            "smart": {"provider": "anthropic", "model": "claude-3-5-haiku", "timeout": 30},
            "tiny": {"provider": "local", "n_ctx": 1024},
        }
    )
    fast = config.resolve("fast")
    assert isinstance(fast, EndpointConfig)
    assert (fast.name, fast.provider, fast.model) == ("fast", "openai", "gpt-4o-mini")
    assert (fast.max_concurrent, fast.rpm, fast.tpm) == (10, 600.0, 90_000.0)
    assert config.resolve("smart").timeout == 30.0
    assert config.resolve("tiny").n_ctx == 1024
    with pytest.raises(AttributeError):
        fast.rpm = 1  # type: ignore[misc]
    assert config.aliases() == ["fast", "smart", "tiny"]
    assert "fast" in config and "judge" not in config
    assert config["smart"] is config.resolve("smart")


def test_local_needs_no_model_and_runs_its_batch_size_at_once() -> None:
    local = ResourceConfig({"m": {"provider": "local"}}).resolve("m")
    assert local.model is None
    assert local.max_concurrent == 4 and local.timeout is None  # its batch size
    assert local.effective_price == Price(0.0, 0.0)


def test_unknown_alias_names_it_and_the_known_aliases() -> None:
    config = ResourceConfig({"fast": OPENAI, "smart": OPENAI})
    with pytest.raises(UnknownAliasError, match=r"'judge'.*known: 'fast', 'smart'") as info:
        config.resolve("judge")
    assert info.value.alias == "judge"
    assert isinstance(info.value, KeyError)


def test_wildcard_serves_every_alias_not_listed() -> None:
    config = ResourceConfig({"fast": OPENAI, "*": {"provider": "local"}})
    assert config.resolve("fast").provider == "openai"
    assert config.resolve("anything").name == "*"
    assert config.resolve("anything") is config.resolve("other")
    assert "anything" in config


def test_all_problems_are_collected_into_one_error_naming_alias_and_key() -> None:
    with pytest.raises(ConfigError) as info:
        ResourceConfig(
            {
                "a": {"provider": "opanai", "model": "x"},
                "b": {**OPENAI, "max_concurent": 3},
                "c": {**OPENAI, "rpm": -5, "timeout": "soon"},
                "d": {"provider": "anthropic"},
            }
        )
    message = str(info.value)
    problems = info.value.problems  # type: ignore[attr-defined]
    assert len(problems) == 5
    assert "5 problems" in message
    assert "alias 'a': unknown provider 'opanai'" in message
    assert "known: 'anthropic', 'local', 'openai', 'test'; did you mean 'openai'?" in message
    assert "alias 'b': unknown key 'max_concurent'; did you mean 'max_concurrent'?" in message
    assert "alias 'c': key 'rpm' must be a finite number > 0, got -5" in message
    assert "alias 'c': key 'timeout' must be a finite number > 0, got 'soon' (str)" in message
    assert "alias 'd': missing key 'model' (required for provider 'anthropic')" in message


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({**OPENAI, "max_concurrent": 0}, "key 'max_concurrent' must be a positive integer"),
        ({**OPENAI, "max_concurrent": 2.5}, "key 'max_concurrent' must be a positive integer"),
        ({**OPENAI, "max_concurrent": True}, "key 'max_concurrent' must be a positive integer"),
        ({**OPENAI, "max_retries": -1}, "key 'max_retries' must be an integer >= 0"),
        ({**OPENAI, "budget": -1}, "key 'budget' must be a finite number >= 0"),
        ({**OPENAI, "price": {"input": 1}}, "key 'price' must be {\"input\""),
        ({**OPENAI, "price": {"input": -1, "output": 1}}, "with finite numbers >= 0"),
        ({**OPENAI, "transport": "grpc"}, "key 'transport' must be 'http' or 'sdk'"),
        ({**OPENAI, "transport": "aiohttp"}, "'transport' names 'aiohttp', which is now 'http'"),
        ({**OPENAI, "headers": {"X-A": 1}}, "key 'headers' must be a mapping of header names"),
        ({**OPENAI, "cache": 3}, "key 'cache' must be true, false or a path"),
        ({**OPENAI, "model": ""}, "key 'model' must be a non-empty string"),
        ({**OPENAI, "api_key": 123456789}, "key 'api_key' must be a non-empty string, got int"),
        ({**OPENAI, "model_path": "m.gguf"}, "key 'model_path' does not apply to provider"),
        ({"provider": "local", "base_url": "http://x"}, "key 'base_url' does not apply"),
        (
            {"model": "gpt-4o"},
            "missing key 'provider'; one of 'anthropic', 'local', 'openai', 'test'",
        ),
        (["openai"], "expected a mapping like"),
        ("openai", "model string 'openai' names no model"),
        ({**OPENAI, "circuit_failures": 0}, "key 'circuit_failures' must be a positive integer"),
        ({**OPENAI, "circuit_cooldown": -1}, "key 'circuit_cooldown' must be a finite number > 0"),
    ],
)
def test_each_bad_value_is_named(entry: object, expected: str) -> None:
    with pytest.raises(ConfigError, match="alias 'x'") as info:
        ResourceConfig({"x": entry})
    assert expected in str(info.value)
    assert "123456789" not in str(info.value)  # a key is never shown, even of the wrong type


INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("timeout", INF, "alias 'x': key 'timeout' must be a finite number > 0, got inf (float)"),
        ("rpm", NAN, "key 'rpm' must be a finite number > 0, got nan (float)"),
        ("tpm", INF, "key 'tpm' must be a finite number > 0, got inf (float)"),
        ("budget", INF, "key 'budget' must be a finite number >= 0, got inf (float)"),
        ("retry_base_delay", NAN, "key 'retry_base_delay' must be a finite number >= 0"),
        ("retry_max_delay", INF, "key 'retry_max_delay' must be a finite number > 0"),
        ("max_retry_after", INF, "key 'max_retry_after' must be a finite number > 0"),
        pytest.param("rpm", 10**400, "key 'rpm' must be a finite number > 0", id="beyond-float"),
        ("price", {"input": INF, "output": 1}, "key 'price' must be {\"input\""),
        ("price", Price(1.0, NAN), "with finite numbers >= 0"),
    ],
)
def test_numbers_that_are_not_finite_are_refused(key: str, value: object, expected: str) -> None:
    with pytest.raises(ConfigError, match="alias 'x'") as info:
        ResourceConfig({"x": {**OPENAI, key: value}})
    assert expected in str(info.value)


def test_max_retry_after_defaults_to_a_minute_and_is_validated() -> None:
    assert ResourceConfig({"x": OPENAI}).resolve("x").max_retry_after == 60.0
    endpoint = ResourceConfig({"x": {**OPENAI, "max_retry_after": 5}}).resolve("x")
    assert endpoint.max_retry_after == 5.0
    with pytest.raises(ConfigError, match="key 'max_retry_after' must be a finite number > 0"):
        ResourceConfig({"x": {**OPENAI, "max_retry_after": 0}})


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            {"provider": "local", "backend_options": {"n_thread": 2}},
            "key 'backend_options' has 'n_thread', which LocalBackend does not take; "
            "did you mean 'n_threads'? (it takes: 'n_seq_max', 'n_threads', 'n_threads_batch', "
            "'seed', 'chat_format', 'verbose')",
        ),
        (
            {"provider": "anthropic", "model": "c", "backend_options": {"max_token_default": 9}},
            "which AnthropicBackend does not take; did you mean 'max_tokens_default'?",
        ),
        (
            {**OPENAI, "backend_options": {"temperature": 0.1}},
            "has 'temperature', which OpenAICompatBackend does not take "
            "(it takes: none besides the endpoint's own keys)",
        ),
        (
            {**OPENAI, "backend_options": {"base_url": "http://127.0.0.1:1/v1"}},
            "key 'backend_options' sets 'base_url', which is a key of the endpoint itself; "
            "write 'base_url' next to 'provider' instead",
        ),
        (
            {"provider": "local", "backend_options": {"n_ctx": 512}},
            "sets 'n_ctx', which is a key of the endpoint itself",
        ),
    ],
)
def test_backend_options_are_checked_against_the_backend_when_built(
    entry: dict[str, object], expected: str
) -> None:
    with pytest.raises(ConfigError, match="alias 'x'") as info:
        ResourceConfig({"x": entry})
    assert expected in str(info.value)


def test_backend_options_the_backend_takes_are_kept() -> None:
    entry = {"provider": "anthropic", "model": "c", "backend_options": {"max_tokens_default": 9}}
    endpoint = ResourceConfig({"x": entry}).resolve("x")
    assert dict(endpoint.backend_options) == {"max_tokens_default": 9}


def test_budget_needs_a_known_price() -> None:
    with pytest.raises(ConfigError, match="alias 'x': key 'budget' is set but the price"):
        ResourceConfig({"x": {"provider": "openai", "model": "my-vllm-model", "budget": 5}})
    priced = {"provider": "openai", "model": "my-vllm-model", "budget": 5}
    priced["price"] = {"input": 1, "output": 2}
    assert ResourceConfig({"x": priced}).resolve("x").effective_price == Price(1.0, 2.0)
    assert ResourceConfig({"x": {**OPENAI, "budget": 5}}).resolve("x").budget == 5.0


def test_null_means_not_set() -> None:
    endpoint = ResourceConfig({"x": {**OPENAI, "rpm": None, "max_concurrent": None}}).resolve("x")
    assert endpoint.rpm is None and endpoint.max_concurrent is None


def test_top_level_must_be_a_non_empty_mapping() -> None:
    with pytest.raises(ConfigError, match="expects a mapping"):
        ResourceConfig(["fast"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no aliases"):
        ResourceConfig({})


def test_repr_is_readable_and_never_shows_secrets() -> None:
    config = ResourceConfig(
        {
            "fast": {
                **OPENAI,
                "max_concurrent": 4,
                "api_key": "sk-very-secret",
                "headers": {"Authorization": "Bearer hidden-token"},
            }
        }
    )
    for text in (repr(config), repr(config.resolve("fast"))):
        assert "sk-very-secret" not in text and "hidden-token" not in text
    assert repr(config) == "ResourceConfig({'fast': openai:gpt-4o-mini max_concurrent=4})"
    assert config.resolve("fast").api_key == "sk-very-secret"


def test_from_json_toml_and_yaml(tmp_path) -> None:
    data = {"fast": {**OPENAI, "rpm": 500}, "*": {"provider": "local"}}
    (tmp_path / "r.json").write_text(json.dumps(data))
    (tmp_path / "r.toml").write_text(
        '[fast]\nprovider = "openai"\nmodel = "gpt-4o-mini"\nrpm = 500\n\n'
        '["*"]\nprovider = "local"\n'
    )
    (tmp_path / "r.yaml").write_text(
        "fast:\n  provider: openai\n  model: gpt-4o-mini\n  rpm: 500\n'*':\n  provider: local\n"
    )
    for name in ("r.json", "r.toml", "r.yaml"):
        config = ResourceConfig.from_file(tmp_path / name)
        assert config.resolve("fast").rpm == 500.0
        assert config.resolve("other").provider == "local"
        assert config.source == str(tmp_path / name)


def test_file_errors_name_the_file(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[fast\nprovider = 1\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: invalid TOML"):
        ResourceConfig.from_file(bad)
    broken = tmp_path / "broken.json"
    broken.write_text('{"fast": {"provider": "openai",}}')
    with pytest.raises(ConfigError, match=r"broken\.json:1:\d+: invalid JSON"):
        ResourceConfig.from_file(broken)
    invalid = tmp_path / "invalid.yml"
    invalid.write_text("fast:\n  provider: openai\n  modle: gpt-4o\n")
    with pytest.raises(ConfigError, match=r"invalid\.yml: invalid ResourceConfig") as info:
        ResourceConfig.from_file(invalid)
    assert "unknown key 'modle'; did you mean 'model'?" in str(info.value)
    with pytest.raises(ConfigError, match=r"missing\.json: no such file; check the path"):
        ResourceConfig.from_file(tmp_path / "missing.json")
    (tmp_path / "folder.toml").mkdir()
    with pytest.raises(ConfigError, match=r"folder\.toml is a folder; name the config file"):
        ResourceConfig.from_file(tmp_path / "folder.toml")
    with pytest.raises(ConfigError, match=r"unknown config file type '\.ini'"):
        ResourceConfig.from_file(tmp_path / "r.ini")


def test_a_file_that_is_not_utf8_names_the_file_and_the_byte(tmp_path) -> None:
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('{"fast": {"provider": "openai",\n "model": "gpt-4o-mini"}}  # caf\xe9'
                       .encode("latin-1"))  # fmt: skip
    with pytest.raises(ConfigError) as info:
        ResourceConfig.from_file(latin1)
    assert str(info.value) == (
        f"{latin1}: config files must be UTF-8 text, but byte 0xe9 at offset 64 (line 2) is "
        "not; save the file as UTF-8"
    )


# -- which environment variables a configuration may send as its key -----------------------


def key_file(tmp_path, variable: str):
    path = tmp_path / "resources.toml"
    path.write_text(
        '[llm]\nprovider = "openai"\nmodel = "m"\nbase_url = "https://llm.example/v1"\n'
        f'api_key_env = "{variable}"\n'
    )
    return path


@pytest.mark.parametrize(
    "variable",
    [
        "HOME",
        "DATABASE_URL",
        "AWS_REGION",
        "MONKEY",
        "PATH",
        "AWS_SECRET_ACCESS_KEY",
        "GITHUB_TOKEN",
    ],
)
def test_a_file_may_not_send_a_variable_that_is_not_a_credential_as_its_key(
    tmp_path, variable: str
) -> None:
    path = key_file(tmp_path, variable)
    with pytest.raises(ConfigError) as info:
        ResourceConfig.from_file(path)
    message = str(info.value)
    assert str(path) in message and "alias 'llm': key 'api_key_env'" in message
    assert f"allow_api_key_env({variable!r})" in message


@pytest.mark.parametrize(
    "variable", ["OPENAI_API_KEY", "MY_SERVICE_API_KEY", "MY_API_TOKEN", "API_KEY", "GROQ_APIKEY"]
)
def test_a_file_may_name_variables_that_look_like_credentials(tmp_path, variable: str) -> None:
    assert ResourceConfig.from_file(key_file(tmp_path, variable)).resolve("llm").api_key_env == (
        variable
    )


def test_code_may_name_any_variable_and_may_allow_one_for_files(tmp_path) -> None:
    from plait.resources import allow_api_key_env

    entry = {**OPENAI, "api_key_env": "CORP_LLM_CREDENTIAL"}
    assert ResourceConfig({"llm": entry}).resolve("llm").api_key_env == "CORP_LLM_CREDENTIAL"
    path = key_file(tmp_path, "CORP_LLM_CREDENTIAL")
    with pytest.raises(ConfigError, match="does not look like an API key"):
        ResourceConfig.from_file(path)
    allow_api_key_env("CORP_LLM_CREDENTIAL")
    assert ResourceConfig.from_file(path).resolve("llm").api_key_env == "CORP_LLM_CREDENTIAL"
    with pytest.raises(ValueError, match="environment variable name"):
        allow_api_key_env("not a name")
