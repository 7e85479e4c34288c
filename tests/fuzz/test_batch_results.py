"""Batch API result files, as the provider serves them: OpenAI's JSONL files, Anthropic's results.

The OpenAI client reads its result file from the scripted server's Batch API
(``/v1/files/{id}/content``), the Anthropic client (the official SDK) from a
loopback server that answers the batch and its ``results_url``. Any file
gives a reply per request (a response, or the `BackendError` of that
request) or a `BackendError` for the batch.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from plait.backends.openai.batch import BatchReply, OpenAIBatchClient
from plait.testing import ScriptedServer
from plait.testing._replies import Reply, completion_payload

from .support import RawServer, documents, fuzz, json_text, mutated_bytes, outcome_async

REPLY = Reply(
    content="Paris.",
    tool_calls=[],
    finish_reason="stop",
    usage={"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
)
OPENAI_LINES = [
    {
        "id": "batch_req_1",
        "custom_id": "item-0",
        "response": {
            "status_code": 200,
            "request_id": "r1",
            "body": completion_payload(REPLY, model="m", request_id="r1", created=1),
        },
        "error": None,
    },
    {
        "id": "batch_req_2",
        "custom_id": "item-1",
        "response": {
            "status_code": 429,
            "body": {"error": {"message": "Slow down", "type": "rate_limit_error"}},
        },
        "error": None,
    },
]
ANTHROPIC_LINES = [
    {
        "custom_id": "item-0",
        "result": {
            "type": "succeeded",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-test",
                "content": [{"type": "text", "text": "Paris."}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 5, "output_tokens": 1},
            },
        },
    },
    {
        "custom_id": "item-1",
        "result": {
            "type": "errored",
            "error": {"type": "error", "error": {"type": "overloaded_error", "message": "Busy"}},
        },
    },
]


ASKED = ("item-0", "item-1")
"""The requests the batch was asked (both valid files answer these two)."""


def jsonl(lines: list[Any]) -> bytes:
    return b"".join(json_text(line) + b"\n" for line in lines)


@st.composite
def result_files(draw: st.DrawFn, lines: list[dict[str, Any]]) -> bytes:
    """A result file near the valid one: a line edited, repeated or dropped, or its bytes edited."""
    kind = draw(st.sampled_from(["line", "repeat", "bytes", "noise"]))
    if kind == "line":
        position = draw(st.integers(0, len(lines) - 1))
        encoded = [json_text(line) for line in lines]
        encoded[position] = draw(documents(lines[position])).replace(b"\n", b" ")
        return b"".join(line + b"\n" for line in encoded)
    if kind == "repeat":
        return jsonl([*lines, lines[0]])
    if kind == "bytes":
        return draw(mutated_bytes(jsonl(lines), (b"\n", b'"custom_id": ', b"\r\n")))
    return draw(st.binary(max_size=200))


def replies_are_whole(replies: dict[str, BatchReply]) -> bool:
    return all((r.response is None) != (r.error is None) for r in replies.values())


@pytest.fixture
async def openai() -> AsyncIterator[tuple[ScriptedServer, OpenAIBatchClient]]:
    async with ScriptedServer() as server:
        client = OpenAIBatchClient("m", base_url=server.base_url, api_key="test-key")
        yield server, client
        await client.aclose()


@fuzz(150)
@given(content=result_files(OPENAI_LINES))
@example(content=b'{"custom_id": "item-0", "response": [200]}\n')
async def test_any_openai_result_file_gives_replies_or_a_backend_error(
    openai: tuple[ScriptedServer, OpenAIBatchClient], content: bytes
) -> None:
    server, client = openai
    server.batch_api.files["file-out"] = content
    batch = {"id": "batch_1", "output_file_id": "file-out"}
    replies = await outcome_async("OpenAI batch results", lambda: client.results(batch, ASKED))
    if isinstance(replies, dict):
        assert replies_are_whole(replies)


@pytest.fixture
async def anthropic() -> AsyncIterator[tuple[RawServer, Any]]:
    pytest.importorskip("anthropic")
    from plait.backends.anthropic.batch import AnthropicBatchClient

    async with RawServer() as server:
        batch = {
            "id": "msgbatch_1",
            "type": "message_batch",
            "processing_status": "ended",
            "request_counts": {"processing": 0, "succeeded": 1, "errored": 1,
                               "canceled": 0, "expired": 0},
            "created_at": "2026-01-01T00:00:00Z",
            "expires_at": "2026-01-02T00:00:00Z",
            "ended_at": "2026-01-01T00:01:00Z",
            "archived_at": None,
            "cancel_initiated_at": None,
            "results_url": f"{server.base_url}/v1/messages/batches/msgbatch_1/results",
        }  # fmt: skip
        server.answer(json.dumps(batch).encode(), path="/v1/messages/batches/msgbatch_1")
        client = AnthropicBatchClient("claude-test", base_url=server.base_url, api_key="k")
        yield server, client
        await client.aclose()


@fuzz(100)
@given(content=result_files(ANTHROPIC_LINES))
async def test_any_anthropic_result_file_gives_replies_or_a_backend_error(
    anthropic: tuple[RawServer, Any], content: bytes
) -> None:
    server, client = anthropic
    server.answer(content, "application/x-jsonl", path="/v1/messages/batches/msgbatch_1/results")
    replies = await outcome_async(
        "Anthropic batch results", lambda: client.results({"id": "msgbatch_1"}, ASKED)
    )
    if isinstance(replies, dict):
        assert replies_are_whole(replies)
