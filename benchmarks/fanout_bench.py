"""Fan-out pipeline benchmark (SPEC §7): plait against DSPy, LangGraph and pydantic-ai.

Each input goes through two extraction calls run in parallel ("extract the people",
"extract the places", on the same text) and then one comparison call that reads both
results: 3 LLM calls in two sequential rounds, against a scripted OpenAI-compatible
server in its own process (default 100 ms per answer). A batch of ``--inputs`` texts
(default 200) runs in two forms (``--form``, default both):

* **slots**: the LLM-call limit is the only limit (``--slots``, default 64 calls in
  flight; plait's ``max_concurrent``), so the ideal is 3 × inputs / slots × latency
  (0.94 s by default): every slot busy from the first call to the last. No client
  reaches it: a call holds its slot a whole latency, so some slot serves
  ⌈3 × inputs / slots⌉ calls one after another (10 by default: 1.00 s, 1.07 ×
  the ideal), the bound printed beside it. The only peer is the floor, raw aiohttp
  with every input gathered at once under a semaphore on calls (unbounded memory,
  outputs only at the end). With a fixed latency the replies of a round land
  together, and client and server each work through the round one request at a
  time, so the CPU each spends per request (the server's is printed too, read
  from ``/proc`` where there is one) sets how far above the bound a run ends.
* **peers'**: ``--concurrency`` inputs in flight (default 32), so the ideal is
  2 × latency × ⌈inputs / concurrency⌉. For each framework the script prints wall
time, its ratio to the ideal, client CPU per LLM call, the number of requests the
server saw (caches and retries are off everywhere, so it must be 3 × inputs) and the
server's peak of requests in flight; then plait's speed relative to each peer.

* plait: a `Module` with two `LLMInference` children and a third reading both through
  an f-string; ``await plait.run(module, texts, resources=config, max_concurrent=64)``.
  plait's ``max_concurrent`` caps LLM *calls* in flight, while the peers' semaphore
  caps *inputs*, each with up to 2 calls in flight; so plait gets 2 × ``--concurrency``
  and every framework may put the same number of requests on the wire (the peak
  column shows what each one actually did).
* DSPy (async): a `dspy.Module` whose ``aforward`` gathers two ``Predict.acall`` and
  then awaits the comparison; ``dspy.LM(cache=False, num_retries=0)``.
* LangGraph: a `StateGraph` fanning out from START to two extraction nodes and joining
  them into a comparison node, on langchain-openai's ``ChatOpenAI(max_retries=0)``;
  ``graph.abatch(inputs, config={"max_concurrency": 32})``.
* pydantic-ai: three `Agent`s on ``OpenAIChatModel`` over an ``AsyncOpenAI`` client
  with ``max_retries=0``; the two extractions gathered, then the comparison.

Peers are batched with ``asyncio.gather`` under a semaphore of ``--concurrency``
(LangGraph through its own ``max_concurrency``). Each framework builds its objects
and runs a warm-up batch before the timed run, all in one event loop. A peer that is
not installed or fails is reported as ``skipped: <reason>`` and the others still run.

The peers live in their own venv, so the project's dev venv stays clean::

    python3 -m venv /work/peers_venv
    /work/peers_venv/bin/pip install -e /work/main -r /work/main/benchmarks/requirements-peers.txt
    /work/peers_venv/bin/python benchmarks/fanout_bench.py [--inputs 200] [--concurrency 32] \\
        [--slots 64] [--latency 0.1] [--form both] [--only plait,dspy,langgraph,pydantic-ai]

The server answers with `respond` below (imported by the server process): a fixed
short text, wrapped in DSPy's ``[[ ## field ## ]]`` markers when a request asks for
them, so DSPy's ChatAdapter parses the first answer and never falls back to a second
request.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import math
import os
import re
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plait.testing import fetch_stats, start_server_process

PEOPLE_PROMPT = "Extract the people named in the text. Reply with their names only."
PLACES_PROMPT = "Extract the places named in the text. Reply with the place names only."
COMPARE_PROMPT = "Compare the two lists: say which person is linked to which place."
ANSWER = "Ada Lovelace; Charles Babbage; London"

_DSPY_FIELD = re.compile(r"`\[\[ ## (\w+) ## \]\]`")


def respond(body: dict[str, Any]) -> str:
    """The scripted server's answer: ``ANSWER``, in DSPy's field markers if asked for."""
    messages = body.get("messages") or []
    last = messages[-1].get("content") if messages else None
    fields = _DSPY_FIELD.findall(last) if isinstance(last, str) else []
    outputs = [name for name in fields if name != "completed"]
    if not outputs:
        return ANSWER
    parts = [f"[[ ## {name} ## ]]\n{ANSWER}" for name in outputs]
    return "\n\n".join([*parts, "[[ ## completed ## ]]"])


def comparison_input(people: str, places: str) -> str:
    return f"People: {people}\nPlaces: {places}"


Batch = Callable[[list[str]], Awaitable[list[str]]]
Close = Callable[[], Awaitable[None]]
Setup = Callable[[str, int], Awaitable[tuple[Batch, Close]]]


async def _nothing() -> None:
    return None


def _limited(one: Callable[[str], Awaitable[str]], concurrency: int) -> Batch:
    """A batch runner: ``one`` over every text, at most ``concurrency`` at once."""
    limit = asyncio.Semaphore(concurrency)

    async def guarded(text: str) -> str:
        async with limit:
            return await one(text)

    async def batch(texts: list[str]) -> list[str]:
        return list(await asyncio.gather(*(guarded(t) for t in texts)))

    return batch


async def setup_plait(base_url: str, concurrency: int) -> tuple[Batch, Close]:
    """The peers' form: ``concurrency`` inputs' worth of calls (2 each) in flight."""
    return await plait_batch(base_url, 2 * concurrency)


async def plait_batch(base_url: str, max_concurrent: int) -> tuple[Batch, Close]:
    """plait's batch runner, at most ``max_concurrent`` LLM calls in flight."""
    import plait
    from plait import LLMInference, Module, ResourceConfig
    from plait.resources import ResourceManager

    class FanOut(Module):
        def __init__(self) -> None:
            super().__init__()
            self.people = LLMInference("llm", PEOPLE_PROMPT)
            self.places = LLMInference("llm", PLACES_PROMPT)
            self.compare = LLMInference("llm", COMPARE_PROMPT)

        def forward(self, text: str) -> Any:
            people, places = self.people(text), self.places(text)
            return self.compare(f"People: {people}\nPlaces: {places}")

    config = ResourceConfig(
        {"llm": {"provider": "openai", "base_url": base_url, "api_key": "k", "model": "bench"}}
    )
    module = FanOut()

    async def batch(texts: list[str]) -> list[str]:
        return await plait.run(
            module, texts, resources=config, max_concurrent=max_concurrent, progress=False
        )

    async def close() -> None:
        await ResourceManager.shared(config).aclose()

    return batch, close


async def aiohttp_floor(base_url: str, max_concurrent: int) -> tuple[Batch, Close]:
    """The floor of the slots form: raw aiohttp, every input gathered at once, a
    semaphore of ``max_concurrent`` around each request (outputs come back only at
    the end, and memory grows with the batch: what plait must not do)."""
    import aiohttp
    import orjson

    limit = asyncio.Semaphore(max_concurrent)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max_concurrent))
    headers = {"Content-Type": "application/json", "Authorization": "Bearer k"}

    async def ask(system: str, user: str) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        body = orjson.dumps({"model": "bench", "messages": messages})
        async with (
            limit,
            session.post(f"{base_url}/chat/completions", data=body, headers=headers) as answer,
        ):
            return orjson.loads(await answer.read())["choices"][0]["message"]["content"]

    async def one(text: str) -> str:
        people, places = await asyncio.gather(ask(PEOPLE_PROMPT, text), ask(PLACES_PROMPT, text))
        return await ask(COMPARE_PROMPT, comparison_input(people, places))

    async def batch(texts: list[str]) -> list[str]:
        return list(await asyncio.gather(*(one(t) for t in texts)))

    return batch, session.close


async def setup_dspy(base_url: str, concurrency: int) -> tuple[Batch, Close]:
    # Use the bundled model-metadata map: otherwise the first call tries to download
    # LiteLLM's (5 s timeout), which is not the server under test.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import dspy

    lm = dspy.LM("openai/bench", api_base=base_url, api_key="k", cache=False, num_retries=0)

    class FanOut(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.people = dspy.Predict(dspy.Signature("text -> people", PEOPLE_PROMPT))
            self.places = dspy.Predict(dspy.Signature("text -> places", PLACES_PROMPT))
            self.compare = dspy.Predict(
                dspy.Signature("people, places -> comparison", COMPARE_PROMPT)
            )

        async def aforward(self, text: str) -> Any:
            people, places = await asyncio.gather(
                self.people.acall(text=text), self.places.acall(text=text)
            )
            return await self.compare.acall(people=people.people, places=places.places)

    program = FanOut()

    async def one(text: str) -> str:
        return (await program.acall(text=text)).comparison

    limited = _limited(one, concurrency)

    async def batch(texts: list[str]) -> list[str]:
        with dspy.context(lm=lm):
            return await limited(texts)

    return batch, lm.aclose


async def setup_langgraph(base_url: str, concurrency: int) -> tuple[Batch, Close]:
    from typing import TypedDict

    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    llm = ChatOpenAI(base_url=base_url, api_key="k", model="bench", max_retries=0)

    class State(TypedDict, total=False):
        text: str
        people: str
        places: str
        comparison: str

    async def ask(system: str, user: str) -> str:
        reply = await llm.ainvoke([SystemMessage(system), HumanMessage(user)])
        return str(reply.content)

    async def people(state: State) -> State:
        return {"people": await ask(PEOPLE_PROMPT, state["text"])}

    async def places(state: State) -> State:
        return {"places": await ask(PLACES_PROMPT, state["text"])}

    async def compare(state: State) -> State:
        user = comparison_input(state["people"], state["places"])
        return {"comparison": await ask(COMPARE_PROMPT, user)}

    builder = StateGraph(State)
    builder.add_node("people", people)
    builder.add_node("places", places)
    builder.add_node("compare", compare)
    builder.add_edge(START, "people")
    builder.add_edge(START, "places")
    builder.add_edge(["people", "places"], "compare")
    builder.add_edge("compare", END)
    graph = builder.compile()

    async def batch(texts: list[str]) -> list[str]:
        states = await graph.abatch(
            [{"text": t} for t in texts], config={"max_concurrency": concurrency}
        )
        return [s["comparison"] for s in states]

    return batch, _nothing


async def setup_pydantic_ai(base_url: str, concurrency: int) -> tuple[Batch, Close]:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.providers.openai import OpenAIProvider

    try:
        from pydantic_ai.models.openai import OpenAIChatModel as ChatModel
    except ImportError:  # before pydantic-ai 1.0
        from pydantic_ai.models.openai import OpenAIModel as ChatModel

    client = AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
    model = ChatModel("bench", provider=OpenAIProvider(openai_client=client))
    people = Agent(model, instructions=PEOPLE_PROMPT)
    places = Agent(model, instructions=PLACES_PROMPT)
    compare = Agent(model, instructions=COMPARE_PROMPT)

    async def one(text: str) -> str:
        found_people, found_places = await asyncio.gather(people.run(text), places.run(text))
        result = await compare.run(comparison_input(found_people.output, found_places.output))
        return result.output

    return _limited(one, concurrency), client.close


@dataclass
class Framework:
    name: str
    setup: Setup
    distribution: str | None  # the package whose version is printed


FRAMEWORKS = {
    "plait": Framework("plait", setup_plait, None),
    "dspy": Framework("DSPy", setup_dspy, "dspy"),
    "langgraph": Framework("LangGraph", setup_langgraph, "langgraph"),
    "pydantic-ai": Framework("pydantic-ai", setup_pydantic_ai, "pydantic-ai-slim"),
}


@dataclass
class Result:
    wall: float
    cpu_ms_per_call: float
    requests: int
    peak: int
    server_cpu_ms_per_call: float | None = None


def _cpu_seconds(pid: int | None) -> float | None:
    """Returns the CPU seconds process ``pid`` has used (Linux ``/proc``), or None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, TypeError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _reset_stats(base_url: str) -> None:
    root = base_url.rstrip("/").removesuffix("/v1")
    request = urllib.request.Request(root + "/stats/reset", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


async def measure(
    framework: Framework,
    base_url: str,
    texts: list[str],
    warmup: list[str],
    concurrency: int,
    timeout: float,
    server_pid: int | None = None,
) -> Result:
    """Builds the framework, warms it up, then times one batch (all in this loop)."""
    batch, close = await framework.setup(base_url, concurrency)
    try:
        await asyncio.wait_for(batch(warmup), timeout)
        _reset_stats(base_url)
        server_cpu = _cpu_seconds(server_pid)
        cpu, wall = time.process_time(), time.perf_counter()
        outputs = await asyncio.wait_for(batch(texts), timeout)
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        server_after = _cpu_seconds(server_pid)
    finally:
        await close()
    stats = fetch_stats(base_url)
    if len(outputs) != len(texts) or not all(outputs):
        raise RuntimeError(f"{sum(map(bool, outputs))} of {len(texts)} outputs came back")
    calls = 3 * len(texts)
    result = Result(wall, cpu * 1000 / calls, stats["requests"], stats["peak_concurrency"])
    if server_cpu is not None and server_after is not None:
        result.server_cpu_ms_per_call = (server_after - server_cpu) * 1000 / calls
    return result


def _version(distribution: str | None) -> str:
    if distribution is None:
        return ""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ImportError):
        return f"not installed ({exc})"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}"


def _let_server_import_this_file() -> None:
    """Puts this file's folder on the path the server process imports `respond` from."""
    here = str(Path(__file__).resolve().parent)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, old) if p)


SLOTS_FORM = {
    "plait": Framework("plait", plait_batch, None),
    "aiohttp": Framework("aiohttp floor", aiohttp_floor, "aiohttp"),
}
"""The slots form: the LLM-call limit is the only limit (its ``concurrency`` is the slots)."""


def run_form(
    frameworks: list[Framework],
    base_url: str,
    texts: list[str],
    warmup: list[str],
    concurrency: int,
    ideal: float,
    server_pid: int | None = None,
) -> dict[str, Result]:
    """Measures each framework in its own loop, printing one row each; returns the results."""
    timeout = max(60.0, 50 * ideal)
    results: dict[str, Result] = {}
    for framework in frameworks:
        label = f"{framework.name} {_version(framework.distribution)}".strip()
        try:
            result = asyncio.run(
                measure(framework, base_url, texts, warmup, concurrency, timeout, server_pid)
            )
        except Exception as exc:
            print(f"  {label:<20} skipped: {_reason(exc)}")
            continue
        results[framework.name] = result
        server = result.server_cpu_ms_per_call
        print(
            f"  {label:<20} {result.wall:6.2f} s  {result.wall / ideal:5.2f} × ideal  "
            f"client CPU {result.cpu_ms_per_call:5.2f} ms/call  "
            + (f"server CPU {server:4.2f} ms/call  " if server is not None else "")
            + f"{result.requests} requests (expected {3 * len(texts)}), "
            f"peak {result.peak} in flight"
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32, help="peers' form: inputs")
    parser.add_argument("--slots", type=int, default=64, help="slots form: LLM calls")
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--warmup", type=int, default=32, help="inputs run before timing")
    parser.add_argument("--form", choices=["slots", "peers", "both"], default="both")
    parser.add_argument(
        "--only", default=",".join(FRAMEWORKS), help=f"comma-separated: {','.join(FRAMEWORKS)}"
    )
    args = parser.parse_args()
    chosen = [FRAMEWORKS[key.strip()] for key in args.only.split(",") if key.strip()]

    texts = [
        f"Item {i}: Ada Lovelace wrote to Charles Babbage from London before they met in Paris."
        for i in range(args.inputs)
    ]
    warmup = [f"Warm-up {i}: Alan Turing worked in Manchester." for i in range(args.warmup)]
    print(
        f"fan-out pipeline: {args.inputs} inputs × 3 calls (2 parallel extractions, then a "
        f"comparison), {args.latency * 1000:.0f} ms latency; Python {sys.version.split()[0]}"
    )
    _let_server_import_this_file()
    with start_server_process(latency=args.latency, responder="fanout_bench:respond") as (
        server,
        base_url,
    ):
        if args.form in ("slots", "both"):
            ideal = 3 * args.inputs / args.slots * args.latency
            bound = math.ceil(3 * args.inputs / args.slots) * args.latency
            print(
                f"slots form: {args.slots} LLM calls in flight; ideal {ideal:.2f} s; reachable "
                f"at best {bound:.2f} s ({bound / ideal:.2f} × ideal: whole calls per slot)"
            )
            run_form(
                list(SLOTS_FORM.values()), base_url, texts, warmup, args.slots, ideal, server.pid
            )
        if args.form in ("peers", "both"):
            ideal = 2 * args.latency * math.ceil(args.inputs / args.concurrency)
            print(f"peers' form: {args.concurrency} inputs in flight; ideal {ideal:.2f} s")
            results = run_form(chosen, base_url, texts, warmup, args.concurrency, ideal)
            _compare(results)


def _compare(results: dict[str, Result]) -> None:
    mine = results.get("plait")
    if mine is None:
        return
    for name, result in results.items():
        if name != "plait":
            print(
                f"plait vs {name}: {result.wall / mine.wall:.2f} × faster wall time, "
                f"{result.cpu_ms_per_call / mine.cpu_ms_per_call:.2f} × less CPU per call"
            )


if __name__ == "__main__":
    main()
