"""Measures how long tracing a 10,000-node program takes (issue 2: well under one second).

The program is a realistic mix, not a straight chain: a root with 100 worker
modules, each running 10 rounds of extraction, structured classification,
key access, cleaning, a fan-in summary, a critique, a merge, a refinement
over ``str(dict)`` and a concatenation that feeds the next round. Every
round is 10 nodes (5 LLM calls, 5 functional ops), so the graph has
100 × 10 × 10 = 10,000 nodes plus one input.

Run: ``python benchmarks/trace_bench.py`` (``--workers``/``--rounds`` to resize,
``--profile`` to print the hottest functions). Prints a ratio to the budget;
nothing is asserted, in line with SPEC §5.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from typing import Any

import pydantic

import plait.functional as F
from plait import LLMInference, Module, Parameter
from plait.tracing import InferenceGraph, Tracer

BUDGET_S = 1.0
NODES_PER_ROUND = 10


class Label(pydantic.BaseModel):
    category: str
    confidence: float


class Worker(Module):
    """One analyst: ``rounds`` rounds of 10 nodes, each round reading the last."""

    def __init__(self, rounds: int) -> None:
        super().__init__()
        self.rounds = rounds
        self.instructions = Parameter(
            "Extract every verifiable fact.", description="How facts are extracted."
        )
        self.extract = LLMInference(alias="fast", system_prompt=self.instructions)
        self.classify = LLMInference(alias="fast", response_format=Label, temperature=0.0)
        self.summarize = LLMInference(alias="smart", system_prompt="Summarize the facts.")
        self.critique = LLMInference(alias="smart", system_prompt="Score 0-10. Reply a number.")
        self.refine = LLMInference(alias="smart", system_prompt="Improve the summary.")

    def forward(self, text: str) -> Any:
        state = text
        for i in range(self.rounds):
            facts = self.extract(f"{self.instructions}\nRound {i}:\n{state}")  # LLM, fan-out
            label = self.classify(state)  # LLM, structured
            category = label["category"]  # F.select
            clean = F.strip(facts)  # op
            summary = self.summarize(f"{clean}\nCategory: {category}")  # LLM, fan-in
            critique = self.critique(summary)  # LLM
            score = F.coerce(critique, float)  # op
            merged = F.merge({"summary": summary}, {"score": score})  # op
            refined = self.refine(str(merged))  # LLM over str(dict)
            state = F.concat([refined, "\n---\n", summary])  # op, feeds the next round
        return state


class Fleet(Module):
    """The root: ``workers`` workers reading the same document."""

    def __init__(self, workers: int, rounds: int) -> None:
        super().__init__()
        self.names = [f"worker{i}" for i in range(workers)]
        for name in self.names:
            setattr(self, name, Worker(rounds))

    def forward(self, text: str) -> dict[str, Any]:
        return {name: getattr(self, name)(text) for name in self.names}


def trace_once(program: Module) -> tuple[InferenceGraph, float]:
    start = time.perf_counter()
    graph = Tracer().trace(program, "A long document about tracing speed.")
    return graph, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5, help="traces to time (median shown)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one trace")
    args = parser.parse_args()

    program = Fleet(args.workers, args.rounds)
    expected = args.workers * args.rounds * NODES_PER_ROUND + 1
    graph, first = trace_once(program)  # a fresh tracer every time; nothing is cached
    if len(graph) != expected:
        raise SystemExit(f"built {len(graph)} nodes, expected {expected}")
    times = [first] + [trace_once(program)[1] for _ in range(args.repeat - 1)]
    median = statistics.median(times)

    start = time.perf_counter()
    graph.lint()
    lint_s = time.perf_counter() - start
    start = time.perf_counter()
    graph.structural_hash()
    hash_s = time.perf_counter() - start

    print(
        f"trace {len(graph):,} nodes: {median:.2f} s ({median / BUDGET_S:.2f} × budget of "
        f"{BUDGET_S:.0f} s); median of {len(times)}, first {first:.2f} s, "
        f"{median / len(graph) * 1e6:.0f} µs/node"
    )
    print(f"lint: {lint_s:.2f} s   structural_hash: {hash_s:.2f} s")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        trace_once(program)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
