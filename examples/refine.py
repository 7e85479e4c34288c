"""Refine on the embedded model: retry with feedback until a requirement holds.

Runs with no key and no network. The requirements are Python checks; when an
attempt breaks one, the next request carries the previous answer and the
reason it fell short, which this example prints. If no attempt passes, the
one meeting the most requirements is kept.

    python examples/refine.py ["topic"]
"""

from __future__ import annotations

import sys
from typing import Any

from plait import Predict, Refine, Requirement, ResourceConfig


def at_most_twelve_words(prediction: Any) -> bool | str:
    words = len(prediction.summary.split())
    return words <= 12 or f"it has {words} words"


def names_chlorophyll(prediction: Any) -> bool | str:
    return "chlorophyll" in prediction.summary.lower() or "it does not say 'chlorophyll'"


def main() -> None:
    topic = sys.argv[1] if len(sys.argv) > 1 else "why leaves change colour in autumn"
    summarize = Predict("topic -> summary", temperature=0.7, max_tokens=48)
    refine = Refine(
        summarize,
        max_iters=3,
        requirements=[
            Requirement("At most twelve words", at_most_twelve_words),
            Requirement("Names the pigment chlorophyll", names_chlorophyll),
        ],
    )
    refine.bind(ResourceConfig({"llm": {"provider": "local"}}))

    result = refine.run_sync(topic=topic)
    for record in summarize.traces():
        print(f"--- {record.rollout_id}: {record.output}")
        feedback = [m["content"] for m in record.messages if m["role"] == "user"][:-1]
        if feedback:
            print(f"    told: {feedback[-1]!r}")
    print(f"\nKept: {result.summary!r}")


if __name__ == "__main__":
    main()
