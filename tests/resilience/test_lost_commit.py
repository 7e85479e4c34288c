"""An update of the state store whose COMMIT reply is lost is applied exactly once.

A loopback proxy between plait and the real PostgreSQL server (`pg_proxy.LosingProxy`)
lets a COMMIT reach the server and then breaks the connection before its reply comes
back: the server committed, and plait sees a broken connection, as after a network cut
or a server crash at that moment. `StateStore.update` tries a broken transaction again;
it must not apply the change twice (a budget's charge counted twice), and a COMMIT that
never reached the server must still be applied once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from pg_proxy import LosingProxy, losing_proxy
from plait.backends.types import Usage
from plait.resources.budget import Budget, Claim, hold
from plait.resources.budget_state import StateBooks
from plait.resources.shared_budget import SharedBudget
from plait.resources.state import StateStore, open_store, release_store
from postgres_server import PostgresServer


@pytest.fixture
def proxy(postgres_server: PostgresServer) -> Iterator[LosingProxy]:
    with losing_proxy(postgres_server.port) as running:
        yield running


@pytest.fixture
def proxied(proxy: LosingProxy) -> Iterator[StateStore]:
    """A store of a schema of its own, reached through the proxy."""
    store = open_store(proxy.url(f"t_{uuid.uuid4().hex[:12]}"))
    yield store
    release_store(store)


def increment(value: bytes | None) -> bytes:
    return str(int(value or b"0") + 1).encode()


@pytest.mark.parametrize("reach", [True, False], ids=["reply lost", "commit lost"])
def test_an_update_whose_connection_breaks_at_commit_is_applied_once(
    proxy: LosingProxy, proxied: StateStore, reach: bool
) -> None:
    assert proxied.update("budgets", "books", increment)
    seen: list[bytes | None] = []

    def counted(value: bytes | None) -> bytes:
        seen.append(value)
        return increment(value)

    proxy.lose_next_commit(reach=reach)
    assert proxied.update("budgets", "books", counted)
    assert proxy.lost == 1  # the connection did break at that COMMIT
    assert proxied.get("budgets", "books") == b"2"
    # reply lost: the server committed, so the change is not made again; commit lost:
    # the server rolled it back, so it is made again, on the same value
    assert seen == ([b"1"] if reach else [b"1", b"1"])


async def test_a_settle_whose_commit_reply_is_lost_is_counted_once(
    proxy: LosingProxy, proxied: StateStore
) -> None:
    books = StateBooks(proxied)
    budget = SharedBudget(books, "llm", Budget(max_cost=10.0))
    claim = Claim(tokens=10, cost=1.0)
    assert await hold([budget], claim) is None
    assert await hold([budget], claim) is None  # two requests in flight
    proxy.lose_next_commit()
    budget.settle(claim, Usage(5, 5, cost=0.25))  # the first one's reply: written off the loop
    for _ in range(100):
        if proxy.lost:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # the write is tried again on another connection
    totals = books.totals("llm").snapshot()
    assert proxy.lost == 1
    # counted once: one reply's tokens and cost, the other call still held (twice would
    # count 20 tokens and $0.50, and settle the other call's hold too)
    assert totals["spent"]["tokens"] == 10 and totals["spent"]["cost"] == 0.25
    assert totals["held"]["calls"] == 1
