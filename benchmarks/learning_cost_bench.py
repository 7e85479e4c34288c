"""Estimate vs actual: how close `estimate` comes to what a learning run then spends.

For `evaluate`, every program search (LabeledFewShot, BootstrapFewShot,
RandomSearch with proposals, GridSearch, ReflectiveSearch) and the Trainer
(SFA), on the scripted server: first the estimate (which makes its sample's
calls), then the run itself, counted by a fresh resource manager (calls,
tokens, dollars at a set price). One row per run, with the ratio
estimate/actual of the expected column and whether the actual lies inside the
estimate's low..high range. The goal is a ratio within 0.75..1.25.

The scripted model answers a parity question right once its prompt holds a
demo of each label or the rule in its instructions, else "even"; it counts
tokens as words. With ``--local``, every one of them also runs on the embedded
SmolLM2 model (free, so no dollars), with real token counts, on 8 training and
8 validation examples and smaller settings::

    python benchmarks/learning_cost_bench.py [--local] [--val 30] [--train 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

import plait
from plait import LLMInference, Parameter, Predict, ResourceConfig, ResourceManager
from plait.optimization import (
    BootstrapFewShot,
    GridSearch,
    LabeledFewShot,
    RandomSearch,
    ReflectiveSearch,
    SFAOptimizer,
    Trainer,
)
from plait.signatures import PlainAdapter
from plait.testing import ScriptedServer

PRICE = {"input": 0.15, "output": 0.60}
SIGNATURE = "question -> parity: Literal['even', 'odd']"
RULE = "Answer even when the last digit is 0, 2, 4, 6 or 8, else odd."


def dataset(numbers: list[int]) -> list[tuple[str, str]]:
    return [
        (f"Is the number {n} even or odd? Look at its last digit.", "odd" if n % 2 else "even")
        for n in numbers
    ]


def respond(body: dict[str, Any]) -> str:
    """The scripted model (see the module docs); optimizer calls get scripted JSON."""
    schema = json.dumps(body.get("response_format") or {})
    if "InstructionProposal" in schema:
        return json.dumps({"rationale": "state the rule", "instruction": RULE})
    if "FeedbackSummary" in schema:
        summary = {"summary": "It says even for odd numbers.", "changes": ["Use the rule."]}
        return json.dumps(summary)
    if "ParameterUpdate" in schema:
        return json.dumps({"new_value": RULE, "rationale": "the rule decides"})
    messages = body["messages"]
    turns = {m["content"] for m in messages if m["role"] == "assistant"}
    question = [m["content"] for m in messages if m["role"] == "user"][-1]
    number = int(question.split("number ")[1].split()[0]) if "number " in question else 0
    knows = RULE in messages[0]["content"] or {"even", "odd"} <= turns
    return ("odd" if number % 2 else "even") if knows else "even"


def program() -> Predict:
    return Predict(SIGNATURE, adapter=PlainAdapter()).copy()


Work = tuple[str, Callable[[Any], Awaitable[Any]], Callable[[Any], Awaitable[Any]]]
"""(name, estimate(resources), run(resources))."""


def works(train: list[tuple[str, str]], val: list[tuple[str, str]], *, local: bool) -> list[Work]:
    def search(name: str, make: Callable[[], Any]) -> Work:
        return (
            name,
            lambda res: make().estimate(program(), trainset=train, valset=val, resources=res),
            lambda res: make().compile(program(), trainset=train, valset=val, resources=res),
        )

    evaluate: Work = (
        "evaluate",
        lambda res: plait.estimate(program(), val, resources=res),
        lambda res: plait.evaluate(program(), val, resources=res),
    )
    # The embedded model takes about a second a call: smaller settings, same methods.
    reflective_calls, candidates, demos = (60, 4, 2) if local else (150, 6, 4)
    return [
        evaluate,
        search("LabeledFewShot", lambda: LabeledFewShot(k=demos)),
        search("BootstrapFewShot", lambda: BootstrapFewShot(max_demos=demos)),
        search("RandomSearch", lambda: RandomSearch(num_candidates=candidates, propose=2)),
        search("GridSearch", lambda: GridSearch(parameters={"instructions": [RULE, "Parity?"]})),
        search("ReflectiveSearch", lambda: ReflectiveSearch(max_calls=reflective_calls)),
        ("Trainer (SFA)", lambda res: trainer(res, train, val).estimate(),
         lambda res: trainer(res, train, val).fit()),
    ]  # fmt: skip


def trainer(resources: Any, train: list[Any], val: list[Any]) -> Trainer:
    module = LLMInference("task", system_prompt=Parameter("Say even or odd.", description="task"))

    def exact(output: Any, target: Any) -> bool:
        return str(output).strip() == target

    return Trainer(
        module, exact, SFAOptimizer(module.named_parameters()), resources=resources,
        train_set=train, val_set=val, metric=exact, epochs=2, batch_size=8, progress=False,
    )  # fmt: skip


async def measure(name: str, work: Work, config: ResourceConfig) -> dict[str, Any]:
    _, estimate_of, run = work
    estimate = await estimate_of(config)
    async with ResourceManager(config) as manager:  # a fresh one counts only the run
        await run(manager)
        usage = manager.total_usage()
        calls = sum(stats.requests for stats in manager.stats().values())
    actual = {
        "calls": calls,
        "tokens": usage.input_tokens + usage.output_tokens,
        "cost": usage.cost,
    }
    row: dict[str, Any] = {"work": name, "sample_calls": estimate.sample_calls}
    for key in ("calls", "tokens", "cost"):
        guess = getattr(estimate, key)
        if guess is None or not actual[key]:
            row[key] = (None, actual[key], None, None)
            continue
        ratio = guess.expected / actual[key]
        row[key] = (guess.expected, actual[key], ratio, guess.low <= actual[key] <= guess.high)
    return row


def show(rows: list[dict[str, Any]], where: str) -> None:
    print(f"\n{where}: estimate (expected) / actual = ratio [inside low..high]")
    print("(sample: the calls the estimate itself made, not counted in the actual)")
    print(f"{'work':<18} {'sample':<7} {'calls':<28} {'tokens':<30} {'cost $':<34}")
    for row in rows:
        cells = []
        for key in ("calls", "tokens", "cost"):
            guess, actual, ratio, inside = row[key]
            if ratio is None:
                cells.append(f"- / {actual:.4g}")
            else:
                mark = "in" if inside else "OUT"
                cells.append(f"{guess:.4g} / {actual:.4g} = {ratio:.2f} [{mark}]")
        sample = row["sample_calls"]
        print(f"{row['work']:<18} {sample:<7} {cells[0]:<28} {cells[1]:<30} {cells[2]:<34}")
    ratios = [row[k][2] for row in rows for k in ("calls", "tokens", "cost") if row[k][2]]
    within = sum(0.75 <= r <= 1.25 for r in ratios)
    print(f"{within} of {len(ratios)} ratios within 0.75..1.25")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=20)
    parser.add_argument("--val", type=int, default=30)
    parser.add_argument("--local", action="store_true", help="also on the embedded model")
    args = parser.parse_args()
    numbers = random.Random(0).sample(range(10, 1000), args.train + args.val)
    train, val = dataset(numbers[: args.train]), dataset(numbers[args.train :])

    async with ScriptedServer(responder=respond) as server:
        config = ResourceConfig(
            {"*": server.endpoint(max_retries=0, max_concurrent=16, price=PRICE)}
        )
        rows = [await measure(w[0], w, config) for w in works(train, val, local=False)]
    show(rows, f"scripted server ({len(train)} train / {len(val)} validation examples)")

    if args.local:
        small_train, small_val = train[:8], val[:8]
        config = ResourceConfig({"*": {"provider": "local"}})
        rows = [await measure(w[0], w, config) for w in works(small_train, small_val, local=True)]
        show(rows, "embedded SmolLM2 (8 train / 8 validation examples)")


if __name__ == "__main__":
    asyncio.run(main())
