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
import random
from typing import Any

from plait._together import together
from plait.errors import BudgetExceededError
from plait.execution import run
from plait.feedback import Feedback
from plait.module import Module
from plait.optimization.evaluation import Metric, evaluate, exact_match
from plait.optimization.events import learning_step, rounds_of, tell_decision, tell_update
from plait.optimization.search.base import Candidate, ProgramSearch
from plait.optimization.search.demos import (
    Example,
    _demo_key,
    _is_demos,
    _jsonable,
    balanced_sample,
    labeled_demo,
)
from plait.optimization.search.reflective_estimate import ReflectiveEstimate
from plait.optimization.search.reflective_rounds import (
    _Child,
    _common_ancestor,
    _descends,
    _Member,
    _Rounds,
)
from plait.optimization.search.report import Trial, _label
from plait.optimization.search.resume import budget_spent
from plait.optimization.training.backward import backward
from plait.optimization.training.losses import Loss, VerifierLoss
from plait.optimization.training.step import TrainingStep, on_examples
from plait.optimization.training.textgrad import TextGradOptimizer
from plait.resources.usage import metered
from plait.values import Value

__all__ = ["ReflectiveSearch"]

logger = logging.getLogger("plait.optimization")


class ReflectiveSearch(ReflectiveEstimate, ProgramSearch):
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

    async def _search(
        self,
        program: Module,
        train: list[Example],
        val: list[Example],
        resources: Any,
        start: Trial,
    ) -> list[Trial]:
        """Runs rounds as a two-stage pipeline (see the module docs) until ``max_calls``."""
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
                self._joined(state, children, members, merging=room)
                if meter.calls + meter.cached == 0:
                    break  # the step asked nothing at all (every reply cached): nothing new
                resumable = room and not budget_spent()
        return [member.trial for member in state.pool[1:]]

    def _joined(
        self,
        state: _Rounds,
        children: list[_Child | None],
        members: list[_Member | None],
        merging: bool,
    ) -> None:
        """Ends a step: the validated children join the pool in the order they were
        proposed, the new proposals await validation, and every ``merge_every`` rounds
        (when the step started a round) a merge joins them."""
        for member in members:
            if member is not None:
                member.trial.number = len(state.pool)
                state.pool.append(member)
        state.pending = [child for child in children if child is not None]
        if merging and self.merge_every and (state.round - 1) % self.merge_every == 0:
            merged = self._merge(state.pool, state.rng) if state.round > 1 else None
            state.pending += [merged] if merged is not None else []

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
        if not self._saved.place.kept:
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
        return _Rounds.restore(rounds, program, start, self._saved.reader(n))

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
    return exact_match(output, target)


def _output_of(module: Module, demo: dict[str, Any]) -> Any:
    fields = list(module.signature.output_fields)  # type: ignore[attr-defined]
    return demo.get(fields[0]) if len(fields) == 1 else {k: demo.get(k) for k in fields}
