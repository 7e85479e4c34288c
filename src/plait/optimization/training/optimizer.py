"""Optimizers: rewrite learnable parameters from the feedback backward left on them.

    optimizer = SFAOptimizer(program.named_parameters()).bind(resources)
    optimizer.zero_feedback()
    losses = await step(examples)                  # a TrainingStep in training mode
    await Value.backward(losses)                   # feedback reaches the parameters
    report = await optimizer.step()                # one structured LLM call or two per parameter

Every call an optimizer makes asks for a structured reply (a JSON schema the
backend enforces where it can: a grammar on the embedded model), so even a
135M model answers in a parseable shape. A reply is still *unusable* when it
does not parse, or when the value it proposes fails `check_update`: empty,
unchanged, absurdly long, missing a ``{placeholder}`` the old value had, or a
bigger edit than the ``conservatism`` allows. An unusable reply is re-asked
(showing the model why it was rejected) up to ``max_retries`` times; if no
usable value comes, the update is *rejected*: logged, recorded in
`Optimizer.history` with the reason, never applied, and ``step()`` goes on.

The conservatism rule (see `plait.optimization.training.updates`): ``conservatism`` c
in [0, 1] is told to the model in words (0: rewrite freely, 1: minimal edits)
and enforced on the result: the words changed may be at most
``max((1 - 0.9 c) × words, 40 × (1 - c))`` (c = 0: anything; the default 0.5:
55 % or 20 words, whichever is more, so a short prompt can be rewritten;
c = 1: 10 %). A new prompt that pastes a run of feedback text is refused too.
A parameter with a ``value_type`` (Predict's demos) is asked for a value of
that type, not for JSON inside a string.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict
from typing import Any, Self

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from plait import _jsontext as jsontext
from plait._together import together
from plait.backends.types import Message, Request, Response, SamplingOptions
from plait.errors import BackendError, BudgetExceededError, PlaitError, StructuredOutputError
from plait.execution.settings import find_resources
from plait.execution.structured import Attempt, ask_structured, output_type_for
from plait.module import Module
from plait.optimization.events import learning_step, tell_decision, tell_update
from plait.optimization.training.prompts import _SYSTEM, OptimizerPrompts
from plait.optimization.training.updates import (
    ParameterUpdate,
    StepReport,
    UpdateRecord,
    as_text,
    change_ratio,
    check_update,
    parse_leniently,
    update_model_for,
)
from plait.parameter import Parameter
from plait.resources import ResourceManager

__all__ = [
    "Optimizer",
    "StepReport",
    "UpdateRecord",
    "change_ratio",
    "check_update",
]

logger = logging.getLogger("plait.optimization")

STATE_FORMAT = "plait.optimizer/1"


# ----------------------------------------------------------------- optimizer
ParamsArg = Iterable[Parameter] | Iterable[tuple[str, Parameter]] | Module


DEFAULT_RETRIES = 2
"""Re-asks an optimizer makes after an unusable reply, per call, unless told otherwise."""


class Optimizer(OptimizerPrompts):
    """Base class of optimizers: bookkeeping, ordering, checks, retries and validation.

    Subclasses implement `_propose`, which asks the model for a parameter's
    new value; everything else (which parameters, in what order, what is
    applied, reverted and recorded) is shared.

    Args:
        params: the parameters to optimise: ``module.named_parameters()``
            (names are kept for prompts and history), ``module.parameters()``,
            any iterable of `Parameter`, or a module.
        alias: the resource alias the optimizer's LLM calls use.
        max_retries: re-asks after an unusable reply, per call.
        conservatism: 0 (rewrite freely) to 1 (minimal edits); see the module docs.
        validate: ``async def validate() -> float`` (higher is better). When
            given, ``step()`` scores before and after its updates and reverts
            them all when the score fell. The score of unchanged parameters is
            remembered, so it is computed once per step in a training loop.

    Raises:
        ValueError: no parameters, a non-`Parameter`, or a setting out of range.
    """

    history_limit = 100
    """Records kept per parameter; older ones are dropped."""
    max_feedback_shown = 8
    """Feedback items shown to the model per parameter (the newest)."""
    feedback_item_chars = 500
    """Characters of one feedback item shown to the model."""
    temperature = 0.7
    """Sampling temperature of the optimizer's calls."""

    def __init__(
        self,
        params: ParamsArg,
        *,
        alias: str = "optimizer",
        max_retries: int = DEFAULT_RETRIES,
        conservatism: float = 0.5,
        validate: Callable[[], Awaitable[float]] | None = None,
    ) -> None:
        if not 0.0 <= conservatism <= 1.0:
            raise ValueError(f"conservatism must be in [0, 1], got {conservatism}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if validate is not None and not callable(validate):
            raise ValueError(
                f"validate must be an async callable returning a score, got {validate!r}"
            )
        self._entries = _named_entries(params, type(self).__name__)
        self.alias = alias
        self.max_retries = max_retries
        self.conservatism = conservatism
        self.validate = validate
        self.resources: Any = None
        self.step_count = 0
        self.history: dict[str, list[UpdateRecord]] = {name: [] for name, _ in self._entries}
        """Per parameter name: what each step did with it, oldest first."""
        self._score: tuple[str, float] | None = None

    # ------------------------------------------------------------ setup
    def bind(self, resources: Any) -> Self:
        """Sets the resources (config, manager or mapping) the optimizer's calls use; returns self.

        Unbound, ``step()`` uses the resources of the active ``ExecutionSettings``.
        """
        self.resources = resources
        return self

    def named_parameters(self) -> list[tuple[str, Parameter]]:
        """Returns the optimised parameters with the names the optimizer uses."""
        return list(self._entries)

    def copy_for(self, params: ParamsArg) -> Self:
        """Returns a copy of this optimizer over ``params``: the same type, settings,
        resources and history, without the ``validate`` hook.

        For a step that must leave this optimizer and its parameters as they are
        (a Trainer's estimate makes one on a copy of the program). Give ``params``
        the names this optimizer uses, so the history (and momentum) is found.
        """
        twin = copy.copy(self)
        twin._entries = _named_entries(params, type(self).__name__)
        twin.history = {name: list(records) for name, records in self.history.items()}
        twin.validate = None
        twin._score = None
        return twin

    def zero_feedback(self) -> None:
        """Clears the feedback of every optimised parameter, like ``zero_grad``."""
        for _, param in self._entries:
            param.zero_feedback()

    def __repr__(self) -> str:
        names = ", ".join(name for name, _ in self._entries)
        return (
            f"{type(self).__name__}([{names}], alias={self.alias!r}, "
            f"conservatism={self.conservatism:g}, max_retries={self.max_retries})"
        )

    # ------------------------------------------------------------- step
    async def step(self) -> StepReport:
        """Updates every parameter that has feedback, upstream levels first; returns a report.

        Parameters read on one graph level update concurrently; each later
        level is shown what changed before it. Feedback is consumed: after the
        step every updated parameter's buffer is empty, whatever the outcome.
        An unusable reply never raises; a failing ``validate`` hook reverts
        the step's updates and re-raises.
        """
        self.step_count += 1
        report = StepReport(step=self.step_count)
        todo = [
            (index, name, param)
            for index, (name, param) in enumerate(self._entries)
            if param.requires_grad and param.get_accumulated_feedback()
        ]
        if not todo:
            return report
        manager = self._manager()
        if self.validate is not None:
            report.score_before = await self._current_score()
        applied: list[tuple[UpdateRecord, Parameter]] = []
        for level, group in _levels(todo):
            report.levels.append([name for name, _ in group])
            upstream = [record for record, _ in applied]
            records = await together(
                *(self._proposal(manager, name, param, level, upstream) for name, param in group)
            )
            for record, (_, param) in zip(records, group, strict=True):
                if record.status == "accepted":
                    param.apply_update(record.new)
                    tell_update(param, record.parameter, record.old, param.value)
                    applied.append((record, param))
                else:
                    param.zero_feedback()
                report.updates.append(record)
        if self.validate is not None and applied:
            await self._validate_step(report, applied)
        for record in report.updates:
            self._remember(record)
        return report

    async def _proposal(
        self, manager: Any, name: str, param: Parameter, level: int | None, upstream: list[Any]
    ) -> UpdateRecord:
        """`_update` told to callbacks as one proposal (its model calls inside) and its decision."""
        told = {"parameter": name, "method": type(self).__name__, "level": level}
        with learning_step("proposal", self, told) as step:
            record = await self._update(manager, name, param, level, upstream)
            accepted = record.status == "accepted"
            evidence = {"parameter": name, "accepted": accepted, "status": record.status}
            tell_decision(self, evidence | {"rule": UPDATE_RULE, "reason": record.reason})
            step.outputs = {"accepted": accepted, "proposed": record.new}
        return record

    async def _update(
        self, manager: Any, name: str, param: Parameter, level: int | None, upstream: list[Any]
    ) -> UpdateRecord:
        record = UpdateRecord(self.step_count, name, old=param.value, level=level)
        try:
            await self._propose(manager, name, param, upstream, record)
        except BudgetExceededError:
            raise
        except BackendError as exc:
            record.status, record.new = "rejected", None
            record.reason = f"the optimizer's call failed: {exc}"
        if record.status == "accepted":
            logger.info(
                "%s: step %d accepted an update of %s", type(self).__name__, record.step, name
            )
        else:
            logger.warning(
                "%s: step %d %s the update of %s: %s",
                type(self).__name__,
                record.step,
                record.status,
                name,
                record.reason,
            )
        return record

    async def _propose(
        self,
        manager: Any,
        name: str,
        param: Parameter,
        upstream: list[UpdateRecord],
        record: UpdateRecord,
    ) -> None:
        """Asks the model for ``param``'s new value and fills ``record`` in. Override this.

        Set ``record.status`` to ``accepted`` with ``record.new``, or leave it
        ``rejected`` / set ``skipped`` with a ``record.reason``. `_ask_for_value`
        does the asking, checking and re-asking.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement _propose")

    async def _validate_step(
        self, report: StepReport, applied: list[tuple[UpdateRecord, Parameter]]
    ) -> None:
        try:
            after = float(await _maybe_await(self.validate()))  # type: ignore[misc]
        except BaseException:
            _revert(applied, "the validation hook failed after this update; reverted")
            report.reverted = True
            raise
        report.score_after = after
        before = report.score_before
        tell_decision(self, _validation_evidence(before, after))
        if before is not None and after < before:
            _revert(applied, f"the validation score fell from {before:.4g} to {after:.4g}")
            report.reverted = True
            self._score = (self._fingerprint(), before)
            logger.warning(
                "%s: step %d reverted %d update(s): validation %.4g -> %.4g",
                type(self).__name__,
                report.step,
                len(applied),
                before,
                after,
            )
        else:
            self._score = (self._fingerprint(), after)

    async def _current_score(self) -> float:
        fingerprint = self._fingerprint()
        if self._score is not None and self._score[0] == fingerprint:
            return self._score[1]
        score = float(await _maybe_await(self.validate()))  # type: ignore[misc]
        self._score = (fingerprint, score)
        return score

    def _fingerprint(self) -> str:
        values = [as_text(param.value) for _, param in self._entries]
        return hashlib.sha256(json.dumps(values).encode()).hexdigest()

    def _remember(self, record: UpdateRecord) -> None:
        records = self.history.setdefault(record.parameter, [])
        records.append(record)
        del records[: max(len(records) - self.history_limit, 0)]

    def _manager(self) -> Any:
        resources = find_resources(bound=self.resources)
        if resources is None:
            raise PlaitError(
                f"{type(self).__name__} has no resources for its LLM calls (alias "
                f"{self.alias!r}): call optimizer.bind(resources) or step inside "
                "`async with ExecutionSettings(resources=...)`"
            )
        return ResourceManager.shared(resources)

    # ------------------------------------------------------- model calls
    async def _ask_structured(
        self,
        manager: Any,
        prompt: str,
        target: type[BaseModel],
        max_tokens: int,
        record: UpdateRecord,
        check: Callable[[Any], str | None] = lambda parsed: None,
    ) -> Any:
        """Asks until ``check`` accepts a parsed reply; returns it.

        One `ask_structured` call with ``max_retries`` re-asks: a reply is
        refused when it does not parse (even leniently: a small model's JSON
        with prose around it still counts) or when ``check`` names a reason,
        and a refused reply is never cached.

        Raises:
            StructuredOutputError: no reply was accepted; says why for each attempt.
        """
        output = output_type_for(target)
        request = Request(
            messages=(Message("system", _SYSTEM), Message("user", prompt)),
            options=SamplingOptions(temperature=self.temperature, max_tokens=max_tokens),
            response_schema=output.schema,
        )

        def parse(response: Response) -> Any:
            try:
                parsed = output.read(response)
            except StructuredOutputError:
                parsed = parse_leniently(response.text, target)
                if parsed is None:
                    raise
            reason = check(parsed)
            if reason is not None:
                raise StructuredOutputError(reason, raw=response.text, target=output.name)
            return parsed

        def complete(request: Request, accept: Callable[[Response], bool]) -> Awaitable[Response]:
            return manager.complete(self.alias, request, accept=accept)

        def count(attempt: Attempt) -> None:
            record.attempts += 1

        reply = await ask_structured(
            complete,
            request,
            parse,
            expected=f"one JSON object with the keys {', '.join(target.model_fields)}",
            label=f"{type(self).__name__} (alias {self.alias!r})",
            reasks=self.max_retries,
            on_attempt=count,
        )
        return reply.value

    async def _ask_for_value(
        self,
        manager: Any,
        param: Parameter,
        parts: list[str],
        upstream: list[UpdateRecord],
        record: UpdateRecord,
    ) -> None:
        """Asks for a `ParameterUpdate`, checks it with `check_update`, fills ``record``.

        ``parts`` is the optimizer's own account of the parameter (`_value_prompt`).
        """
        prompt = self._value_prompt(param, parts, upstream)
        old_text = as_text(param.value)
        proposals: list[Any] = []
        sources = param.get_accumulated_feedback()

        def usable(update: ParameterUpdate) -> str | None:
            value, reason = check_update(
                param.value, update.new_value, self.conservatism, sources=sources
            )
            proposals.append((update, value))
            return reason

        max_tokens = min(4096, 256 + len(old_text) // 2)
        target = update_model_for(param.value_type)
        try:
            await self._ask_structured(manager, prompt, target, max_tokens, record, check=usable)
        except StructuredOutputError as exc:
            record.status, record.reason = "rejected", str(exc)
            if proposals:
                record.new = _jsonable(proposals[-1][0].new_value)
            return
        update, value = proposals[-1]
        record.status, record.new, record.rationale = "accepted", value, update.rationale

    # ------------------------------------------------------------- state
    def _settings(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "max_retries": self.max_retries,
            "conservatism": self.conservatism,
        }

    def state_dict(self) -> dict[str, Any]:
        """Returns the optimizer's state as JSON-compatible data.

        Per parameter: its current value and description and the history of
        every step (old and proposed values, feedback summaries, accepted or
        rejected with the reason). Parameter values themselves are restored
        from the module's ``state_dict``, not from here.
        """
        return {
            "format": STATE_FORMAT,
            "type": type(self).__name__,
            "settings": self._settings(),
            "step": self.step_count,
            "score": None
            if self._score is None
            else {"fingerprint": self._score[0], "value": self._score[1]},
            "parameters": {
                name: {
                    "value": param.value,
                    "description": param.description,
                    "history": [asdict(record) for record in self.history.get(name, [])],
                }
                for name, param in self._entries
            },
        }

    def load_state_dict(self, state: Mapping[str, Any] | str) -> None:
        """Restores history, step count and the remembered validation score.

        Args:
            state: what `state_dict` returned, or its JSON text.

        Raises:
            ValueError: ``state`` is not an optimizer state.
            KeyError: it names parameters this optimizer does not have (all
                listed, one per line; nothing is changed).
        """
        if isinstance(state, str):
            try:
                state = jsontext.loads(state)
            except ValueError as exc:
                raise ValueError(f"not an optimizer state: the text is not JSON ({exc})") from None
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"not an optimizer state (expected a mapping with format {STATE_FORMAT!r}); "
                "pass what optimizer.state_dict() returned"
            )
        params = state.get("parameters", {})
        unknown = [name for name in params if name not in self.history]
        if unknown:
            lines = "\n".join(f"  {name}" for name in unknown)
            known = ", ".join(self.history) or "none"
            raise KeyError(f"unknown parameter(s) in optimizer state:\n{lines}\nknown: {known}")
        for name, entry in params.items():
            self.history[name] = [UpdateRecord(**r) for r in entry.get("history", [])]
        self.step_count = int(state.get("step", 0))
        score = state.get("score")
        self._score = None if score is None else (score["fingerprint"], float(score["value"]))


def _named_entries(params: ParamsArg, owner: str) -> list[tuple[str, Parameter]]:
    items = list(params.named_parameters() if isinstance(params, Module) else params)
    entries: list[tuple[str, Parameter]] = []
    seen: set[int] = set()
    names: set[str] = set()
    for position, item in enumerate(items):
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Parameter):
            name, param = str(item[0]), item[1]
        elif isinstance(item, Parameter):
            name, param = item.name if item._name else f"param{position}", item
        else:
            raise ValueError(
                f"{owner} got {type(item).__name__} at position {position}; pass "
                "module.named_parameters(), module.parameters() or Parameters"
            )
        if id(param) in seen:
            continue
        seen.add(id(param))
        unique, n = name, 2
        while unique in names:  # two unnamed-path prompts, e.g. two system_prompts
            unique, n = f"{name}#{n}", n + 1
        names.add(unique)
        entries.append((unique, param))
    if not entries:
        raise ValueError(f"{owner} got an empty parameter list")
    return entries


def _levels(
    todo: list[tuple[int, str, Parameter]],
) -> list[tuple[int | None, list[tuple[str, Parameter]]]]:
    """Groups parameters by graph level, upstream first; unknown levels follow one by one."""
    known = sorted({p.graph_level for _, _, p in todo if p.graph_level is not None})
    groups: list[tuple[int | None, list[tuple[str, Parameter]]]] = [
        (level, [(name, p) for _, name, p in todo if p.graph_level == level]) for level in known
    ]
    groups += [(None, [(name, p)]) for _, name, p in todo if p.graph_level is None]
    return groups


UPDATE_RULE = "a proposed value is applied if it passes the update check (check_update)"
"""The rule a proposal is decided by, as its decision tells it."""

VALIDATION_RULE = "a step's updates are kept unless the validation score falls"
"""The rule a step with a ``validate`` hook is decided by."""


def _validation_evidence(before: float | None, after: float) -> dict[str, Any]:
    """Returns the evidence of a step's validation check."""
    kept = before is None or after >= before
    return {"accepted": kept, "old_score": before, "new_score": after, "rule": VALIDATION_RULE}


def _revert(applied: list[tuple[UpdateRecord, Parameter]], reason: str) -> None:
    for record, param in applied:
        param.value = record.old
        tell_update(param, record.parameter, record.new, record.old)
        record.status, record.reason = "reverted", reason


async def _maybe_await(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


def _jsonable(value: Any) -> Any:
    return to_jsonable_python(value, fallback=str)
