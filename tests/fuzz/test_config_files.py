"""Resource configuration files (JSON, TOML, YAML), read by `ResourceConfig.from_file`.

Whatever a file holds, reading it gives a configuration or a `ConfigError`
naming the file, and a configuration that was read can be shown (``repr``,
``describe``) and compared (``identity``, what `ResourceManager.shared`
keys on) in bounded time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait.errors import ConfigError
from plait.resources import ResourceConfig

from .support import Nest, documents, fuzz, mutated_bytes, mutated_json, outcome

VALID: dict[str, Any] = {
    "fast": {
        "provider": "openai",
        "model": "gpt-4o-mini",
        "base_url": "https://api.example.com/v1",
        "api_key_env": "EXAMPLE_KEY",
        "max_concurrent": 8,
        "rpm": 500,
        "timeout": 30.5,
        "headers": {"X-Team": "search"},
        "cache": {"path": "cache.sqlite", "memory_entries": 100},
        "price": {"input": 0.15, "output": 0.6},
        "budget": 5.0,
    },
    "judge": {"provider": "anthropic", "model": "claude-3-5-haiku-latest", "max_retries": 2},
    "*": {"provider": "local", "n_ctx": 2048, "backend_options": {"n_threads": 2}},
}


def toml_value(value: Any) -> str:
    """Writes one value as TOML (strings in JSON's escapes, which TOML mostly shares)."""
    if isinstance(value, Nest):
        return value.text().replace('"a":', "a =")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        pairs = ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items())
        return "{" + pairs + "}"
    return json.dumps(value)  # strings; None becomes null, which TOML refuses


def toml_text(data: Any) -> bytes:
    """Writes a configuration as TOML: a table per alias (anything else as a plain key)."""
    if not isinstance(data, dict):
        return f"value = {toml_value(data)}\n".encode("utf-8", "surrogatepass")
    plain = [
        f"{json.dumps(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)
    ]
    tables = [
        f"[{json.dumps(alias)}]\n"
        + "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in entry.items())
        for alias, entry in data.items()
        if isinstance(entry, dict)
    ]
    return ("\n".join(plain) + "\n" + "\n".join(tables)).encode("utf-8", "surrogatepass")


VALID_TOML = toml_text(VALID)
TOML_FRAGMENTS = (b"[[a]]\n", b"[a.b]\n", b'"x" = ', b"= 1979-05-27T07:32:00Z", b"'''", b'"""')

VALID_YAML = b"""\
defaults: &defaults
  max_retries: 2
  timeout: 30
fast:
  <<: *defaults
  provider: openai
  model: gpt-4o-mini
  headers: {X-Team: search}
  price: {input: 0.15, output: 0.6}
"*":
  provider: local
  backend_options:
    n_threads: 2
"""
YAML_FRAGMENTS = (
    b"&a ",
    b"*a",
    b"<<: *defaults\n",
    b"&r [*r]",  # a list that holds itself
    b"!!python/object/apply:os.system ['true']",
    b"!!timestamp 2020-13-45",
    b"!!binary ",
    b"!!float x",
    b"? [1]: 2\n",
    b"\t",
    b"---\n",
    b"%YAML 1.1\n",
)

FILES = {
    ".json": st.one_of(documents(VALID), documents(VALID).map(lambda b: b.replace(b"  ", b"\n"))),
    ".toml": st.one_of(
        mutated_json(VALID).map(toml_text),
        mutated_bytes(VALID_TOML, TOML_FRAGMENTS),
        st.binary(max_size=200),
    ),
    # PyYAML takes seconds to scan thousands of open brackets (bounded: the pinned
    # test below reads 100,000 in about 4 s), so fuzzed YAML nests 500 deep at most,
    # which is already past what its recursive reader can take.
    ".yaml": st.one_of(
        documents(VALID, deepest=500),  # JSON text is YAML too
        mutated_bytes(VALID_YAML, YAML_FRAGMENTS, deepest=500),
        st.binary(max_size=200),
    ),
}


def read_and_use(path: Path) -> ResourceConfig:
    """Reads a configuration and does what a run does with it before any call."""
    config = ResourceConfig.from_file(path)
    repr(config)
    hash(config.identity)
    for endpoint in config.endpoints():
        endpoint.describe()
    return config


@pytest.mark.parametrize("suffix", sorted(FILES))
@fuzz(300)
@given(data=st.data())
def test_any_config_file_gives_a_configuration_or_a_config_error(
    tmp_path: Path, suffix: str, data: st.DataObject
) -> None:
    content = data.draw(FILES[suffix], label="file")
    path = tmp_path / f"resources{suffix}"
    path.write_bytes(content)
    result = outcome(f"config file ({suffix[1:]})", lambda: read_and_use(path))
    if isinstance(result, ConfigError):
        assert str(path) in str(result)


# -- what the fuzzing found, pinned ---------------------------------------------------------

NESTED = b"[" * 100_000
DIGITS = b"1" * 5_000
LAUGHS = b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n".encode()
    for i in range(8)
)
"""YAML whose aliases multiply: ten times more values at each of nine levels."""

BAD_FILES = {
    "provider is a list": (
        ".json",
        b'{"a": {"provider": ["openai"], "model": "m"}}',
        "alias 'a': unknown provider ['openai']",
    ),
    "json nested too deeply": (".json", b'{"a": ' + NESTED, "nested too deeply"),
    "toml nested too deeply": (".toml", b"a = " + NESTED, "nested too deeply"),
    "yaml nested too deeply": (".yaml", NESTED, "nested too deeply"),
    "json integer too long": (".json", b'{"a": ' + DIGITS + b"}", "invalid JSON"),
    "toml integer too long": (".toml", b"a = " + DIGITS, "invalid TOML"),
    "yaml integer too long": (".yaml", b"a: " + DIGITS, "invalid YAML"),
    "yaml impossible date": (".yaml", b"a: 2020-13-45", "invalid YAML"),
    "yaml tagged float": (".yaml", b"a: !!float x", "invalid YAML"),
    "yaml tagged timestamp that is not one": (".yaml", b"a: !!timestamp x", "invalid YAML"),
    "option nested too deeply": (
        ".json",
        b'{"*": {"provider": "local", "backend_options": {"n_threads": '
        + b"[" * 400
        + b"]" * 400
        + b"}}}",
        "nested more than 100 levels deep",
    ),
    "yaml alias inside its own anchor": (
        ".yaml",
        b'"*": {provider: local, backend_options: &r {n_threads: [*r]}}',
        "nested more than 100 levels deep",
    ),
    "yaml aliases that multiply": (".yaml", LAUGHS, "more than 100,000 values"),
}


@pytest.mark.parametrize(("suffix", "content", "problem"), BAD_FILES.values(), ids=BAD_FILES)
def test_a_bad_config_file_is_a_config_error_naming_the_file(
    tmp_path: Path, suffix: str, content: bytes, problem: str
) -> None:
    path = tmp_path / f"resources{suffix}"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        outcome("config file (pinned)", lambda: read_and_use(path), allowed=())
    assert str(path) in str(info.value)
    assert problem in str(info.value)
