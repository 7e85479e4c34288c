"""The embedded model decodes concurrent calls together, each as it would be alone.

On the real SmolLM2-135M; replies are kept short (the model is slow on two
cores). Speed is measured in ``benchmarks/local_batch_bench.py``, not here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from plait.backends.local import LocalBackend
from plait.backends.types import Message, Request, ResponseSchema, SamplingOptions
from plait.errors import BackendError

pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backend() -> Iterator[LocalBackend]:
    local = LocalBackend()
    yield local
    asyncio.run(local.aclose())


def ask(prompt: str, max_tokens: int = 24, **options: object) -> Request:
    return Request(
        messages=(Message("user", prompt),),
        options=SamplingOptions(max_tokens=max_tokens, **options),  # type: ignore[arg-type]
    )


SCHEMA = ResponseSchema(
    "city",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
    },
)


async def test_calls_in_flight_get_the_text_they_get_alone(backend: LocalBackend) -> None:
    requests = [
        ask("Name a colour.", temperature=0.0),
        ask("Describe the sea.", temperature=0.0),
        ask("What is 2 plus 3?", temperature=0.0),
        ask("Tell me about cats.", temperature=0.8, seed=7),  # its own sampler and seed
        Request(
            messages=(Message("user", "Where is the Eiffel tower?"),),
            options=SamplingOptions(max_tokens=24, temperature=0.0),
            response_schema=SCHEMA,  # its own grammar
        ),
    ]
    alone = [await backend.complete(r) for r in requests]
    together = await asyncio.gather(*(backend.complete(r) for r in requests))
    assert [r.text for r in together] == [r.text for r in alone]
    assert [r.usage for r in together] == [r.usage for r in alone]
    assert "city" in json.loads(together[-1].text)


async def test_streams_in_flight_advance_together(backend: LocalBackend) -> None:
    # Each stream notes its chunks in one shared log: decoded together, the second
    # stream's text begins before the first one's ends (one after the other, it cannot).
    log: list[tuple[int, str]] = []

    async def read(index: int, prompt: str) -> None:
        async for chunk in backend.stream(ask(prompt, max_tokens=16, temperature=0.0)):
            if chunk.text:
                log.append((index, chunk.text))

    await asyncio.gather(read(0, "Describe the sea."), read(1, "Describe a forest."))
    first_of_1 = next(i for i, (index, _) in enumerate(log) if index == 1)
    last_of_0 = max(i for i, (index, _) in enumerate(log) if index == 0)
    assert first_of_1 < last_of_0, log


async def test_each_call_keeps_its_own_stop_strings_and_token_cap(backend: LocalBackend) -> None:
    stopped, capped = await asyncio.gather(
        backend.complete(ask("Describe the sea in two sentences.", 48, stop=(".",))),
        backend.complete(ask("Describe the sea in two sentences.", 5)),
    )
    assert "." not in stopped.text and stopped.finish_reason == "stop"
    assert capped.usage.output_tokens == 5 and capped.finish_reason == "length"


async def test_each_call_has_a_context_window_of_its_own() -> None:
    local = LocalBackend(n_ctx=256, n_seq_max=2)  # a cache of 512 tokens, 256 a call
    try:
        with pytest.raises(BackendError, match=r"does not fit the context window .* n_ctx 256"):
            await local.complete(ask("word " * 290, max_tokens=4))
        # Two calls of about 200 tokens each fit at once: neither takes the other's room.
        near_full = [ask("word " * 170 + f"How many words? ({i})", max_tokens=4) for i in (1, 2)]
        replies = await asyncio.gather(*(local.complete(r) for r in near_full))
        assert [r.usage.input_tokens > 180 for r in replies] == [True, True], replies
    finally:
        await local.aclose()


GREEDY_PROMPTS = [
    *(f"Describe {t} in two sentences." for t in ("the sea", "a forest", "winter", "a river")),
    *("What is a cat?", "What is a dog?", "Name three colours.", "Name three fruits."),
]


async def test_a_call_reads_as_when_alone_whatever_its_sequence_held_before() -> None:
    # A call whose whole prompt a sequence still holds (the same call run before, alone or
    # with others in flight) reads only the prompt's end; its greedy reply must be the one
    # it gets on a model that never ran anything.
    def greedy(prompt: str) -> Request:
        return ask(prompt, max_tokens=32, temperature=0.0)

    first = LocalBackend(n_ctx=1024)  # a model of its own: another n_ctx than `local`
    try:
        fresh = [(await first.complete(greedy(p))).text for p in GREEDY_PROMPTS]
    finally:
        await first.aclose()
    local = LocalBackend(n_ctx=1000)
    gate = asyncio.Semaphore(4)

    async def in_flight(prompt: str) -> str:
        async with gate:
            return (await local.complete(greedy(prompt))).text

    try:
        for _ in range(2):
            assert await asyncio.gather(*map(in_flight, GREEDY_PROMPTS)) == fresh
            assert [(await local.complete(greedy(p))).text for p in GREEDY_PROMPTS] == fresh
    finally:
        await local.aclose()
