"""The four BIG-Bench-Hard tasks of the learning benchmarks: data, split, prompts, labels.

Plain Python with no plait import, so the peers' scripts (DSPy, TextGrad, in
their own venv) read exactly the same tasks. The split is by file order: the
first 30 examples train, the next 30 validate, the next 100 test.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "bbh"
"""Where the task files are: ``../shared/data/bbh`` beside the checkout."""

SPLIT = (30, 30, 100)
"""Train, validation and test sizes, taken in file order."""


@dataclass(frozen=True)
class Task:
    """One BBH task as the benchmarks use it."""

    name: str
    instructions: str
    """The zero-shot prompt every method starts from."""
    labels: tuple[str, ...] | None
    """The answers a reply may be (None: free text, e.g. a sorted word list)."""

    def examples(self, data: Path = DATA) -> list[dict[str, str]]:
        """Returns the task's examples in file order (``input`` and ``target`` keys)."""
        path = data / f"{self.name}.json"
        return json.loads(path.read_text(encoding="utf-8"))["examples"]

    def split(self, data: Path = DATA) -> tuple[list[dict[str, str]], ...]:
        """Returns (train, validation, test) by file order."""
        examples = self.examples(data)
        train, val, test = SPLIT
        return (
            examples[:train],
            examples[train : train + val],
            examples[train + val : train + val + test],
        )


TASKS = {
    task.name: task
    for task in (
        Task(
            "boolean_expressions",
            "Evaluate the boolean expression. Answer with exactly one word: True or False.",
            ("True", "False"),
        ),
        Task(
            "sports_understanding",
            "Decide whether the sentence is plausible. Answer with exactly one word: yes or no.",
            ("yes", "no"),
        ),
        Task(
            "object_counting",
            "Count the objects the question asks about. Answer with only the number.",
            tuple(str(n) for n in range(21)),
        ),
        Task(
            "word_sorting",
            "Sort the words alphabetically. Answer with only the sorted words, "
            "separated by spaces.",
            None,
        ),
    )
}


def normalise(reply: Any, task: Task) -> str:
    """Returns the answer in a text reply: for label tasks its first word (or number), bare.

    A free reply to "Answer with exactly one word: True or False" is often
    ``True.`` or ``False, because ...``; scoring only exact text would
    punish the punctuation, not the answer. A count's answer is the first
    number in the reply ("There are 8 instruments." → 8). For free-text tasks
    the whole reply is kept, with runs of spaces folded.
    """
    text = str(reply).strip()
    if task.labels is None:
        return " ".join(text.split())
    pattern = r"\d+" if all(label.isdigit() for label in task.labels) else r"[A-Za-z0-9]+"
    words = re.findall(pattern, text)
    return words[0] if words else ""


def is_correct(reply: Any, target: str, task: Task) -> bool:
    """Whether a reply answers ``target`` (case-insensitive, see `normalise`)."""
    return normalise(reply, task).casefold() == target.strip().casefold()
