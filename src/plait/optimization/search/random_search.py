"""RandomSearch: random demo sets and instruction candidates, every candidate concurrently."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from plait._together import together
from plait.module import Module
from plait.optimization.costs import Phase, Proposal, Range, Variant, measure_variant
from plait.optimization.evaluation import Metric
from plait.optimization.search.base import Candidate, ProgramSearch
from plait.optimization.search.demos import (
    Demo,
    Example,
    _bootstrap_runs,
    _describe,
    _instructed_steps,
    _labeled_pool,
    _pick,
    _read_pool,
    _remembered_pool,
    _require_steps,
    _with_demos,
    demo_modules,
)
from plait.optimization.search.instructions import propose_instruction
from plait.optimization.training.updates import as_text
from plait.parameter import Parameter
from plait.resources.usage import metered

__all__ = ["RandomSearch"]


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
        plans: list[tuple[float, float, dict[str, float]]] = []
        if self.max_demos:
            plans += [(float(min(self.max_demos, len(train))), 0.0, {})] * 2
        random_chars, random_mix = 0.0, defaultdict[str, float](float)
        for index, (_, module) in enumerate(_instructed_steps(program)):
            current = str(module._parameters["instructions"].value)
            pool = self._planned_instructions(current, drawn if index == 0 else None, drawn)
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

    def _planned_instructions(
        self, current: str, first: _Drawn | None, drawn: _Drawn | None
    ) -> list[tuple[float, dict[str, float]]]:
        """Returns one step's pool of instructions as `_candidate_mix` plans it: each as the
        characters it adds beyond ``current`` and its share of runs under a measured drawn
        proposal. The given ones, then (for the first step, ``first``) the drawn ones as
        they are, then those not drawn at the share the drawn ones were usable, each like
        the drawn ones."""
        measured = drawn.runs if drawn is not None else {}
        accepted = [text for text in (drawn.texts if drawn else []) if text is not None]
        usable = drawn.proposal.usable if drawn and drawn.proposal else 1.0
        given = [text for text in self.instructions if text != current]
        pool: list[tuple[float, dict[str, float]]] = [
            (float(len(text) - len(current)), {}) for text in given
        ]
        texts = first.texts if first is not None else []
        seen = {current, *given}
        for text in texts:
            if text is not None and text not in seen:
                seen.add(text)
                known = text in measured
                chars = 0.0 if known else float(len(text) - len(current))
                pool.append((chars, {text: 1.0} if known else {}))
        like = [text for text in accepted if first is not None and text in measured]
        undrawn = _undrawn(accepted, like, current)
        return pool + [undrawn] * round((self.propose - len(texts)) * usable)

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


def _undrawn(accepted: list[str], like: list[str], current: str) -> tuple[float, dict[str, float]]:
    """Returns the plan of a proposal the estimate did not draw: runs like the drawn ones
    measured (``like``), else as long as the drawn ones on average, else as ``current``."""
    if like:
        return (0.0, {text: 1 / len(like) for text in like})
    if accepted:
        return (sum(len(t) for t in accepted) / len(accepted) - len(current), {})
    return (0.0, {})
