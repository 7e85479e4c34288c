"""Train a system prompt on a BIG-Bench-Hard task with the embedded model, and measure it.

The task is ``boolean_expressions`` ("not ( True ) and ( True ) is" → False),
copied with its MIT licence from BIG-Bench-Hard (github.com/suzgunmirac/BIG-Bench-Hard)
into ``examples/data/bbh/``. The program is one LLM call whose system prompt is
a learnable `Parameter`; its reply is constrained to ``Literal["True", "False"]``,
so every answer is valid. Feedback comes from an exact-match `VerifierLoss`;
`SFAOptimizer` rewrites the prompt with the *same* 135M model (its calls ask
for JSON schemas, so even this model answers in a usable shape, and unusable
rewrites are rejected and logged). Two guards keep training from doing harm:
the optimizer's ``validate`` hook reverts a step that lowers validation
accuracy, and `Trainer` keeps the best validated prompt, so validation
accuracy never ends below where it started. Because the prompt is *chosen*
on the validation set, a held-out test set gives the honest figure.

Runs with no key and no network, in several minutes on 2 cores:

    python examples/train_bbh.py [--epochs 3] [--train 24] [--val 40] [--test 48]

A 135M model is weak at this task and weaker as an optimizer: expect small
gains or none. The point is that the machinery measurably works.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import time
from pathlib import Path
from typing import Any, Literal

from plait import LLMInference, Parameter, ResourceConfig, SFAOptimizer, Trainer, evaluate
from plait.evaluation import exact_match
from plait.optimization import VerifierLoss

DATA = Path(__file__).parent / "data" / "bbh" / "boolean_expressions.json"
START = "Evaluate the boolean expression. Answer True or False."
ROLE = "Instructions for answering whether the boolean expression in the input is True or False."


def split(sizes: list[int], seed: int) -> list[list[dict[str, Any]]]:
    """Returns disjoint example sets of the given sizes, drawn reproducibly from the task file."""
    examples = json.loads(DATA.read_text(encoding="utf-8"))["examples"]
    random.Random(seed).shuffle(examples)
    parts, start = [], 0
    for size in sizes:
        parts.append(examples[start : start + size])
        start += size
    return parts


async def main(args: argparse.Namespace) -> None:
    train_set, val_set, test_set = split([args.train, args.val, args.test], args.seed)
    # Two aliases, one model: the endpoints share the loaded SmolLM2 and its queue.
    local = {"provider": "local", "n_ctx": 4096}
    resources = ResourceConfig({"task": local, "optimizer": local})
    program = LLMInference(
        "task",
        system_prompt=Parameter(START, description=ROLE),
        temperature=0.0,
        response_format=Literal["True", "False"],
    )

    async def validation_accuracy() -> float:
        return await evaluate(program, val_set, exact_match, resources=resources)

    optimizer = SFAOptimizer(
        program.named_parameters(),
        conservatism=args.conservatism,
        validate=validation_accuracy,
    )
    trainer = Trainer(
        program,
        VerifierLoss(exact_match),
        optimizer,
        resources=resources,
        train_set=train_set,
        val_set=val_set,
        metric=exact_match,
        epochs=args.epochs,
        batch_size=args.batch_size,
        checkpoint_dir=args.checkpoint_dir,
    )

    started = time.perf_counter()
    test_before = await evaluate(program, test_set, exact_match, resources=resources)
    report = await trainer.fit()
    test_after = await evaluate(program, test_set, exact_match, resources=resources)
    minutes = (time.perf_counter() - started) / 60

    sizes = f"{len(train_set)} train / {len(val_set)} validation / {len(test_set)} test"
    print(f"\ntask: boolean_expressions, {sizes}")
    print(f"validation accuracy before: {report.initial_score:.3f}")
    for epoch, score in enumerate(report.scores, 1):
        print(f"  after epoch {epoch}: {score:.3f}")
    kept = f"the prompt of epoch {report.best_epoch}" if report.best_epoch else "the first prompt"
    print(f"validation accuracy after:  {report.best_score:.3f} (kept {kept})")
    print(f"test accuracy (held out):   {test_before:.3f} -> {test_after:.3f}")
    print(
        f"optimizer: {report.steps} steps, {report.accepted} updates kept, "
        f"{report.rejected} rejected or reverted"
    )
    for record in optimizer.history["system_prompt"]:
        outcome = record.status + (f": {record.reason[:100]}" if record.reason else "")
        print(f"  step {record.step} {outcome}")
        if record.new is not None:
            print(f"    proposed {str(record.new)[:120]!r}")
    print(f"learned prompt: {program.system_prompt.value!r}")
    print(f"runtime: {minutes:.1f} min")
    print(f"saved to {program.save(args.out, optimizer)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train", type=int, default=24)
    parser.add_argument("--val", type=int, default=40)
    parser.add_argument("--test", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--conservatism", type=float, default=0.0, help="0 rewrite freely … 1 minimal edits"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default=None, help="resume from / save to here")
    parser.add_argument("--out", default="learned_prompt.json")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every update")
    arguments = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO if arguments.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(main(arguments))
