"""Traced text through encoders: json.dumps renders like eager code, other encoders refuse.

Programs run bound to the scripted server: the first call's reply flows into
the text of a second call, and the tests assert the exact prompt the server
received against what the same Python code gives on the real reply.
"""

from __future__ import annotations

import html
import json
import textwrap
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from modules.scripted import bodies, last_user, scripted
from plait import LLMInference, Module, TracingError

REPLY = 'Zürich says "grüezi" & <b>\n\ttab \\ back\u2028 end'
"""The first call's reply: non-ASCII, quotes, a newline, a tab, a backslash, U+2028."""
STRUCTURED = {"city": "Zürich", "quote": 'say "hi"\n'}
"""The first call's structured reply (``response_format=dict[str, str]``)."""


def line_of(marker: str) -> str:
    """Returns ``test_placeholders.py:<n>`` for the one line ending in ``# <marker>``."""
    lines = Path(__file__).read_text().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, f"marker {marker!r} found {len(found)} times"
    return f"test_placeholders.py:{found[0]}"


class Relay(Module):
    """Asks ``first``; sends ``build(reply)`` to ``second``."""

    def __init__(self, build: Callable[[Any], Any], response_format: Any = None) -> None:
        super().__init__()
        self.build = build
        self.first = LLMInference("llm", response_format=response_format)
        self.second = LLMInference("llm")

    def forward(self, question: str) -> Any:
        return self.second(self.build(self.first(question)))


def replying(first: str) -> Callable[[dict[str, Any]], str]:
    """A responder: ``first`` to the question, ``ok`` to anything else."""
    return lambda body: first if last_user(body) == "question" else "ok"


async def second_prompt(program: Relay, first_reply: str) -> str:
    """Runs ``program`` bound to a scripted server; returns the prompt of its second call."""
    async with scripted(replying(first_reply)) as (server, manager):
        assert await program.bind(manager)("question") == "ok"
    first, second = bodies(server)
    assert last_user(first) == "question"
    return last_user(second)


TEXT_CASES: dict[str, Callable[[Any], str]] = {
    "dict": lambda r: json.dumps({"q": r}),
    "list": lambda r: json.dumps([r, "const", 3, None]),
    "the value itself": lambda r: json.dumps(r),
    "ensure_ascii=False": lambda r: json.dumps({"q": r}, ensure_ascii=False),
    "inside a longer string": lambda r: json.dumps({"q": f"Q: {r}!"}),
    "inside, ensure_ascii=False": lambda r: json.dumps({"q": f"Q: {r}!"}, ensure_ascii=False),
    "format spec, str() and repr()": lambda r: json.dumps([f"{r:>60}", str(r), repr(r)]),
    "indent and sort_keys": lambda r: json.dumps({"b": r, "a": [r]}, indent=2, sort_keys=True),
    "quoted inside the text": lambda r: json.dumps({"q": '"' + r + '"'}),
    "JSON inside an f-string": lambda r: f"Data: {json.dumps({'q': r})} (end)",
    "JSON of JSON-ready parts": lambda r: json.dumps({"q": [r, {"n": r}]}, ensure_ascii=False),
}


@pytest.mark.parametrize("build", TEXT_CASES.values(), ids=TEXT_CASES.keys())
async def test_json_dumps_of_traced_text_sends_what_eager_code_sends(build: Callable) -> None:
    assert await second_prompt(Relay(build), REPLY) == build(REPLY)


STRUCTURED_CASES: dict[str, Callable[[Any], str]] = {
    "object": lambda d: json.dumps({"data": d}),
    "object, ensure_ascii=False": lambda d: json.dumps({"data": d}, ensure_ascii=False),
    "the value itself": lambda d: json.dumps(d),
    "str() of it is text": lambda d: json.dumps({"text": str(d)}),
    "a field": lambda d: json.dumps({"city": d["city"], "quote": d["quote"]}),
}


@pytest.mark.parametrize("build", STRUCTURED_CASES.values(), ids=STRUCTURED_CASES.keys())
async def test_json_dumps_of_a_structured_reply_sends_what_eager_code_sends(
    build: Callable,
) -> None:
    program = Relay(build, response_format=dict[str, str])
    assert await second_prompt(program, json.dumps(STRUCTURED)) == build(STRUCTURED)


class City(BaseModel):
    name: str


async def test_json_dumps_of_a_model_reply_fails_like_eager_code_and_names_the_node() -> None:
    program = Relay(lambda city: json.dumps({"city": city}), response_format=City)
    with pytest.raises(TypeError, match="second failed while its inputs were rendered"):
        try:
            await second_prompt(program, '{"name": "Oslo"}')
        except TypeError as failed:
            assert str(failed).startswith(
                "json.dumps of the output of first (a City) failed at run time: "
                "Object of type City is not JSON serializable"
            )
            raise


# ------------------------------------------------------- other encoders refuse
class Stage(Module):
    """A composite stage whose forward transforms its input before its LLM call."""

    def __init__(self, transform: Callable[[Any], Any]) -> None:
        super().__init__()
        self.transform = transform
        self.llm = LLMInference("llm")

    def forward(self, reply: Any) -> Any:
        return self.llm(self.transform(reply))  # stage call


class Pipeline(Module):
    def __init__(self, transform: Callable[[Any], Any]) -> None:
        super().__init__()
        self.ask = LLMInference("llm")
        self.stage = Stage(transform)

    def forward(self, question: str) -> Any:
        return self.stage(self.ask(question))


async def refused(transform: Callable[[Any], Any]) -> str:
    """Runs a bound `Pipeline`; returns the TracingError's message (no call may be sent)."""
    async with scripted() as (server, manager):
        with pytest.raises(TracingError) as raised:
            await Pipeline(transform).bind(manager)("question")
    assert server.stats.requests == 0
    return str(raised.value)


BUILT_FROM_A_TRACED_VALUE: dict[str, Callable[[Any], Any]] = {
    "html.escape": lambda r: html.escape(f"Reply: {r}"),
    "textwrap.fill": lambda r: textwrap.fill(f"Reply: {r}", width=30),
    "urllib.parse.quote": lambda r: urllib.parse.quote(f"Reply: {r}"),
    "repr of a list": lambda r: repr([f"Reply: {r}"]),
    "str of a dict": lambda r: str({"reply": f"Reply: {r}"}),
    ".upper()": lambda r: f"Reply: {r}".upper(),
    ".lower()": lambda r: f"Reply: {r}".lower(),
    ".split()": lambda r: " | ".join(f"Reply: {r}".split()),
    ".encode()": lambda r: f"Reply: {r}".encode(),
    "JSON of JSON": lambda r: json.dumps({"inner": json.dumps({"q": r})}),
}


@pytest.mark.parametrize(
    "transform", BUILT_FROM_A_TRACED_VALUE.values(), ids=BUILT_FROM_A_TRACED_VALUE.keys()
)
async def test_a_string_built_from_a_traced_value_then_transformed_is_refused(
    transform: Callable[[Any], Any],
) -> None:
    message = await refused(transform)
    assert message.startswith(
        f"stage ({line_of('stage call')}) passed stage.llm a string in which a traced value's "
        "placeholder was changed by an escaping or transforming function"
    )
    assert "async def forward" in message and "`F.*` op" in message
    assert message.endswith("\n    return self.llm(self.transform(reply))  # stage call")


ON_THE_TRACED_VALUE = [
    pytest.param(
        lambda r: html.escape(r),  # escape
        "escape",
        "inside html.escape) used a traced value in the string method `.replace()`",
        id="html.escape",
    ),
    pytest.param(
        lambda r: textwrap.fill(r),  # fill
        "fill",
        "inside textwrap.fill) used a traced value in the string method `.expandtabs()`",
        id="textwrap.fill",
    ),
    pytest.param(
        lambda r: urllib.parse.quote(r),  # quote
        "quote",
        "inside urllib.parse.quote) used a traced value in an `if`/`while` condition",
        id="urllib.parse.quote",
    ),
    pytest.param(
        lambda r: r.upper(),  # upper
        "upper",
        ") used a traced value in the string method `.upper()` (use F.upper)",
        id=".upper()",
    ),
]


@pytest.mark.parametrize(("transform", "marker", "action"), ON_THE_TRACED_VALUE)
async def test_an_encoder_applied_to_the_traced_value_itself_is_refused(
    transform: Callable[[Any], Any], marker: str, action: str
) -> None:
    message = await refused(transform)
    assert message.startswith(f"stage ({line_of(marker)}")
    assert action in message
    assert "its value (the output of ask) is unknown until run time" in message


async def test_an_escaped_placeholder_in_the_output_is_refused() -> None:
    class Escaping(Module):
        def __init__(self) -> None:
            super().__init__()
            self.ask = LLMInference("llm")

        def forward(self, question: str) -> Any:
            return {"answer": html.escape(f"<p>{self.ask(question)}</p>")}

    async with scripted() as (server, manager):
        with pytest.raises(TracingError, match=r"^Escaping returned a string in which a traced"):
            await Escaping().bind(manager)("question")
    assert server.stats.requests == 0


async def test_a_dict_key_built_from_a_traced_value_is_refused() -> None:
    message = await refused(lambda r: {f"key {r}": "value"})
    assert message.startswith(f"stage ({line_of('stage call')}) passed stage.llm a string")
