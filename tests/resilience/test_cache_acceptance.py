"""Only accepted replies reach the response cache (issue: a refused reply replayed forever).

A structured reply that failed validation, its failed re-ask, and a reply cut
off by the token limit are returned or refused as usual but never stored: a
later run asks the provider again instead of failing with zero requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from plait import (
    InputField,
    LLMInference,
    OutputField,
    Predict,
    ResourceConfig,
    ResourceManager,
    Signature,
    run,
)
from plait.errors import StructuredOutputError
from plait.optimization.losses import LLMJudge
from plait.testing import ScriptedServer

from .support import endpoint


class Verdict(BaseModel):
    label: Literal["spam", "ham"]


class Classify(Signature):
    """Classify the message."""

    message: str = InputField()
    label: Literal["spam", "ham"] = OutputField()


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as running:
        yield running


@pytest.fixture
def config(server: ScriptedServer, tmp_path: Path) -> ResourceConfig:
    return ResourceConfig({"llm": endpoint(server, cache=str(tmp_path / "replies.sqlite"))})


def answer(text: str):
    def responder(body):
        return text

    return responder


async def test_a_refused_structured_reply_and_its_refused_reask_are_not_cached(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    program = LLMInference("llm", temperature=0.0, response_format=Verdict)
    server.responder = answer('{"label": "eggs"}')  # valid JSON, invalid value: a transient fault
    async with ResourceManager(config) as manager:
        with pytest.raises(StructuredOutputError):
            await run(program, "buy now", resources=manager)
        assert server.stats.requests == 2  # asked, re-asked once

        server.responder = answer('{"label": "spam"}')  # the fault is gone
        assert (await run(program, "buy now", resources=manager)).label == "spam"
        assert server.stats.requests == 3  # asked again: nothing refused was replayed

        assert (await run(program, "buy now", resources=manager)).label == "spam"
        assert server.stats.requests == 3  # the accepted reply is cached


async def test_a_reply_fixed_by_the_reask_caches_only_the_accepted_reply(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    program = LLMInference("llm", temperature=0.0, response_format=Verdict)
    replies = iter(['{"label": "eggs"}', '{"label": "ham"}', '{"label": "spam"}'])
    server.responder = lambda body: next(replies)
    async with ResourceManager(config) as manager:
        assert (await run(program, "hello", resources=manager)).label == "ham"
        assert server.stats.requests == 2
    async with ResourceManager(config) as fresh:  # what is on disk
        # The first request's refused reply was not stored: it is asked again.
        assert (await run(program, "hello", resources=fresh)).label == "spam"
    assert server.stats.requests == 3


async def test_predict_does_not_cache_a_refused_reply(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    classify = Predict(Classify, alias="llm", temperature=0.0)
    server.responder = answer('{"label": "maybe"}')
    async with ResourceManager(config) as manager:
        with pytest.raises(StructuredOutputError):
            await run(classify, message="hi", resources=manager)
        server.responder = answer('{"label": "ham"}')
        assert (await run(classify, message="hi", resources=manager)).label == "ham"
    assert server.stats.requests == 3


async def test_a_judge_verdict_that_did_not_parse_is_not_cached(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    judge = LLMJudge("llm", "Is it polite?")
    server.responder = answer("I think it is fine!")
    async with ResourceManager(config) as manager:
        feedback = await run(judge, "thanks", resources=manager)
        assert feedback.score is None and server.stats.requests == 2
        server.responder = answer('{"critique": "polite", "score": 9, "improvements": []}')
        feedback = await run(judge, "thanks", resources=manager)
        assert feedback.score is not None and server.stats.requests == 3


async def test_a_reply_cut_off_by_the_token_limit_is_returned_but_not_cached(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    program = LLMInference("llm", temperature=0.0, max_tokens=2)
    server.responder = answer("one two three four")
    async with ResourceManager(config) as manager:
        first = await run(program, "count", resources=manager)
        assert first == "one two"  # the caller still gets the text ...
        assert server.stats.requests == 1
        await run(program, "count", resources=manager)
        assert server.stats.requests == 2  # ... but a rerun asks again


async def test_a_truncated_structured_reply_is_invalid_even_when_it_parses(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    program = LLMInference("llm", temperature=0.0, response_format=Verdict)
    server.responder = lambda body: {"content": '{"label": "spam"}', "finish_reason": "length"}
    async with ResourceManager(config) as manager:
        with pytest.raises(StructuredOutputError, match="cut off at the token limit"):
            await run(program, "buy", resources=manager)
    assert server.stats.requests == 2


async def test_a_truncated_or_empty_text_reply_is_visible_to_the_caller(
    server: ScriptedServer, config: ResourceConfig, caplog: pytest.LogCaptureFixture
) -> None:
    from plait.report.profiling import profile

    program = LLMInference("llm", temperature=0.0, max_tokens=2)
    server.responder = answer("one two three four")
    async with ResourceManager(config) as manager:
        with profile() as run_profile, caplog.at_level("WARNING", logger="plait.execution"):
            await run(program, ["count", "again"], resources=manager, cache=False)
            server.responder = answer("")
            quiet = LLMInference("llm", temperature=0.0)
            assert await run(quiet, "silence", resources=manager, cache=False) == ""
    assert [r.finish_reason for r in run_profile.records] == ["length", "length", "stop"]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2  # once per module, not once per batch item
    assert "alias 'llm'" in messages[0] and "cut off by the token limit" in messages[0]
    assert "alias 'llm'" in messages[1] and "empty reply" in messages[1]
