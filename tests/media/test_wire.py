"""Media on the wire: the exact content parts each provider documents, live and in batches.

OpenAI chat completions go to the scripted server over loopback (both
transports); Anthropic's Messages API goes through its SDK to the loopback
stub of `tests.backends.test_anthropic`; both Batch APIs through the scripted
server, whose lines must carry the same parts as live calls.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from tests.backends.test_anthropic import MessagesStub, message, text

from plait import Audio, File, Image, LLMInference, Module, ResourceManager
from plait.backends.openai import OpenAICompatBackend
from plait.backends.types import Message, Request
from plait.errors import MediaError
from plait.execution.batch_api import BatchJob
from plait.testing import ScriptedServer

from .samples import MP3, PDF, png, wav


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


PNG, WAV = png(), wav()


@pytest.fixture(params=["http", "sdk"])
async def openai(request: pytest.FixtureRequest):
    async with ScriptedServer() as server:
        backend = OpenAICompatBackend("gpt-4o", base_url=server.base_url, transport=request.param)
        yield backend, server
        await backend.aclose()


async def test_openai_gets_image_audio_and_file_parts_in_order(openai):
    backend, server = openai
    turn = Message(
        "user",
        [
            "Read these.",
            Image(PNG, detail="low"),
            Image("https://example.com/cat.jpg"),
            Audio(WAV),
            Audio(MP3),
            File(PDF, name="invoice.pdf"),
            File(b"plain words"),
        ],
    )
    reply = await backend.complete(Request(messages=(Message("system", "Be brief."), turn)))

    assert reply.text.startswith("echo: Read these.")
    assert server.stats.log[0].body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Read these."},
                {
                    "type": "image_url",
                    "image_url": {"url": f"data:image/png;base64,{b64(PNG)}", "detail": "low"},
                },
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                {"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}},
                {"type": "input_audio", "input_audio": {"data": b64(MP3), "format": "mp3"}},
                {
                    "type": "file",
                    "file": {
                        "filename": "invoice.pdf",
                        "file_data": f"data:application/pdf;base64,{b64(PDF)}",
                    },
                },
                {
                    "type": "file",
                    "file": {
                        "filename": "document.txt",
                        "file_data": f"data:text/plain;base64,{b64(b'plain words')}",
                    },
                },
            ],
        },
    ]


async def test_openai_streams_the_same_body(openai):
    backend, server = openai
    turn = Message("user", ["What is it?", Image(PNG)])
    chunks = [chunk async for chunk in backend.stream(Request(messages=(turn,)))]
    assert "".join(c.text for c in chunks).startswith("echo: What is it?")
    assert server.stats.log[0].body["messages"][0]["content"][1]["type"] == "image_url"


async def test_openai_refuses_audio_by_url_and_media_outside_user_turns(openai):
    backend, server = openai
    for item in (Audio("https://example.com/a.wav"), File("https://example.com/a.pdf")):
        with pytest.raises(MediaError, match="is a URL; this provider needs the bytes"):
            await backend.complete(Request(messages=(Message("user", ["x", item]),)))
    with pytest.raises(MediaError, match="is in a assistant turn"):
        await backend.complete(Request(messages=(Message("assistant", ["x", Image(PNG)]),)))
    assert server.stats.requests == 0


# -- Anthropic -----------------------------------------------------------------------------


@pytest.fixture
async def anthropic():
    pytest.importorskip("anthropic")
    from plait.backends.anthropic import AnthropicBackend

    stub = MessagesStub()
    await stub.start()
    backend = AnthropicBackend("claude-test", api_key="k", base_url=stub.base_url, timeout=5.0)
    yield backend, stub
    await backend.aclose()
    await stub.stop()


async def test_anthropic_gets_image_and_document_blocks(anthropic):
    backend, stub = anthropic
    stub.replies.append(message(text("Two items.")))
    turn = Message(
        "user",
        [
            "Read these.",
            Image(PNG, detail="high"),
            Image("https://example.com/cat.jpg"),
            File(PDF, name="invoice.pdf"),
            File("https://example.com/terms.pdf"),
            File(b"plain words"),
        ],
    )
    reply = await backend.complete(Request(messages=(Message("system", "Be brief."), turn)))

    assert reply.text == "Two items."
    (body,) = stub.received
    assert body["system"] == "Be brief."
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Read these."},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
                {
                    "type": "document",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)},
                    "title": "invoice.pdf",
                },
                {
                    "type": "document",
                    "source": {"type": "url", "url": "https://example.com/terms.pdf"},
                },
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "plain words"},
                },
            ],
        }
    ]


async def test_anthropic_passes_images_inside_a_tool_result(anthropic):
    backend, stub = anthropic
    stub.replies.append(message(text("A cat.")))
    from plait.backends.types import ToolCall

    call = ToolCall(id="toolu_1", name="screenshot", arguments="{}")
    request = Request(
        messages=(
            Message("user", "Look."),
            Message("assistant", tool_calls=(call,)),
            Message("tool", ["The screen:", Image(PNG)], tool_call_id="toolu_1"),
        )
    )
    await backend.complete(request)
    result = stub.received[0]["messages"][2]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_1"
    assert result["content"] == [
        {"type": "text", "text": "The screen:"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
        },
    ]


async def test_anthropic_refuses_audio_before_sending(anthropic):
    backend, stub = anthropic
    with pytest.raises(MediaError, match=r"takes images and documents .* not audio"):
        await backend.complete(Request(messages=(Message("user", ["hear", Audio(WAV)]),)))
    with pytest.raises(MediaError, match="system prompt is text only"):
        await backend.complete(Request(messages=(Message("system", ["x", Image(PNG)]),)))
    assert stub.received == []


# -- Batch APIs ----------------------------------------------------------------------------


class Describe(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm")

    def forward(self, image: Image) -> str:
        return self.llm(["Describe:", image])


async def test_openai_batch_lines_carry_the_same_parts_as_live_calls():
    images = [Image(png(shade=i)) for i in range(2)]
    async with ScriptedServer() as server:
        job = BatchJob(Describe(), {"llm": server.endpoint()}, poll_interval=0.01)
        outputs = await job.run(images)
        store = server.batch_api
        (batch_id,) = job.batch_ids
        raw = store.files[store.batches[batch_id]["input_file_id"]]
        async with ResourceManager({"llm": server.endpoint()}) as manager:
            await Describe().bind(manager)(images[0])
        live = server.stats.log[0].body["messages"]

    import orjson

    lines = [orjson.loads(line) for line in raw.splitlines()]
    assert [o.strip() for o in outputs] == ["echo: Describe:"] * 2
    assert lines[0]["body"]["messages"] == live
    assert [line["body"]["messages"][0]["content"][1] for line in lines] == [
        {"type": "image_url", "image_url": {"url": image.data_uri()}} for image in images
    ]


async def test_anthropic_batch_requests_carry_image_blocks():
    pytest.importorskip("anthropic")
    async with ScriptedServer() as server:
        config: dict[str, Any] = {
            "llm": {
                "provider": "anthropic",
                "model": "claude-test",
                "base_url": f"http://127.0.0.1:{server.port}",
                "api_key": "k",
            }
        }
        job = BatchJob(Describe(), config, poll_interval=0.01)
        outputs = await job.run([Image(PNG)])
    assert [o.strip() for o in outputs] == ["echo: Describe:"]
    (params,) = [entry["params"] for entry in server.batch_api._requests[job.batch_ids[0]]]
    assert params["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Describe:"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)},
                },
            ],
        }
    ]
