"""Learn a program for a BIG-Bench-Hard task with the embedded model, and measure it honestly.

The task is ``boolean_expressions`` ("not ( True ) and ( True ) is" → False),
copied with its MIT licence from BIG-Bench-Hard (github.com/suzgunmirac/BIG-Bench-Hard)
into ``examples/data/bbh/``; ``--data`` reads another BBH task file. Split by
file order: the first 30 examples train, the next 30 validate, the next 100 test.

The program is one `Predict` step ``question -> answer`` whose answer is a
``Literal`` of the task's labels (the local backend decodes the bare label),
sent by `PlainAdapter` as plainly as a 135M model needs. Its learnable
parameters are its instructions and its few-shot demos. Then:

1. ``BootstrapFewShot`` runs the program on the training set and keeps the
   calls that got the right answer as demos, balanced across labels (labeled
   examples fill in a label the good runs lack);
2. ``ReflectiveSearch`` evolves the program from there: it runs a few
   training examples in training mode, sends the verifier's feedback
   backward, rewrites the instructions from that feedback (or swaps demos),
   keeps a child only if it does better on those examples, and keeps a Pareto
   frontier of candidates over the validation examples, within a call budget.

Each step changes the program only if the change wins clearly on the
validation set (more examples gained than lost, by a sign test), so the
program never ends below where it started on validation; the held-out test
set gives the honest figure. Runs with no key and no network:

    python examples/train_bbh.py [--budget 300] [--data path/to/task.json] \
        [--model-path path/to/model.gguf]

What to expect: SmolLM2-135M is close to chance on these tasks (on
booleans it scores 0.64 against a majority class of 0.52), and measured so,
no candidate any optimizer found won clearly on validation: the program is
kept as it started, and the printout says so rather than showing a change
that validation noise chose. A larger GGUF model (``--model-path``) has
more to gain. The printout shows the learned demos and instructions, the
validation evidence and the test score, so you can judge the change yourself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any, Literal

from plait import Predict, ResourceConfig, evaluate
from plait.optimization import BootstrapFewShot, ReflectiveSearch
from plait.signatures import FieldSpec, PlainAdapter, make_signature

DATA = Path(__file__).parent / "data" / "bbh" / "boolean_expressions.json"
START = "Evaluate the boolean expression. Answer with exactly one word: True or False."


def load(path: Path) -> tuple[list[tuple[str, str]], ...]:
    """Returns (train, validation, test) by file order: 30, 30 and 100 examples."""
    items = [(x["input"], x["target"]) for x in json.loads(path.read_text())["examples"]]
    return items[:30], items[30:60], items[60:160]


def build(labels: tuple[str, ...], instructions: str) -> Predict:
    fields = [
        FieldSpec("question", str, "", "input"),
        FieldSpec("answer", Literal[labels], "", "output"),  # type: ignore[valid-type]
    ]
    signature = make_signature(fields, instructions=instructions, name="BBH")
    return Predict(signature, alias="task", adapter=PlainAdapter(), temperature=0.0, max_tokens=16)


def correct(output: Any, target: str) -> bool:
    return output.answer == target


async def main(args: argparse.Namespace) -> None:
    train, val, test = load(Path(args.data))
    labels = tuple(sorted({target for _, target in train + val}))
    local: dict[str, Any] = {"provider": "local", "n_ctx": 4096}
    if args.model_path:
        local["model_path"] = args.model_path
    resources = ResourceConfig({"task": local, "optimizer": local})
    program = build(labels, args.instructions)

    started = time.perf_counter()
    before_val = await evaluate(program, val, correct, resources=resources, progress=False)
    before_test = await evaluate(program, test, correct, resources=resources, progress=False)
    reports = [
        await BootstrapFewShot(correct, max_demos=4).compile(
            program, train, val, resources=resources
        ),
        await ReflectiveSearch(correct, max_calls=args.budget, seed=args.seed).compile(
            program, train, val, resources=resources
        ),
    ]
    after_test = await evaluate(program, test, correct, resources=resources, progress=False)
    minutes = (time.perf_counter() - started) / 60

    model = Path(args.model_path).name if args.model_path else "SmolLM2-135M"
    print(f"\n{Path(args.data).stem}: 30 train / 30 validation / 100 test, {model}")
    for report in reports:
        outcome = (
            f"applied trial {report.best.number} ({report.best.note})"
            if report.improved
            else "kept the program: no candidate won clearly on validation"
        )
        print(
            f"  {report.optimizer}: {len(report.trials)} trials, {report.calls} calls, "
            f"validation {report.start.score:.2f} -> {report.best.score:.2f}; {outcome}"
        )
    print(f"validation accuracy: {before_val:.2f} -> {program.state.best_score:.2f}")
    low, high = after_test.ci
    print(
        f"test accuracy (held out): {before_test:.2f} -> {after_test:.2f} "
        f"(95% CI {low:.2f}-{high:.2f})"
    )
    print(f"learned instructions: {program.instructions.value!r}")
    print("learned demos:")
    for demo in program.demos.value or []:
        print(f"  {demo['question']!r} -> {demo['answer']}")
    if not program.demos.value:
        print("  (none)")
    print(f"runtime: {minutes:.1f} min")
    print(f"saved to {program.save(args.out)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(DATA), help="a BBH task file")
    parser.add_argument("--instructions", default=START)
    parser.add_argument("--budget", type=int, default=300, help="ReflectiveSearch's model calls")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-path", help="a GGUF model (default: the embedded SmolLM2-135M)")
    parser.add_argument("--out", default="learned_program.json")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every trial")
    arguments = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO if arguments.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(main(arguments))
