# size: ReflectiveSearch with its proposals and lineage; issue 35 splits the search from its parts.
"""ReflectiveSearch: evolve a program by reflecting on the feedback its runs get.

    search = ReflectiveSearch(exact_match, max_calls=600)
    report = await search.compile(program, train, val, resources=config)

The search keeps a *pool* of candidate programs and, for each, its score on
every validation example. Each round:

1. **Select** parents from the Pareto frontier over validation examples: a
   candidate is on it for an example when no candidate scores higher there;
   dominated candidates are dropped, and parents are drawn with weight equal
   to the number of examples each one leads on. A candidate that is best on a
   few hard examples survives even when its mean is lower.
2. **Mutate by reflection**: run the parent in training mode on a small
   minibatch of training examples, send the loss backward through plait's
   own `backward`, so every parameter collects textual feedback on the calls
   it took part in, and rewrite one component (parameters in turn):
   instructions with a `TextGradOptimizer` step (a structured call; an
   unusable or too drifting proposal is refused, see `check_update`); a
   ``demos`` parameter by swapping in demos from the minibatch's good runs,
   balanced across labels.
3. **Accept** the child only if it beats its parent on that same minibatch;
   it is then evaluated on the whole validation set and joins the pool.
4. Every ``merge_every`` rounds, **merge** two frontier candidates that
   descend from a common ancestor: each parameter is taken from whichever of
   the two changed it (from the better one when both did).

**Pipelined rounds.** A child's validation is the longest part of a round
(the whole validation set, against a minibatch for the rest), and the next
round's reflection does not need its result: so each step runs a round's
proposals (2) *while* the previous round's accepted children (and a merge)
are validated (3), all concurrently under the endpoints' limits. What this
changes against rounds run one after the other: round r + 1's parents are
drawn from the pool without round r's children, which are still being
validated (they can be parents from round r + 2); a merge planned after round
r's children join is validated beside round r + 2's proposals; and the
rounds' spans hold, besides their proposals, the validations of the round
before. For a given seed the result is the same from run to run (parents,
minibatches and merges are drawn between steps, never while calls are in
flight, and children join the pool in the order they were proposed), except
in a last step the hard budget cuts short, where which calls were refused
depends on timing, as it did before.

It stops starting new rounds once the calls spent, plus the validations
already under way, reach ``max_calls`` model calls (the search's own: runs,
backward, rewrites, evaluations), and ``max_calls`` is also its hard budget
(`ProgramSearch`): requests are held against it before they are sent, so the
last step's work stops where the budget ends, and a child whose validation
it left half-done does not join the pool. The pool's best (chosen as in
`ProgramSearch`: never below the start on validation, balanced over labels)
is applied to the program.

With ``checkpoint=``, where the rounds are (the pool, the children awaiting
validation, the random generator's state, the calls spent) is written at
each step boundary that a run with a larger ``max_calls`` passes too; a rerun
with the same file goes on from the last one, and ``max_calls`` counts the
whole search: the calls the checkpoint spent are not spent again.

Why plait's own engine and not the ``gepa`` package (0.1.4, MIT, no
dependencies), whose adapter API (``GEPAAdapter.evaluate`` returning an
``EvaluationBatch``, ``make_reflective_dataset``, ``propose_new_texts``,
``gepa.optimize(seed_candidate, trainset, valset, adapter, max_metric_calls)``)
was evaluated as the engine:

* its engine and adapter are synchronous and evaluate one candidate at a
  time: an adapter would have to block a thread on plait's event loop for
  each evaluation, and the proposals of a round and their evaluations could
  no longer run concurrently under the endpoint limits;
* a candidate is ``dict[str, str]``: plait's structured parameters (demos as
  a typed list) would travel as JSON text and be parsed back;
* its default proposer asks the reflection LM for free text and reads the new
  instruction out of a fenced block, which SmolLM2-135M does not write; plait
  would replace it with its structured, checked updates anyway (a custom
  ``propose_new_texts``), and would rebuild the "reflective dataset" from the
  feedback its own backward already routes to each parameter;
* its budget counts metric calls (examples evaluated), not model calls, so
  the "same call budget" comparison of the learning benchmark would need a
  second meter.

What is left for an engine — Pareto bookkeeping, parent sampling, merge — is
about 150 lines here, in plait's terms.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from plait._together import together
from plait.errors import BudgetExceededError
from plait.feedback import Feedback
from plait.module import Module
from plait.optimization.training.backward import backward
from plait.optimization.costs import Phase, Range
from plait.optimization.evaluation import Metric
from plait.optimization.events import learning_step, rounds_of, tell_decision, tell_update
from plait.optimization.search.demos import (
    Example,
    _demo_key,
    _jsonable,
    balanced_sample,
    demo_modules,
    labeled_demo,
)
from plait.optimization.training.losses import Loss, VerifierLoss
from plait.optimization.training.optimizer import DEFAULT_RETRIES, TextGradOptimizer
from plait.optimization.search.base import Candidate, ProgramSearch, Trial, _label, budget_spent
from plait.optimization.search.checkpoint import trial_key
from plait.optimization.training.step import TrainingStep, on_examples
from plait.values import Value

__all__ = ["ReflectiveSearch"]

logger = logging.getLogger("plait.optimization")


@dataclass
class _Member:
    """A candidate in the pool: its program, its trial, and where it came from."""

    program: Module
    trial: Trial
    parent: int | None = None
    """Pool index of the parent (None for the start)."""
    other_parent: int | None = None
    """The second parent of a merge."""
    changed: set[str] = field(default_factory=set)
    """Parameter names this member changed relative to its parent."""


@dataclass
class _Child:
    """A program proposed (or merged) and waiting for its validation in the next step."""

    program: Module
    params: dict[str, Any]
    note: str
    parent: int
    other_parent: int | None = None
    changed: set[str] = field(default_factory=set)

    def as_json(self) -> dict[str, Any]:
        return {
            "parameters": self.program.state_dict(),
            "params": self.params,
            "note": self.note,
            "parent": self.parent,
            "other_parent": self.other_parent,
            "changed": sorted(self.changed),
        }


@dataclass
class _Rounds:
    """Where a search's rounds are: what its checkpoint keeps between two steps."""

    pool: list[_Member]
    rng: random.Random
    spent: int
    """Calls the search has spent at this step boundary (trial 0's included)."""
    pending: list[_Child] = field(default_factory=list)
    round: int = 0
    turn: int = 0
    """Proposals made so far (which parameter the next one rewrites)."""
    log: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {
            "round": self.round,
            "turn": self.turn,
            "spent": self.spent,
            "rng": [version, list(internal), gauss],
            "log": list(self.log),
            "pool": [
                {
                    "trial": asdict(m.trial),
                    "parent": m.parent,
                    "other_parent": m.other_parent,
                    "changed": sorted(m.changed),
                }
                for m in self.pool
            ],
            "pending": [child.as_json() for child in self.pending],
        }

    @staticmethod
    def check(data: Any, read: Any, where: str) -> None:
        """Checks rounds as a checkpoint holds them (a `search_checkpoint.Reader` complains)."""
        data = read.mapping(data, where)
        for key in ("round", "turn", "spent"):
            read.integer(read.field(data, key, where), f"{where}.{key}")
        rng = read.field(data, "rng", where)
        try:
            random.Random().setstate((rng[0], tuple(rng[1]), rng[2]))
        except (TypeError, ValueError, IndexError, KeyError, OverflowError):
            read.fail(f"{where}.rng", "is not a random generator's state")
        for i, line in enumerate(read.sequence(read.field(data, "log", where), f"{where}.log")):
            read.text(line, f"{where}.log[{i}]")
        pool = read.sequence(read.field(data, "pool", where), f"{where}.pool")
        if not pool:
            read.fail(f"{where}.pool", "is empty: it always holds trial 0")
        for i, member in enumerate(pool):
            at = f"{where}.pool[{i}]"
            read.trial(read.field(read.mapping(member, at), "trial", at), f"{at}.trial")
            _check_lineage(member, read, at, i)
        for i, child in enumerate(
            read.sequence(read.field(data, "pending", where), f"{where}.pending")
        ):
            at = f"{where}.pending[{i}]"
            read.mapping(read.field(read.mapping(child, at), "parameters", at), f"{at}.parameters")
            read.mapping(read.field(child, "params", at), f"{at}.params")
            read.text(read.field(child, "note", at), f"{at}.note")
            _check_lineage(child, read, at, len(pool))

    @staticmethod
    def restore(data: dict[str, Any], program: Module, start: Trial, n: int, path: Any) -> _Rounds:
        """Rebuilds checked rounds on copies of ``program`` (trial 0 is ``start``)."""
        from plait.execution.checkpoint_codec import CheckpointError
        from plait.optimization.search.checkpoint import REMEDY, Reader

        read = Reader(path, n)

        def copy_with(parameters: dict[str, Any], where: str) -> Module:
            copy = program.copy()
            try:
                copy.load_state_dict(parameters)
            except (KeyError, TypeError, ValueError) as exc:
                text = str(exc.args[0] if exc.args else exc).replace("\n", " ")
                raise CheckpointError(
                    f"{path}: {where} cannot be loaded ({text}); {REMEDY}"
                ) from None
            return copy

        pool = []
        for i, member in enumerate(data["pool"]):
            where = f"state.rounds.pool[{i}]"
            trial = start if i == 0 else read.trial(member["trial"], f"{where}.trial")
            copy = program.copy() if i == 0 else copy_with(trial.parameters, where)
            changed = set(member.get("changed") or ())
            pool.append(_Member(copy, trial, member["parent"], member["other_parent"], changed))
        pending = [
            _Child(
                copy_with(child["parameters"], f"state.rounds.pending[{i}].parameters"),
                child["params"],
                child["note"],
                child["parent"],
                child["other_parent"],
                set(child.get("changed") or ()),
            )
            for i, child in enumerate(data["pending"])
        ]
        rng = random.Random()
        version, internal, gauss = data["rng"]
        rng.setstate((version, tuple(internal), gauss))
        return _Rounds(
            pool, rng, data["spent"], pending, data["round"], data["turn"], list(data["log"])
        )


def _check_lineage(member: Any, read: Any, where: str, below: int) -> None:
    """Checks a member's parents: earlier members of the pool (so lineages never loop)."""
    for key in ("parent", "other_parent"):
        parent = read.field(member, key, where)
        if parent is not None and (
            isinstance(parent, bool) or not isinstance(parent, int) or not 0 <= parent < below
        ):
            read.fail(f"{where}.{key}", f"is {parent!r:.40}, not an earlier member of the pool")
    changed = read.sequence(member.get("changed", []), f"{where}.changed")
    for i, name in enumerate(changed):
        read.text(name, f"{where}.changed[{i}]")


# size: the search loop, its proposals and its Pareto front share state; split in issue 35.
class ReflectiveSearch(ProgramSearch):
    """Reflective evolutionary search with a Pareto frontier, merges and a call budget.

    See the module docs for the algorithm and why it does not use the
    ``gepa`` package.

    Args:
        metric: ``metric(output, target)`` for validation and for the default loss.
        loss: the training loss whose feedback drives reflection (default:
            ``VerifierLoss(metric)``); an LLM judge gives richer feedback.
        max_calls: model calls the search may spend: a hard budget (see the module docs).
        max_tokens, max_cost: more of the hard budget, as in `ProgramSearch`.
        minibatch: training examples per reflection.
        proposals: children proposed concurrently per round.
        merge_every: rounds between merges (0: never merge).
        max_demos: most demos a demo mutation leaves in a step.
        alias: the resource alias of the rewriting calls.
        conservatism: how far one rewrite may go (see `Optimizer`).
        seed: the seed of every random choice.
        balance, max_concurrent: as `ProgramSearch`.
        checkpoint: as `ProgramSearch`; it also keeps the pool and where the
            rounds are at each step boundary.
    """

    _checkpointed = (
        "minibatch", "proposals", "merge_every", "max_demos", "alias", "conservatism", "seed",
        "loss_kind",
    )  # fmt: skip

    def __init__(
        self,
        metric: Metric | None = None,
        *,
        loss: Loss | None = None,
        max_calls: int = 600,
        minibatch: int = 4,
        proposals: int = 2,
        merge_every: int = 3,
        max_demos: int = 4,
        alias: str = "optimizer",
        conservatism: float = 0.5,
        seed: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(metric, max_calls=max_calls, **options)
        if max_calls < 1 or minibatch < 1 or proposals < 1 or merge_every < 0:
            raise ValueError(
                "ReflectiveSearch needs max_calls, minibatch and proposals >= 1 and "
                f"merge_every >= 0; got {max_calls}, {minibatch}, {proposals}, {merge_every}"
            )
        self.loss = loss
        self.max_calls: int = max_calls  # always set here: it is also the stopping rule
        self.minibatch = minibatch
        self.proposals = proposals
        self.merge_every = merge_every
        self.max_demos = max_demos
        self.alias = alias
        self.conservatism = conservatism
        self.seed = seed
        self.log: list[str] = []
        """What each proposal of the last search did, in words."""

    def _own_calls(self, program: Module) -> list[tuple[str, str]]:
        texts = [
            name
            for name, param in program.named_parameters()
            if param.requires_grad and not _is_demos(program, name)
        ]
        return [("rewrites", self.alias)] if texts else []

    async def _schedule(
        self, program: Module, train: list[Example], val: list[Example], proposal: Any = None
    ) -> list[Any]:
        """Proposals until ``max_calls`` (the budget caps the totals); what a checkpoint spent
        is not counted again.

        The components take turns: a demos component's proposal runs the minibatch,
        swaps demos, runs it again and validates the child if it did better; an
        instruction's runs the minibatch, asks for a rewrite and, if the rewrite is
        usable, runs the minibatch again and validates the child if it did better.
        Expected: rewrites as the sampled ones went (`costs.Proposal`: their calls, and
        the share usable), half the children better; low: every rewrite usable at the
        first ask and every child validated (the fewest rewrites fit); high: every
        rewrite refused after all its re-asks and no child validated, so the most
        rewrites fit. Each column spends about the budget.
        """
        m, n = min(self.minibatch, len(train)), len(val)
        held = self._saved.reusable.get(trial_key(program.state_dict(), {}))
        left = self._limits()[0] - (held[0].unevaluated if held else n)
        components = [name for name, p in program.named_parameters() if p.requires_grad]
        texts = sum(not _is_demos(program, name) for name in components)
        share = texts / len(components) if components else 0.0
        most = proposal.most if proposal is not None else 1 + DEFAULT_RETRIES
        if proposal is not None:
            proposal = self._rewrite_like(proposal, m, n, left, share)
        asked = proposal.calls if proposal is not None else 1.0
        usable = proposal.usable if proposal is not None else 1.0

        def column(calls: float, usable: float, better: float) -> tuple[float, float, float]:
            """Returns the proposals, runs and rewrites that fill the budget when each
            rewrite makes ``calls`` calls, that share of them is usable and that share of
            the children beats its parent on the minibatch (and is validated)."""
            rewritten = m + usable * (m + better * n)
            swapped = 2 * m + better * n
            per_proposal = share * (rewritten + calls) + (1 - share) * swapped
            proposals = max(left / per_proposal, 0) if per_proposal else 0
            runs = share * rewritten + (1 - share) * swapped
            return proposals, proposals * runs, proposals * share

        # A child beating its parent is a coin toss before the search has run: on the
        # embedded model demo swaps mostly do and rewrites mostly do not; on a model that
        # learns only from instructions, the other way round.
        better = 0.5
        low, high = column(1, 1.0, 1.0), column(most, 0.0, 0.0)
        expected = column(asked, usable, better)
        rewrites = Range(low[2], expected[2], high[2])
        demos, added = self._carried(m, n, share, usable, better, proposal)
        return [
            Phase(
                f"about {math.ceil(expected[2])} rewrites and "
                f"{math.ceil(expected[0] - expected[2])} demo swaps "
                f"until max_calls={self.max_calls}",
                runs=Range(low[1], expected[1], high[1]),
                demos=demos,
                added_chars=added,
                other=rewrites if proposal is not None else Range(*rewrites[:2], high[2] * most),
                other_alias=self.alias,
                proposal=proposal,
            )
        ]

    def _rewrite_like(self, sampled: Any, m: int, n: int, left: float, share: float) -> Any:
        """Returns the rewrite the search's proposals are expected to be like: the sampled
        one (on the program as it was), blended with the one sampled on the value it
        gave (``sampled.then``) for the proposals whose parent was rewritten.

        Rounds are pipelined, so the first two rounds' parents are the program as it
        was; later parents are drawn from a pool that holds it beside its children,
        taken to be a rewritten child half the time.
        """
        if sampled.then is None:
            return sampled
        per_proposal = share * (2 * m + n + sampled.calls) + (1 - share) * (2 * m + n)
        proposals = left / per_proposal if per_proposal else 0.0
        later = max(proposals - 2 * self.proposals, 0.0) / proposals if proposals else 0.0
        return sampled.blend(sampled.then, later / 2)

    def _carried(
        self, m: int, n: int, share: float, usable: float, better: float, proposal: Any
    ) -> tuple[float, float]:
        """Returns the demos per step and the characters of rewritten values beyond the
        program's own in each run's prompts, on average over a proposal's runs.

        A change travels with the program that has it: a demo swap's child runs its
        second minibatch (and, when ``better``, its validation) with up to ``max_demos``
        demos (from its minibatch), a usable rewrite's child with the rewritten value (as
        much longer as the sampled one); a proposal's first minibatch runs on its
        parent, which is taken to be a changed child half the time (the pool holds the
        program as it was beside its children), of either kind in proportion.
        """
        children = m + better * n
        swapped = (1 - share) * children
        rewritten = share * usable * children
        runs = share * (m + usable * children) + (1 - share) * (m + children)
        kinds = (1 - share) + share * usable
        if not runs or not kinds:
            return 0.0, 0.0
        demo_parent = (1 - share) / kinds
        demo_runs = swapped + m / 2 * demo_parent
        text_runs = rewritten + m / 2 * (1 - demo_parent)
        grown = proposal.grown if proposal is not None else 0.0
        return min(self.max_demos, m) * demo_runs / runs, grown * text_runs / runs

    async def _sampled_proposal(
        self,
        program: Module,
        train: list[Example],
        val: list[Example],
        resources: Any,
        sample: int,
    ) -> Any:
        """One rewrite of the first instruction-like component, as `_mutate` asks for it: a
        copy of the program runs ``sample`` training examples in training mode, backward
        brings their feedback, repeated to a minibatch's worth, and a `TextGradOptimizer`
        step asks for the new value (its re-asks included)."""
        from plait.optimization.costs import Proposal, repeat_feedback, sample_twice
        from plait.optimization.training.updates import as_text
        from plait.resources.usage import metered

        texts = [
            name
            for name, p in program.named_parameters()
            if p.requires_grad and not _is_demos(program, name)
        ]
        if not texts or not train or self._limits()[0] <= 0:
            return None
        copy = program.copy()
        batch = train[: max(1, min(sample, self.minibatch))]
        losses, _ = await self._run_training(copy, batch, resources)
        await backward([v for v in losses if isinstance(v, Value)], resources=resources)
        param = dict(copy.named_parameters())[texts[0]]
        repeat_feedback([param], min(self.minibatch, len(train)) / len(batch))
        optimizer = TextGradOptimizer(
            [(texts[0], param)], alias=self.alias, conservatism=self.conservatism
        ).bind(resources)

        async def rewrite() -> tuple[Any, bool]:
            old = _jsonable(param.value)
            with metered() as meter:
                report = await optimizer.step()
            changed = bool(report.accepted) and _jsonable(param.value) != old  # as `_mutate`
            grown = len(as_text(param.value)) - len(as_text(old)) if changed else 0
            most = 1 + optimizer.max_retries
            return Proposal.of(meter, 1, least=1, most=most, grown=grown), changed

        first, then = await sample_twice([param], rewrite)
        return None if first is None else replace(first, then=then)

    async def _search(
        self,
        program: Module,
        train: list[Example],
        val: list[Example],
        resources: Any,
        start: Trial,
    ) -> list[Trial]:
        """Runs rounds as a two-stage pipeline (see the module docs) until ``max_calls``."""
        from plait.resources.usage import metered

        if not train:
            raise ValueError("ReflectiveSearch needs a non-empty train_set")
        components = [n for n, p in program.named_parameters() if p.requires_grad]
        if not components:
            raise ValueError(
                f"ReflectiveSearch: {type(program).__name__} has no learnable parameter"
            )
        state = self._restored(program, start, len(val)) or _Rounds(
            pool=[_Member(program.copy(), start)], rng=random.Random(self.seed), spent=start.calls
        )
        self.log = state.log
        with rounds_of(self) as rounds:
            resumable = not start.unevaluated  # a whole run's trial 0 is never cut short
            while True:
                if resumable:  # a step boundary a whole run also passes: a rerun starts here
                    self._save_rounds(state)
                committed = len(state.pending) * len(val)
                room = state.spent + committed < self.max_calls and not budget_spent()
                proposals = []
                if room:
                    state.round += 1
                    rounds.start(round=state.round)
                    proposals = self._plan(state, components, train, val, resources)
                if not proposals and not state.pending:
                    break
                with metered() as meter:
                    children, members = await together(
                        together(*proposals),
                        together(*(self._validate(c, val, resources) for c in state.pending)),
                    )
                state.spent += meter.calls
                for member in members:
                    if member is not None:
                        member.trial.number = len(state.pool)
                        state.pool.append(member)
                state.pending = [child for child in children if child is not None]
                if room and self.merge_every and (state.round - 1) % self.merge_every == 0:
                    merged = self._merge(state.pool, state.rng) if state.round > 1 else None
                    state.pending += [merged] if merged is not None else []
                if meter.calls + meter.cached == 0:
                    break  # the step asked nothing at all (every reply cached): nothing new
                resumable = room and not budget_spent()
        return [member.trial for member in state.pool[1:]]

    def _plan(
        self,
        state: _Rounds,
        components: list[str],
        train: list[Example],
        val: list[Example],
        resources: Any,
    ) -> list[Any]:
        """Returns one round's proposals, their parents and minibatches drawn now, in order."""
        rng = state.rng
        parents = [self._select(state.pool, rng) for _ in range(self.proposals)]
        jobs = []
        for parent in parents:
            name = components[state.turn % len(components)]
            state.turn += 1
            batch = rng.sample(train, min(self.minibatch, len(train)))
            jobs.append(self._proposal(state.pool, parent, name, batch, resources, rng.random()))
        return jobs

    async def _validate(self, child: _Child, val: list[Example], resources: Any) -> _Member | None:
        """Evaluates a child on the validation set; None when the budget left it half-done."""
        trial = await self._evaluate_one(-1, Candidate(child.program, child.params), val, resources)
        trial.note = child.note
        if child.other_parent is not None:
            self.log.append(f"{child.note}: {trial.score:.3g}")
        if trial.unevaluated:
            return None
        return _Member(child.program, trial, child.parent, child.other_parent, child.changed)

    # --------------------------------------------------------- checkpoint
    @property
    def loss_kind(self) -> str | None:
        """The loss's class (what a checkpoint's settings hold of it)."""
        return None if self.loss is None else type(self.loss).__name__

    def _limits(self) -> tuple[Any, Any, Any]:
        """``max_calls`` counts the whole search: what its checkpoint spent is not spent again
        (the rounds' calls, or before any round the calls of trial 0, cut short or not)."""
        rounds = self._saved.state.get("rounds")
        start = [t.calls for t in self._saved.trials if t.number == 0][:1]
        spent = rounds["spent"] if rounds else sum(start)
        return max(self.max_calls - spent, 0), self.max_tokens, self.max_cost

    def _save_rounds(self, state: _Rounds) -> None:
        """Keeps where the rounds are (pool, children awaiting validation, generator) in the
        checkpoint."""
        if self._saved.path is None:
            return  # nothing to write: no need to describe the state
        self._saved.state["rounds"] = state.as_json()
        self._saved.save()

    def _read_state(self, state: dict[str, Any], read: Any) -> None:
        super()._read_state({"steps": state.get("steps", {})}, read)
        if "rounds" in state:
            _Rounds.check(state["rounds"], read, "state.rounds")

    def _restored(self, program: Module, start: Trial, n: int) -> _Rounds | None:
        """Returns the rounds the checkpoint holds, rebuilt on ``program``; None without."""
        rounds = self._saved.state.get("rounds")
        if rounds is None:
            return None
        self._saved.resumed_calls += rounds["spent"] - start.calls  # trial 0 is counted already
        return _Rounds.restore(rounds, program, start, n, self._saved.path)

    # ----------------------------------------------------------- selection
    @staticmethod
    def frontier(pool: list[_Member]) -> dict[int, int]:
        """Returns pool index → validation examples it leads on; dominated members are dropped."""
        vectors = [m.trial.scores for m in pool]
        best = [max(column) for column in zip(*vectors, strict=True)]
        leads = {
            i: sum(s >= b for s, b in zip(v, best, strict=True)) for i, v in enumerate(vectors)
        }
        leads = {i: n for i, n in leads.items() if n}

        def dominated(i: int) -> bool:
            return any(
                j != i
                and all(a >= b for a, b in zip(vectors[j], vectors[i], strict=True))
                and vectors[j] != vectors[i]
                for j in leads
            )

        return {i: n for i, n in leads.items() if not dominated(i)} or {0: 1}

    def _select(self, pool: list[_Member], rng: random.Random) -> int:
        weights = self.frontier(pool)
        indices = sorted(weights)
        return rng.choices(indices, weights=[weights[i] for i in indices])[0]

    # ------------------------------------------------------------ mutation
    async def _proposal(
        self,
        pool: list[_Member],
        parent_index: int,
        name: str,
        batch: list[Example],
        resources: Any,
        salt: float,
    ) -> _Child | None:
        """One mutation (`_mutate`) told to callbacks as a proposal, its runs, rewrite and
        checks inside; None when it was not kept, or when the search's budget ran out in it."""
        method = "demos" if _is_demos(pool[parent_index].program, name) else "reflection"
        told = {"parameter": name, "method": method, "parent": pool[parent_index].trial.number}
        with learning_step("proposal", self, told) as step:
            try:
                child = await self._mutate(pool, parent_index, name, batch, resources, salt)
            except BudgetExceededError:
                if not budget_spent():
                    raise  # an endpoint's own budget, not the search's
                self.log.append(f"{name}: stopped, the search's budget is spent")
                child = None
            step.outputs = {"accepted": child is not None}
        return child

    async def _mutate(
        self,
        pool: list[_Member],
        parent_index: int,
        name: str,
        batch: list[Example],
        resources: Any,
        salt: float,
    ) -> _Child | None:
        """Returns a child of ``pool[parent_index]`` with ``name`` rewritten, once it beats
        its parent on ``batch``; its validation is the next step's (see `_search`)."""
        parent = pool[parent_index]
        child = parent.program.copy()
        losses, before = await self._run_training(child, batch, resources)
        if before and min(before) >= 1.0:
            self.log.append(f"{name}: the minibatch was already perfect")
            return None
        param = dict(child.named_parameters())[name]
        old = _jsonable(param.value)
        if _is_demos(child, name):
            self._mutate_demos(child, name, batch, before, random.Random(salt))
            tell_update(param, name, old, _jsonable(param.value))
        else:
            await backward([v for v in losses if isinstance(v, Value)], resources=resources)
            optimizer = TextGradOptimizer(
                [(name, param)], alias=self.alias, conservatism=self.conservatism
            ).bind(resources)
            report = await optimizer.step()
            if not report.accepted:
                reasons = "; ".join(r.reason for r in report.updates) or "no feedback"
                self.log.append(f"{name}: rewrite refused ({reasons[:200]})")
                for _, other in child.named_parameters():
                    other.zero_feedback()
                return None
        for _, other in child.named_parameters():
            other.zero_feedback()
        if _jsonable(param.value) == old:
            self.log.append(f"{name}: no change")
            return None
        after = await self._scores(child, batch, resources)
        tell_decision(self, _minibatch_evidence(before, after))
        if sum(after) <= sum(before):
            self.log.append(f"{name}: minibatch {sum(before):g} -> {sum(after):g}, rejected")
            return None
        self.log.append(f"{name}: minibatch {sum(before):g} -> {sum(after):g}, accepted")
        note = f"reflection on {name}, from trial {parent.trial.number}"
        return _Child(child, {"changed": name}, note, parent_index, changed={name})

    async def _run_training(
        self, program: Module, batch: list[Example], resources: Any
    ) -> tuple[list[Any], list[float]]:
        """Runs ``program`` in training mode on ``batch``; returns the losses and their scores."""
        from plait.execution import run

        step = TrainingStep(program, self.loss or VerifierLoss(self.metric or _exact))
        examples = on_examples(step)
        examples.train()
        try:
            losses = await run(
                examples,
                list(batch),
                resources=resources,
                max_concurrent=self.max_concurrent,
                on_error="collect",
                progress=False,
            )
        finally:
            examples.eval()
        scores = []
        for loss in losses:
            payload = loss.payload if isinstance(loss, Value) else None
            score = payload.score if isinstance(payload, Feedback) else None
            scores.append(0.0 if score is None else float(score))
        return list(losses), scores

    async def _scores(self, program: Module, batch: list[Example], resources: Any) -> list[float]:
        from plait.optimization.evaluation import evaluate

        result = await evaluate(
            program,
            batch,
            self.metric,
            resources=resources,
            max_concurrent=self.max_concurrent,
            progress=False,
        )
        return result.scores

    def _mutate_demos(
        self,
        program: Module,
        name: str,
        batch: list[Example],
        scores: list[float],
        rng: random.Random,
    ) -> None:
        """Swaps demos of one step for demos from the minibatch's good runs (or its labels)."""
        path = name.rpartition(".")[0]
        module = dict(program.named_modules())[path]
        param = module._parameters["demos"]
        good: list[tuple[str, dict[str, Any]]] = []
        for record in module.__dict__.get("_traces", ()):
            index = record.index
            if index is None or index >= len(batch) or scores[index] < 1.0:
                continue
            if record.error is None and isinstance(record.output, dict):
                demo = _jsonable({**record.inputs, **record.output})
                good.append((_label(batch[index][1]), demo))
        labeled = [
            (_label(t), d) for (x, t) in batch if (d := labeled_demo(module, (x, t))) is not None
        ]
        current = [(_label(_output_of(module, d)), d) for d in param.value or []]
        fresh = {_demo_key(d, module): (lab, d) for lab, d in good + labeled}
        for _, d in current:
            fresh.pop(_demo_key(d, module), None)
        if not fresh:
            return
        keep = max(1, min(self.max_demos, len(current) + 1)) - 1
        kept = rng.sample(current, min(keep, len(current)))
        picked = balanced_sample(
            list(fresh.values()), lambda item: item[0], self.max_demos - len(kept), rng
        )
        merged = balanced_sample(kept + picked, lambda item: item[0], self.max_demos, rng)
        param.value = [d for _, d in merged]

    # --------------------------------------------------------------- merge
    def _merge(self, pool: list[_Member], rng: random.Random) -> _Child | None:
        """Returns a merge of two frontier members with a common ancestor (each parameter
        from whichever changed it), or None when no pair gives a new program."""
        leaders = sorted(self.frontier(pool))
        pairs = [
            (a, b)
            for a in leaders
            for b in leaders
            if a < b and not _descends(pool, a, b) and not _descends(pool, b, a)
        ]
        rng.shuffle(pairs)
        for a, b in pairs:
            ancestor = _common_ancestor(pool, a, b)
            if ancestor is None:
                continue
            base = pool[ancestor].trial.parameters
            first, second = pool[a].trial, pool[b].trial
            merged = dict(base)
            for key in base:
                took_a = first.parameters.get(key) != base[key]
                took_b = second.parameters.get(key) != base[key]
                if took_a and (not took_b or first.score >= second.score):
                    merged[key] = first.parameters[key]
                elif took_b:
                    merged[key] = second.parameters[key]
            if merged in (first.parameters, second.parameters):
                continue
            program = pool[a].program.copy()
            program.load_state_dict(merged)
            note = f"merge of trials {first.number} and {second.number}"
            return _Child(program, {"merge": [first.number, second.number]}, note, a, b)
        return None


MINIBATCH_RULE = "a child joins the pool if its minibatch score rises above its parent's"
"""The rule a reflective proposal is accepted by, as its decision tells it."""


def _minibatch_evidence(before: list[float], after: list[float]) -> dict[str, Any]:
    """Returns the evidence of a child's minibatch check (scores are means)."""
    return {
        "accepted": sum(after) > sum(before),
        "n": len(before),
        "old_score": sum(before) / len(before),
        "new_score": sum(after) / len(after),
        "rule": MINIBATCH_RULE,
    }


def _exact(output: Any, target: Any) -> bool:
    from plait.optimization.evaluation import exact_match

    return exact_match(output, target)


def _is_demos(program: Module, name: str) -> bool:
    path, _, attribute = name.rpartition(".")
    return attribute == "demos" and path in dict(demo_modules(program))


def _output_of(module: Module, demo: dict[str, Any]) -> Any:
    fields = list(module.signature.output_fields)  # type: ignore[attr-defined]
    return demo.get(fields[0]) if len(fields) == 1 else {k: demo.get(k) for k in fields}


def _ancestors(pool: list[_Member], index: int) -> list[int]:
    seen: list[int] = []
    frontier = [index]
    while frontier:
        current = frontier.pop()
        member = pool[current]
        for parent in (member.parent, member.other_parent):
            if parent is not None and parent not in seen:
                seen.append(parent)
                frontier.append(parent)
    return seen


def _descends(pool: list[_Member], child: int, ancestor: int) -> bool:
    return ancestor in _ancestors(pool, child)


def _common_ancestor(pool: list[_Member], a: int, b: int) -> int | None:
    mine = set(_ancestors(pool, a))
    for candidate in _ancestors(pool, b):
        if candidate in mine:
            return candidate
    return None
