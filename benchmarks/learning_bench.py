"""The learning benchmark: does an optimizer make a program better on held-out data?

On the embedded SmolLM2-135M, for each BBH task in ``../shared/data/bbh``
(split by file order: 30 train, 30 validation, 100 test; see `bbh_tasks`),
every method starts from the same zero-shot instructions and may spend about
the same number of model calls (``--budget``) on optimisation; then its
program answers the 100 test questions. One table: test accuracy,
optimisation calls and minutes, per method and task.

plait (this venv, embedded backend, greedy): a `Predict` step
``question -> answer`` with `PlainAdapter` (the answer a ``Literal`` of the
task's labels, decoded as a bare label; free text for word_sorting), and

* ``zero-shot`` — the instructions as they are;
* ``LabeledFewShot`` (k=4), ``BootstrapFewShot`` (4 demos), ``RandomSearch``
  (demo sets × instructions, incl. 2 proposed by the model), ``GridSearch``
  (temperature × 3 instruction variants), ``ReflectiveSearch`` (GEPA-like,
  ``max_calls=budget``) — chosen on the validation set;
* ``SFA`` and ``TextGrad`` — `Trainer` (2 epochs, minibatches of 8, a
  validation hook and keep-best) rewriting the instructions;
* ``RandomSearch (no sign test)`` — RandomSearch choosing on validation
  scores alone (``significance=None``), to show what the evidence rule of
  `ProgramSearch` guards against.

Peers (their own venv, ``/work/peers_venv``; see `learning_peers.py`) talk to
the same model served by ``python -m llama_cpp.server`` on loopback: DSPy
zero-shot, LabeledFewShot, BootstrapFewShot, MIPROv2 ``auto="light"``, and
TextGrad (TGD on the system prompt, with a validation revert, as in its
prompt-optimisation tutorial). Their replies are scored like plait's text
replies (first word, or first number; `bbh_tasks.is_correct`).

Results go to a JSON Lines file as each (task, method) finishes, and a rerun
with the same ``--out`` skips what is done, so a long run can be resumed::

    python benchmarks/learning_bench.py [--tasks boolean_expressions,...] \\
        [--methods zero-shot,BootstrapFewShot,...] [--budget 400] [--no-peers] \\
        [--out benchmarks/learning_results.jsonl]

It prints the table from everything in ``--out``; ``--table`` only prints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from plait.testing import start_llama_server

sys.path.insert(0, str(Path(__file__).parent))

from bbh_tasks import TASKS, Task, is_correct

PLAIT_METHODS = [
    "zero-shot",
    "LabeledFewShot",
    "BootstrapFewShot",
    "RandomSearch",
    "GridSearch",
    "ReflectiveSearch",
    "SFA",
    "TextGrad",
    "RandomSearch (no sign test)",
]
PEER_METHODS = [
    "DSPy zero-shot",
    "DSPy LabeledFewShot",
    "DSPy BootstrapFewShot",
    "DSPy MIPROv2-light",
    "TextGrad (peer)",
]
PEERS_PYTHON = os.environ.get("PEERS_PYTHON", "/work/peers_venv/bin/python")

VARIANTS = {
    "boolean_expressions": [
        "Answer True or False.",
        "Work out the boolean expression: not, then and, then or. "
        "Answer with one word: True or False.",
    ],
    "sports_understanding": [
        "Answer yes or no.",
        "Is the sentence plausible for this athlete and this sport? Answer yes or no.",
    ],
    "object_counting": [
        "Answer with a number.",
        "Count only the items of the kind asked about; answer with the total as a number.",
    ],
    "word_sorting": [
        "Sort the words.",
        "Put the listed words in alphabetical order and reply with them separated by spaces.",
    ],
}
"""Hand-written instruction variants for the grid (besides the task's own instructions)."""


# ------------------------------------------------------------------- plait
def metric_for(task: Task) -> Any:
    def correct(output: Any, target: Any) -> bool:
        answer = output.get("answer") if hasattr(output, "get") else output
        return is_correct(answer, str(target), task)

    correct.__name__ = f"{task.name}_correct"
    return correct


def program_for(task: Task) -> Any:
    from plait import Predict
    from plait.signatures import FieldSpec, PlainAdapter, make_signature

    answer_type: Any = Literal[task.labels] if task.labels else str  # type: ignore[valid-type]
    fields = [
        FieldSpec("question", str, "", "input"),
        FieldSpec("answer", answer_type, "", "output"),
    ]
    signature = make_signature(fields, instructions=task.instructions, name="BBH")
    return Predict(
        signature,
        alias="task",
        adapter=PlainAdapter(),
        temperature=0.0,
        max_tokens=16 if task.labels else 100,
    )


def resources() -> Any:
    from plait import ResourceConfig

    local = {"provider": "local", "n_ctx": 4096}
    return ResourceConfig({"task": local, "optimizer": local})


async def run_plait(task: Task, method: str, budget: int) -> dict[str, Any]:
    from plait import evaluate
    from plait.optimization import (
        BootstrapFewShot,
        GridSearch,
        LabeledFewShot,
        RandomSearch,
        ReflectiveSearch,
    )
    from plait.resources.usage import metered

    train, val, test = task.split()
    metric = metric_for(task)
    config = resources()
    program = program_for(task)
    detail: dict[str, Any] = {}
    val_before = float(await evaluate(program, val, metric, resources=config, progress=False))
    started = time.perf_counter()
    with metered() as meter:
        searches = {
            "LabeledFewShot": lambda: LabeledFewShot(metric, k=4),
            "BootstrapFewShot": lambda: BootstrapFewShot(metric, max_demos=4),
            "RandomSearch": lambda: RandomSearch(
                metric, num_candidates=max(2, (budget - 60) // len(val) - 1), propose=2
            ),
            "GridSearch": lambda: GridSearch(
                metric,
                {
                    "temperature": [0.0, 0.7],
                    "instructions": [task.instructions, *VARIANTS[task.name]],
                },
            ),
            "ReflectiveSearch": lambda: ReflectiveSearch(metric, max_calls=budget),
            # The same search choosing on validation alone: what the sign test guards against.
            "RandomSearch (no sign test)": lambda: RandomSearch(
                metric,
                num_candidates=max(2, (budget - 60) // len(val) - 1),
                propose=2,
                significance=None,
            ),
        }
        if method in searches:
            report = await searches[method]().compile(program, train, val, resources=config)
            val_after = report.best.score
            detail = {
                "trials": len(report.trials),
                "best": report.best.params,
                "val_scores": [round(t.score, 3) for t in report.trials],
            }
        elif method in ("SFA", "TextGrad"):
            val_after = await _train(program, method, train, val, metric, config)
        elif method == "zero-shot":
            val_after = val_before
        else:
            raise ValueError(f"unknown plait method {method!r}")
        calls = meter.calls
    minutes = (time.perf_counter() - started) / 60
    test_score = float(await evaluate(program, test, metric, resources=config, progress=False))
    detail["instructions"] = program.instructions.value
    detail["demos"] = [d.get("answer") for d in program.demos.value]
    return {
        "task": task.name,
        "method": method,
        "framework": "plait",
        "test": test_score,
        "val_before": val_before,
        "val_after": val_after,
        "calls": calls,
        "minutes": minutes,
        "detail": detail,
    }


async def _train(
    program: Any, method: str, train: list[Any], val: list[Any], metric: Any, config: Any
) -> float:
    from plait import evaluate
    from plait.optimization import SFAOptimizer, TextGradOptimizer, Trainer, VerifierLoss

    async def validate() -> float:
        return float(await evaluate(program, val, metric, resources=config, progress=False))

    kind = SFAOptimizer if method == "SFA" else TextGradOptimizer
    optimizer = kind([("instructions", program.instructions)], validate=validate)
    trainer = Trainer(
        program,
        VerifierLoss(metric),
        optimizer,
        resources=config,
        train_set=train,
        val_set=val,
        metric=metric,
        epochs=2,
        batch_size=8,
        progress=False,
    )
    report = await trainer.fit()
    return report.best_score


# ------------------------------------------------------------------- peers
def run_peer(task: Task, method: str, budget: int, base_url: str) -> dict[str, Any]:
    script = Path(__file__).parent / "learning_peers.py"
    command = [
        PEERS_PYTHON,
        str(script),
        "--task",
        task.name,
        "--method",
        method,
        "--budget",
        str(budget),
        "--base-url",
        base_url,
    ]
    # TextGrad writes a log folder into the working directory unless told otherwise.
    logs = Path(tempfile.gettempdir()) / "textgrad-logs"
    environment = {**os.environ, "TEXTGRAD_LOG_DIR": f"{logs}/"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=environment)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout)[-600:]
        return {
            "task": task.name,
            "method": method,
            "framework": "peer",
            "error": f"exit {done.returncode}: {tail}",
        }
    return json.loads(lines[-1])


# ------------------------------------------------------------------- table
def print_table(results: list[dict[str, Any]], tasks: list[str]) -> None:
    by = {(r["task"], r["method"]): r for r in results}
    methods = [m for m in [*PLAIT_METHODS, *PEER_METHODS] if any((t, m) in by for t in tasks)]
    header = ["method", *tasks]
    rows = []
    for method in methods:
        row = [method if method in PEER_METHODS else f"plait {method}"]
        for task in tasks:
            r = by.get((task, method))
            if r is None:
                row.append("-")
            elif "error" in r:
                row.append("failed")
            else:
                lenient = (r.get("detail") or {}).get("test_lenient")
                shown = f"{r['test']:.2f}" + (f" [{lenient:.2f}]" if lenient is not None else "")
                row.append(f"{shown} / {r['calls']} / {r['minutes']:.1f}")
        rows.append(row)
    widths = [max(len(str(x[i])) for x in [header, *rows]) for i in range(len(header))]
    print("test accuracy / optimisation calls / minutes (100 test items per task);")
    print("[lenient]: DSPy scored by the first label anywhere in its answer field")
    for row in [header, ["-" * w for w in widths], *rows]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    print()
    for task in tasks:
        plait_rows = [by[(task, m)] for m in PLAIT_METHODS if (task, m) in by]
        peer_rows = [
            by[(task, m)] for m in PEER_METHODS if "error" not in by.get((task, m), {"error": 1})
        ]
        if not plait_rows:
            continue
        best = max(plait_rows, key=lambda r: r["test"])
        zero = by.get((task, "zero-shot"))
        worse = [r["method"] for r in plait_rows if r["val_after"] < r["val_before"] - 1e-9]
        line = f"{task}: plait best {best['test']:.2f} ({best['method']})"
        if zero:
            line += f", plait zero-shot {zero['test']:.2f}"
        if peer_rows:
            peer = max(peer_rows, key=lambda r: r["test"])
            line += f", best peer {peer['test']:.2f} ({peer['method']})"
        line += "; below start on validation: " + (", ".join(worse) or "none")
        print(line)


def load(out: Path) -> list[dict[str, Any]]:
    if not out.is_file():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--methods", default=",".join(PLAIT_METHODS + PEER_METHODS))
    parser.add_argument("--budget", type=int, default=400)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).parent / "learning_results.jsonl"))
    parser.add_argument("--table", action="store_true", help="only print the table of --out")
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    out = Path(args.out)
    methods = args.methods.split(",")
    if not args.table:
        done = {(r["task"], r["method"]) for r in load(out)}
        started = time.perf_counter()
        for name in tasks:
            task = TASKS[name]
            for method in [m for m in methods if m in PLAIT_METHODS]:
                if (name, method) in done:
                    continue
                result = asyncio.run(run_plait(task, method, args.budget))
                _append(out, result)
        peers = [m for m in methods if m in PEER_METHODS and not args.no_peers]
        todo = [(n, m) for n in tasks for m in peers if (n, m) not in done]
        if todo:
            with start_llama_server(out.with_suffix(".server.log"), n_ctx=4096) as base_url:
                for name, method in todo:
                    _append(out, run_peer(TASKS[name], method, args.budget, base_url))
        print(f"wall time of this run: {(time.perf_counter() - started) / 60:.1f} min\n")
    print_table(load(out), tasks)


def _append(out: Path, result: dict[str, Any]) -> None:
    with out.open("a", encoding="utf-8") as f:
        f.write(json.dumps(result) + "\n")
    shown = {k: v for k, v in result.items() if k != "detail"}
    print(json.dumps(shown), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
