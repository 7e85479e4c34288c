"""The tool-calling loop: ReAct's, and Predict's when it has tools (run every call, answer, repeat).

Each turn sends the conversation with the tools attached (native tool
calling). Every tool call of the reply is run — the calls of one turn
concurrently — and its result, or its error explained, goes back to the
model as a ``tool`` message. The loop ends when the model replies without
tool calls, or when its turns run out; what the module does then (ReAct's
extraction call, Predict's last turn without tools) is the module's own.

This is the one place where a model's tool calls run, so approvals behave
the same in every module that calls tools: a tool that needs a person's
confirmation pauses the loop with a `ConfirmationRequired` that holds the
run (as JSON data in its ``context``) and is sealed for the module
(`agent_identity`); the next call's ``resume_state=`` is claimed through
`plait.confirmation.claim_resume` and the run goes on from where it
stopped, without asking the model again for the steps already taken.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from plait.backends.types import Message, ToolCall, Usage, message_from_dict, message_to_dict
from plait.confirmation import (
    ConfirmationRequired,
    ResumeState,
    approved,
    as_json_data,
    claim_resume,
    rejection,
)
from plait.errors import ReplyCutOffError, ResumeRefusedError, StructuredOutputError
from plait.media import Audio, File, Image, Media
from plait.modules._wrapping import bind_signature_inputs
from plait.modules.predict import record_system
from plait.modules.prediction import Prediction
from plait.modules.traces import module_path
from plait.signatures.signature import Signature
from plait.streaming import ToolCallEvent, ToolResultEvent, emit_event, is_streaming
from plait.tools import Tool, ToolResult, tool_identity
from plait.values import Value, ValueKind

__all__ = ["DECLINE_CHOICES", "ReActPrediction", "ReActStep", "ToolLoop", "ToolRun"]

DECLINE_CHOICES = ("tell_model", "raise")
"""What a module that runs tools does with a person's "no": show it to the model as the
tool's result (the run goes on), or raise `ConfirmationRejected`."""


@dataclass(frozen=True, slots=True)
class ReActStep:
    """One tool call of a tool-calling run."""

    thought: str
    """What the model wrote in the turn that made the call ("" when it only called tools)."""
    tool: str
    """The tool's name, as the model called it."""
    args: Any
    """The arguments: a dict when they were valid JSON, else the text the model sent."""
    result: str
    """What the model was shown: the tool's output, or the error explained."""
    ok: bool = True
    """False when the call failed (bad arguments, unknown tool, the tool raised)."""
    call_id: str = ""
    """The id that pairs the call with its result."""
    turn: int = 0
    """Which model turn made the call (0-based)."""
    error: str | None = None
    """Why the call did not run as asked, as `ToolResult.error` says (e.g. ``"declined"``)."""

    def to_dict(self) -> dict[str, Any]:
        """Returns the step as a JSON-ready dict."""
        return {
            "thought": self.thought,
            "tool": self.tool,
            "args": self.args,
            "result": self.result,
            "ok": self.ok,
            "call_id": self.call_id,
            "turn": self.turn,
            "error": self.error,
        }

    def as_value(self) -> Value:
        """Returns the call's result as ``Value(TOOL_RESULT)``: the text the model was shown.

        The meta says which call it answers (``tool``, ``args``, ``call_id``,
        ``turn``) and how it went (``ok``, ``error``), so code downstream
        reads every tool's result in one shape.
        """
        meta = {k: v for k, v in self.to_dict().items() if k not in ("result", "thought")}
        return Value(ValueKind.TOOL_RESULT, self.result, meta=meta)


class ReActPrediction(Prediction):
    """A `Prediction` that also carries the run's ``trajectory`` (a list of `ReActStep`).

    ``extracted`` says whether the outputs came from a call made after the
    loop (ReAct's extraction, Predict's last turn without tools): the model
    never gave a parseable answer, or its turns ran out.
    """

    __slots__ = ("extracted", "trajectory")

    trajectory: list[ReActStep]
    extracted: bool

    def __init__(
        self,
        outputs: Mapping[str, Any] | None = None,
        /,
        *,
        trajectory: Iterable[ReActStep] = (),
        extracted: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(outputs, **kwargs)
        object.__setattr__(self, "trajectory", list(trajectory))
        object.__setattr__(self, "extracted", extracted)

    def __reduce__(self) -> tuple[Any, ...]:
        state = (self.to_dict(), self.usage, self.raw, self.messages, self.trajectory)
        return (_rebuild, (*state, self.extracted))


def _rebuild(
    outputs: dict[str, Any],
    usage: Usage,
    raw: str,
    messages: tuple[Message, ...],
    trajectory: list[ReActStep],
    extracted: bool,
) -> ReActPrediction:
    return ReActPrediction(
        outputs,
        usage=usage,
        raw=raw,
        messages=messages,
        trajectory=trajectory,
        extracted=extracted,
    )


Ask = Callable[[list[Message], str, dict[str, Any]], Awaitable[Prediction]]
"""One model turn of a module: ``ask(messages, tool_choice, inputs)`` returns its calls
(a non-final `Prediction`) or its outputs; raises `StructuredOutputError` for a reply
that holds neither."""


@dataclass
class ToolLoop:
    """A module's tool-calling loop: its tools, how many turns, and how it treats a "no".

    Args:
        module: the module that runs it (its path names the pauses; it is
            part of what they are sealed with).
        signature: the module's signature (its inputs; part of the seal).
        tools: the module's tools by name.
        max_turns: most model turns.
        first_tool_choice: the first turn's ``tool_choice`` (later turns: ``"auto"``).
        on_decline: one of `DECLINE_CHOICES`.
    """

    module: Any
    signature: type[Signature]
    tools: Mapping[str, Tool]
    max_turns: int
    first_tool_choice: str = "auto"
    on_decline: str = "tell_model"

    def identity(self) -> dict[str, Any]:
        """Returns what a pause of this loop is sealed with, and a resume must match (see
        `agent_identity`)."""
        return agent_identity(self.module, self.signature, self.tools)

    async def run(
        self,
        given: dict[str, Any] | None,
        *,
        label: str,
        start: Callable[[dict[str, Any]], Sequence[Message]],
        ask: Ask,
    ) -> ToolRun:
        """Runs the loop to its end, or to a pause; returns the run.

        Args:
            given: the call's inputs by field name, or None when it was given
                none (a resume then takes the paused ones).
            label: how errors name the module.
            start: the conversation that starts a run, from its inputs.
            ask: the module's model turn.

        Returns:
            The run; its ``final`` is the turn that answered (a final
            `Prediction`), the `StructuredOutputError` of a reply that held
            neither calls nor outputs, or None when the turns ran out.

        Raises:
            ReplyCutOffError: a turn's reply (a tool call, or the answer) was
                cut off at its token limit; the run stops at that turn.
            ConfirmationRequired: a tool call waits for a person's approval.
            ConfirmationRejected: the person declined it and ``on_decline`` is ``"raise"``.
            ResumeRefusedError: the resume state was changed, forged, made by
                another module or for other inputs, or already used.
        """
        path = module_path(self.module)
        resume = claim_resume(path, agent=self.identity, inputs=given)
        if given is not None:
            values = given
        else:  # a resume without inputs takes the paused ones
            paused = resume.exception.context.get("inputs") if resume is not None else None
            values = bind_signature_inputs(self.signature, (), dict(paused or {}), label)
        run = ToolRun.restore(resume.exception.context) if resume is not None else None
        run = run or ToolRun.start(tuple(start(values)))
        run.values = values
        while run.turn < self.max_turns:
            if run.pending is None:
                choice = self.first_tool_choice if run.turn == 0 else "auto"
                try:
                    step = await ask(run.messages, choice, values)
                except ReplyCutOffError:  # nothing of it can be used: this step fails
                    raise
                except StructuredOutputError as unusable:  # the module decides what follows
                    run.usage += unusable.usage
                    run.final = unusable
                    return run
                run.usage += step.usage
                if step.is_final:
                    run.final = step
                    return run
                calls = _with_ids(step.native_tool_calls, run.turn)
                run.messages.append(Message("assistant", step.raw, tool_calls=calls))
                run.pending = _Turn(step.raw, calls)
            await self._run_turn(run, path, resume)
            resume = None  # answered: later pauses are new ones
            run.turn += 1
        return run

    async def _run_turn(self, run: ToolRun, path: str, resume: ResumeState | None) -> None:
        """Runs the pending turn's tool calls (concurrently); pauses if one needs approval.

        When the turn resumes, the call the person answered runs as they
        decided (with the arguments they chose, recorded as what ran), or,
        declined with ``on_decline="raise"``, nothing runs.
        """
        turn = run.pending
        assert turn is not None
        if resume is not None:
            decision, reason = resume.decision
            if decision == "decline" and self.on_decline == "raise":
                raise rejection(resume.exception, reason)
            turn.calls = _as_answered(turn.calls, resume)
        todo = [call for call in turn.calls if call.id not in turn.results]
        outcomes = await asyncio.gather(
            *(self._run_tool(call, path, resume, run.trajectory) for call in todo),
            return_exceptions=True,
        )
        pause: ConfirmationRequired | None = None
        for call, outcome in zip(todo, outcomes, strict=True):
            if isinstance(outcome, ConfirmationRequired):
                pause = pause or outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                turn.results[call.id] = outcome
        if pause is not None:
            await self._pause(run, path, pause)
        for call in turn.calls:
            result = turn.results[call.id]
            run.trajectory.append(_step(turn.thought, call, result, run.turn))
            run.messages.append(result.to_message())
        shown = _media_turn([turn.results[call.id] for call in turn.calls])
        if shown is not None:
            run.messages.append(shown)
        run.pending = None

    async def _pause(self, run: ToolRun, path: str, pause: ConfirmationRequired) -> None:
        """Keeps the run in the pause, seals it and raises it (streamed first, non-final)."""
        pause.context.update(run.to_dict(path))
        pause.seal_for(self.identity())
        if is_streaming():
            await emit_event(
                ReActPrediction(
                    usage=run.usage,
                    messages=tuple(run.messages),
                    trajectory=run.trajectory,
                    native_tool_calls=run.pending.calls if run.pending else (),
                    is_final=False,
                    confirmation=pause,
                )
            )
        raise pause

    async def _run_tool(
        self,
        call: ToolCall,
        path: str,
        resume: ResumeState | None,
        earlier: list[ReActStep],
    ) -> ToolResult:
        """Runs one call (as the person decided, when it is the paused one); never raises.

        An unknown tool is an error result, like any failed call; a call that
        needs approval raises `ConfirmationRequired` (collected by the turn),
        unless the person already answered the same call in an ``earlier``
        turn (`_answered_before`).
        """
        arguments = _arguments_of(call)
        await emit_event(ToolCallEvent(self.module, call.name, arguments, call.id, path))
        found = self.tools.get(call.name)
        if found is None:
            known = ", ".join(self.tools) or "none"
            result = ToolResult(
                call.name,
                f"Error: there is no tool named '{call.name}'; the tools are: {known}",
                ok=False,
                error="unknown_tool",
                call_id=call.id,
            )
        elif resume is not None and resume.exception.confirmation_id == call.id:
            result = await _as_decided(found, call, resume)
        elif (answered := _answered_before(found, call, earlier)) is not None:
            result = answered
        else:
            result = await found.call(call.arguments, call_id=call.id)
        await emit_event(
            ToolResultEvent(
                self.module, call.name, result.content, result.ok, call.id, path, result.error
            )
        )
        return result


def agent_identity(
    module: Any, signature: type[Signature], tools: Mapping[str, Tool]
) -> dict[str, Any]:
    """Returns what a pause of a tool-calling module is sealed with, and a resume must match.

    The class, the signature, and each tool's name, argument schema and
    function: a module that would run something else under the same tool
    name (another function, other arguments) cannot resume the pause. The
    instructions are left out: learning may change them meanwhile.
    """
    cls = type(module)
    return {
        "module": f"{cls.__module__}.{cls.__qualname__}",
        "signature": signature.signature_text(),
        "tools": [tool_identity(t) for t in tools.values()],
    }


# ------------------------------------------------------------------ the run
@dataclass
class _Turn:
    """A model turn whose tool calls are being run; ``results`` holds those done so far."""

    thought: str
    calls: tuple[ToolCall, ...]
    results: dict[str, ToolResult] = field(default_factory=dict)


@dataclass
class ToolRun:
    """Where a tool-calling run is: its conversation, trajectory, usage, turn and pending calls.

    It is what a pause keeps (as JSON data in the exception's ``context``) and
    a resume restores, so no step already taken is asked of the model again.
    """

    messages: list[Message]
    first_new: int
    trajectory: list[ReActStep] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    turn: int = 0
    pending: _Turn | None = None
    values: dict[str, Any] = field(default_factory=dict)
    """The run's inputs by field name (kept in a pause as ``inputs``)."""
    final: Any = None
    """How the loop ended (see `ToolLoop.run`); not kept in a pause."""

    @classmethod
    def start(cls, messages: Sequence[Message]) -> ToolRun:
        # the inputs turn is the first message this run adds (to a History)
        return cls(list(messages), first_new=len(messages) - 1)

    def prediction(self, outputs: Prediction, *, extracted: bool = False) -> ReActPrediction:
        """Returns ``outputs`` as the run's result, with its usage, conversation and trajectory."""
        return ReActPrediction(
            outputs.to_dict(),
            usage=self.usage,
            raw=outputs.raw,
            messages=tuple(self.messages),
            trajectory=self.trajectory,
            extracted=extracted,
        )

    def extend_history(self, history: Any, final_text: str) -> None:
        """Appends the run's turns and its final answer to a History-like object."""
        extend = getattr(history, "extend", None)
        if history is None or not hasattr(history, "messages") or not callable(extend):
            return
        extend([*self.messages[self.first_new :], Message("assistant", final_text)])
        record_system(history, self.messages)

    def to_dict(self, path: str) -> dict[str, Any]:
        pending = self.pending
        return {
            "module": path,
            "inputs": as_json_data(self.values),
            "messages": [_paused_message_dict(m) for m in self.messages],
            "first_new": self.first_new,
            "trajectory": [step.to_dict() for step in self.trajectory],
            "usage": dataclasses.asdict(self.usage),  # a state saved before has no "cached"
            "turn": self.turn,
            "pending": None
            if pending is None
            else {
                "thought": pending.thought,
                "calls": [_call_dict(call) for call in pending.calls],
                "results": {key: _result_dict(r) for key, r in pending.results.items()},
            },
        }

    @classmethod
    def restore(cls, data: dict[str, Any]) -> ToolRun:
        """Rebuilds a run from `to_dict` data (raises ResumeRefusedError naming what is wrong)."""
        try:
            pending = data.get("pending")
            turn = None
            if pending is not None:
                calls = tuple(
                    ToolCall(c["id"], c["name"], c["arguments"]) for c in pending["calls"]
                )
                results = {
                    k: ToolResult(**{**r, "media": _media_of(r.get("media", ()))})
                    for k, r in pending["results"].items()
                }
                turn = _Turn(pending["thought"], calls, results)
            return cls(
                messages=[_paused_message(m) for m in data["messages"]],
                first_new=int(data["first_new"]),
                trajectory=[ReActStep(**step) for step in data["trajectory"]],
                usage=Usage(**data["usage"]),
                turn=int(data["turn"]),
                pending=turn,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeRefusedError(f"the paused run cannot be resumed: {exc!r}") from None


# ------------------------------------------------------------------ helpers
def _with_ids(calls: tuple[ToolCall, ...], turn: int) -> tuple[ToolCall, ...]:
    """Returns the calls with an id each, no two alike.

    Results pair with calls by id, and a person's answer names its call by
    id: a provider may omit ids, or give two calls one id, and then those
    calls get fresh ones, so every call needing approval is asked about.
    """
    seen: set[str] = set()
    unique = []
    for i, call in enumerate(calls):
        call_id = call.id or f"call_{turn}_{i}"
        while call_id in seen:
            call_id = f"{call_id}_{i}"
        seen.add(call_id)
        unique.append(call if call_id == call.id else ToolCall(call_id, call.name, call.arguments))
    return tuple(unique)


def _as_answered(calls: tuple[ToolCall, ...], resume: ResumeState) -> tuple[ToolCall, ...]:
    """Returns the pending calls with the paused one carrying the person's edited arguments."""
    decision, edited = resume.decision
    if decision != "edit":
        return calls
    paused = resume.exception.confirmation_id
    arguments = json.dumps(as_json_data(edited), ensure_ascii=False)
    return tuple(
        ToolCall(call.id, call.name, arguments) if call.id == paused else call for call in calls
    )


def _arguments_of(call: ToolCall) -> Any:
    """Returns a call's arguments as a dict when they are valid JSON, else as the model's text."""
    try:
        return orjson.loads(call.arguments) if call.arguments.strip() else {}
    except orjson.JSONDecodeError:
        return call.arguments


async def _as_decided(tool: Tool, call: ToolCall, resume: ResumeState) -> ToolResult:
    """Runs (or not) the call a person was asked about, as they decided.

    ``call`` already carries edited arguments (`_as_answered`); the model is
    told that the person changed them, so it reads the result rightly.
    """
    decision, detail = resume.decision
    if decision == "decline":
        because = f" Their reason: {detail}" if detail else ""
        return ToolResult(
            call.name,
            f"The user declined to run the tool '{call.name}' with these arguments.{because} "
            "Do not run it again unless they ask; answer with what you have.",
            ok=False,
            error="declined",
            call_id=call.id,
        )
    with approved(call.id):
        result = await tool.call(call.arguments, call_id=call.id)
    if decision != "edit":
        return result
    note = f"The user changed the arguments of this call to {call.arguments}. "
    return dataclasses.replace(result, content=note + result.content)


def _answered_before(tool: Tool, call: ToolCall, earlier: list[ReActStep]) -> ToolResult | None:
    """Returns the result of a call the person already answered in this run; None otherwise.

    Models (small ones often) make again the call whose result they just
    read. Asking the person about it again would run an approved side effect
    twice, or press them about one they declined; so the same tool with the
    same arguments, when it needs approval and the person already approved
    (and it ran) or declined it, is neither asked about nor run, and the
    model is told so.
    """
    if not tool.require_confirmation:
        return None
    arguments = _arguments_of(call)
    for step in earlier:
        if step.tool != call.name or step.args != arguments:
            continue
        if step.ok:
            told = (
                "Not run again: this exact call already ran in this task, approved by the "
                "user. Do not call it again; answer with what you have. It returned: "
                f"{step.result}"
            )
        elif step.error == "declined":
            told = (
                "Not run: the user already declined this exact call in this task. Do not "
                "call it again; answer with what you have."
            )
        else:
            continue
        return ToolResult(call.name, told, ok=False, error="repeated", call_id=call.id)
    return None


def _step(thought: str, call: ToolCall, result: ToolResult, turn: int) -> ReActStep:
    return ReActStep(
        thought=thought,
        tool=call.name,
        args=_arguments_of(call),
        result=result.content,
        ok=result.ok,
        call_id=call.id,
        turn=turn,
        error=result.error,
    )


def _call_dict(call: ToolCall) -> dict[str, str]:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}


def _result_dict(result: ToolResult) -> dict[str, Any]:
    return {
        "name": result.name,
        "content": result.content,
        "ok": result.ok,
        "error": result.error,
        "call_id": result.call_id,
        "media": [_media_dict(item) for item in result.media],
    }


def _media_turn(results: list[ToolResult]) -> Message | None:
    """The user turn that shows the model the media its tools returned (None without any).

    Providers take images, audio and documents only in a user's turn, so the
    tool answers name them and this turn, right after, carries them.
    """
    parts: list[Any] = []
    for result in results:
        if result.media:
            kinds = {item.kind for item in result.media}
            what = next(iter(kinds)) if len(kinds) == 1 else "item"
            what = what if len(result.media) == 1 else f"{what}s"
            parts.append(f"The {what} returned by tool {result.name!r}:")
            parts.extend(result.media)
    return Message("user", parts=tuple(parts)) if parts else None


def _media_dict(item: Any) -> dict[str, Any]:
    """A medium as JSON inside a paused state: its kind and its bytes as a data URI."""
    return {"type": "media", "kind": item.kind, "uri": item.data_uri()}


def _media_of(data: Any) -> tuple[Any, ...]:
    """The media a paused state holds, read back (their formats read from the bytes again)."""
    kinds: dict[Any, type[Media]] = {"image": Image, "audio": Audio, "file": File}
    items = []
    for item in data:
        kind = kinds.get(item.get("kind")) if isinstance(item, dict) else None
        if kind is None or not isinstance(item.get("uri"), str):
            raise ValueError(f"a paused medium must be {{'kind', 'uri'}}, got {item!r:.80}")
        items.append(kind(item["uri"]))
    return tuple(items)


def _paused_message_dict(message: Message) -> dict[str, Any]:
    data = message_to_dict(message)
    if message.parts:
        data["content"] = [
            {"type": "text", "text": part} if isinstance(part, str) else _media_dict(part)
            for part in message.parts
        ]
    return data


def _paused_message(data: Any) -> Message:
    content = data.get("content") if isinstance(data, dict) else None
    if isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") == "media" for part in content
    ):
        parts = tuple(
            _media_of([part])[0] if part.get("type") == "media" else str(part.get("text", ""))
            for part in content
        )
        if data.get("role") != "user":  # a run's media are shown in a user's turn only
            raise ValueError(f"a paused {data.get('role')!r} turn cannot hold media")
        return Message("user", parts=parts)
    return message_from_dict(data, "paused message")
