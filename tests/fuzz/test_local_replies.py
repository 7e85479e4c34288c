"""What the embedded model writes, read by the local backend: text and tool calls.

`build_plan` decides how `LocalBackend` decodes a request and
`ChatPlan.read_reply` reads the finished reply (``<tool_call>`` blocks, a
chosen tool, a label); `ToolCallFilter` does it for a streamed reply, piece
by piece. Whatever the model writes, they give text and tool calls: a
malformed block stays visible as text.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from plait.backends.local._prompt import ChatPlan, ToolCallFilter, build_plan
from plait.backends.types import Message, Request, ToolSpec

from .support import documents, fuzz, mutated_bytes, outcome

WEATHER = ToolSpec("weather", "Weather of a city.", {"type": "object", "properties": {}})
CLOCK = ToolSpec("clock", "The time.", {"type": "object", "properties": {}})
ASK = (Message("user", "Weather and time?"),)
PLANS: list[ChatPlan] = [
    build_plan(Request(messages=ASK, tools=(WEATHER, CLOCK), tool_choice=choice), seed=1)
    for choice in ("auto", "required", "weather")
]
CALL = {"name": "weather", "arguments": {"city": "Paris"}}
BLOCK = b'Let me look.<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'

REPLIES = st.one_of(
    st.text(max_size=200),
    documents(CALL).map(lambda data: data.decode("utf-8", "surrogateescape")),
    mutated_bytes(BLOCK, (b"<tool_call>", b"</tool_call>", b"<", b"{")).map(
        lambda data: data.decode("utf-8", "surrogateescape")
    ),
)


@fuzz(300)
@given(plan=st.sampled_from(PLANS), text=REPLIES)
def test_any_finished_reply_gives_text_and_tool_calls(plan: ChatPlan, text: str) -> None:
    outcome("local reply", lambda: plan.read_reply(text))


def streamed(text: str, cuts: list[int]) -> tuple[str, tuple]:
    reader = ToolCallFilter((WEATHER, CLOCK))
    shown, start = [], 0
    for cut in sorted({c % (len(text) + 1) for c in cuts}):
        shown.append(reader.feed(text[start:cut]))
        start = cut
    shown.append(reader.feed(text[start:]))
    tail, calls = reader.finish()
    return "".join(shown) + tail, calls


@fuzz(300)
@given(text=REPLIES, cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_any_streamed_reply_gives_the_same_text_and_calls_however_it_is_split(
    text: str, cuts: list[int]
) -> None:
    whole = outcome("local reply (stream)", lambda: streamed(text, []))
    split = outcome("local reply (stream)", lambda: streamed(text, cuts))
    assert split[0] == whole[0]
    assert [(c.name, c.arguments) for c in split[1]] == [(c.name, c.arguments) for c in whole[1]]


NESTED = "[" * 100_000


def test_a_tool_call_nested_too_deeply_stays_text() -> None:
    auto, choose, _ = PLANS
    block = f'<tool_call>{{"name": "weather", "arguments": {NESTED}</tool_call>'
    assert auto.read_reply(block) == (block, ())
    assert choose.read_reply(NESTED) == (NESTED, ())


def test_a_tool_call_whose_name_is_not_text_stays_text() -> None:
    auto, choose, _ = PLANS
    call = '{"name": ["weather"], "arguments": {}}'
    assert choose.read_reply(call) == (call, ())
    block = f"<tool_call>{call}</tool_call>"
    assert auto.read_reply(block) == (block, ())
