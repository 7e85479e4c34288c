"""The state store's faults on a real PostgreSQL server, for what the store holds.

Issue 36's Faults: the database down or restarted mid-run (no item lost or done
twice; a failed cache write never fails the call), slow (a server process frozen
with SIGSTOP answers nothing, so only plait's own bounds can end a wait), and rows
plait did not write (nested too deeply, not JSON), which are refused, never
loaded. The other clauses are proved beside the code they test: restarts in
tests/resources/test_state.py (cache), tests/resilience/test_store_checkpoint.py (run
checkpoints), tests/serve/test_shared_pauses.py (pauses) and
tests/resilience/test_learning_outage.py (search and Trainer checkpoints); unreachable at
start in those and tests/cli/test_train_state.py. Through public entry points only (a manager's
``complete``, ``plait.run``, a search's ``compile``): the tests do not depend on how
the cache reads the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from optimization.test_budget import TRAIN, VAL, program, respond
from optimization.test_search_resume import SEARCHES, outcome
from plait import LLMInference, run
from plait.backends.types import Message, Request, Usage
from plait.errors import DeadlineExceededError
from plait.execution.checkpoint_codec import CheckpointError
from plait.resources import ResourceConfig, ResourceManager
from plait.resources.budget import Budget, Claim, hold
from plait.resources.budget_state import StateBooks
from plait.resources.shared_budget import SharedBudget
from plait.resources.state import StateURL, StateWarning, open_store, release_store
from plait.serve.pending import PendingRun, PendingStoreFull, PendingStoreUnavailable
from plait.serve.pending_state import StatePendingStore
from plait.testing import ScriptedServer
from postgres_server import PostgresServer


@contextlib.contextmanager
def frozen(server: PostgresServer) -> Iterator[None]:
    """Stops every process of the server with SIGSTOP (it accepts connections and answers
    nothing, so its own statement timeout never fires), and lets them go on after."""
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(
        ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
    ).stdout.split()
    pids = [postmaster, *map(int, children)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def _sql(url: str, statement: str) -> Any:
    """Runs one statement on ``url``'s schema (``{schema}`` in it) on a connection of its
    own; returns the first row."""
    import psycopg  # optional extra: the test is skipped without it

    parsed = StateURL.parse(url)
    with psycopg.connect(parsed.target, autocommit=True, connect_timeout=2) as conn:
        cursor = conn.execute(statement.format(schema=parsed.schema))
        return cursor.fetchone() if cursor.description else None


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as running:
        yield running


def cached(server: ScriptedServer, url: str, *, cache: bool = True) -> ResourceConfig:
    endpoint = {"provider": "openai", "model": "scripted", "base_url": server.base_url,
                "api_key": "test-key", "retry_base_delay": 0.01, "cache": cache}  # fmt: skip
    return ResourceConfig({"fast": endpoint}, state=url)


def ask(text: str) -> Request:
    return Request(messages=(Message("user", text),))


# -- the response cache ------------------------------------------------------------------


async def test_cache_writes_while_the_database_is_down_fail_no_call_and_resume_after(
    database: PostgresServer, state_url: str, server: ScriptedServer
) -> None:
    async with ResourceManager(cached(server, state_url)) as manager:
        await manager.complete("fast", ask("warm"))  # the store is open and answers
        await asyncio.to_thread(database.stop)
        down = await asyncio.gather(*(manager.complete("fast", ask(f"d{i}")) for i in range(20)))
        assert [r.text for r in down] == [f"echo: d{i}" for i in range(20)]
        await asyncio.to_thread(database.start)
        for attempt in range(200):  # the cache reconnects by itself: a later reply is kept
            await manager.complete("fast", ask(f"after {attempt}"))
            await asyncio.sleep(0.05)
            if _sql(state_url, "SELECT count(*) FROM {schema}.responses")[0] > 1:
                break
        else:
            pytest.fail("the cache never wrote to the database once it was back")
    assert server.stats.requests == 1 + 20 + attempt + 1  # each call answered upstream once


async def test_a_frozen_database_fails_no_cached_call_within_its_deadline(
    database: PostgresServer, state_url: str, server: ScriptedServer
) -> None:
    program = LLMInference("fast", temperature=0.0)
    async with ResourceManager(cached(server, state_url)) as manager:
        await manager.complete("fast", ask("warm"))  # the pool holds a live connection
        with frozen(database):
            # a lookup waits for the store at most its timeout, then misses: the calls
            # are answered upstream inside their deadline (unbounded, a lookup would
            # wait on the frozen server until the deadline cancelled the call)
            outputs = await asyncio.gather(
                *(run(program, f"f{i}", resources=manager, deadline=60) for i in range(6))
            )
        assert outputs == [f"echo: f{i}" for i in range(6)]


async def test_a_batch_opening_on_a_frozen_database_is_ended_by_its_deadline(
    database: PostgresServer, state_url: str, server: ScriptedServer
) -> None:
    program = LLMInference("fast", temperature=0.0)
    config = cached(server, state_url)
    await run(program, ["warm"], resources=config, progress=False)  # the schema exists
    with frozen(database), pytest.raises(DeadlineExceededError, match="deadline of 3 s"):
        # its checkpoint's rows cannot be read: it waits for them, within the deadline
        await run(program, ["a", "b"], resources=config, progress=False, deadline=3)
    assert server.stats.requests == 1  # nothing sent while the rows could not be read


# -- hostile rows ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [b"[" * 100_000 + b"]" * 100_000, b"\x80 not utf-8", b'{"text": 1}'], ids=str
)
async def test_a_cached_row_plait_did_not_write_is_a_miss_never_a_failure(
    state_url: str, server: ScriptedServer, value: bytes
) -> None:
    async with ResourceManager(cached(server, state_url)) as manager:
        await manager.complete("fast", ask("q"))
    import psycopg  # optional extra

    parsed = StateURL.parse(state_url)
    with psycopg.connect(parsed.target, autocommit=True) as conn:
        conn.execute(f"UPDATE {parsed.schema}.responses SET value = %s", (value,))
    async with ResourceManager(cached(server, state_url)) as manager:
        reply = await manager.complete("fast", ask("q"))
    assert reply.text == "echo: q" and not reply.meta.get("cached")
    assert server.stats.requests == 2  # not taken from the row: asked again


async def test_a_checkpoint_row_nested_too_deeply_is_refused_naming_it(
    state_url: str, server: ScriptedServer
) -> None:
    program = LLMInference("fast", temperature=0.0)
    items = [f"c{i}" for i in range(4)]
    config = cached(server, state_url, cache=False)  # the rows, not the cache, answer
    await run(program, items, resources=config, progress=False)
    _sql(state_url, "UPDATE {schema}.checkpoints SET value = '\\x" + "5b" * 5000 + "'")
    server.reset_stats()
    with pytest.raises(CheckpointError, match="nested too deeply") as refused:
        await run(program, items, resources=config, progress=False)
    told = str(refused.value)
    assert "in state store postgresql://" in told and "row 'run/" in told
    assert "Delete that row" in told and "\n" not in told and "not-needed" not in told
    assert server.stats.requests == 0


# -- budgets -----------------------------------------------------------------------------


async def test_budget_books_refuse_while_down_and_keep_every_settle_across_a_restart(
    database: PostgresServer, state_url: str
) -> None:
    store = open_store(state_url)
    try:
        books = StateBooks(store)
        budget = SharedBudget(books, "llm", Budget(max_calls=100))
        claim = Claim(tokens=10, cost=None)
        for _ in range(5):  # sent and settled while the store answers
            assert await hold([budget], claim) is None
            budget.settle(claim, Usage(5, 5))
        in_flight = 3
        for _ in range(in_flight):
            assert await hold([budget], claim) is None
        await asyncio.sleep(0.2)  # the settles above are written
        await asyncio.to_thread(database.stop)
        for _ in range(in_flight):  # their replies come while the store is down
            budget.settle(claim, Usage(5, 5))
        refused = await hold([budget], claim)  # it cannot be checked: never passed
        assert refused is not None and "cannot be reached" in refused.why
        await asyncio.to_thread(database.start)
        for _ in range(200):  # the next hold once the store is back carries the settles
            if await hold([budget], claim) is None:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the budget never answered after the restart")
        budget.settle(claim, Usage(5, 5))
        await asyncio.sleep(0.5)
        totals = books.totals("llm").snapshot()
    finally:
        release_store(store)
    # every call sent is counted once: none lost in the outage, none counted twice
    assert totals["spent"]["calls"] == 5 + in_flight + 1
    assert totals["held"]["calls"] == 0


# -- learning ----------------------------------------------------------------------------


async def test_a_frozen_database_does_not_hold_up_a_search_and_gets_its_last_checkpoint(
    database: PostgresServer, state_url: str
) -> None:
    async with ScriptedServer(responder=respond, latency=0.2) as scripted:
        config = ResourceConfig({"*": scripted.endpoint(max_retries=0, max_concurrent=16)})
        whole_program = program()
        whole = await SEARCHES["RandomSearch"]().compile(
            whole_program, trainset=TRAIN, valset=VAL, resources=config
        )
        total = scripted.stats.requests
        scripted.reset_stats()

        async def freeze_mid_run() -> bool:
            for _ in range(1000):  # once the first checkpoint is saved
                with contextlib.suppress(Exception):
                    if _sql(state_url, "SELECT count(*) FROM {schema}.learning")[0]:
                        break
                await asyncio.sleep(0.01)
            with frozen(database):
                for _ in range(600):  # the search's calls go on while the store is frozen
                    if scripted.stats.requests == total:
                        return True
                    await asyncio.sleep(0.05)
            return False

        first = program()
        with warnings.catch_warnings():
            warnings.simplefilter("error", StateWarning)
            report, went_on = await asyncio.gather(
                SEARCHES["RandomSearch"](state=state_url).compile(
                    first, trainset=TRAIN, valset=VAL, resources=config
                ),
                freeze_mid_run(),
            )
        assert went_on, "the search stopped while the store was frozen"
        assert outcome(report, first) == outcome(whole, whole_program)
        scripted.reset_stats()
        again = program()
        await SEARCHES["RandomSearch"](state=state_url).compile(
            again, trainset=TRAIN, valset=VAL, resources=config
        )
        assert scripted.stats.requests == 0  # the last checkpoint was written after all


@pytest.mark.timeout(30)
async def test_budget_books_on_a_frozen_database_refuse_in_bounded_time_then_go_on(
    database: PostgresServer, state_url: str
) -> None:
    store = open_store(state_url)
    try:
        books = StateBooks(store)
        budget = SharedBudget(books, "llm", Budget(max_calls=10))
        claim = Claim(tokens=10, cost=None)
        assert await hold([budget], claim) is None
        budget.settle(claim, Usage(5, 5))
        await asyncio.sleep(0.2)
        with frozen(database):
            # the books cannot be read: refused (never passed), not waited on forever
            refused = await hold([budget], claim)
            assert refused is not None and "cannot be reached" in refused.why
        for _ in range(200):
            if await hold([budget], claim) is None:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the budget never answered after the server went on")
        budget.settle(claim, Usage(5, 5))
        await asyncio.sleep(0.5)
        assert books.totals("llm").snapshot()["spent"]["calls"] == 2
    finally:
        release_store(store)


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_budget_books_nested_too_deeply_refuse_rather_than_pass(state_url: str, depth: int) -> None:
    store = open_store(state_url)
    try:
        books = StateBooks(store)
        budget = SharedBudget(books, "llm", Budget(max_calls=10))
        store.put("budgets", books._keys["llm"], b"[" * depth + b"]" * depth)
        verdict = budget.try_hold(Claim(10, None))
        assert isinstance(verdict, str) and "unreadable" in verdict
    finally:
        release_store(store)


# -- paused runs -------------------------------------------------------------------------


def paused(run_id: str) -> PendingRun:
    pause = {"confirmation_id": "call_1", "approval_id": f"approval-{run_id}"}
    return PendingRun(run_id, "agent", {"request": "clean"}, pause, owner="alice")


async def test_a_pause_on_a_frozen_database_is_unavailable_for_a_while_never_lost(
    database: PostgresServer, state_url: str
) -> None:
    store = StatePendingStore(state_url)
    try:
        await store.put(paused("r1"))
        with frozen(database):
            # bounded by the store's timeout: "retry later", never "unknown run"
            with pytest.raises(PendingStoreUnavailable):
                await store.take("r1")
            with pytest.raises((PendingStoreFull, PendingStoreUnavailable)):
                await store.put(paused("r2"))  # refused, not kept somewhere it is lost
        # The take that gave up went on when the server did: the run it took is put
        # back, so it is resumed once, after all (not lost to a take nobody saw).
        for _ in range(200):
            with contextlib.suppress(PendingStoreUnavailable):
                taken = await store.take("r1")
                if taken is not None:
                    break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the paused run was lost: taken by a resume that was told to retry")
        assert taken.run_id == "r1"
        assert await store.take("r1") is None and await store.get("r2") is None
    finally:
        await store.aclose()


async def test_a_stored_pause_nested_too_deeply_is_refused_not_parsed(state_url: str) -> None:
    state = open_store(state_url)
    store = StatePendingStore(state_url)
    try:
        deep = b"[" * 100_000 + b"]" * 100_000
        state.put("pauses", "run/deep", b'{"program": "agent"}\n' + deep + b"\n{}")
        with pytest.raises(Exception, match=r"nested too deeply|not a paused run|holds no JSON"):
            await store.get("deep")
    finally:
        await store.aclose()
        release_store(state)


async def test_a_batch_with_a_deadline_ends_within_it_when_its_rows_cannot_be_written(
    database: PostgresServer, state_url: str, server: ScriptedServer
) -> None:
    program = LLMInference("fast", temperature=0.0)
    config = cached(server, state_url, cache=False)
    server.latency = 0.5
    batch = asyncio.ensure_future(
        run(program, ["a", "b"], resources=config, progress=False, deadline=3)
    )
    while server.stats.requests < 2:  # its checkpoint is read: the items are sent
        await asyncio.sleep(0.01)
    with frozen(database), pytest.warns(StateWarning, match="2 finished rows could not be"):
        # the rows cannot be written: the end of the batch waits for them only as long
        # as its deadline leaves (the wait of 30 s would have the outer bound end it)
        async with asyncio.timeout(20):
            outputs = await batch
    assert outputs == ["echo: a", "echo: b"]
