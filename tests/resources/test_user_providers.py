"""A user-written provider (seed 003 "Implementing Custom Providers"): a Backend subclass
used by class, instance or registered name, with limits, retries, the cache, usage and
streaming all applying as for the built-in providers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from plait import LLMInference, OutputStreamChunk, ResourceConfig, ResourceManager, run
from plait.backends.base import Backend
from plait.backends.types import Request, Response, StreamChunk, Usage
from plait.errors import BackendError, ConfigError
from plait.resources import register_provider


class Reverser(Backend):
    """Answers the last user message reversed, word by word when streaming.

    Counts its own concurrency, and fails the first ``fail_first`` calls with a
    retryable error, so a test sees what the resource layer did around it.
    """

    provider = "reverser"

    def __init__(self, model: str = "rev-1", fail_first: int = 0, delay: float = 0.0) -> None:
        self.model = model
        self.fail_first = fail_first
        self.delay = delay
        self.calls = 0
        self.in_flight = 0
        self.peak = 0

    def _reply(self, request: Request) -> str:
        return request.messages[-1].content[::-1]

    async def _enter(self) -> None:
        self.calls += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.calls <= self.fail_first:
            self.in_flight -= 1
            raise BackendError("temporarily unavailable", status=503, retryable=True)
        await asyncio.sleep(self.delay)

    async def complete(self, request: Request) -> Response:
        await self._enter()
        self.in_flight -= 1
        text = self._reply(request)
        return Response(text=text, usage=Usage(7, len(text.split())), finish_reason="stop")

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        await self._enter()
        try:
            words = self._reply(request).split(" ")
            for i, word in enumerate(words):
                yield StreamChunk(text=word if i == 0 else " " + word)
            yield StreamChunk(finish_reason="stop", usage=Usage(7, len(words)))
        finally:
            self.in_flight -= 1


async def test_an_instance_gets_limits_retries_usage_and_cost() -> None:
    backend = Reverser(fail_first=1, delay=0.02)
    config = ResourceConfig(
        {
            "*": {
                "provider": backend,
                "max_concurrent": 2,
                "retry_base_delay": 0.01,
                "price": {"input": 1.0, "output": 2.0},
            }
        }
    )
    async with ResourceManager(config) as manager:
        outputs = await run(LLMInference("llm"), [f"a{i} b" for i in range(6)], resources=manager)
        assert outputs == [f"b {i}a" for i in range(6)]  # "a0 b" reversed
        assert backend.peak == 2  # max_concurrent held
        assert backend.calls == 7  # the first call failed and was retried
        usage = manager.usage()["llm"]
        assert usage.input_tokens == 42 and usage.cost > 0
        assert manager.stats()["*"].retries == 1


async def test_a_class_is_built_with_backend_options_and_the_cache_applies(tmp_path: Path) -> None:
    config = ResourceConfig(
        {
            "*": {
                "provider": Reverser,
                "model": "rev-2",
                "backend_options": {"delay": 0.0},
                "cache": str(tmp_path / "c.sqlite"),
            }
        }
    )
    async with ResourceManager(config) as manager:
        program = LLMInference("llm", temperature=0.0)
        assert await run(program, "one two", resources=manager) == "owt eno"
        assert await run(program, "one two", resources=manager) == "owt eno"
        backend = manager._endpoints["*"].backend
        assert isinstance(backend, Reverser) and backend.model == "rev-2"
        assert backend.calls == 1 and manager.stats()["*"].cache_hits == 1


async def test_a_registered_name_works_in_a_config_file(tmp_path: Path) -> None:
    register_provider("reverser", Reverser)
    file = tmp_path / "res.toml"
    file.write_text('[llm]\nprovider = "reverser"\nmax_concurrent = 1\n')
    config = ResourceConfig.from_file(file)
    assert config["llm"].provider == "reverser"
    async with ResourceManager(config) as manager:
        assert await run(LLMInference("llm"), "ab", resources=manager) == "ba"


async def test_streaming_uses_the_user_backend_stream() -> None:
    config = ResourceConfig({"*": {"provider": Reverser()}})
    program = LLMInference("llm").bind(config)
    events = [event async for event in program.astream("x y z")]
    deltas = [e.delta for e in events if isinstance(e, OutputStreamChunk) and e.delta]
    assert deltas == ["z", " y", " x"] and events[-1] == "z y x"


class OnlyComplete(Backend):
    async def complete(self, request: Request) -> Response:
        return Response(text="whole", finish_reason="stop")


async def test_a_backend_with_only_complete_still_streams_as_one_piece() -> None:
    program = LLMInference("llm").bind(ResourceConfig({"*": {"provider": OnlyComplete}}))
    events = [event async for event in program.astream("x")]
    assert [e.delta for e in events if isinstance(e, OutputStreamChunk)] == ["whole", ""]


def test_bad_user_provider_entries_are_refused_when_the_config_is_built() -> None:
    with pytest.raises(
        ConfigError, match="'dely', which Reverser does not take; did you mean 'delay'"
    ):
        ResourceConfig({"x": {"provider": Reverser, "backend_options": {"dely": 1}}})
    with pytest.raises(ConfigError, match="instance, which is used as it is"):
        ResourceConfig({"x": {"provider": Reverser(), "backend_options": {"delay": 1}}})
    with pytest.raises(ConfigError, match="key 'base_url' does not apply to a user-written"):
        ResourceConfig({"x": {"provider": Reverser, "base_url": "http://x"}})
    with pytest.raises(ConfigError, match=r"unknown provider 'nope'.*register_provider"):
        ResourceConfig({"x": {"provider": "nope"}})
    with pytest.raises(TypeError, match="Backend subclass"):
        register_provider("thing", dict)
    with pytest.raises(ValueError, match="new, non-empty name"):
        register_provider("openai", Reverser)
