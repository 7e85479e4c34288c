"""The response cache (memory LRU over SQLite), alone and behind a real ResourceManager.

Calls go over loopback HTTP to the scripted server; "no request was sent" is
always the server's own count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from plait.backends.types import (
    Message,
    Request,
    Response,
    ResponseSchema,
    SamplingOptions,
    ToolCall,
    ToolSpec,
    Usage,
)
from plait.errors import ConfigError
from plait.resources import ResourceConfig, ResourceManager
from plait.resources.cache import (
    DEFAULT_MEMORY_ENTRIES,
    CacheWarning,
    ResponseCacheStore,
    cache_key,
    create_cache,
    default_cache_path,
)
from plait.resources.state.sqlite import SQLiteStore
from plait.testing import Fault, ScriptedServer


def ask(text: str = "hello", **kwargs: Any) -> Request:
    return Request(messages=(Message("user", text),), **kwargs)


def endpoint(server: ScriptedServer, cache: Any, **options: Any) -> dict[str, Any]:
    return {
        "provider": "openai",
        "model": "gpt-4o-mini",  # priced in the built-in table: misses cost something
        "base_url": server.base_url,
        "api_key": "test-key",
        "retry_base_delay": 0.01,
        "cache": cache,
        **options,
    }


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as running:
        yield running


@pytest.fixture
def cache_file(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "responses.sqlite"


# -- keys -------------------------------------------------------------------------------

BASE_CONFIG = ResourceConfig(
    {
        "a": {"provider": "openai", "model": "gpt-4o-mini", "cache": True},
        "other_model": {"provider": "openai", "model": "gpt-4o", "cache": True},
        "other_provider": {"provider": "anthropic", "model": "gpt-4o-mini", "cache": True},
        "secret": {
            "provider": "openai",
            "model": "gpt-4o-mini",
            "cache": True,
            "api_key": "sk-other",
            "base_url": "http://elsewhere.invalid/v1",
            "headers": {"Authorization": "Bearer x"},
            "timeout": 5,
        },
    }
)
BASE = Request(
    messages=(Message("system", "Be brief."), Message("user", "hello")),
    options=SamplingOptions(temperature=0.0, max_tokens=50),
)
WEATHER = ToolSpec("weather", "Looks up the weather.", {"type": "object", "properties": {}})
VARIANTS = {
    "temperature": dataclasses.replace(BASE, options=SamplingOptions(0.7, 50)),
    "max_tokens": dataclasses.replace(BASE, options=SamplingOptions(0.0, 51)),
    "top_p": dataclasses.replace(BASE, options=SamplingOptions(0.0, 50, top_p=0.9)),
    "stop": dataclasses.replace(BASE, options=SamplingOptions(0.0, 50, stop=("\n",))),
    "seed": dataclasses.replace(BASE, options=SamplingOptions(0.0, 50, seed=1)),
    "presence_penalty": dataclasses.replace(
        BASE, options=SamplingOptions(0.0, 50, presence_penalty=0.5)
    ),
    "frequency_penalty": dataclasses.replace(
        BASE, options=SamplingOptions(0.0, 50, frequency_penalty=0.5)
    ),
    "user message": BASE.with_messages((Message("system", "Be brief."), Message("user", "hi"))),
    "system message": BASE.with_messages((Message("system", "Be long."), Message("user", "hello"))),
    "role": BASE.with_messages((Message("user", "Be brief."), Message("user", "hello"))),
    "tool call in history": BASE.with_messages(
        (*BASE.messages, Message("assistant", "", tool_calls=(ToolCall("c1", "f", "{}"),)))
    ),
    "tool turn": BASE.with_messages(
        (*BASE.messages, Message("tool", "sunny", tool_call_id="c1", name="weather"))
    ),
    "tool turn name": BASE.with_messages(
        (*BASE.messages, Message("tool", "sunny", tool_call_id="c1", name="forecast"))
    ),
    "model override": dataclasses.replace(BASE, model="gpt-4o"),
    "tools": dataclasses.replace(BASE, tools=(WEATHER,)),
    "tool_choice": dataclasses.replace(BASE, tool_choice="required"),
    "response schema": dataclasses.replace(
        BASE, response_schema=ResponseSchema("Answer", {"type": "object"})
    ),
    "strict schema": dataclasses.replace(
        BASE, response_schema=ResponseSchema("Answer", {"type": "object"}, strict=True)
    ),
    "rollout_id": dataclasses.replace(BASE, rollout_id="sample-1"),
}


def test_key_is_a_sha256_stable_for_an_equal_request() -> None:
    key = cache_key(BASE_CONFIG["a"], BASE)
    assert len(key) == 64 and int(key, 16) >= 0
    same = Request(
        messages=(Message("system", "Be brief."), Message("user", "hello")),
        options=SamplingOptions(max_tokens=50, temperature=0.0),
    )
    assert cache_key(BASE_CONFIG["a"], same) == key


@pytest.mark.parametrize("change", sorted(VARIANTS))
def test_every_part_of_the_provider_request_changes_the_key(change: str) -> None:
    endpoint = BASE_CONFIG["a"]
    assert cache_key(endpoint, VARIANTS[change]) != cache_key(endpoint, BASE)


def test_model_and_provider_of_the_endpoint_change_the_key() -> None:
    key = cache_key(BASE_CONFIG["a"], BASE)
    assert cache_key(BASE_CONFIG["other_model"], BASE) != key
    assert cache_key(BASE_CONFIG["other_provider"], BASE) != key


def test_credentials_urls_headers_and_timeouts_are_not_in_the_key() -> None:
    assert cache_key(BASE_CONFIG["secret"], BASE) == cache_key(BASE_CONFIG["a"], BASE)
    assert cache_key(BASE_CONFIG["a"], dataclasses.replace(BASE, timeout=3.0)) == cache_key(
        BASE_CONFIG["a"], BASE
    )


# -- through the manager ----------------------------------------------------------------


async def test_a_repeated_call_is_served_from_the_cache_at_no_cost(
    server: ScriptedServer, cache_file: Path
) -> None:
    config = {"fast": endpoint(server, str(cache_file))}
    async with ResourceManager(config) as manager:
        first = await manager.complete("fast", ask())
        second = await manager.complete("fast", ask())
        assert server.stats.requests == 1
        assert (second.text, second.usage.input_tokens) == (first.text, first.usage.input_tokens)
        assert second.meta["cached"] is True and "cached" not in first.meta
        assert second.usage.cost == 0.0 and first.usage.cost > 0
        assert manager.total_usage().cost == first.usage.cost
        second.usage.output_tokens = 999  # a hit is a fresh object: changing it changes nothing
        third = await manager.complete("fast", ask())
        assert third.usage.output_tokens == first.usage.output_tokens
        assert manager.stats()["fast"].cache_hits == 2


async def test_the_cache_outlives_the_manager_on_disk(
    server: ScriptedServer, cache_file: Path
) -> None:
    config = ResourceConfig({"fast": endpoint(server, str(cache_file))})
    async with ResourceManager(config) as manager:
        first = await manager.complete("fast", ask("remember me"))
    async with ResourceManager(config) as manager:
        again = await manager.complete("fast", ask("remember me"))
    assert server.stats.requests == 1
    assert again.text == first.text == "echo: remember me" and again.meta["cached"] is True


async def test_rollout_ids_get_separate_entries(server: ScriptedServer, cache_file: Path) -> None:
    samples = iter(range(100))
    server.responder = lambda body: f"sample {next(samples)}"
    hot = SamplingOptions(temperature=1.0)
    async with ResourceManager({"fast": endpoint(server, str(cache_file))}) as manager:
        first = [
            (await manager.complete("fast", ask(options=hot, rollout_id=r))).text
            for r in ("r1", "r2")
        ]
        assert first == ["sample 0", "sample 1"]  # two distinct samples
        assert server.stats.requests == 2
        for rollout, text in (("r1", "sample 0"), ("r2", "sample 1"), ("r1", "sample 0")):
            hit = await manager.complete("fast", ask(options=hot, rollout_id=rollout))
            assert (hit.text, hit.meta["cached"]) == (text, True)
        assert server.stats.requests == 2
    # rollout_id only separates cache entries: it never reaches the provider
    one, two = server.stats.log
    assert one.body == two.body


async def test_a_changed_sampling_option_is_a_miss(
    server: ScriptedServer, cache_file: Path
) -> None:
    async with ResourceManager({"fast": endpoint(server, str(cache_file))}) as manager:
        await manager.complete("fast", ask(options=SamplingOptions(temperature=0.0)))
        await manager.complete("fast", ask(options=SamplingOptions(temperature=0.5)))
        await manager.complete("fast", ask(options=SamplingOptions(temperature=0.5, top_p=0.5)))
        assert server.stats.requests == 3
        await manager.complete("fast", ask(options=SamplingOptions(temperature=0.5)))
        assert server.stats.requests == 3


async def test_endpoints_differing_only_in_key_and_url_share_entries(cache_file: Path) -> None:
    async with ScriptedServer() as one, ScriptedServer() as two:
        config = {
            "a": endpoint(one, str(cache_file), api_key="key-one"),
            "b": endpoint(two, str(cache_file), api_key="key-two", headers={"X-Team": "b"}),
        }
        async with ResourceManager(config) as manager:
            first = await manager.complete("a", ask())
            shared = await manager.complete("b", ask())
        assert (one.stats.requests, two.stats.requests) == (1, 0)
        assert shared.text == first.text and shared.meta["cached"] is True


async def test_per_call_switch_skips_lookup_and_store(
    server: ScriptedServer, cache_file: Path
) -> None:
    async with ResourceManager({"fast": endpoint(server, str(cache_file))}) as manager:
        await manager.complete("fast", ask(), cache=False)
        await manager.complete("fast", ask(), cache=False)
        assert server.stats.requests == 2
        await manager.complete("fast", ask())  # nothing was stored by the uncached calls
        assert server.stats.requests == 3


async def test_values_are_plain_json_with_tool_calls(
    server: ScriptedServer, cache_file: Path
) -> None:
    server.responder = lambda body: {
        "content": "",
        "tool_calls": [{"name": "weather", "arguments": {"city": "Paris"}}],
    }
    async with ResourceManager({"fast": endpoint(server, str(cache_file))}) as manager:
        first = await manager.complete("fast", ask())
        again = await manager.complete("fast", ask())
    assert again.tool_calls == first.tool_calls and again.finish_reason == "tool_calls"
    with sqlite3.connect(cache_file) as db:
        (raw,) = db.execute("SELECT value FROM responses").fetchone()
    db.close()
    stored = json.loads(raw)
    assert stored == {
        "text": "",
        "tool_calls": [
            {"id": first.tool_calls[0].id, "name": "weather", "arguments": '{"city":"Paris"}'}
        ],
        "usage": {"input_tokens": 1, "output_tokens": 1},
        "finish_reason": "tool_calls",
        "model": "gpt-4o-mini",
    }


# -- a broken file ----------------------------------------------------------------------


def overwrite(path: Path, keep: int = 0) -> None:
    """Writes deterministic garbage over ``path``, keeping its first ``keep`` bytes."""
    data = path.read_bytes()
    garbage = bytes((i * 97 + 13) % 256 for i in range(len(data) - keep))
    path.write_bytes(data[:keep] + garbage)


async def fill(server: ScriptedServer, cache_file: Path, count: int) -> None:
    async with ResourceManager({"fast": endpoint(server, str(cache_file))}) as manager:
        await asyncio.gather(*(manager.complete("fast", ask(f"q{i}")) for i in range(count)))


@pytest.mark.parametrize(
    "keep",
    [0, 100, 4096],
    ids=["whole file", "header kept", "first page kept: found on the first read"],
)
async def test_a_corrupted_file_is_reported_once_and_bypassed(
    server: ScriptedServer, cache_file: Path, keep: int
) -> None:
    await fill(server, cache_file, 200)
    overwrite(cache_file, keep)
    server.reset_stats()
    config = ResourceConfig({"fast": endpoint(server, str(cache_file))})
    with pytest.warns(CacheWarning) as caught:
        async with ResourceManager(config) as manager:
            replies = [await manager.complete("fast", ask(f"q{i}")) for i in range(5)]
        async with ResourceManager(config) as manager:  # a new manager opens it anew
            await manager.complete("fast", ask("q0"))
    assert [r.text for r in replies] == [f"echo: q{i}" for i in range(5)]
    assert server.stats.requests == 6  # every call went to the provider
    assert not any(r.meta.get("cached") for r in replies)
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(messages) == 2  # once per opening of the file, not once per call
    assert str(cache_file) in messages[0] and "is unusable" in messages[0]


async def test_a_file_of_another_program_or_format_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "app.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    db.close()
    with pytest.warns(CacheWarning, match="another program"):
        store = SQLiteStore(foreign)
    assert not store.is_usable and store.get("responses", "k") is None
    store.add("responses", "k", b"{}")  # dropped, the file is left alone
    with sqlite3.connect(foreign) as db:
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == [("users",)]
    db.close()

    newer = tmp_path / "newer.sqlite"
    with sqlite3.connect(newer) as db:
        db.execute("PRAGMA user_version=7")
    db.close()
    with pytest.warns(CacheWarning, match="format 7"):
        SQLiteStore(newer).close()


def test_an_unwritable_location_is_reported_and_bypassed(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    with pytest.warns(CacheWarning, match="not-a-dir"):
        store = SQLiteStore(blocker / "responses.sqlite")
    assert store.error and store.get("responses", "k") is None


@pytest.mark.parametrize("planted", ["responses.sqlite", "responses.sqlite-wal"])
def test_a_link_planted_as_the_cache_file_is_refused_and_its_target_untouched(
    tmp_path: Path, planted: str
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / planted).symlink_to(victim)
    with pytest.warns(CacheWarning, match="symbolic link"):
        store = SQLiteStore(tmp_path / "responses.sqlite")
    store.add("responses", "k", b"{}")
    store.close()
    assert not store.is_usable and victim.read_text() == "precious\n"


# -- memory -----------------------------------------------------------------------------


def stored(text: str) -> Response:
    return Response(text, usage=Usage(2, 3), finish_reason="stop", model="m")


async def test_memory_holds_at_most_memory_entries_and_disk_keeps_the_rest(
    cache_file: Path,
) -> None:
    cache = ResponseCacheStore(cache_file, memory_entries=3)
    try:
        for i in range(5):
            await cache.put(f"k{i}", stored(f"r{i}"))
        assert len(cache.memory) == 3
        assert [f"k{i}" in cache.memory for i in range(5)] == [False, False, True, True, True]
        await cache.get("k2")  # now the most recently used: k3 goes next
        await cache.put("k5", stored("r5"))
        assert "k2" in cache.memory and "k3" not in cache.memory and len(cache.memory) == 3
        hit = await cache.get("k0")  # evicted from memory, still on disk
        assert hit is not None and hit.text == "r0" and hit.usage == Usage(2, 3)
        assert "k0" in cache.memory and len(cache.memory) == 3
        assert cache.store is not None and cache.store.count("responses") == 6
    finally:
        await cache.aclose()

    no_memory = ResponseCacheStore(cache_file, memory_entries=0)
    hit = await no_memory.get("k4")
    assert hit is not None and hit.text == "r4" and len(no_memory.memory) == 0
    await no_memory.aclose()


async def test_memory_bound_from_the_config_through_the_manager(
    server: ScriptedServer, cache_file: Path
) -> None:
    config = {"fast": endpoint(server, {"path": str(cache_file), "memory_entries": 4})}
    async with ResourceManager(config) as manager:
        await asyncio.gather(*(manager.complete("fast", ask(f"q{i}")) for i in range(10)))
        cache = manager._endpoints["fast"].cache
        assert isinstance(cache, ResponseCacheStore)
        assert (len(cache.memory), cache.memory.max_entries) == (4, 4)
        replies = [await manager.complete("fast", ask(f"q{i}")) for i in range(10)]
    assert server.stats.requests == 10
    assert all(r.meta["cached"] for r in replies)


# -- configuration ----------------------------------------------------------------------


def test_config_accepts_a_mapping_and_rejects_unknown_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path))
    base = {"provider": "openai", "model": "gpt-4o-mini"}
    config = ResourceConfig({"x": {**base, "cache": {"memory_entries": 5}}})
    assert create_cache(config["x"]).memory.max_entries == 5
    config = ResourceConfig({"x": {**base, "cache": {}}})
    assert config["x"].cache  # an empty mapping still turns the cache on
    with pytest.raises(ConfigError, match=r"alias 'x': key 'cache'.*unknown key\(s\) 'size'"):
        ResourceConfig({"x": {**base, "cache": {"size": 5}}})
    with pytest.raises(ConfigError, match=r"'memory_entries' must be an integer >= 0"):
        ResourceConfig({"x": {**base, "cache": {"memory_entries": -1}}})
    with pytest.raises(ConfigError, match=r"'path' must be a non-empty string"):
        ResourceConfig({"x": {**base, "cache": {"path": ""}}})


async def test_true_uses_the_default_file_under_plait_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path / "plait-cache"))
    assert default_cache_path() == tmp_path / "plait-cache" / "responses.sqlite"
    config = ResourceConfig({"x": {"provider": "openai", "model": "m", "cache": True}})
    cache = create_cache(config["x"])
    try:
        assert cache.path == tmp_path / "plait-cache" / "responses.sqlite"
        assert cache.memory.max_entries == DEFAULT_MEMORY_ENTRIES
        assert cache.path.exists()
    finally:
        await cache.aclose()
    monkeypatch.delenv("PLAIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "xdg" / "plait" / "responses.sqlite"


async def test_caches_of_one_file_share_one_store_until_the_last_closes(
    cache_file: Path,
) -> None:
    first = ResponseCacheStore(cache_file, memory_entries=0)
    second = ResponseCacheStore(cache_file, memory_entries=0)
    assert first.store is second.store
    store = first.store
    assert store is not None
    await first.put("k", stored("shared"))
    hit = await second.get("k")
    assert hit is not None and hit.text == "shared"
    await first.aclose()
    assert store.is_usable  # still used by the second cache
    await second.aclose()
    assert not store.is_usable
    reopened = ResponseCacheStore(cache_file)  # warnings are errors: it opens cleanly
    assert (await reopened.get("k")) is not None
    await reopened.aclose()


async def test_identical_calls_in_flight_together_make_one_request(
    server: ScriptedServer, cache_file: Path
) -> None:
    server.latency = 0.2
    async with ResourceManager({"fast": endpoint(server, str(cache_file))}) as manager:
        first, second, third = await asyncio.gather(
            *(manager.complete("fast", ask()) for _ in "abc")
        )
        assert server.stats.requests == 1
        assert first.text == second.text == third.text
        followers = [r for r in (first, second, third) if r.meta.get("cached")]
        assert len(followers) == 2 and all(r.usage.cost == 0.0 for r in followers)
        assert manager.stats()["fast"].cache_hits == 2


async def test_a_follower_makes_its_own_call_when_the_first_one_fails(
    server: ScriptedServer, cache_file: Path
) -> None:
    server.latency = 0.2
    server.inject(Fault(status=400, times=1))
    async with ResourceManager({"fast": endpoint(server, str(cache_file))}) as manager:
        results = await asyncio.gather(
            manager.complete("fast", ask()), manager.complete("fast", ask()), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        assert len(failures) == 1 and "400" in str(failures[0])
        answer = next(r for r in results if not isinstance(r, BaseException))
        assert answer.text and not answer.meta.get("cached")
        assert server.stats.requests == 2
