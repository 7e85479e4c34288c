"""Entry points (``await module(x)``, batches, ``run_sync``, ``run``), async leaves, graph cache."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from plait import (
    ExecutionSettings,
    LLMInference,
    Module,
    PlaitError,
    ResourceManager,
    run,
)
from plait.errors import BackendError
from plait.execution.graph_cache import _GRAPHS
from plait.optimization import LabeledFewShot
from plait.testing import server_in_thread
from seed_programs import MultiPerspectiveAnalysis, SummarizeAndAnalyze

from .support import (
    Shout,
    config_for,
    label_prompts,
    path_of,
    system_of,
    user_of,
)


def finishing_in_reverse(items: list[str]):
    """A responder that answers ``items`` last to first, whatever order they arrive in.

    Each item waits until the one after it has been answered, so every item
    must be in flight at once.
    """
    answered = {item: asyncio.Event() for item in items}

    async def responder(body: dict[str, Any]) -> str:
        text = user_of(body)
        position = items.index(text)
        if position + 1 < len(items):
            await answered[items[position + 1]].wait()
        answered[text].set()
        return "echo: " + text

    return responder


# ------------------------------------------------------------------ awaiting


async def test_await_a_bound_module(server, manager):
    program = SummarizeAndAnalyze().bind(manager)

    assert await program("hello") == "echo: echo: hello"
    assert server.stats.requests == 2


async def test_await_a_batch_returns_outputs_in_input_order(server, manager):
    items = [f"item {i}" for i in range(5)]
    server.responder = finishing_in_reverse(items)
    program = label_prompts(MultiPerspectiveAnalysis()).bind(manager)

    outs = await program(items)

    assert [o["user"] for o in outs] == [f"echo: {item}" for item in items]
    finished = sorted(
        (r for r in server.stats.log if path_of(r) == "user"), key=lambda r: r.finished
    )
    assert [user_of(r.body) for r in finished] == items[::-1]  # the server finished last first


async def test_run_with_a_config_shares_one_manager_per_loop(server):
    config = config_for(server)
    try:
        outs = await run(SummarizeAndAnalyze(), ["a", "b"], resources=config)
        single = await run(SummarizeAndAnalyze(), "c", resources=config)
        usage = ResourceManager.shared(config).usage()
    finally:
        await ResourceManager.shared(config).aclose()

    assert outs == ["echo: echo: a", "echo: echo: b"]
    assert single == "echo: echo: c"
    assert set(usage) == {"fast_llm", "smart_llm"}  # all six calls went through one manager
    assert usage["smart_llm"].output_tokens == 3 * 3  # "echo: echo: <x>"


class Greet(Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference(alias="llm")

    def forward(self, name: str, greeting: str = "hi") -> str:
        return self.llm(f"{greeting}, {name}")


async def test_run_passes_extra_and_keyword_arguments_to_forward(manager):
    assert await run(Greet(), "ada", greeting="hello", resources=manager) == "echo: hello, ada"
    outs = await run(Greet(), ["ada", "bob"], "hey", resources=manager)
    assert outs == ["echo: hey, ada", "echo: hey, bob"]


WAYS_TO_GIVE_RESOURCES = (
    "bind them with program.bind(config), use `async with ExecutionSettings(resources=config)`, "
    "or pass resources= to "
)


async def test_a_module_without_resources_says_how_to_give_them():
    with pytest.raises(PlaitError) as info:
        await run(Greet(), "ada")

    assert str(info.value) == f"Greet has no resources: {WAYS_TO_GIVE_RESOURCES}plait.run"


async def test_a_search_without_resources_says_the_same_ways_to_give_them():
    search = LabeledFewShot(lambda example, prediction: 1.0, k=1)

    with pytest.raises(PlaitError) as info:
        await search.compile(Greet(), trainset=[{"name": "ada", "answer": "hi, ada"}])

    assert str(info.value) == f"LabeledFewShot has no resources: {WAYS_TO_GIVE_RESOURCES}compile()"


def test_a_module_without_llm_called_directly_runs_eagerly():
    shout = Shout()

    assert shout("hello") == "HELLO"
    assert shout.seen == ["hello"]


def test_an_llm_call_without_resources_names_the_alias():
    with pytest.raises(RuntimeError, match=r"'technical'.*alias 'llm'.*has no resources"):
        MultiPerspectiveAnalysis()("text")


async def test_settings_give_resources_to_an_unbound_module(server, manager):
    async with ExecutionSettings(resources=manager):
        assert await SummarizeAndAnalyze()("x") == "echo: echo: x"
    with ExecutionSettings(resources=manager):  # the sync form works in async code too
        assert await SummarizeAndAnalyze()("y") == "echo: echo: y"
    assert server.stats.requests == 4


# ------------------------------------------------------------------ run_sync


def test_run_sync_from_sync_code():
    with server_in_thread(latency=0.01) as server:
        config = config_for(server)
        program = label_prompts(MultiPerspectiveAnalysis()).bind(config)

        single = program.run_sync("one")
        batch = program.run_sync(["two", "three"])

    assert single["technical"] == "echo: one"
    assert [o["user"] for o in batch] == ["echo: two", "echo: three"]
    assert server.stats.requests == 9


async def test_run_sync_inside_a_running_event_loop():
    """As in Jupyter: the call runs on plait's background loop instead of failing."""
    with server_in_thread() as server:
        program = SummarizeAndAnalyze().bind(config_for(server))

        assert program.run_sync("nb") == "echo: echo: nb"
        assert program.run_sync(["a", "b"]) == ["echo: echo: a", "echo: echo: b"]

    assert server.stats.requests == 6


def test_run_sync_raises_the_execution_error():
    def refuse(body: dict[str, Any]) -> str:
        raise RuntimeError("no")

    with server_in_thread(responder=refuse) as server:
        program = SummarizeAndAnalyze().bind(config_for(server, max_retries=0))
        with pytest.raises(BackendError, match="summarizer failed") as info:
            program.run_sync("x")

    assert info.value.module_path == "summarizer"


def test_run_sync_inside_sync_settings():
    with server_in_thread() as server, ExecutionSettings(resources=config_for(server)):
        assert SummarizeAndAnalyze().run_sync("s") == "echo: echo: s"


# ------------------------------------------------------------- async leaves


class Triage(Module):
    """Decides on the real reply text: possible only in an ``async def forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.classify = LLMInference(alias="llm")
        self.urgent = LLMInference(alias="llm")
        self.routine = LLMInference(alias="llm")
        self.labels: list[Any] = []

    async def forward(self, ticket: str) -> str:
        label = await self.classify(ticket)
        self.labels.append(label)
        if label == "URGENT":
            return await self.urgent(ticket)
        return await self.routine(ticket)


class Desk(Module):
    """A traced program with an async leaf in the middle."""

    def __init__(self) -> None:
        super().__init__()
        self.triage = Triage()
        self.summary = LLMInference(alias="llm")

    def forward(self, ticket: str) -> str:
        return self.summary(self.triage(ticket))


def triage_responder(body: dict[str, Any]) -> str:
    system, text = system_of(body), user_of(body)
    if system.endswith("classify"):
        return "URGENT" if "fire" in text else "later"
    return f"{system} on {text}"


async def test_async_leaves_branch_on_real_values_through_the_same_manager(server, manager):
    server.responder = triage_responder
    program = label_prompts(Desk())

    outs = await run(program, ["fire in the hall", "printer jam"], resources=manager)

    assert outs == [
        "summary on triage.urgent on fire in the hall",
        "summary on triage.routine on printer jam",
    ]
    assert sorted(program.triage.labels) == ["URGENT", "later"]  # real str, not traced
    paths = sorted(path_of(r) for r in server.stats.log)
    assert paths == sorted(
        ["triage.classify"] * 2 + ["triage.urgent", "triage.routine"] + ["summary"] * 2
    )
    stats = manager.stats()["*"]
    assert (stats.calls, stats.requests) == (6, 6)
    assert manager.usage()["llm"].output_tokens == sum(
        len(triage_responder(r.body).split()) for r in server.stats.log
    )


async def test_an_async_module_at_the_root_runs_as_one_node(server, manager):
    server.responder = triage_responder
    program = label_prompts(Triage())

    assert await run(program, "fire", resources=manager) == "urgent on fire"
    assert [path_of(r) for r in server.stats.log] == ["classify", "urgent"]


class Panel(Module):
    """An async leaf that fans out by hand and calls composite and plain children."""

    def __init__(self) -> None:
        super().__init__()
        self.views = MultiPerspectiveAnalysis()
        self.shout = Shout()
        self.extra = LLMInference(alias="llm")

    async def forward(self, text: str) -> dict[str, Any]:
        loud = self.shout(text)  # plain-Python child: runs at once, no await
        views, extra = await asyncio.gather(self.views(loud), self.extra(loud))
        return {"views": views, "extra": extra}


async def test_calls_inside_async_leaves_respect_the_endpoint_limit(server):
    server.latency = 0.03
    program = Panel()
    async with ResourceManager(config_for(server, max_concurrent=3)) as manager:
        outs = await run(program, [f"t{i}" for i in range(8)], resources=manager)

    assert outs[5] == {
        "views": {"technical": "echo: T5", "business": "echo: T5", "user": "echo: T5"},
        "extra": "echo: T5",
    }
    assert server.stats.requests == 32
    assert server.stats.peak_concurrency == 3


async def test_a_failure_inside_an_async_leaf_names_the_leaf(server, manager):
    def refuse_urgent(body: dict[str, Any]) -> str:
        if system_of(body) == "triage.urgent":
            raise RuntimeError("on fire")
        return triage_responder(body)

    server.responder = refuse_urgent
    program = label_prompts(Desk())

    with pytest.raises(BackendError, match=r"triage failed on input 1") as info:
        await run(program, ["jam", "fire"], resources=manager)
    assert (info.value.node_id, info.value.input_index) == ("triage", 1)


# ------------------------------------------------------------------- caching


async def test_a_batch_of_same_shape_inputs_is_traced_once(manager):
    program = MultiPerspectiveAnalysis()

    await run(program, [f"doc {i}" for i in range(50)], resources=manager)
    assert len(_GRAPHS[program]) == 1

    await run(program, "one more", resources=manager)
    assert len(_GRAPHS[program]) == 1

    await run(Greet(), "x", resources=manager)  # other modules have their own entries
    assert len(_GRAPHS[program]) == 1


class CountsItsTraces(Module):
    """Counts how often ``forward`` runs, in a plain setting that is part of the graph's key.

    Tracing changes ``traces``, so a later lookup in the graph cache misses:
    each extra lookup of one call or batch shows as one more trace.
    """

    def __init__(self) -> None:
        super().__init__()
        self.step = LLMInference(alias="llm")
        self.traces = 0

    def forward(self, text: str) -> Any:
        self.traces += 1
        return self.step(text)


@pytest.mark.parametrize(
    "how",
    [
        {},
        {"report": True},
        {"checkpoint_dir": True},
        {"checkpoint_dir": True, "report": True},
        {"streaming": True},
    ],
    ids=["batch", "report", "checkpoint", "checkpoint+report", "streaming"],
)
async def test_one_batch_is_traced_once(manager, tmp_path, how):
    program = CountsItsTraces()
    options = {**how, "resources": manager}
    if how.get("checkpoint_dir"):
        options["checkpoint_dir"] = tmp_path / "checkpoint"

    result = await run(program, ["a", "b", "c"], **options)

    outputs = result[0] if how.get("report") else result
    assert len(outputs) == 3
    assert program.traces == 1


async def test_one_call_with_a_report_is_traced_once(manager):
    program = CountsItsTraces()

    output, report = await run(program, "a", resources=manager, report=True)

    assert output == "echo: a"
    assert program.traces == 1
    assert report.graph is not None


async def test_a_batch_traces_each_input_shape_once(manager):
    class EachOf(CountsItsTraces):
        def forward(self, texts: Any) -> Any:
            self.traces += 1
            return [self.step(text) for text in texts] if isinstance(texts, list) else texts

    program = EachOf()

    outputs = await run(program, [["a"], ["b", "c"], ["d"], ["e", "f"]], resources=manager)

    assert outputs == [["echo: a"], ["echo: b", "echo: c"], ["echo: d"], ["echo: e", "echo: f"]]
    assert program.traces == 2  # a list of one, a list of two


async def test_a_failure_inside_an_async_leafs_child_graph_names_the_full_path(server, manager):
    def refuse_business(body: dict[str, Any]) -> str:
        if system_of(body) == "Analyze from a business perspective." and "T1" in user_of(body):
            raise RuntimeError("no business today")
        return "echo: " + user_of(body)

    server.responder = refuse_business

    with pytest.raises(BackendError) as info:
        await run(Panel(), ["t0", "t1"], resources=manager)

    error = info.value  # located where it happened, inside the leaf, not at the leaf
    assert (error.node_id, error.module_path, error.input_index) == (
        "views.business",
        "views.business",
        1,
    )
    assert error.__notes__ == ["views.business failed on input 1"]
