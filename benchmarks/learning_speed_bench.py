"""Optimisation wall-clock at API latency: plait's searches against DSPy's and GEPA's.

What it measures: how long each prompt optimiser takes, and how many model calls
per second it gets through, on one small task against an OpenAI-compatible
endpoint that answers every request after a fixed latency (default 100 ms) --
the regime of a paid API, where an optimiser's time is its calls' waiting, and
what matters is how many of them it keeps in flight.

* The endpoint: plait's scripted server (`plait.testing.start_server_process`),
  in its own process, answering with `respond` below. Clients are limited to
  ``--limit`` calls in flight (default 64): plait's endpoint ``max_concurrent``,
  DSPy's ``num_threads``. The server counts the requests it saw and its peak of
  requests in flight.
* The task: "Is <n> even or odd?" (``--train`` / ``--val`` examples, default 20 /
  20, from a seeded sample). The scripted model answers "even" unless its prompt
  holds the rule (the words ``last digit`` in its system turn, which is where
  every framework puts a step's instructions) or demos of both labels; then it
  answers right. So demos and instructions both have something to find: zero-shot
  scores about 0.5, a program with either scores 1.0. Optimiser calls get the rule:
  plait's structured proposals and rewrites, MIPROv2's proposed instruction,
  dspy.GEPA's proposed instruction (JSON).
* The methods, each given the same budget of model calls (``--budget``, default
  240) where it takes one: plait's `BootstrapFewShot`, `RandomSearch` (bootstrapped
  and labeled demos, 2 proposed instructions, as many candidates as the budget
  holds) and `ReflectiveSearch` (4 proposals a round), each with ``max_calls`` as
  its hard budget; DSPy's `BootstrapFewShot` (4 + 4 demos; sequential, and it stops
  once it has its demos: its teacher holds the 4 labeled ones, so its first 4 runs
  are good), `MIPROv2` (``auto=None``, 3 candidates, every trial on the whole
  validation set, trials as the budget holds; needs ``optuna``) and `dspy.GEPA`
  (``max_metric_calls`` as the budget less its reflection calls, gepa underneath).
  BootstrapFewShot makes as many calls as its data asks on either side, well
  under the budget.

Each method runs in a child process of its own (``--timeout`` seconds, default
150; a peer that fails or hangs is reported with the reason). The child resets the
server's counters, times ``compile`` alone, reads the counters, then scores the
result on the validation set (those calls are not counted). Per method it prints
wall-clock, calls the server saw, calls/s, the server's peak in flight, the final
validation score, and for each peer two ratios to plait: its wall-clock over that
of plait's fastest run that made at least 0.9 × as many calls, and its seconds
per call over plait's best (wall-clock at the same call budget: the methods do
not all spend the whole budget, and DSPy's BootstrapFewShot spends a few calls).
The issue's goal: at the same call budget, at least 3 × faster than the fastest
peer, with the peak at most the limit.

It needs DSPy and gepa, so it runs in the peers' venv with this checkout's plait
first on the path (keep sizes small: the machine is shared)::

    PYTHONPATH=src /work/peers_venv/bin/python benchmarks/learning_speed_bench.py \\
        [--budget 240] [--train 20] [--val 20] [--latency 0.1] [--limit 64] [--only ...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTRUCTIONS = "Classify the number."
RULE_WORDS = "last digit"
RULE = "Look at the last digit: 0, 2, 4, 6 or 8 means even; 1, 3, 5, 7 or 9 means odd."
LABELS = ("even", "odd")

_QUESTION = re.compile(r"Is (\d+) even or odd\?")
_DSPY_FIELD = re.compile(r"`\[\[ ## (\w+) ## \]\]`")
_LABEL_WORD = re.compile(r"\b(even|odd)\b")


# ------------------------------------------------------------ the scripted model
def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _knows(messages: list[dict[str, Any]]) -> bool:
    """Whether the prompt holds the rule (system turn) or demos of both labels."""
    system = " ".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    shown = {
        label
        for m in messages
        if m.get("role") == "assistant"
        for label in _LABEL_WORD.findall(_text(m.get("content")))
    }
    return RULE_WORDS in system or set(LABELS) <= shown


def _in_dspy_fields(values: dict[str, str]) -> str:
    parts = [f"[[ ## {name} ## ]]\n{value}" for name, value in values.items()]
    return "\n\n".join([*parts, "[[ ## completed ## ]]"])


def respond(body: dict[str, Any]) -> str:
    """The scripted model (see the module docs), in the form each caller asks for."""
    schema = json.dumps(body.get("response_format") or {})
    if "InstructionProposal" in schema:
        return json.dumps({"rationale": "state the rule", "instruction": RULE})
    if "FeedbackSummary" in schema:
        return json.dumps(
            {"summary": "It says even for odd numbers.", "changes": ["Use the rule."]}
        )
    if "ParameterUpdate" in schema:
        return json.dumps({"new_value": RULE, "rationale": "the last digit decides"})
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    last = _text(messages[-1].get("content")) if messages else ""
    if "new_instruction" in schema or "new_instruction" in last:  # dspy.GEPA's proposer
        return json.dumps({"new_instruction": RULE})
    fields = [name for name in _DSPY_FIELD.findall(last) if name != "completed"]
    if fields and "answer" not in fields:  # MIPROv2's proposer steps
        return _in_dspy_fields(
            {
                name: RULE if "instruction" in name else "Numbers to sort by parity."
                for name in fields
            }
        )
    found = _QUESTION.search(last)
    number = int(found.group(1)) if found else 0
    label = LABELS[number % 2] if _knows(messages) else "even"
    return _in_dspy_fields({name: label for name in fields}) if fields else label


def dataset(train: int, val: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    numbers = random.Random(0).sample(range(10, 1000), train + val)
    pairs = [(f"Is {n} even or odd?", LABELS[n % 2]) for n in numbers]
    return pairs[:train], pairs[train:]


# ---------------------------------------------------------------- the methods
@dataclass
class Settings:
    base_url: str
    budget: int
    limit: int
    train: list[tuple[str, str]]
    val: list[tuple[str, str]]


def _plait(make_search: Callable[[Settings], Any]) -> Callable[[Settings], dict[str, Any]]:
    """A plait method: time ``make_search(settings).compile`` on a Predict, then score it."""

    def run(s: Settings) -> dict[str, Any]:
        import plait
        from plait import Predict, ResourceConfig
        from plait.signatures import PlainAdapter, as_signature

        endpoint = {
            "provider": "openai",
            "model": "bench",
            "base_url": s.base_url,
            "api_key": "k",
            "max_retries": 0,
            "max_concurrent": s.limit,
        }
        config = ResourceConfig({"*": endpoint})
        signature = as_signature("question -> answer", INSTRUCTIONS)
        program = Predict(signature, adapter=PlainAdapter())
        search = make_search(s)
        _reset_stats(s.base_url)
        started = time.perf_counter()
        search.compile(program, trainset=s.train, valset=s.val, resources=config)
        wall = time.perf_counter() - started
        stats = _stats(s.base_url)
        score = float(plait.evaluate(program, s.val, resources=config, progress=False))
        return {"wall": wall, **stats, "score": score}

    return run


def _plait_bootstrap(s: Settings) -> Any:
    from plait.optimization import BootstrapFewShot

    return BootstrapFewShot(max_demos=4, max_calls=s.budget)


def _plait_random(s: Settings) -> Any:
    from plait.optimization import RandomSearch

    proposals = 2
    # the start and the bootstrap run, then candidates on the validation set
    fixed = len(s.val) + len(s.train) + proposals
    candidates = max((s.budget - fixed) // len(s.val), 1)
    return RandomSearch(num_candidates=candidates, propose=proposals, max_calls=s.budget)


def _plait_reflective(s: Settings) -> Any:
    from plait.optimization import ReflectiveSearch

    return ReflectiveSearch(max_calls=s.budget, proposals=4)


def _dspy(compile_with: Callable[[Any, Settings, Any, Any, Any], Any]) -> Callable[..., Any]:
    """A DSPy method: time ``compile_with(...)`` on a Predict, then score it."""

    def run(s: Settings) -> dict[str, Any]:
        # LiteLLM would otherwise download its price list first: not the endpoint under test.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import dspy

        lm = dspy.LM("openai/bench", api_base=s.base_url, api_key="k", cache=False, num_retries=0)
        dspy.configure(lm=lm)
        signature = dspy.Signature("question -> answer", INSTRUCTIONS)
        train, val = (
            [dspy.Example(question=q, answer=a).with_inputs("question") for q, a in pairs]
            for pairs in (s.train, s.val)
        )

        def metric(example: Any, prediction: Any, trace: Any = None, *_: Any) -> float:
            return float(str(getattr(prediction, "answer", "")).strip() == example.answer)

        _reset_stats(s.base_url)
        started = time.perf_counter()
        program = compile_with(dspy, s, dspy.Predict(signature), (train, val), metric)
        wall = time.perf_counter() - started
        stats = _stats(s.base_url)
        check = dspy.Evaluate(
            devset=val, metric=metric, num_threads=s.limit, display_progress=False
        )
        score = float(check(program).score) / 100
        return {"wall": wall, **stats, "score": score}

    return run


def _dspy_bootstrap(dspy: Any, s: Settings, program: Any, data: Any, metric: Any) -> Any:
    train, _ = data
    optimizer = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=4, max_labeled_demos=4)
    return optimizer.compile(program, trainset=train)


def _dspy_mipro(dspy: Any, s: Settings, program: Any, data: Any, metric: Any) -> Any:
    train, val = data
    candidates = 3
    # its bootstraps and proposals take about one validation pass; then a pass per trial
    trials = max(s.budget // len(val) - 2, 1)
    optimizer = dspy.MIPROv2(
        metric=metric,
        auto=None,
        num_candidates=candidates,
        num_threads=s.limit,
        max_bootstrapped_demos=4,
        max_labeled_demos=4,
        verbose=False,
    )
    return optimizer.compile(
        program, trainset=train, valset=val, num_trials=trials, minibatch=False
    )


def _dspy_gepa(dspy: Any, s: Settings, program: Any, data: Any, metric: Any) -> Any:
    train, val = data
    # about one reflection call per 8 metric calls (a minibatch of 3 twice, sometimes a
    # validation pass): the metric budget is the call budget less those
    optimizer = dspy.GEPA(
        metric=metric,
        max_metric_calls=s.budget * 8 // 9,
        reflection_lm=dspy.settings.lm,
        num_threads=s.limit,
        track_stats=False,
    )
    return optimizer.compile(program, trainset=train, valset=val)


METHODS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "plait BootstrapFewShot": _plait(_plait_bootstrap),
    "plait RandomSearch": _plait(_plait_random),
    "plait ReflectiveSearch": _plait(_plait_reflective),
    "DSPy BootstrapFewShot": _dspy(_dspy_bootstrap),
    "DSPy MIPROv2": _dspy(_dspy_mipro),
    "DSPy GEPA": _dspy(_dspy_gepa),
}


# ------------------------------------------------------------- the server's view
def _root(base_url: str) -> str:
    return base_url.rstrip("/").removesuffix("/v1")


def _reset_stats(base_url: str) -> None:
    request = urllib.request.Request(_root(base_url) + "/stats/reset", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


def _stats(base_url: str) -> dict[str, int]:
    from plait.testing import fetch_stats

    stats = fetch_stats(base_url)
    return {"calls": stats["requests"], "peak": stats["peak_concurrency"]}


# ------------------------------------------------------------------- the driver
def run_one(name: str, args: argparse.Namespace) -> None:
    """The child's part: one method, one JSON line on stdout."""
    train, val = dataset(args.train, args.val)
    settings = Settings(args.base_url, args.budget, args.limit, train, val)
    result = METHODS[name](settings)
    print("RESULT " + json.dumps(result), flush=True)


def measure(name: str, args: argparse.Namespace, base_url: str) -> dict[str, Any] | str:
    """Runs ``name`` in a child process; returns its result, or why there is none."""
    command = [sys.executable, __file__, "--one", name, "--base-url", base_url]
    for option in ("budget", "train", "val", "limit"):
        command += [f"--{option}", str(getattr(args, option))]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {args.timeout:g} s"
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    tail = " ".join(done.stderr.strip().splitlines()[-1:]) or f"exit code {done.returncode}"
    return f"failed: {tail[:200]}"


def _fastest_plait(done: dict[str, dict[str, Any]], calls: int) -> float | None:
    """plait's shortest wall-clock among its runs that made at least ~``calls`` calls."""
    walls = [
        r["wall"]
        for name, r in done.items()
        if name.startswith("plait") and r["calls"] >= 0.9 * calls
    ]
    return min(walls, default=None)


def _ratios(done: dict[str, dict[str, Any]], result: dict[str, Any], per_call: float) -> str:
    """A peer's wall-clock over plait's: its fastest run of as many calls, and per call."""
    wall, calls = result["wall"], result["calls"]
    plait_wall = _fastest_plait(done, calls)
    raw = f"{wall / plait_wall:6.2f} ×" if plait_wall else "     - "
    return f"   {raw}  {wall / calls / per_call:6.2f} ×"


def show(results: dict[str, dict[str, Any] | str], limit: int) -> None:
    done = {name: r for name, r in results.items() if isinstance(r, dict) and r["calls"]}
    mine = [r["wall"] / r["calls"] for name, r in done.items() if name.startswith("plait")]
    per_call = min(mine, default=None)
    print(
        f"\n{'method':<24} {'wall s':>7} {'calls':>6} {'calls/s':>8} {'peak':>5} {'val':>5}"
        "   peer ÷ plait: wall (plait's fastest run of ≥ 0.9 × its calls), seconds per call"
    )
    for name, result in results.items():
        if not isinstance(result, dict):
            print(f"{name:<24} {result}")
            continue
        wall, calls = result["wall"], result["calls"]
        rate = calls / wall if wall else 0.0
        peer = not name.startswith("plait") and name in done
        ratios = _ratios(done, result, per_call) if peer and per_call else ""
        print(
            f"{name:<24} {wall:7.2f} {calls:6d} {rate:8.1f} {result['peak']:5d} "
            f"{result['score']:5.2f}{ratios}"
        )
    peers = [r["wall"] / r["calls"] for name, r in done.items() if not name.startswith("plait")]
    if per_call and peers:
        factor = min(peers) / per_call
        peak = max(r["peak"] for r in done.values())
        verdict = "met" if factor >= 3 and peak <= limit else "not met"
        print(
            f"\nat the same call budget (seconds per call) plait's best is {factor:.2f} × faster "
            f"than the fastest peer; highest peak {peak} (limit {limit}); "
            f"goal (≥ 3 ×, peak ≤ limit) {verdict}"
        )


def _let_server_import_this_file() -> None:
    """Puts this file's folder on the path the server process imports `respond` from."""
    here = str(Path(__file__).resolve().parent)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, old) if p)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=240, help="model calls per method")
    parser.add_argument("--train", type=int, default=20)
    parser.add_argument("--val", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.1, help="seconds per reply")
    parser.add_argument("--limit", type=int, default=64, help="calls in flight per client")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per method")
    parser.add_argument("--only", default=",".join(METHODS), help="comma-separated methods")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        run_one(args.one, args)
        return
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    print(
        f"parity task, {args.train} train / {args.val} validation examples; budget "
        f"{args.budget} calls; {args.latency * 1000:.0f} ms per reply; {args.limit} in flight"
    )
    from plait.testing import start_server_process

    _let_server_import_this_file()
    results: dict[str, dict[str, Any] | str] = {}
    with start_server_process(latency=args.latency, responder="learning_speed_bench:respond") as (
        _,
        base_url,
    ):
        for name in chosen:
            results[name] = measure(name, args, base_url)
            print(f"  {name}: {results[name]}", flush=True)
    show(results, args.limit)


if __name__ == "__main__":
    main()
