"""Search and Trainer checkpoints on PostgreSQL while the server goes down and comes back.

A search or a training with ``state=postgresql://…`` saves its checkpoint on
every step. With the session's real server stopped part-way and started
again: the work goes on without a raw psycopg error, its result is the one a
run without an outage gets, and the store ends with the latest document, so a
rerun sends no call (nothing lost, nothing done twice). A server down when the
work ends is waited for; one that never comes back is named in a
`StateWarning`. A resume that cannot read the store stops before any call.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import warnings
from collections.abc import AsyncIterator
from typing import Any

import pytest

from optimization import test_trainer as trained
from optimization.test_budget import TRAIN, VAL, program, respond
from optimization.test_search_resume import SEARCHES, outcome
from plait import ResourceConfig, ResourceManager
from plait.execution.checkpoint_codec import CheckpointError
from plait.optimization import SFAOptimizer, checkpoint_place
from plait.resources.state import (
    StateError,
    StateOversized,
    StateURL,
    StateWarning,
    open_store,
    release_store,
)
from plait.testing import ScriptedServer
from postgres_server import PostgresServer

LATENCY = 0.3
"""Seconds a scripted reply takes: a search then saves every fraction of a second."""


def _saved(url: str) -> bytes | None:
    """The learning document of ``url`` (there is one key per work here), read on a
    connection of its own; None when there is none or the server does not answer."""
    import psycopg  # optional extra: the test is skipped without it

    parsed = StateURL.parse(url)
    try:
        with psycopg.connect(parsed.target, connect_timeout=2) as conn:
            row = conn.execute(f"SELECT value FROM {parsed.schema}.learning").fetchone()
    except psycopg.Error:
        return None
    return None if row is None else bytes(row[0])


async def _outage(
    server: PostgresServer, url: str, *, until: Any = None, down: float = 1.0
) -> None:
    """Stops the server once the work saved its first checkpoint, and starts it again
    ``down`` seconds later, or once ``until()`` holds."""
    for _ in range(2000):
        if await asyncio.to_thread(_saved, url) is not None:
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("the work never saved a checkpoint")
    await asyncio.to_thread(server.stop)
    if until is None:
        await asyncio.sleep(down)
    else:
        while not until():
            await asyncio.sleep(0.05)
    await asyncio.to_thread(server.start)


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(responder=respond, latency=LATENCY) as running:
        yield running


@pytest.fixture
def config(scripted: ScriptedServer) -> ResourceConfig:
    return ResourceConfig({"*": scripted.endpoint(max_retries=0, max_concurrent=16)})


async def _whole(scripted: ScriptedServer, config: ResourceConfig) -> tuple[Any, int]:
    """The outcome and the calls of a RandomSearch with no checkpoint and no outage."""
    whole_program = program()
    whole = await SEARCHES["RandomSearch"]().compile(
        whole_program, trainset=TRAIN, valset=VAL, resources=config
    )
    calls = scripted.stats.requests
    scripted.reset_stats()
    return outcome(whole, whole_program), calls


async def test_a_search_whose_database_restarts_mid_run_loses_no_trial_and_does_none_twice(
    database: PostgresServer,
    state_url: str,
    scripted: ScriptedServer,
    config: ResourceConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    expected, total = await _whole(scripted, config)
    caplog.set_level(logging.WARNING, "plait.optimization")
    first = program()
    with warnings.catch_warnings():
        warnings.simplefilter("error", StateWarning)  # the last checkpoint is not given up
        report, _ = await asyncio.gather(
            SEARCHES["RandomSearch"](state=state_url).compile(
                first, trainset=TRAIN, valset=VAL, resources=config
            ),
            _outage(database, state_url),
        )
    # the outage cut saves mid-run, and a later one caught up
    assert "the store did not take the checkpoint" in caplog.text
    assert "the store takes the checkpoint again" in caplog.text
    assert outcome(report, first) == expected and scripted.stats.requests == total
    scripted.reset_stats()

    again = program()
    resumed = await SEARCHES["RandomSearch"](state=state_url).compile(
        again, trainset=TRAIN, valset=VAL, resources=config
    )
    assert scripted.stats.requests == 0 and resumed.resumed_calls == total  # none twice
    assert outcome(resumed, again) == expected  # none lost


async def test_a_search_that_ends_while_the_database_is_down_waits_for_it(
    database: PostgresServer, state_url: str, scripted: ScriptedServer, config: ResourceConfig
) -> None:
    expected, total = await _whole(scripted, config)
    first = program()
    ended_down: list[bool] = []

    def all_sent() -> bool:  # the search's last calls are answered: it ends in the outage
        done = scripted.stats.requests == total
        if done:
            ended_down.append(True)
        return done

    with warnings.catch_warnings():
        warnings.simplefilter("error", StateWarning)
        report, _ = await asyncio.gather(
            SEARCHES["RandomSearch"](state=state_url).compile(
                first, trainset=TRAIN, valset=VAL, resources=config
            ),
            _outage(database, state_url, until=all_sent),
        )
    assert ended_down and outcome(report, first) == expected
    scripted.reset_stats()
    again = program()
    resumed = await SEARCHES["RandomSearch"](state=state_url).compile(
        again, trainset=TRAIN, valset=VAL, resources=config
    )
    assert scripted.stats.requests == 0 and outcome(resumed, again) == expected


async def test_a_database_down_past_the_end_is_named_and_a_rerun_does_only_what_was_lost(
    database: PostgresServer,
    state_url: str,
    scripted: ScriptedServer,
    config: ResourceConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected, total = await _whole(scripted, config)
    monkeypatch.setattr(checkpoint_place, "CLOSE_WAIT", 0.5)
    first = program()
    stopped = asyncio.Event()

    async def stop_after_first_save() -> None:
        await _outage(database, state_url, until=stopped.is_set)

    outage = asyncio.ensure_future(stop_after_first_save())
    try:
        with pytest.warns(StateWarning) as told:
            report = await SEARCHES["RandomSearch"](state=state_url).compile(
                first, trainset=TRAIN, valset=VAL, resources=config
            )
    finally:
        stopped.set()
        await outage
    assert outcome(report, first) == expected  # the result is the caller's all the same
    (warning,) = [w for w in told if w.category is StateWarning]
    text = str(warning.message)
    assert "the last checkpoint could not be written" in text and "a rerun does again" in text
    assert "table learning, key search/RandomSearch/" in text and ":***@" in text
    assert "not-needed" not in text and "\n" not in text
    scripted.reset_stats()

    again = program()
    resumed = await SEARCHES["RandomSearch"](state=state_url).compile(
        again, trainset=TRAIN, valset=VAL, resources=config
    )
    # what the store took before the outage is not sent again; the rest is, once
    assert 0 < resumed.resumed_calls < total
    assert scripted.stats.requests == total - resumed.resumed_calls
    assert outcome(resumed, again) == expected


async def test_a_resume_from_a_database_that_is_down_stops_before_any_call(
    database: PostgresServer, state_url: str, scripted: ScriptedServer, config: ResourceConfig
) -> None:
    await SEARCHES["RandomSearch"](max_calls=20, state=state_url).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    scripted.reset_stats()
    held = open_store(state_url)  # another user in the process holds the store open
    try:
        await asyncio.to_thread(database.stop)
        with pytest.raises(CheckpointError, match="cannot be read") as refused:
            await SEARCHES["RandomSearch"](state=state_url).compile(
                program(), trainset=TRAIN, valset=VAL, resources=config
            )
        told = str(refused.value)
        assert "table learning, key search/RandomSearch/" in told and "rerun when" in told
        assert ":***@" in told and "not-needed" not in told and "\n" not in told
    finally:
        release_store(held)
    # nobody holds it: the store is opened anew, and cannot be reached at all
    with pytest.raises(StateError, match="unreachable") as unreachable:
        await SEARCHES["RandomSearch"](state=state_url).compile(
            program(), trainset=TRAIN, valset=VAL, resources=config
        )
    told = str(unreachable.value)
    assert f"127.0.0.1:{database.port}" in told and ":***@" in told and "\n" not in told
    assert scripted.stats.requests == 0


async def test_a_search_checkpoint_over_the_cap_is_refused_by_name_not_started_over(
    state_url: str,
    scripted: ScriptedServer,
    config: ResourceConfig,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await SEARCHES["RandomSearch"](state=state_url).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    scripted.reset_stats()
    # its document is now over the cap: written by a plait of a larger cap, or by hand
    monkeypatch.setattr(sys.modules["plait.resources.state.postgres"], "MAX_VALUE_BYTES", 100)
    with pytest.raises(StateOversized, match=r"row '[^']+' of table learning is [\d,]+ bytes"):
        await SEARCHES["RandomSearch"](state=state_url).compile(
            program(), trainset=TRAIN, valset=VAL, resources=config
        )
    assert scripted.stats.requests == 0  # no trial run again


def test_a_checkpoint_larger_than_the_store_keeps_is_refused_when_written(
    state_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint_place, "MAX_VALUE_BYTES", 64)
    place = checkpoint_place.CheckpointPlace(state=state_url, key="search/x")

    async def save() -> None:
        try:
            place.write('{"trials": [' + "1, " * 40 + "1]}")
        finally:
            await place.aclose()

    with pytest.raises(CheckpointError, match=r"bytes, more than a state store keeps"):
        asyncio.run(save())


# ------------------------------------------------------------------ Trainer
@pytest.fixture
async def manager() -> AsyncIterator[ResourceManager]:
    async with (
        ScriptedServer(responder=trained.model("GOOD"), latency=0.1) as running,
        ResourceManager(ResourceConfig({"*": running.endpoint(max_retries=0)})) as manager,
    ):
        manager.server = running  # type: ignore[attr-defined]
        yield manager


async def test_a_training_whose_database_restarts_mid_run_loses_no_step_and_does_none_twice(
    database: PostgresServer,
    state_url: str,
    manager: ResourceManager,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server: ScriptedServer = manager.server  # type: ignore[attr-defined]
    plain = trained.program()
    await trained.trainer_for(plain, manager, epochs=3).fit()
    total = server.stats.requests
    server.stats.reset()

    caplog.set_level(logging.WARNING, "plait.optimization")
    task = trained.program()
    with warnings.catch_warnings():
        warnings.simplefilter("error", StateWarning)
        report, _ = await asyncio.gather(
            trained.trainer_for(task, manager, epochs=3, state=state_url).fit(),
            _outage(database, state_url),
        )
    assert "the store did not take the checkpoint" in caplog.text
    assert "the store takes the checkpoint again" in caplog.text
    assert server.stats.requests == total and task.system_prompt.value == plain.system_prompt.value
    server.stats.reset()

    again = trained.program()
    optimizer = SFAOptimizer(again.named_parameters(), conservatism=0)
    resumed = await trained.trainer_for(
        again, manager, epochs=3, state=state_url, optimizer=optimizer
    ).fit()
    assert resumed.resumed_from == (3, 0) and server.stats.requests == 0  # nothing twice
    assert again.system_prompt.value == task.system_prompt.value  # nothing lost
    assert (resumed.best_score, resumed.best_epoch) == (report.best_score, report.best_epoch)
