"""MultiChainComparison on the embedded model: three reasoning chains, then one comparison.

Runs with no key and no network. The three chains are sampled concurrently,
each under its own rollout id (so they differ); a fourth call reads all three
and writes the final answer. The 135M model reasons poorly — the point is the
shape of the program, shown by its traces.

    python examples/multi_chain.py ["question"]
"""

from __future__ import annotations

import sys

from plait import MultiChainComparison, ResourceConfig


def main() -> None:
    question = sys.argv[1] if len(sys.argv) > 1 else "Is a tomato a fruit or a vegetable?"
    solve = MultiChainComparison("question -> answer", m=3, temperature=0.8, max_tokens=64)
    solve.bind(ResourceConfig({"llm": {"provider": "local"}}))

    prediction = solve.run_sync(question=question)
    for record in solve.traces():
        print(f"--- {record.module} ({record.rollout_id or 'comparison'})\n{record.output}")
    print(f"\nanswer: {prediction.answer!r}\nwhy:    {prediction.reasoning!r}")


if __name__ == "__main__":
    main()
