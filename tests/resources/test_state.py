"""The state store's contract, run against SQLite and a real PostgreSQL server.

The PostgreSQL server is the session's (tests/postgres_server.py), each test
in a schema of its own; "no request was sent" is the scripted server's count.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from plait.backends.types import Message, Request, Response
from plait.errors import ConfigError
from plait.resources import ResourceConfig, ResourceManager
from plait.resources.cache import ResponseCacheStore
from plait.resources.state import (
    StateError,
    StateOversized,
    StateStore,
    StateUnavailable,
    StateURL,
    open_store,
    release_store,
)
from plait.resources.state.base import prefix_end
from plait.testing import ScriptedServer
from postgres_server import PostgresServer

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as running:
        yield running


def ask(text: str) -> Request:
    return Request(messages=(Message("user", text),))


def endpoint(server: ScriptedServer) -> dict[str, Any]:
    return {
        "provider": "openai",
        "model": "gpt-4o-mini",
        "base_url": server.base_url,
        "api_key": "test-key",
        "retry_base_delay": 0.01,
        "cache": True,
    }


# -- the contract, on both stores -----------------------------------------------------


def test_a_key_is_stored_once_and_read_back(store: StateStore) -> None:
    assert store.get("responses", "k") is None
    assert store.add("responses", "k", b"first")
    assert not store.add("responses", "k", b"second")  # the first value stays
    assert store.get("responses", "k") == b"first"
    assert store.count("responses") == 1
    assert store.delete("responses", "k") and not store.delete("responses", "k")
    assert store.get("responses", "k") is None and store.count("responses") == 0
    with pytest.raises(ValueError, match="unknown state table 'users'"):
        store.get("users", "k")


def test_a_batch_of_writes_stores_each_new_key_once(store: StateStore) -> None:
    assert store.add("responses", "old", b"kept")
    items = [("old", b"replaced?"), ("a", b"1"), ("b", b"2"), ("a", b"again")]
    store.add_many("responses", items)
    assert store.count("responses") == 3
    assert [store.get("responses", k) for k in ("old", "a", "b")] == [b"kept", b"1", b"2"]
    assert store.add_many("responses", []) == 0


def test_concurrent_writers_of_one_key_store_one_row(store: StateStore) -> None:
    stored: list[bool] = []
    start = threading.Barrier(8)

    def write(n: int) -> None:
        start.wait()
        stored.append(store.add("responses", "same", f"writer {n}".encode()))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stored.count(True) == 1
    assert store.count("responses") == 1
    assert (store.get("responses", "same") or b"").startswith(b"writer ")


def test_values_over_the_cap_are_neither_written_nor_read(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert store.add("responses", "big", b"x" * 64)
    module = sys.modules[type(store).__module__]
    monkeypatch.setattr(module, "MAX_VALUE_BYTES", 32)
    assert store.get("responses", "big") is None  # stored before the cap: a cache miss
    assert store.get_many("responses", ["big"]) == {} and store.scan("responses", "") == []
    assert store.update("responses", "big", lambda old: b"fresh" if old is None else old)
    assert store.get("responses", "big") == b"fresh"
    assert not store.add("responses", "bigger", b"x" * 33)
    assert store.add("responses", "small", b"x" * 32)


def test_a_row_over_the_cap_is_refused_by_name_where_reading_it_as_absent_redoes_work(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = ("checkpoints", "pauses", "budgets", "learning")
    for table in tables:
        assert store.put(table, "run/big", b"x" * 64) and store.put(table, "run/small", b"ok")
    monkeypatch.setattr(sys.modules[type(store).__module__], "MAX_VALUE_BYTES", 32)
    for table in tables:
        reads = {
            "get": (store.get, "run/big"),
            "get_many": (store.get_many, ["run/small", "run/big"]),
            "scan": (store.scan, "run/"),
            "update": (store.update, "run/big", lambda old: b"new books"),
            "take": (store.take, "run/big"),
        }
        for name, (read, *args) in reads.items():
            with pytest.raises(StateOversized) as refused:
                read(table, *args)
            message = str(refused.value)
            assert "\n" not in message, name
            assert f"row 'run/big' of table {table} is 64 bytes, over the 32 bytes" in message
            assert f"plait state prune --table {table}" in message, name
        assert store.count(table) == 2  # neither taken nor overwritten
        assert store.get(table, "run/small") == b"ok"
        assert store.take(table, "run/small") == b"ok"


def test_put_replaces_and_take_hands_a_key_to_one_taker(store: StateStore) -> None:
    assert store.put("learning", "search", b"round 1")
    assert store.put("learning", "search", b"round 2")
    assert store.get("learning", "search") == b"round 2" and store.count("learning") == 1
    assert store.add("pauses", "run", b"paused")
    taken: list[bytes | None] = []
    start = threading.Barrier(8)

    def take() -> None:
        start.wait()
        taken.append(store.take("pauses", "run"))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert taken.count(b"paused") == 1 and taken.count(None) == 7
    assert store.get("pauses", "run") is None


def test_update_reads_and_writes_a_key_one_writer_at_a_time(store: StateStore) -> None:
    def increment(value: bytes | None) -> bytes:
        return str(int(value or b"0") + 1).encode()

    start = threading.Barrier(8)

    def work() -> None:
        start.wait()
        for _ in range(20):
            assert store.update("budgets", "books", increment)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.get("budgets", "books") == b"160"  # no increment lost between writers


def test_update_rolls_back_on_an_error_and_deletes_on_none(store: StateStore) -> None:
    store.put("budgets", "books", b"1")

    def refuse(value: bytes | None) -> bytes:
        raise RuntimeError(f"over the budget at {value!r}")

    with pytest.raises(RuntimeError, match="over the budget at b'1'"):
        store.update("budgets", "books", refuse)
    assert store.get("budgets", "books") == b"1"
    seen: list[bytes | None] = []
    assert store.update("budgets", "books", lambda value: seen.append(value) or value)
    assert seen == [b"1"] and store.get("budgets", "books") == b"1"
    assert store.update("budgets", "books", lambda value: None)
    assert store.get("budgets", "books") is None
    assert store.update("budgets", "new", lambda value: b"made" if value is None else value)
    assert store.get("budgets", "new") == b"made"


def test_a_scan_pages_through_one_prefix_in_key_order(store: StateStore) -> None:
    rows = [(f"run-a/{n:05d}", str(n).encode()) for n in range(25)]
    others = [("run-", b"short"), ("run-a", b"the prefix itself, no slash"), ("run-b/00000", b"b")]
    store.add_many("checkpoints", rows + others + [("run-a/\U0010ffff", b"last")])
    seen: list[tuple[str, bytes]] = []
    after = ""
    while page := store.scan("checkpoints", "run-a/", after=after, limit=10):
        assert len(page) <= 10
        seen += page
        after = page[-1][0]
    assert seen == [*sorted(rows), ("run-a/\U0010ffff", b"last")]
    assert store.scan("checkpoints", "run-c/") == []
    assert len(store.scan("checkpoints", "")) == 29  # no prefix: every key
    assert store.delete_prefix("checkpoints", "run-a/") == 26
    assert store.count("checkpoints") == 3


def test_get_many_reads_the_stored_keys_of_a_page_in_one_call(store: StateStore) -> None:
    store.add_many("checkpoints", [(f"run/{n}", str(n).encode()) for n in range(5)])
    found = store.get_many("checkpoints", ["run/1", "run/4", "run/9", "run/\U0010ffff"])
    assert found == {"run/1": b"1", "run/4": b"4"}
    assert store.get_many("checkpoints", []) == {}
    with pytest.raises(ValueError, match="at most"):
        store.get_many("checkpoints", [str(n) for n in range(1001)])


def test_prune_removes_what_was_written_before_a_time(store: StateStore) -> None:
    store.add("checkpoints", "old", b"1")
    cut = time.time() + 0.001
    time.sleep(0.01)
    store.put("checkpoints", "new", b"2")
    assert store.prune("checkpoints", cut) == 1
    assert store.get("checkpoints", "old") is None and store.get("checkpoints", "new") == b"2"


def test_a_closed_store_refuses_a_scan_rather_than_answer_nothing(url: str) -> None:
    opened = open_store(url)
    opened.add("checkpoints", "run/1", b"done")
    release_store(opened)  # the last user: closed
    with pytest.raises(StateUnavailable):
        opened.scan("checkpoints", "run/")
    with pytest.raises(StateUnavailable):
        opened.get_many("checkpoints", ["run/1"])


def test_prefix_end_bounds_exactly_the_keys_of_a_prefix() -> None:
    assert prefix_end("") is None
    assert prefix_end("ab") == "ac"
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("a\ud7ff") == "a\ue000"


def test_one_store_per_url_per_process(url: str) -> None:
    first, second = open_store(url), open_store(url)
    assert first is second
    release_store(first)
    assert first.is_usable  # still held by the second user
    release_store(second)
    assert not first.is_usable


async def test_lookups_asked_together_each_get_their_own_answer(state_url: str) -> None:
    cache = ResponseCacheStore(state_url, memory_entries=0)
    try:
        for n in range(0, 200, 2):  # every even key stored
            await cache.put(f"k{n}", Response(f"reply {n}"))
        await cache.aclose()
        cache = ResponseCacheStore(state_url, memory_entries=0)
        # First while the connection opens (they go in one read once it is open), then on
        # the open connection (the first few sent as they are asked, the rest together).
        for _ in range(2):
            lookups = [asyncio.ensure_future(cache.get(f"k{n}")) for n in range(200)]
            lookups[7].cancel()  # a caller that gives up leaves the others their answers
            answers = await asyncio.gather(*lookups, return_exceptions=True)
            for n, answer in enumerate(answers):
                if n == 7:
                    assert isinstance(answer, asyncio.CancelledError)
                elif n % 2:
                    assert answer is None, n
                else:
                    assert isinstance(answer, Response) and answer.text == f"reply {n}", n
        assert await cache.get("k4") is not None  # the next lookup starts a new read
    finally:
        await cache.aclose()


async def test_a_lookup_is_sent_as_it_is_asked_and_a_later_lookup_reads_its_reply(
    state_url: str,
) -> None:
    # The loop never turns here: the first lookup must be on its way when asked, and its
    # reply read by a later lookup rather than by the loop's reader callback.
    store = open_store(state_url)
    try:
        store.add("responses", "a", b"A")
        reads = store.loop_reads("responses")  # type: ignore[attr-defined]
        assert await reads.get("warm") is None  # the connection is open
        first = reads.get("a")
        future = first.send(None)  # runs to its await: the lookup is written
        later = []
        for _ in range(500):
            if future.done():
                break
            time.sleep(0.01)  # blocks the loop: only a lookup asked now can read the reply
            later.append(reads.get("b"))
            later[-1].send(None)
        assert future.done(), "the first lookup was not answered without a turn of the loop"
        with pytest.raises(StopIteration) as answered:
            first.send(None)
        assert answered.value.value == b"A"
        for lookup in later:
            lookup.close()
        reads.close()
    finally:
        release_store(store)


async def test_a_connection_broken_with_lookups_on_it_answers_misses_and_marks_the_store_down(
    state_url: str,
) -> None:
    import psycopg

    store = open_store(state_url)
    parsed = StateURL.parse(state_url)
    try:
        store.add("responses", "a", b"A")
        reads = store.loop_reads("responses")  # type: ignore[attr-defined]
        assert await reads.get("a") == b"A"
        with (
            psycopg.connect(parsed.target, autocommit=True) as admin,
            psycopg.connect(parsed.target) as blocker,
        ):
            blocker.execute(f"LOCK TABLE {parsed.schema}.responses IN ACCESS EXCLUSIVE MODE")
            keys = ["a", "b", "a", "c"] * 3  # more than go at once: some wait to go together
            lookups = [asyncio.ensure_future(reads.get(key)) for key in keys]
            waiting: list[Any] = []
            for _ in range(500):  # until the server holds them behind the lock
                await asyncio.sleep(0.002)
                waiting = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                ).fetchall()
                if waiting:
                    break
            assert len(waiting) == 1, "the lookups did not go on one connection"
            admin.execute("SELECT pg_terminate_backend(%s)", waiting[0])
            missed = await asyncio.wait_for(asyncio.gather(*lookups), 10)
            assert missed == [None] * len(keys)
            assert store.error is not None and "administrator" in store.error  # type: ignore[attr-defined]
            assert await reads.get("a") is None  # the store is skipped for a moment
        for _ in range(100):  # then a new connection answers
            await asyncio.sleep(0.05)
            if await reads.get("a") == b"A":
                break
        else:
            pytest.fail("the lookups never read from a new connection")
        reads.close()
    finally:
        release_store(store)


async def test_lookups_on_the_loop_read_keys_of_any_text_and_miss_once_closed(
    state_url: str,
) -> None:
    store = open_store(state_url)
    try:
        keys = ["plain", 'quote"d', "back\\slash", "comma,key", "{brace}", "NULL", " spaced ", "ü"]
        for key in keys:
            store.add("responses", key, key.encode() + b"\x00\xff")
        reads = store.loop_reads("responses")  # type: ignore[attr-defined]
        found = await asyncio.gather(*(reads.get(key) for key in [*keys, "absent"]))
        assert found == [key.encode() + b"\x00\xff" for key in keys] + [None]
        reads.close()
        assert await reads.get("plain") is None
    finally:
        release_store(store)


async def test_the_cache_keeps_replies_in_the_store_a_new_manager_reads(
    url: str, server: ScriptedServer
) -> None:
    config = ResourceConfig({"fast": endpoint(server)}, state=url)
    async with ResourceManager(config) as manager:
        first = [await manager.complete("fast", ask(f"q{i}")) for i in range(5)]
    async with ResourceManager(config) as manager:  # its memory is empty: the store answers
        again = [await manager.complete("fast", ask(f"q{i}")) for i in range(5)]
    assert server.stats.requests == 5
    assert [r.text for r in again] == [r.text for r in first]
    assert all(r.meta["cached"] for r in again)


async def test_plait_run_with_state_keeps_the_cache_in_the_store(
    url: str, server: ScriptedServer
) -> None:
    import plait

    program = plait.LLMInference("fast")
    outputs = await plait.run(
        program, ["a", "b", "c"], resources={"fast": endpoint(server)}, state=url
    )
    assert [str(o) for o in outputs] == ["echo: a", "echo: b", "echo: c"]
    store = open_store(url)
    try:
        for _ in range(100):  # PostgreSQL writes are not waited for; they land soon
            if store.count("responses") == 3:
                break
            await asyncio.sleep(0.05)
        assert store.count("responses") == 3
    finally:
        release_store(store)


# -- PostgreSQL: schema, URL, faults -----------------------------------------------------


def test_a_newer_schema_is_refused_saying_what_to_do(state_url: str) -> None:
    import psycopg

    release_store(open_store(state_url))  # creates the schema, version 1
    parsed = StateURL.parse(state_url)
    with psycopg.connect(parsed.target, autocommit=True) as conn:
        conn.execute(f"UPDATE {parsed.schema}.meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(StateError, match=r"format 99, newer than this plait.*upgrade plait"):
        open_store(state_url)


def test_the_password_is_masked_in_every_repr_and_error(postgres_server: PostgresServer) -> None:
    closed = _closed_port()
    url = f"postgresql://bob:hunter2@127.0.0.1:{closed}/db?schema=proj&sslmode=disable"
    parsed = StateURL.parse(url)
    assert "hunter2" not in f"{parsed} {parsed!r}" and "bob:***@" in str(parsed)
    assert "hunter2" in parsed.target and "schema" not in parsed.target
    with pytest.raises(StateError) as caught:
        open_store(url)
    message = str(caught.value)
    assert f"127.0.0.1:{closed}" in message and "hunter2" not in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=r"bob:\*\*\*@.*schema 'Bad-Name'"):
        StateURL.parse("postgresql://bob:hunter2@h/db?schema=Bad-Name")
    with pytest.raises(ConfigError, match="unknown scheme 'mysql'"):
        StateURL.parse("mysql://bob:hunter2@h/db")


async def test_the_database_restarted_mid_run_fails_no_call_and_the_cache_reconnects(
    postgres_server: PostgresServer, state_url: str, server: ScriptedServer
) -> None:
    server.latency = 0.02
    config = ResourceConfig({"fast": endpoint(server)}, state=state_url)
    async with ResourceManager(config) as manager:
        cache = manager._endpoint(config["fast"]).cache
        assert isinstance(cache, ResponseCacheStore) and cache.store is not None
        before = [manager.complete("fast", ask(f"before {i}")) for i in range(40)]
        restart = asyncio.to_thread(postgres_server.restart)
        results = await asyncio.gather(restart, *before)
        during = await asyncio.gather(*(manager.complete("fast", ask(f"d {i}")) for i in range(40)))
        assert all(r.text.startswith("echo: ") for r in [*results[1:], *during])
        # The store comes back by itself: a new reply reaches it once it answers.
        for attempt in range(100):
            await manager.complete("fast", ask(f"after {attempt}"))
            await asyncio.sleep(0.05)
            if cache.store.get("responses", cache.key(config["fast"], ask(f"after {attempt}"))):
                break
        else:
            pytest.fail("the cache never wrote to the restarted database again")


async def test_a_database_that_does_not_answer_slows_no_call_past_its_timeout(
    state_url: str, server: ScriptedServer
) -> None:
    import psycopg

    config = ResourceConfig({"fast": endpoint(server)}, state=state_url)
    async with ResourceManager(config) as manager:
        await manager.complete("fast", ask("warm"))  # the schema exists, the pool is open
        parsed = StateURL.parse(state_url)
        with psycopg.connect(parsed.target) as blocker:  # holds the table until it closes
            blocker.execute(f"LOCK TABLE {parsed.schema}.responses IN ACCESS EXCLUSIVE MODE")
            replies = await asyncio.gather(
                *(manager.complete("fast", ask(f"blocked {i}")) for i in range(4))
            )
        assert [r.text for r in replies] == [f"echo: blocked {i}" for i in range(4)]
        assert not any(r.meta.get("cached") for r in replies)
    assert server.stats.requests == 5


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- processes ---------------------------------------------------------------------------

CHILD = """
import asyncio, json, sys
from plait.backends.types import Message, Request
from plait.resources import ResourceConfig, ResourceManager

async def main():
    config = ResourceConfig(json.loads(sys.argv[1]), state=sys.argv[2])
    async with ResourceManager(config) as manager:
        replies = await asyncio.gather(*(
            manager.complete("fast", Request(messages=(Message("user", f"q{i}"),)))
            for i in range(20)
        ))
    print(sum(1 for r in replies if r.meta.get("cached")))

asyncio.run(main())
"""


async def test_two_processes_share_the_cache_through_postgres(
    state_url: str, server: ScriptedServer
) -> None:
    import json

    env = {**os.environ, "PYTHONPATH": SRC}
    args = [sys.executable, "-c", CHILD, json.dumps({"fast": endpoint(server)}), state_url]
    first = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    assert server.stats.requests == 20 and first.stdout.strip() == "0"
    second = await asyncio.to_thread(subprocess.run, args, capture_output=True, text=True, env=env)
    assert second.returncode == 0, second.stderr
    assert server.stats.requests == 20  # the second process sent nothing upstream
    assert second.stdout.strip() == "20"


def test_plait_run_with_an_unreachable_state_store_says_so_in_one_line(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "hi"}\n')
    resources = tmp_path / "res.toml"
    resources.write_text('[fast]\nprovider = "openai"\nmodel = "gpt-4o-mini"\ncache = true\n')
    program = tmp_path / "prog.py"
    program.write_text(
        "import plait\n"
        "class Echo(plait.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.llm = plait.LLMInference('fast')\n"
        "    def forward(self, text):\n"
        "        return self.llm(text)\n"
    )
    closed = _closed_port()
    url = f"postgresql://bob:hunter2@127.0.0.1:{closed}/db"
    done = subprocess.run(
        [sys.executable, "-m", "plait", "run", f"{program}:Echo", "-i", str(rows), "-o",
         str(tmp_path / "out.jsonl"), "-r", str(resources), "--state", url],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC,
                                             "OPENAI_API_KEY": "test-key"},
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{closed}" in lines[0] and "unreachable" in lines[0]
    assert "hunter2" not in done.stderr and "bob:***@" in lines[0]


def test_a_state_table_in_a_resources_file(tmp_path: Path, state_url: str) -> None:
    file = tmp_path / "res.toml"
    file.write_text(f'[fast]\nprovider = "local"\n\n[state]\nurl = "{state_url}"\n')
    config = ResourceConfig.from_file(file)
    assert config.aliases() == ["fast"] and config.state == StateURL.parse(state_url)
    file.write_text(f'[fast]\nprovider = "local"\n\n[state]\nurl = "{state_url}"\nsize = 1\n')
    with pytest.raises(ConfigError, match=r"table 'state': unknown key\(s\) 'size'"):
        ResourceConfig.from_file(file)
