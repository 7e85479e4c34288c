# size: three searches in one file; issue 35 gives each search a file of its own.
"""Few-shot demos and instructions: LabeledFewShot, BootstrapFewShot, RandomSearch.

    report = await BootstrapFewShot(exact_match, max_demos=4).compile(
        program, trainset=train, valset=val, resources=config
    )

These optimizers fill the ``demos`` parameters of a program's `Predict`
steps (any module with a ``signature`` and a learnable ``demos``
parameter) and, for `RandomSearch`, choose among instruction candidates.
They are `ProgramSearch` optimizers: candidates are deep copies evaluated
concurrently on the validation set, and the program is changed only if a
candidate is at least as good as the program was (see
`plait.optimization.search.base`).

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
from dataclasses import dataclass
from functools import partial
from typing import Any

from pydantic import BaseModel, Field

from plait._together import together
from plait.backends.types import Message, Request, Response, SamplingOptions
from plait.errors import BudgetExceededError, StructuredOutputError
from plait.execution.structured import ask_structured, output_type_for
from plait.module import Module
from plait.optimization.costs import Phase, Proposal, Range, Variant
from plait.optimization.evaluation import Metric, evaluate
from plait.optimization.events import learning_step
from plait.optimization.search.base import Candidate, ProgramSearch, _label
from plait.optimization.training.updates import as_text, check_update
from plait.parameter import Parameter
from plait.resources.usage import active_budgets

__all__ = [
    "BootstrapFewShot",
    "LabeledFewShot",
    "RandomSearch",
    "balanced_sample",
    "demo_modules",
]

Example = tuple[Any, Any]
Demo = dict[str, Any]


# ----------------------------------------------------------------- helpers
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
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value, fallback=str)


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
    from plait.resources.usage import metered

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
class LabeledFewShot(ProgramSearch):
    """Uses ``k`` training examples, balanced across labels, as every step's demos.

    A step gets demos only from examples that fit its fields (see the module
    docs); a program whose steps no example fits is an error.

    Args:
        metric, balance, max_concurrent: as `ProgramSearch`.
        k: demos per step, also as a keyword alone (``LabeledFewShot(k=16)``;
            the older order ``LabeledFewShot(k, metric)`` works too).
        seed: the sampling seed.
    """

    _checkpointed = ("k", "seed")

    def __init__(
        self, metric: Metric | None = None, k: int = 4, *, seed: int = 0, **options: Any
    ) -> None:
        if isinstance(metric, int) and not isinstance(metric, bool):  # LabeledFewShot(k, metric)
            metric, k = (k if callable(k) else None), metric
        super().__init__(metric, **options)
        if k < 1:
            raise ValueError(f"LabeledFewShot needs k >= 1, got {k}")
        self.k = k
        self.seed = seed

    async def _schedule(
        self, program: Module, train: list[Example], val: list[Example], proposal: Any = None
    ) -> list[Any]:
        n = await self._candidate_runs(program, train, len(val), 1)
        return [
            Phase(f"1 candidate with {self.k} labeled demos", runs=Range(n, n, n), demos=self.k)
        ]

    async def _candidates(
        self, program: Module, train: list[Example], resources: Any
    ) -> list[Candidate]:
        _require_steps(program, type(self).__name__)
        pool = {path: items for path, items in _labeled_pool(program, train).items() if items}
        if not pool:
            raise ValueError(
                f"LabeledFewShot: no training example fits the fields of any step of "
                f"{type(program).__name__}; give examples whose input and target are the step's "
                "field values (a mapping by field name), or use BootstrapFewShot"
            )
        chosen = _pick(pool, program, self.k, random.Random(self.seed))
        return [Candidate(_with_demos(program, chosen), _describe(chosen), "labeled demos")]


class BootstrapFewShot(ProgramSearch):
    """Demos from the program's own successful runs on the training set, balanced across labels.

    The program runs on every training example (concurrently); each step's
    call on an example the metric accepts becomes a demo for that step. Where
    the good runs lack a label (a model that always answers "True" has good
    runs only on True examples) or are too few, labeled examples that fit the
    step's fields fill in (``fill_labeled``), so the set stays balanced.

    Args:
        metric: decides which runs are good; default exact match.
        max_demos: demos per step.
        threshold: the score a run needs to count as good.
        fill_labeled: fill a short demo set with labeled examples.
        seed: the sampling seed.
        balance, max_concurrent, checkpoint: as `ProgramSearch` (the checkpoint
            also keeps the bootstrap pass).
    """

    _checkpointed = ("max_demos", "threshold", "fill_labeled", "seed")

    def __init__(
        self,
        metric: Metric | None = None,
        *,
        max_demos: int = 4,
        threshold: float = 1.0,
        fill_labeled: bool = True,
        seed: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(metric, **options)
        if max_demos < 1:
            raise ValueError(f"BootstrapFewShot needs max_demos >= 1, got {max_demos}")
        self.max_demos = max_demos
        self.threshold = threshold
        self.fill_labeled = fill_labeled
        self.seed = seed

    async def _schedule(
        self, program: Module, train: list[Example], val: list[Example], proposal: Any = None
    ) -> list[Any]:
        m = _bootstrap_runs(self, train)
        n = await self._candidate_runs(program, train, len(val), 1)
        return [
            Phase(f"bootstrap: the program on {m} training examples", runs=Range(m, m, m)),
            Phase(
                f"1 candidate with up to {self.max_demos} demos",
                runs=Range(n, n, n),
                demos=self.max_demos,
            ),
        ]

    async def _candidates(
        self, program: Module, train: list[Example], resources: Any
    ) -> list[Candidate]:
        _require_steps(program, type(self).__name__)
        if not train:
            raise ValueError("BootstrapFewShot needs a non-empty train_set")
        pool = await _remembered_pool(self, program, train, resources, self.threshold)
        rng = random.Random(self.seed)
        labeled = _labeled_pool(program, train) if self.fill_labeled else None
        chosen = _pick(pool, program, self.max_demos, rng, fallback=labeled)
        note = f"bootstrapped from {sum(len(v) for v in pool.values())} good runs"
        return [Candidate(_with_demos(program, chosen), _describe(chosen), note)]

    def _read_state(self, state: dict[str, Any], read: Any) -> None:
        for key, step in state.get("steps", {}).items():
            if key != "bootstrap":
                read.fail(f"state.steps.{key}", "is not a step of BootstrapFewShot")
            _read_pool(step["value"], read, f"state.steps.{key}.value")


class InstructionProposal(BaseModel):
    """What an instruction-proposal call returns."""

    rationale: str = Field(max_length=300)
    instruction: str = Field(max_length=600)


_DRAWN = 3
"""The run's own instruction proposals a RandomSearch estimate asks for (the first step's
first ones); the rest are expected to be like them."""


@dataclass
class _Drawn:
    """What a RandomSearch estimate drew of the run's own proposals (`_sampled_proposal`)."""

    proposal: Proposal | None
    """What one proposal spends, from those asked for (None: all read from the checkpoint)."""
    texts: list[str | None]
    """The first step's first proposals in the run's order (None: refused at every ask)."""
    runs: dict[str, Variant]
    """Per instruction given: the size of the program's runs under it, on the estimate's
    sample (none when no call reached a model)."""


class RandomSearch(ProgramSearch):
    """Random search over demo sets and instruction candidates, every candidate concurrently.

    Candidates combine a demo set (bootstrapped from good runs with labeled
    examples filling in missing labels, or labeled only; balanced across
    labels; 1 to ``max_demos`` per step) with an
    instruction for each step (its current one, one of ``instructions``, or
    one proposed by the optimizer model). The first candidates are the
    plain ones (bootstrapped demos; labeled demos; each instruction alone),
    then random combinations up to ``num_candidates``.

    Args:
        metric: as `ProgramSearch`.
        num_candidates: candidates besides the program as it was.
        max_demos: most demos per step.
        instructions: instruction texts to try (for every step).
        propose: instructions to ask the optimizer model for, per step.
        alias: the resource alias of the proposal calls.
        seed: the sampling seed.
        balance, max_concurrent, checkpoint: as `ProgramSearch` (the checkpoint
            also keeps the bootstrap pass and the proposed instructions).
    """

    _checkpointed = ("num_candidates", "max_demos", "instructions", "propose", "alias", "seed")

    def __init__(
        self,
        metric: Metric | None = None,
        *,
        num_candidates: int = 8,
        max_demos: int = 4,
        instructions: Sequence[str] = (),
        propose: int = 0,
        alias: str = "optimizer",
        seed: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(metric, **options)
        if num_candidates < 1 or max_demos < 0 or propose < 0:
            raise ValueError(
                "RandomSearch needs num_candidates >= 1, max_demos >= 0 and propose >= 0; got "
                f"{num_candidates}, {max_demos}, {propose}"
            )
        self.num_candidates = num_candidates
        self.max_demos = max_demos
        self.instructions = [str(text) for text in instructions]
        self.propose = propose
        self.alias = alias
        self.seed = seed
        self.proposals: dict[str, list[str]] = {}
        """Instructions the model proposed in the last search, per step (kept or not)."""

    def _own_calls(self, program: Module) -> list[tuple[str, str]]:
        return [("instruction proposals", self.alias)] if self._asks_left(program) else []

    async def _schedule(
        self, program: Module, train: list[Example], val: list[Example], proposal: Any = None
    ) -> list[Any]:
        drawn: _Drawn | None = proposal
        phases = []
        if train and self.max_demos:
            m = _bootstrap_runs(self, train)
            phases.append(
                Phase(f"bootstrap: the program on {m} training examples", runs=Range(m, m, m))
            )
        asks = self._asks_left(program)
        if asks and drawn is not None and drawn.proposal is not None:
            phases.append(
                Phase(
                    f"{asks} instruction proposals",
                    other=Range(asks, asks, asks),
                    other_alias=self.alias,
                    proposal=drawn.proposal,
                )
            )
        elif asks:  # each may be asked again once when its reply is refused
            shown = sum(len(as_text(x)[:300]) + len(as_text(t)[:100]) for x, t in train[:4])
            phases.append(
                Phase(
                    f"{asks} instruction proposals",
                    other=Range(asks, asks, 2 * asks),
                    other_chars=(800 + shown, 600),
                    other_alias=self.alias,
                )
            )
        runs = await self._candidate_runs(program, train, len(val), self.num_candidates)
        demos, added, shares = self._candidate_mix(program, train, drawn)
        measured = drawn.runs if drawn is not None else {}
        phases.append(
            Phase(
                f"{self.num_candidates} candidates",
                runs=Range(runs, runs, runs),
                demos=demos,
                added_chars=added,
                variants=[(share, measured[text]) for text, share in shares.items()],
            )
        )
        return phases

    def _asks_left(self, program: Module) -> int:
        """Returns the instruction proposals `compile` asks for: ``propose`` per step with
        learnable instructions, less those the checkpoint holds."""
        held = sum(key.startswith("instructions ") for key in self._saved.saved_steps)
        return max(self.propose * len(_instructed_steps(program)) - held, 0)

    async def _sampled_proposal(
        self,
        program: Module,
        train: list[Example],
        val: list[Example],
        resources: Any,
        sample: int,
    ) -> Any:
        """The run's own first instruction proposals for the first step with learnable
        instructions, and the program's runs under each instruction they gave.

        The search's schedule follows its seed, so the estimate asks with the seeds
        `compile` will ask with (those the checkpoint holds are read from it), the
        first `_DRAWN` of them: on a model that honours a request's seed (the
        embedded one), these are the run's own proposals, and the instructions its
        candidates will carry; on an API that samples anyway, proposals from the same
        distribution. Their calls size every proposal (`costs.Proposal`), and the
        program runs the estimate's ``sample`` validation examples once under each
        instruction given (`costs.measure_variant`): the tokens of the candidates that
        carry it are measured, not guessed from its length (SmolLM2's proposal of 421
        characters is 169 tokens; another may make the task's replies longer or be
        asked again). Returns a `_Drawn`; None when the run has no proposal left to ask
        for.
        """

        from plait.optimization.costs import Proposal, measure_variant
        from plait.resources.usage import metered

        steps = _instructed_steps(program)
        if not steps or not self._asks_left(program):
            return None
        path, module = steps[0]
        rng = random.Random(self.seed)  # as `_candidates`: the first step's are its first draws
        seeds = [rng.randrange(2**31) for _ in range(self.propose)]
        got: dict[int, str | None] = {}
        asked: list[int] = []
        for seed in seeds:
            held = self._saved.saved_steps.get(f"instructions {path} {seed}")
            if held is not None:
                got[seed] = held["value"]
            elif len(asked) < _DRAWN:
                asked.append(seed)
            else:
                break
        with metered() as meter:
            texts = await together(
                *(propose_instruction(module, train, resources, self.alias, seed=s) for s in asked)
            )
        got.update(zip(asked, texts, strict=True))
        drawn = [got[seed] for seed in seeds if seed in got]
        given = [text for text in dict.fromkeys(drawn) if text is not None]
        sizes = await together(
            *(
                measure_variant(_with_demos(program, {}, {path: text}), val, resources, sample)
                for text in given
            )
        )
        return _Drawn(
            proposal=Proposal.of(meter, len(asked), least=1, most=2),
            texts=drawn,
            runs={text: size for text, size in zip(given, sizes, strict=True) if size is not None},
        )

    def _candidate_mix(
        self, program: Module, train: list[Example], drawn: _Drawn | None
    ) -> tuple[float, float, dict[str, float]]:
        """Returns, averaged over the candidates `_candidates` plans, the demos per step, the
        characters of instructions beyond the program's own in each run's prompts, and
        the share of runs under each drawn proposal measured on the sample (by its
        text; those runs' prompts are measured with it, so their characters are left
        out).

        The plans: two with ``max_demos`` demos, one per instruction of a step's pool
        alone, then random ones (1 to ``max_demos`` demos, an instruction of the pool
        each, the current one included). The pool holds the given instructions and the
        proposals: the drawn ones as they are (a repeated one once, as `compile` keeps
        it), those not drawn at the share the drawn ones were usable, each like the
        drawn ones in its runs (as long as their mean when unmeasured; as the current
        one without any)."""
        measured = drawn.runs if drawn is not None else {}
        plans: list[tuple[float, float, dict[str, float]]] = []
        if self.max_demos:
            plans += [(float(min(self.max_demos, len(train))), 0.0, {})] * 2
        accepted = [text for text in (drawn.texts if drawn else []) if text is not None]
        usable = drawn.proposal.usable if drawn and drawn.proposal else 1.0
        random_chars, random_mix = 0.0, defaultdict[str, float](float)
        for index, (_, module) in enumerate(_instructed_steps(program)):
            current = str(module._parameters["instructions"].value)
            given = [text for text in self.instructions if text != current]
            pool: list[tuple[float, dict[str, float]]] = [
                (float(len(text) - len(current)), {}) for text in given
            ]
            texts = drawn.texts if drawn is not None and index == 0 else []
            seen = {current, *given}
            for text in texts:
                if text is not None and text not in seen:
                    seen.add(text)
                    known = text in measured
                    chars = 0.0 if known else float(len(text) - len(current))
                    pool.append((chars, {text: 1.0} if known else {}))
            like = [text for text in accepted if index == 0 and text in measured]
            undrawn: tuple[float, dict[str, float]] = (0.0, {})
            if like:
                undrawn = (0.0, {text: 1 / len(like) for text in like})
            elif accepted:
                undrawn = (sum(len(t) for t in accepted) / len(accepted) - len(current), {})
            pool += [undrawn] * round((self.propose - len(texts)) * usable)
            plans += [(0.0, chars, mix) for chars, mix in pool]
            for chars, mix in pool:  # the current one is drawn too
                random_chars += chars / (len(pool) + 1)
                for text, weight in mix.items():
                    random_mix[text] += weight / (len(pool) + 1)
        random_demos = (1 + self.max_demos) / 2 if self.max_demos else 0.0
        plans += [(random_demos, random_chars, dict(random_mix))] * max(
            self.num_candidates - len(plans), 0
        )
        plans = plans[: self.num_candidates]
        shares: dict[str, float] = defaultdict(float)
        for _, _, mix in plans:
            for text, weight in mix.items():
                shares[text] += weight / len(plans)
        return (
            sum(d for d, _, _ in plans) / len(plans),
            sum(c for _, c, _ in plans) / len(plans),
            dict(shares),
        )

    async def _candidates(
        self, program: Module, train: list[Example], resources: Any
    ) -> list[Candidate]:
        _require_steps(program, type(self).__name__)
        rng = random.Random(self.seed)
        steps = dict(demo_modules(program))
        booted: dict[str, list[tuple[str, Demo]]] = {path: [] for path in steps}
        if train and self.max_demos:
            booted = await _remembered_pool(self, program, train, resources, 1.0)
        labeled = _labeled_pool(program, train)
        texts = await self._instruction_pool(program, steps, train, resources, rng)
        plans: list[tuple[str, dict[str, list[Demo]], dict[str, str]]] = []
        if self.max_demos:
            chosen = _pick(booted, program, self.max_demos, rng, fallback=labeled)
            plans.append(("bootstrapped demos", chosen, {}))
            plans.append(("labeled demos", _pick(labeled, program, self.max_demos, rng), {}))
        for path, pool in texts.items():
            for text in pool[1:]:
                plans.append(("instructions", {}, {path: text}))
        while len(plans) < self.num_candidates:
            k = rng.randint(1, self.max_demos) if self.max_demos else 0
            source = rng.choice(["bootstrapped", "labeled"])
            if source == "bootstrapped":
                chosen = _pick(booted, program, k, rng, fallback=labeled)
            else:
                chosen = _pick(labeled, program, k, rng)
            instructions = {path: rng.choice(pool) for path, pool in texts.items()}
            plans.append((f"random: {k} {source} demos", chosen, instructions))
        candidates = []
        for note, chosen, instructions in plans[: self.num_candidates]:
            params: dict[str, Any] = _describe(chosen)
            for path, text in instructions.items():
                if text != steps[path]._parameters["instructions"].value:
                    params[f"{path or 'program'}.instructions"] = text
            candidate = _with_demos(program, chosen, instructions)
            candidates.append(Candidate(candidate, params, note))
        return candidates

    async def _instruction_pool(
        self,
        program: Module,
        steps: Mapping[str, Module],
        train: list[Example],
        resources: Any,
        rng: random.Random,
    ) -> dict[str, list[str]]:
        """Returns per step: its current instructions, then the given and proposed ones."""

        pools: dict[str, list[str]] = {}
        self.proposals = {}
        for path, module in steps.items():
            learnable = module._parameters.get("instructions")
            if not isinstance(learnable, Parameter):
                continue  # a step without learnable instructions keeps what it has
            current = str(learnable.value)
            pool = [current, *(t for t in self.instructions if t != current)]
            if self.propose:
                seeds = [rng.randrange(2**31) for _ in range(self.propose)]
                proposed = await together(
                    *(
                        self._remembered(
                            f"instructions {path} {seed}",
                            partial(
                                propose_instruction, module, train, resources, self.alias, seed=seed
                            ),
                        )
                        for seed in seeds
                    )
                )
                self.proposals[path] = [p for p in proposed if p is not None]
                pool += [p for p in self.proposals[path] if p not in pool]
            pools[path] = pool
        return pools

    def _read_state(self, state: dict[str, Any], read: Any) -> None:
        for key, step in state.get("steps", {}).items():
            where = f"state.steps.{key}.value"
            if key == "bootstrap":
                _read_pool(step["value"], read, where)
            elif key.startswith("instructions "):
                read.text(step["value"], where, optional=True)
            else:
                read.fail(f"state.steps.{key}", "is not a step of RandomSearch")


async def propose_instruction(
    module: Module,
    train: Sequence[Example],
    resources: Any,
    alias: str = "optimizer",
    *,
    seed: int = 0,
    shown: int = 4,
) -> str | None:
    """Asks the optimizer model for new instructions of one step; None when none is usable.

    The model sees the current instructions and a few training examples
    (input and expected output) and answers ``{"rationale", "instruction"}``
    through `ask_structured`. A proposal that is empty, the same, too long,
    or pastes an example is refused (`check_update` at conservatism 0).
    Callbacks hear it as one proposal, the model's call inside it.
    """
    parameter: Parameter = module.instructions  # type: ignore[attr-defined]
    told = {"parameter": parameter.path, "method": "instruction proposal", "alias": alias}
    with learning_step("proposal", module, told) as step:
        proposed = await _proposed_instruction(module, train, resources, alias, seed, shown)
        step.outputs = {"accepted": proposed is not None, "proposed": proposed}
    return proposed


async def _proposed_instruction(
    module: Module, train: Sequence[Example], resources: Any, alias: str, seed: int, shown: int
) -> str | None:
    """The body of `propose_instruction`."""
    from plait.resources import ResourceManager

    manager = ResourceManager.shared(resources)
    current = str(module.instructions.value)  # type: ignore[attr-defined]
    rng = random.Random(seed)
    examples = rng.sample(list(train), min(shown, len(train)))
    lines = "\n".join(
        f"- input: {as_text(x)[:300]!s}\n  expected output: {as_text(t)[:100]!s}"
        for x, t in examples
    )
    prompt = (
        "Write better instructions for one step of an LLM program.\n\n"
        f"Current instructions:\n<<<\n{current}\n>>>\n\n"
        f"Examples of the step's input and the output it should give:\n{lines}\n\n"
        "The instructions must say what to do with any input like these and what to answer. "
        "Do not copy the examples. Reply with JSON: a short rationale, then the instruction."
    )
    output = output_type_for(InstructionProposal)
    request = Request(
        messages=(
            Message("system", "You write instructions for LLM programs."),
            Message("user", prompt),
        ),
        options=SamplingOptions(temperature=0.9, max_tokens=400, seed=seed),
        response_schema=output.schema,
    )
    sources = [f"{as_text(x)} {as_text(t)}" for x, t in examples]

    def parse(response: Response) -> str:
        proposal = output.read(response)
        value, reason = check_update(current, proposal.instruction, 0.0, sources=sources)
        if reason is not None:
            raise StructuredOutputError(reason, raw=response.text, target=output.name)
        return value

    def complete(request: Request, accept: Callable[[Response], bool]) -> Any:
        return manager.complete(alias, request, accept=accept)

    try:
        reply = await ask_structured(
            complete,
            request,
            parse,
            expected=output.expected,
            label=f"RandomSearch (alias {alias!r})",
        )
    except StructuredOutputError:
        return None
    except BudgetExceededError:
        if not any(budget.stopped for budget in active_budgets()):
            raise  # an endpoint's own budget: the configuration's limit, not the search's
        return None  # the search's budget is spent: no proposal, and the search winds down
    return reply.value
