"""Label outputs on the embedded model: does ``response_format=Literal[...]`` keep the accuracy?

For each BBH task in ``../shared/data/bbh`` (test split: examples 60–159 in file
order), the same zero-shot prompt is run three ways on SmolLM2-135M, greedy:

* ``text``: no response format; the first word of the reply is the answer
  (`bbh_tasks.normalise`), which forgives "True." and "False, because …";
* ``Literal``: ``LLMInference(response_format=Literal[labels])``; the local
  backend decodes the bare label under a grammar (a count may follow a few
  words: "There are 3.") and gives it back as JSON;
* ``Literal (JSON grammar)``: the same type, but the reply decoded as the
  JSON object ``{"value": "<label>"}`` under a JSON-schema grammar — how the
  local backend decoded labels before, shown for comparison.

``word_sorting`` has no label set, so it has only the text row.

    python benchmarks/labels_bench.py [--tasks boolean_expressions,...] [--limit 100]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).parent))

from bbh_tasks import TASKS, Task, is_correct

from plait import LLMInference, ResourceConfig, run


def json_wrapped(labels: tuple[str, ...]) -> Any:
    """Returns a pydantic model ``{"value": Literal[labels], "note": ""}`` whose grammar is JSON.

    A second, fixed-empty field makes the schema more than one enum field, so
    the backend uses its JSON-schema grammar: how labels were decoded before.
    """
    from pydantic import Field, create_model

    return create_model(
        "Answer",
        value=(Literal[labels], ...),  # type: ignore[valid-type]
        note=(str, Field("", max_length=0)),
    )


async def accuracy(task: Task, response_format: Any, items: list[dict[str, str]]) -> float:
    resources = ResourceConfig({"task": {"provider": "local", "n_ctx": 2048}})
    program = LLMInference(
        "task",
        system_prompt=task.instructions,
        temperature=0.0,
        max_tokens=64 if task.labels else 256,
        response_format=response_format,
    )
    outputs = await run(
        program, [x["input"] for x in items], resources=resources, on_error="collect"
    )
    right = 0
    for output, item in zip(outputs, items, strict=True):
        if isinstance(output, BaseException):
            continue
        answer = getattr(output, "value", output)
        right += is_correct(answer, item["target"], task)
    return right / len(items)


async def main(args: argparse.Namespace) -> None:
    rows = []
    started = time.perf_counter()
    for name in args.tasks.split(","):
        task = TASKS[name]
        test = task.split()[2][: args.limit]
        text = await accuracy(task, None, test)
        row = [name, f"{text:.2f}", "n/a", "n/a"]
        if task.labels:
            bare = await accuracy(task, Literal[task.labels], test)  # type: ignore[valid-type]
            wrapped = await accuracy(task, json_wrapped(task.labels), test)
            row[2:] = [f"{bare:.2f}", f"{wrapped:.2f}"]
        rows.append(row)
        print(f"  {name}: done", file=sys.stderr)
    print(f"\nSmolLM2-135M, greedy, {args.limit} test items per task; same prompt in every column")
    header = ["task", "text", "Literal", "Literal (JSON grammar)"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print(" | ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)))
    print(f"\nwall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--limit", type=int, default=100)
    asyncio.run(main(parser.parse_args()))
