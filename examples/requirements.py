"""Instruct, validate, repair (Mellea style) on the embedded model.

Runs with no key and no network. One requirement is checked in Python, the
other by the model acting as a judge (a structured ``{reason, passed}``
answer). Failed requirements are listed in a repair request; the result says
which requirements the kept answer meets. A 135M judge is not a good judge —
swap the alias for a real model to get meaningful verdicts.

    python examples/requirements.py ["question"]
"""

from __future__ import annotations

import sys

from plait import Predict, Requirement, ResourceConfig, ValidateAndRepair


def main() -> None:
    question = sys.argv[1] if len(sys.argv) > 1 else "Name three colours of the rainbow."
    requirements = [
        Requirement("Uses at most 15 words", lambda p: len(p.answer.split()) <= 15),
        Requirement("Answers the question that was asked"),  # judged by the model
    ]
    answer = Predict("question -> answer", temperature=0.3, max_tokens=48)
    program = ValidateAndRepair(answer, requirements, max_repairs=1)
    program.bind(ResourceConfig({"llm": {"provider": "local"}}))

    result = program.run_sync(question=question)
    print(f"answer: {result.output.answer!r}")
    print(f"repairs: {result.repairs}, all met: {result.passed}")
    print(result.report)


if __name__ == "__main__":
    main()
