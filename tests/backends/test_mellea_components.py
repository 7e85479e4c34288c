"""Components and generate_walk (seed 004): pending thunks computed concurrently, then rendered."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from plait.backends.openai import OpenAICompatBackend
from plait.porting.mellea import CBlock, Component, Context, ModelOutputThunk, generate_walk, render
from plait.testing import ScriptedServer


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(latency=0.2) as running:
        yield running


@pytest.fixture
async def backend(server: ScriptedServer) -> AsyncIterator[OpenAICompatBackend]:
    made = OpenAICompatBackend("test-model", base_url=server.base_url)
    yield made
    await made.aclose()


class Compare(Component):
    def __init__(self, *items: Any) -> None:
        self.items = items

    def parts(self) -> Sequence[Any]:
        return [CBlock("Which is better?"), *self.items]


def test_generate_walk_finds_uncomputed_thunks_depth_first(backend: OpenAICompatBackend) -> None:
    a, b, c = backend.generate_from_raw(["a", "b", "c"])
    tree = Compare(a, Compare(b, CBlock("x"), a), c)
    assert generate_walk(tree) == [a, b, c]  # each thunk once, in the order met
    assert generate_walk(CBlock("text")) == [] and generate_walk(a) == [a]
    with pytest.raises(ValueError, match="parts must be CBlocks, Components or ModelOutputThunks"):
        generate_walk(Compare("plain text"))
    with pytest.raises(RuntimeError, match="has not been computed"):
        render(tree)


async def test_do_generate_walk_computes_every_thunk_concurrently(
    backend: OpenAICompatBackend, server: ScriptedServer
) -> None:
    first, second = backend.generate_from_raw(["Write a haiku.", "Write a limerick."])
    tree = Compare(first, Compare(second))
    await backend.do_generate_walk(tree)
    assert first.is_computed and second.is_computed
    assert server.stats.peak_concurrency == 2
    assert (
        render(tree)
        == "Which is better?\necho: Write a haiku.\nWhich is better?\necho: Write a limerick."
    )
    assert generate_walk(tree) == []


async def test_do_generate_walks_resolves_a_thunk_shared_by_two_actions_once(
    backend: OpenAICompatBackend, server: ScriptedServer
) -> None:
    shared, other = backend.generate_from_raw(["shared", "other"])
    await backend.do_generate_walks([Compare(shared), Compare(shared, other)])
    assert server.stats.requests == 2 and server.stats.peak_concurrency == 2


async def test_a_component_action_is_rendered_after_its_thunks_are_computed(
    backend: OpenAICompatBackend, server: ScriptedServer
) -> None:
    haiku, limerick = backend.generate_from_raw(["Write a haiku.", "Write a limerick."])
    thunk, ctx = backend.generate_from_context(Compare(haiku, limerick), Context())
    assert thunk.request is None  # its text is not known before the poems are written
    assert ctx.messages == () and len(ctx.pending) == 3
    reply = await thunk
    last = server.stats.log[-1].body["messages"]
    assert last == [
        {
            "role": "user",
            "content": "Which is better?\necho: Write a haiku.\necho: Write a limerick.",
        }
    ]
    assert server.stats.peak_concurrency == 2  # both poems at once, then the comparison
    assert [m.role for m in ctx.messages] == ["user", "assistant"]
    assert ctx.messages[-1].content == reply.text
    assert isinstance(thunk, ModelOutputThunk) and thunk.request is not None


def test_the_components_keep_their_old_import_path() -> None:
    from plait.backends import components

    old = (components.CBlock, components.Component, components.generate_walk, components.render)
    assert old == (CBlock, Component, generate_walk, render)
