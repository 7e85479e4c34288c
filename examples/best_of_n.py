"""BestOfN on the embedded model: three slogans sampled concurrently, the best one kept.

Runs with no key and no network. Each attempt runs under its own rollout id
(``best_of_n:0`` … ``best_of_n:2``), so the local model samples each one
differently and a response cache would keep them apart. The reward here is
plain Python: slogans close to six words win.

    python examples/best_of_n.py ["product"]
"""

from __future__ import annotations

import sys
from typing import Any

from plait import BestOfN, Predict, ResourceConfig


def six_words(inputs: dict[str, Any], prediction: Any) -> float:
    """Rewards slogans of about six words (1.0 for exactly six)."""
    return 1.0 / (1 + abs(len(prediction.slogan.split()) - 6))


def main() -> None:
    product = sys.argv[1] if len(sys.argv) > 1 else "a solar-powered bicycle lamp"
    write = Predict("product -> slogan", temperature=1.0, max_tokens=32)
    best = BestOfN(write, n=3, reward_fn=six_words)
    best.bind(ResourceConfig({"llm": {"provider": "local"}}))

    winner = best.run_sync(product=product)
    print("Attempts:")
    for record in write.traces():
        slogan = record.output.get("slogan") if isinstance(record.output, dict) else record.output
        print(f"  {record.rollout_id}: {slogan!r}")
    print(f"\nBest (reward {six_words({}, winner):.2f}): {winner.slogan!r}")


if __name__ == "__main__":
    main()
