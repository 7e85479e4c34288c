"""ExecutionSettings: scoping, nesting, and the priority call > bind > context > defaults."""

from __future__ import annotations

import asyncio

import pytest

from plait import ExecutionSettings, ResourceManager, run
from plait._context import SETTINGS
from plait.errors import BackendTimeout
from plait.execution.settings import DEFAULTS, effective_options
from seed_programs import MultiPerspectiveAnalysis

from .support import (
    Ask,
    config_for,
)

# ------------------------------------------------------------ pure priority


def test_defaults_apply_outside_any_settings():
    assert effective_options({}, {}) == DEFAULTS
    assert DEFAULTS["max_concurrent"] == 100 and DEFAULTS["on_error"] == "raise"


def test_priority_is_call_then_bind_then_context_then_defaults():
    with ExecutionSettings(timeout=3.0, max_concurrent=7, preserve_order=True):
        assert effective_options({}, {})["timeout"] == 3.0
        assert effective_options({"timeout": 2.0}, {})["timeout"] == 2.0
        options = effective_options({"timeout": 2.0}, {"timeout": 1.0})
        assert options["timeout"] == 1.0
        assert options["max_concurrent"] == 7  # untouched layers still come through
        assert options["preserve_order"] is True
        assert options["streaming"] is False  # default


def test_none_in_a_higher_layer_means_not_set():
    with ExecutionSettings(timeout=3.0):
        assert effective_options({"timeout": None}, {"timeout": None})["timeout"] == 3.0


def test_nested_settings_override_only_what_they_set_and_restore_on_exit():
    with ExecutionSettings(timeout=3.0, max_concurrent=7):
        with ExecutionSettings(max_concurrent=2):
            options = effective_options({}, {})
            assert (options["timeout"], options["max_concurrent"]) == (3.0, 2)
        assert effective_options({}, {})["max_concurrent"] == 7
    assert SETTINGS.get() is None


async def test_async_form_scopes_like_the_sync_form():
    async with ExecutionSettings(streaming=True):
        async with ExecutionSettings(preserve_order=True):
            options = effective_options({}, {})
            assert (options["streaming"], options["preserve_order"]) == (True, True)
        assert effective_options({}, {})["preserve_order"] is False
    assert SETTINGS.get() is None


def test_the_same_settings_object_can_be_entered_twice():
    settings = ExecutionSettings(max_concurrent=3)
    with settings, ExecutionSettings(max_concurrent=5), settings:
        assert effective_options({}, {})["max_concurrent"] == 3
    assert SETTINGS.get() is None


async def test_settings_do_not_leak_into_concurrent_tasks():
    entered = asyncio.Event()
    seen: list[int] = []

    async def inside() -> None:
        async with ExecutionSettings(max_concurrent=9):
            entered.set()
            await asyncio.sleep(0)

    async def outside() -> None:
        await entered.wait()
        seen.append(effective_options({}, {})["max_concurrent"])

    await asyncio.gather(inside(), outside())
    assert seen == [100]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_concurrent": 0}, "max_concurrent must be at least 1, got 0"),
        ({"on_error": "ignore"}, "on_error must be 'raise' or 'collect', got 'ignore'"),
    ],
)
def test_invalid_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ExecutionSettings(**kwargs)


# ------------------------------------------------------- seen at the server


async def peak_of(server, work) -> int:
    server.reset_stats()
    await work
    return server.stats.peak_concurrency


async def test_max_concurrent_priority_is_observed_at_the_server(server, manager):
    server.latency = 0.03
    items = [f"item {i}" for i in range(8)]

    async with ExecutionSettings(resources=manager, max_concurrent=3):
        assert await peak_of(server, MultiPerspectiveAnalysis()(items)) == 3
        async with ExecutionSettings(max_concurrent=5):  # nested: inner wins
            assert await peak_of(server, MultiPerspectiveAnalysis()(items)) == 5
        bound = MultiPerspectiveAnalysis().bind(manager, max_concurrent=2)
        assert await peak_of(server, bound(items)) == 2  # bind beats the context
        assert await peak_of(server, bound(items, max_concurrent=4)) == 4  # the call beats bind


async def test_timeout_option_reaches_the_call_and_the_call_overrides_bind(server, manager):
    server.latency = 0.3
    program = Ask().bind(manager, timeout=0.02)

    with pytest.raises(BackendTimeout, match="ask failed"):
        await program("late")
    assert server.stats.log[0].status is None  # the client hung up before the answer

    assert await program("in time", timeout=10.0) == "echo: in time"
    assert server.stats.log[-1].status == 200


async def test_timeout_from_settings_applies_to_unbound_calls(server):
    server.latency = 0.3
    config = config_for(server, max_retries=0, timeout=10.0)
    async with (
        ResourceManager(config) as manager,
        ExecutionSettings(resources=manager, timeout=0.02),
    ):
        with pytest.raises(BackendTimeout):
            await run(Ask(), "late")
