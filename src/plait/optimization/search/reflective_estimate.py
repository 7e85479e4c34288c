"""ReflectiveSearch's estimate: how many rewrites and demo swaps fit its ``max_calls``.

`ReflectiveEstimate` is the part of `ReflectiveSearch` that gives `ProgramSearch.estimate`
its schedule: one rewrite made for real on a copy (`_sampled_proposal`) sizes the
proposals, and the budget decides how many fit (`_schedule`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Protocol

from plait.module import Module
from plait.optimization.costs import Phase, Proposal, Range, repeat_feedback, sample_twice
from plait.optimization.search.checkpoint import SearchCheckpoint, trial_key
from plait.optimization.search.demos import (
    Example,
    _is_demos,
    _jsonable,
)
from plait.optimization.training.backward import backward
from plait.optimization.training.optimizer import DEFAULT_RETRIES
from plait.optimization.training.textgrad import TextGradOptimizer
from plait.optimization.training.updates import as_text
from plait.resources.usage import metered
from plait.values import Value


class _Reflecting(Protocol):
    """What `ReflectiveEstimate` uses of the search it is part of."""

    minibatch: int
    proposals: int
    max_demos: int
    max_calls: int
    alias: str
    conservatism: float
    _saved: SearchCheckpoint

    def _limits(self: _Reflecting) -> tuple[Any, Any, Any]: ...

    def _rewrite_like(
        self: _Reflecting, sampled: Any, m: int, n: int, left: float, share: float
    ) -> Any: ...

    def _carried(
        self: _Reflecting, m: int, n: int, share: float, usable: float, better: float, proposal: Any
    ) -> tuple[float, float]: ...

    async def _run_training(
        self: _Reflecting, program: Module, batch: list[Example], resources: Any
    ) -> tuple[list[Any], list[float]]: ...


class ReflectiveEstimate:
    """The estimate of a `ReflectiveSearch` (its mixin: what it uses of the search is
    `_Reflecting`)."""

    async def _schedule(
        self: _Reflecting,
        program: Module,
        train: list[Example],
        val: list[Example],
        proposal: Any = None,
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

    def _rewrite_like(
        self: _Reflecting, sampled: Any, m: int, n: int, left: float, share: float
    ) -> Any:
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
        self: _Reflecting, m: int, n: int, share: float, usable: float, better: float, proposal: Any
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
        self: _Reflecting,
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
