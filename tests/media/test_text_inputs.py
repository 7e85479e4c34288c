"""A media-typed input field given text: a data: URI or an http(s) URL is that medium,
anything else (a path, a word) is refused in one line, never sent to the model as text."""

from __future__ import annotations

import json

import pytest

from plait import Audio, Image, InputField, OutputField, Predict, ReAct, Signature, run
from plait.errors import MediaError
from plait.testing import ScriptedServer

from .samples import png, wav


class Describe(Signature):
    """Describe the picture."""

    picture: Image = InputField()
    shape: str = OutputField()


def _content_types(server: ScriptedServer) -> list[str]:
    content = server.stats.log[0].body["messages"][-1]["content"]
    return [part["type"] for part in content] if isinstance(content, list) else ["text only"]


@pytest.mark.parametrize("text", ["shape.png", "hello"])
async def test_a_path_or_word_for_an_image_field_is_a_one_line_error(text: str):
    async with ScriptedServer() as server:
        describe = Predict(Describe, alias="llm")
        with pytest.raises(MediaError) as caught:
            await run(describe, picture=text, resources={"llm": server.endpoint()})
    message = str(caught.value)
    assert "\n" not in message
    assert "picture" in message and "Image" in message
    assert f"plait.Image({text!r})" in message and "data:" in message
    assert server.stats.log == []  # nothing reached the model


async def test_a_data_uri_for_an_image_field_is_sent_as_an_image_part():
    picture = Image(png())
    async with ScriptedServer(responder=lambda body: json.dumps({"shape": "square"})) as server:
        describe = Predict(Describe, alias="llm")
        result = await run(
            describe, picture=picture.data_uri(), resources={"llm": server.endpoint()}
        )
    assert result.shape == "square"
    content = server.stats.log[0].body["messages"][-1]["content"]
    assert {"type": "image_url", "image_url": {"url": picture.data_uri()}} in content


async def test_an_https_url_and_a_list_of_data_uris_are_media_too():
    class Compare(Signature):
        """Compare the pictures with the reference."""

        pictures: list[Image] = InputField()
        reference: Image | None = InputField()
        same: bool = OutputField()

    uris = [Image(png()).data_uri(), Image(png(shade=9)).data_uri()]
    async with ScriptedServer(responder=lambda body: json.dumps({"same": True})) as server:
        compare = Predict(Compare, alias="llm")
        inputs = {"pictures": uris, "reference": "https://example.com/ref.png"}
        await run(compare, **inputs, resources={"llm": server.endpoint()})
    assert _content_types(server).count("image_url") == 3


async def test_a_data_uri_of_another_kind_is_refused_naming_the_field():
    async with ScriptedServer() as server:
        describe = Predict(Describe, alias="llm")
        audio = Audio(wav()).data_uri()
        with pytest.raises(MediaError, match="picture"):
            await run(describe, picture=audio, resources={"llm": server.endpoint()})
    assert server.stats.log == []


async def test_react_refuses_a_path_for_an_image_field_too():
    async with ScriptedServer() as server:
        agent = ReAct(Describe, tools=[], alias="llm")
        with pytest.raises(MediaError, match="picture"):
            await run(agent, picture="shape.png", resources={"llm": server.endpoint()})
    assert server.stats.log == []


async def test_a_field_that_takes_text_or_an_image_keeps_text_as_text():
    class Either(Signature):
        """Describe it."""

        thing: str | Image = InputField()
        shape: str = OutputField()

    async with ScriptedServer(responder=lambda body: json.dumps({"shape": "round"})) as server:
        await run(
            Predict(Either, alias="llm"), thing="a ball", resources={"llm": server.endpoint()}
        )
    assert server.stats.log[0].body["messages"][-1]["content"].endswith("thing: a ball")
