"""Modules of your own that pause for a person and resume with the answer.

A module whose ``async def forward`` takes ``resume_state=`` is one that can
pause: a tool it calls (or its own code) raises `ConfirmationRequired`, the
module may add what it needs to the pause's ``context``, and the pause
reaches the caller. The next call's ``resume_state=`` then reaches the
module's ``forward``, which decides what to do (for instance, carry on
from the state it saved, given the person's answer)::

    class Cleanup(Module):
        async def forward(self, *, resume_state=None, **inputs):
            if resume_state:
                return await self.aresume(
                    user_response=resume_state.user_response,
                    saved_state=resume_state.exception.context,
                )
            try:
                return await self.do_work(**inputs)
            except ConfirmationRequired as e:
                e.context["saved_data"] = self.saved
                raise

plait keeps the guarantees ReAct keeps (`plait.confirmation`): a pause that
leaves such a module is sealed for it (its class and its tools) with its
path and inputs, so an edited, forged, replayed or foreign resume state is
refused before ``forward`` runs, and each approval is used once. While the
resumed call runs, the paused call is the person's to decide: a "yes" runs
it (once), edited arguments run instead, a "no" makes it raise
`ConfirmationRejected` (`plait.confirmation.confirm_call`).

`Module` calls into this module (`run_resumable`, `resume_call`) only for
such modules, and for calls given ``resume_state=`` directly.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Coroutine, Mapping
from typing import Any

from plait.backends.types import ToolCall
from plait.confirmation import (
    ConfirmationRequired,
    answering,
    as_json_data,
    claim_resume,
    offering,
)
from plait.errors import PlaitError, ResumeRefusedError
from plait.module import call_forward
from plait.modules.prediction import Prediction
from plait.modules.traces import module_path
from plait.streaming import emit_event, is_streaming
from plait.tools import Tool, tool_identity

__all__ = ["module_identity", "resume_call", "run_resumable"]


async def run_resumable(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Runs the ``async def forward`` of a module that takes ``resume_state=``.

    The module's pending resume state (offered by the run, or by
    `resume_call`) is claimed, checked and used up first, and passed as
    ``resume_state=`` (None when there is none); a call without inputs then
    gets the paused ones. A `ConfirmationRequired` that leaves ``forward``
    unsealed is made this module's: it keeps the module's path and inputs,
    is sealed for the module, and (under ``astream``) is shown first as a
    non-final `Prediction`.

    Raises:
        ResumeRefusedError: the resume state was changed, forged, made by
            another module or for other inputs, or already used.
        PlaitError: the module changed the context of a pause that a module
            inside it had sealed (that module resumes it).
    """
    path = module_path(module)
    given = _named_inputs(module.forward, args, kwargs)
    state = claim_resume(path, agent=lambda: module_identity(module), inputs=given)
    if state is not None and given is None:
        kwargs = dict(state.exception.context.get("inputs") or {})
    try:
        with answering(state):
            return await module.forward(*args, resume_state=state, **kwargs)
    except ConfirmationRequired as pause:
        await _make_own(pause, module, path, given if given is not None else kwargs)
        raise


def resume_call(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Calls ``module`` with the ``resume_state=`` given to this call itself (no run offered it).

    A direct call (a module without resources) or a child called as
    ``child(x, resume_state=state)`` gets here: the state is offered to the
    modules of this call as a run offers it, and the call fails when none of
    them took it. ``resume_state=None`` (the first pass of a caller's loop)
    is a call with nothing to resume.
    """
    kwargs = dict(kwargs)
    state = kwargs.pop("resume_state")
    if state is None:
        return call_forward(module, args, kwargs)
    if inspect.iscoroutinefunction(type(module).forward):
        return _offered(state, call_forward(module, args, kwargs))
    with offering(state):
        return call_forward(module, args, kwargs)


async def _offered(state: Any, work: Coroutine[Any, Any, Any]) -> Any:
    with offering(state):
        return await work


def module_identity(module: Any) -> dict[str, Any]:
    """Returns what a custom module's pauses are sealed with, and its resume must match.

    Its class, and the name, function and argument schema of each tool it
    holds as an attribute: a module that would run something else under the
    same path cannot resume the pause.
    """
    cls = type(module)
    tools = [tool_identity(t) for t in vars(module).values() if isinstance(t, Tool)]
    return {
        "module": f"{cls.__module__}.{cls.__qualname__}",
        "tools": sorted(tools, key=lambda t: t["name"]),
    }


def _named_inputs(
    forward: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Returns a call's inputs by name (None when it was given none), as a pause keeps them.

    Inputs gathered by ``**kwargs`` are kept by their own names, so a resume
    without inputs can pass them back by keyword.
    """
    if not args and not kwargs:
        return None
    try:
        bound = inspect.signature(forward).bind(*args, **kwargs)
    except TypeError:  # forward itself will say what is wrong with the call
        return {"args": list(args), **kwargs}
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if bound.signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


async def _make_own(
    pause: ConfirmationRequired, module: Any, path: str, inputs: Mapping[str, Any]
) -> None:
    """Seals a pause that leaves ``module`` for it, unless a module inside it sealed it first."""
    if pause.seal is not None:  # a module inside (a ReAct) paused: it resumes its own pause
        try:
            pause.check_seal()
        except ResumeRefusedError:
            raise PlaitError(
                f"module {path!r} changed the context of a pause that module "
                f"{pause.context.get('module')!r} made and sealed; that module resumes it, so "
                f"keep {path!r}'s own state out of the pause (in the module itself)"
            ) from None
        return
    pause.context["module"] = path
    pause.context["inputs"] = as_json_data(dict(inputs))
    pause.seal_for(module_identity(module))
    if is_streaming():
        await emit_event(_non_final(pause))


def _non_final(pause: ConfirmationRequired) -> Prediction:
    """Returns the pause as the non-final `Prediction` an ``astream`` consumer sees last."""
    calls: tuple[ToolCall, ...] = ()
    if pause.tool_name is not None:
        arguments = as_json_data(pause.arguments)
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls = (ToolCall(pause.confirmation_id, pause.tool_name, arguments),)
    return Prediction(native_tool_calls=calls, is_final=False, confirmation=pause)
