"""Few-shot demos: what LabeledFewShot, BootstrapFewShot and RandomSearch share.

    report = await BootstrapFewShot(exact_match, max_demos=4).compile(
        program, trainset=train, valset=val, resources=config
    )

These optimizers fill the ``demos`` parameters of a program's `Predict`
steps (any module with a ``signature`` and a learnable ``demos``
parameter) and, for `RandomSearch`, choose among instruction candidates.
They are `ProgramSearch` optimizers: candidates are deep copies evaluated
concurrently on the validation set, and the program is changed only if a
candidate is at least as good as the program was (see
`plait.optimization.search`).

Demo sets are **balanced across labels**: demos are drawn round-robin from
the examples of each target value, so a set of four demos for a True/False
task holds two of each instead of following the majority class. (Four
demos drawn as they come from a skewed set can all say "True"; a program
shown only those answers "True" to everything and scores at chance.)

Where demos come from:

* labeled (`LabeledFewShot`): the training examples themselves, mapped onto
  the step's fields (an input string fills the only input field, a mapping
  fills fields by name; the target likewise fills the output field(s));
* bootstrapped (`BootstrapFewShot`): the program is run on the training
  examples, and for each example the metric accepts, every step's own call
  (its inputs and parsed outputs, from its traces) becomes a demo for that
  step, so a multi-step program gets demos for its inner steps too.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plait._jsondata import as_json_data
from plait.module import Module
from plait.optimization.evaluation import Metric, evaluate
from plait.optimization.events import learning_step
from plait.optimization.search.base import ProgramSearch
from plait.optimization.search.report import _label
from plait.parameter import Parameter
from plait.resources.usage import metered

__all__ = [
    "balanced_sample",
    "demo_modules",
]

Example = tuple[Any, Any]
Demo = dict[str, Any]


def demo_modules(program: Module) -> list[tuple[str, Module]]:
    """Returns the steps whose demos an optimizer may set: ``(path, module)``, in tree order.

    A step is a module with a ``signature`` and a learnable ``demos``
    parameter (`Predict`, `ChainOfThought` …).
    """
    found = []
    for path, module in program.named_modules():
        demos = module._parameters.get("demos")
        has_signature = getattr(module, "signature", None) is not None
        if has_signature and demos is not None and demos.requires_grad:
            found.append((path, module))
    return found


def balanced_sample(
    items: Sequence[Any],
    label: Callable[[Any], str],
    k: int,
    rng: random.Random,
    fallback: Sequence[Any] = (),
) -> list[Any]:
    """Returns up to ``k`` items drawn round-robin across labels, in a shuffled order.

    Each label's items are shuffled, the labels are visited in a shuffled
    order, and one item is taken from each label in turn: with two labels and
    ``k`` = 4, two of each (when each label has two). ``fallback`` items are
    used for a label only after its own ``items`` ran out, and bring in
    labels ``items`` lack: bootstrapped demos first, labeled ones to balance.
    """
    groups: dict[str, list[Any]] = defaultdict(list)
    for tier in (items, fallback):
        shuffled = list(tier)
        rng.shuffle(shuffled)
        for item in shuffled:
            groups[label(item)].append(item)
    order = sorted(groups)
    rng.shuffle(order)
    picked: list[Any] = []
    while len(picked) < k and any(groups.values()):
        for key in order:
            if groups[key] and len(picked) < k:
                picked.append(groups[key].pop(0))
    rng.shuffle(picked)
    return picked


def labeled_demo(module: Module, example: Example) -> Demo | None:
    """Returns ``example`` as a demo of ``module``'s signature, or None when it does not fit."""
    signature = module.signature  # type: ignore[attr-defined]
    inputs = _fields(signature.input_fields, example[0])
    outputs = _fields(signature.output_fields, example[1])
    if inputs is None or outputs is None:
        return None
    return _jsonable({**inputs, **outputs})


def _fields(fields: Mapping[str, Any], value: Any) -> dict[str, Any] | None:
    if isinstance(value, Mapping):
        if all(name in value for name in fields):
            return {name: value[name] for name in fields}
        return None
    if len(fields) == 1:
        return {next(iter(fields)): value}
    return None


def _jsonable(value: Any) -> Any:
    return as_json_data(value)


def _demo_key(demo: Demo, module: Module) -> str:
    inputs = {k: demo.get(k) for k in module.signature.input_fields}  # type: ignore[attr-defined]
    return json.dumps(inputs, sort_keys=True, default=str)


def _labeled_pool(program: Module, train: list[Example]) -> dict[str, list[tuple[str, Demo]]]:
    """Returns, per demo step, the training examples that fit it, each with its label."""
    pool: dict[str, list[tuple[str, Demo]]] = {}
    for path, module in demo_modules(program):
        fitting = [(ex, labeled_demo(module, ex)) for ex in train]
        pool[path] = [(_label(ex[1]), demo) for ex, demo in fitting if demo is not None]
    return pool


async def bootstrap_pool(
    program: Module,
    train: list[Example],
    metric: Metric | None,
    resources: Any,
    *,
    threshold: float = 1.0,
    max_concurrent: int | None = None,
) -> tuple[dict[str, list[tuple[str, Demo]]], float]:
    """Runs ``program`` on ``train`` and returns each step's demos from the accepted examples.

    Returns:
        Per demo step (by path): ``(label, demo)`` pairs, one per training
        example whose score reached ``threshold`` (the step's last successful
        call for that example), and the program's mean score on ``train``.
    """
    everything = list(range(len(train)))
    demos, _, score = await _bootstrap_demos(
        program, train, everything, metric, resources, threshold, max_concurrent
    )
    return _labeled(demos, train), score


async def _bootstrap_demos(
    program: Module,
    train: list[Example],
    indices: list[int],
    metric: Metric | None,
    resources: Any,
    threshold: float,
    max_concurrent: int | None,
) -> tuple[dict[str, list[list[Any]]], list[int], float]:
    """Runs ``program`` on the training examples at ``indices``.

    Returns:
        Per demo step, ``[index, demo]`` for each accepted example, by index;
        the indices a budget left undone; the mean score of the run.
    """
    teacher = program.copy()  # its own traces, so the caller's records stay as they were
    told = {"parameter": "demos", "method": "bootstrap", "examples": len(indices)}
    with learning_step("proposal", program, told) as step:
        result = await evaluate(
            teacher,
            [train[i] for i in indices],
            metric,
            resources=resources,
            max_concurrent=max_concurrent,
            progress=False,
        )
        accepted = {row.index for row in result.rows if (row.score or 0.0) >= threshold}
        step.outputs = {
            "accepted": bool(accepted),
            "score": float(result),
            "good_runs": len(accepted),
        }
    modules = dict(teacher.named_modules())
    demos: dict[str, list[list[Any]]] = {}
    for path, _ in demo_modules(program):
        latest: dict[int, Demo] = {}
        for record in modules[path].__dict__.get("_traces", ()):
            if (
                record.index in accepted
                and record.error is None
                and isinstance(record.output, dict)
            ):
                latest[record.index] = _jsonable({**record.inputs, **record.output})
        demos[path] = [[indices[i], demo] for i, demo in sorted(latest.items())]
    undone = [indices[row.index] for row in result.rows if row.refused]
    return demos, undone, float(result)


def _labeled(demos: Mapping[str, list[list[Any]]], train: list[Example]) -> dict[str, Any]:
    """Returns ``[index, demo]`` pairs as ``(label, demo)``, labelled by their example's target."""
    return {
        path: [(_label(train[i][1]), demo) for i, demo in items] for path, items in demos.items()
    }


async def _remembered_pool(
    search: ProgramSearch, program: Module, train: list[Example], resources: Any, threshold: float
) -> dict[str, list[tuple[str, Demo]]]:
    """Returns `bootstrap_pool`'s demos, from the search's checkpoint as far as it holds them.

    The checkpoint keeps the demos of the examples run so far and those a
    budget left undone; a rerun runs only those.
    """
    held = search._held_step("bootstrap")
    demos = held["value"]["demos"] if held else {}
    undone = held["value"]["undone"] if held else list(range(len(train)))
    spent = held["calls"] if held else 0
    steps = {path for path, _ in demo_modules(program)}
    for path, items in demos.items():
        where = f"state.steps.bootstrap.value.demos.{path}"
        if path not in steps:
            search._saved.reader().fail(where, "is not a step of the program with demos")
        if any(i >= len(train) for i, _ in items):
            search._saved.reader().fail(where, "names an example the trainset does not have")
    if undone:
        search._before_calls()
        with metered() as meter:
            found, undone, _ = await _bootstrap_demos(
                program, train, undone, search.metric, resources, threshold, search.max_concurrent
            )
        for path, items in found.items():
            demos[path] = sorted([*demos.get(path, []), *items], key=lambda item: item[0])
        search._saved.add_step("bootstrap", {"demos": demos, "undone": undone}, spent + meter.calls)
    return _labeled(demos, train)


def _instructed_steps(program: Module) -> list[tuple[str, Module]]:
    """Returns the steps whose instructions are a learnable `Parameter`, by path."""
    return [
        (path, module)
        for path, module in demo_modules(program)
        if isinstance(module._parameters.get("instructions"), Parameter)
    ]


def _bootstrap_runs(search: ProgramSearch, train: list[Example]) -> int:
    """Runs the bootstrap pass makes: the examples the search's checkpoint has not run."""
    held = search._saved.saved_steps.get("bootstrap")
    return len(held["value"]["undone"]) if held else len(train)


def _read_pool(value: Any, read: Any, where: str) -> None:
    """Checks a bootstrap pass as a checkpoint holds it: per step ``[index, demo]`` pairs,
    and the indices left undone."""
    value = read.mapping(value, where)
    for path, items in read.mapping(read.field(value, "demos", where), f"{where}.demos").items():
        for i, item in enumerate(read.sequence(items, f"{where}.demos.{path}")):
            at = f"{where}.demos.{path}[{i}]"
            if not (isinstance(item, list) and len(item) == 2):
                read.fail(at, "is not an [index, demo] pair")
            read.integer(item[0], f"{at}[0]")
            read.mapping(item[1], f"{at}[1]")
    read.positions(read.field(value, "undone", where), f"{where}.undone")


def _with_demos(
    program: Module, chosen: Mapping[str, list[Demo]], instructions: Mapping[str, str] | None = None
) -> Module:
    candidate = program.copy()
    modules = dict(candidate.named_modules())
    for path, demos in chosen.items():
        modules[path]._parameters["demos"].value = list(demos)
    for path, text in (instructions or {}).items():
        modules[path]._parameters["instructions"].value = text
    return candidate


def _pick(
    pool: Mapping[str, list[tuple[str, Demo]]],
    program: Module,
    k: int,
    rng: random.Random,
    fallback: Mapping[str, list[tuple[str, Demo]]] | None = None,
) -> dict[str, list[Demo]]:
    """Returns a balanced demo set of up to ``k`` per step, without repeated inputs.

    ``fallback`` demos (per step) fill labels that ``pool`` has too few of.
    """
    modules = dict(program.named_modules())
    chosen: dict[str, list[Demo]] = {}
    for path, items in pool.items():
        module = modules[path]
        first = {_demo_key(d, module): (lab, d) for lab, d in items}
        extra = {
            key: item
            for key, item in (
                (_demo_key(d, module), (lab, d)) for lab, d in (fallback or {}).get(path, [])
            )
            if key not in first
        }
        picked = balanced_sample(
            list(first.values()), lambda item: item[0], k, rng, list(extra.values())
        )
        chosen[path] = [d for _, d in picked]
    return chosen


def _describe(chosen: Mapping[str, list[Demo]]) -> dict[str, Any]:
    return {f"{path or 'program'}.demos": len(demos) for path, demos in chosen.items()}


def _require_steps(program: Module, owner: str) -> None:
    if not demo_modules(program):
        raise ValueError(
            f"{owner}: {type(program).__name__} has no step with learnable demos (a Predict or "
            "another module with a signature and a demos parameter)"
        )


# ------------------------------------------------------------ the searches


def _is_demos(program: Module, name: str) -> bool:
    path, _, attribute = name.rpartition(".")
    return attribute == "demos" and path in dict(demo_modules(program))
