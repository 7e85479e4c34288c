"""ReAct: an agent that calls tools in a loop until it can answer a signature.

Each turn sends the conversation with the tools attached (native tool
calling, ``tool_choice="auto"``). Every tool call of the reply is run — the
calls of one turn concurrently — and its result, or its error explained,
goes back to the model as a ``tool`` message. The loop ends when the model
replies without tool calls; that reply is parsed into the signature's
outputs. When it does not parse, or after ``max_iters`` turns, one last
*extraction* call (a `Predict` over the inputs plus the trajectory, with the
outputs' JSON schema and no tools) must produce them.

A call that needs a person's approval pauses the run (see `forward`). The
person is asked about a call once in a run: when a later turn repeats a call
they approved or declined (same tool, same arguments), the model is told so
instead of the call being run or asked about again.

Everything goes through the run's resources (`plait.execution.generate`),
and every call is recorded in `Module.traces`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from plait import _context
from plait.backends.types import (
    Message,
    Request,
    SamplingOptions,
    ToolCall,
    Usage,
    message_from_dict,
    message_to_dict,
)
from plait.confirmation import (
    ConfirmationRequired,
    ResumeState,
    approved,
    as_json_data,
    claim_resume,
)
from plait.errors import ResumeRefusedError, StructuredOutputError
from plait.module import Module
from plait.modules._wrapping import bind_signature_inputs
from plait.modules.predict import Predict, ask_step, history_messages, record_system
from plait.modules.prediction import Prediction
from plait.modules.traces import module_path
from plait.parameter import Parameter
from plait.signatures.adapters import Adapter, JSONAdapter, format_value
from plait.signatures.signature import InputField, Signature, as_signature
from plait.streaming import (
    FieldStreamer,
    ToolCallEvent,
    ToolResultEvent,
    emit_event,
    is_streaming,
    whole_text,
)
from plait.tools import Tool, ToolResult, tool_table

__all__ = ["ReAct", "ReActPrediction", "ReActStep"]

TOOL_GUIDANCE = (
    "You can call the tools you are given to look things up or act. Call them as often as "
    "useful, several at once when they do not depend on each other. A tool result that starts "
    "with 'Error:' explains what went wrong: fix the call and try again. When you have what "
    "you need, stop calling tools and reply with the final answer."
)
"""Appended to the signature's instructions to make ReAct's default instructions."""

EXTRACT_INSTRUCTIONS = (
    "The trajectory lists the tool calls an agent made for this task and their results. "
    "Using it, produce the final outputs."
)
"""Appended to the signature's instructions for the final extraction call."""


@dataclass(frozen=True, slots=True)
class ReActStep:
    """One tool call of a ReAct run."""

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


class ReActPrediction(Prediction):
    """A `Prediction` that also carries the agent's ``trajectory`` (a list of `ReActStep`).

    ``extracted`` says whether the outputs came from the final extraction call
    (the model never gave a parseable answer, or ``max_iters`` was reached).
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


class ReAct(Module):
    """Answers a signature by calling tools in a loop (native tool calling).

    Args:
        signature: a `Signature` subclass or a string like ``"question -> answer"``.
        tools: `Tool` objects or plain functions (wrapped with `Tool`).
        alias: the resource alias of the agent's calls and of the extraction.
        max_iters: most model turns in the loop; after that the extraction
            call answers from what was gathered.
        first_tool_choice: ``"auto"`` (the model decides), ``"required"`` (the
            first turn must call a tool; later turns decide) or a tool's name
            (the first turn calls that tool). Small models that rarely call a
            tool on their own still act when the task is known to need one.
        adapter: how messages are written and replies parsed (default `JSONAdapter`).
        temperature: sampling temperature of every call (None: the provider's default).
        max_tokens: cap on generated tokens per call.

    Learnable parameters: ``instructions`` (the agent's system instructions,
    tool guidance included), and the extraction step's ``extract.instructions``
    and ``extract.demos``.

    ``forward(**inputs, history=None)`` returns a `ReActPrediction` with the
    outputs, ``.trajectory`` (one `ReActStep` per tool call) and usage of all
    calls. With a `plait.History`, the run's turns (tool calls included) are
    appended to it.

    Example::

        @tool
        def population(city: str) -> int:
            \"\"\"Returns the population of a city.\"\"\"
            return {"Paris": 2_100_000}.get(city, 0)

        agent = ReAct("question -> answer: int", tools=[population]).bind(config)
        pred = await agent(question="How many people live in Paris?")
        pred.answer, [step.tool for step in pred.trajectory]
    """

    def __init__(
        self,
        signature: type[Signature] | str,
        tools: Iterable[Tool | Callable[..., Any]],
        *,
        alias: str = "llm",
        max_iters: int = 5,
        first_tool_choice: str = "auto",
        adapter: Adapter | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        super().__init__()
        sig = as_signature(signature)
        if not isinstance(max_iters, int) or max_iters < 1:
            raise ValueError(f"ReAct needs max_iters >= 1, got {max_iters!r}")
        self.signature = sig
        self.tools = tool_table(tools)
        self.alias = alias
        self.max_iters = max_iters
        if first_tool_choice not in ("auto", "required", *self.tools):
            known = ", ".join(["'auto'", "'required'", *map(repr, self.tools)])
            raise ValueError(
                f"ReAct first_tool_choice must be one of {known}, got {first_tool_choice!r}"
            )
        self.first_tool_choice = first_tool_choice
        self.adapter = JSONAdapter() if adapter is None else adapter
        self.temperature = temperature
        self.max_tokens = max_tokens
        task = sig.instructions
        self.instructions = Parameter(
            f"{task}\n\n{TOOL_GUIDANCE}" if task else TOOL_GUIDANCE,
            description=(
                f"Instructions of the tool-using agent for `{sig.signature_text()}`: the task, "
                "and when and how to use the tools."
            ),
        )
        trajectory = InputField("The tool calls made so far and their results.")
        extract_sig = sig.append("trajectory", trajectory).with_instructions(
            f"{task}\n\n{EXTRACT_INSTRUCTIONS}" if task else EXTRACT_INSTRUCTIONS
        )
        self.extract = Predict(
            extract_sig,
            alias=alias,
            adapter=self.adapter,
            temperature=temperature,
            max_tokens=max_tokens,
        )
        self._call_signature: tuple[str, type[Signature]] | None = None

    # ---------------------------------------------------------------- forward
    async def forward(self, *args: Any, history: Any = None, **inputs: Any) -> ReActPrediction:
        """Runs the agent on the signature's inputs (by keyword; one positional if one input).

        A tool that needs a person's confirmation pauses the run: it raises
        `ConfirmationRequired` whose ``context`` holds the trajectory (as
        JSON data), sealed for this agent; calling the agent again with
        ``resume_state=`` (and the same inputs, or none) continues from there.
        Under ``astream`` the pause is first shown as a non-final
        `ReActPrediction`.

        Raises:
            TypeError: inputs are missing or unknown.
            ConfirmationRequired: a tool call waits for a person's approval.
            ResumeRefusedError: the resume state was changed, forged, made by
                another agent or for other inputs, or already used.
            StructuredOutputError: the extraction reply stayed invalid after one re-ask.
            BackendError: a model call failed after the resource layer's retries.
        """
        label = f"ReAct ({self.signature.signature_text()})"
        path = module_path(self)
        given = None
        if args or inputs:
            given = bind_signature_inputs(self.signature, args, inputs, label)
        resume = claim_resume(path, agent=self._approval_identity, inputs=given)
        if given is not None:
            values = given
        else:  # a resume without inputs takes the paused ones
            paused = resume.exception.context.get("inputs") if resume is not None else None
            values = bind_signature_inputs(self.signature, (), dict(paused or {}), label)
        sig = self._current_signature()
        run = (
            _Run.restore(resume.exception.context)
            if resume is not None
            else _Run.start(self.adapter.format(sig, values, history=history_messages(history)))
        )
        specs = tuple(t.spec for t in self.tools.values())
        final: Prediction | str | None = None
        while run.turn < self.max_iters:
            if run.pending is None:
                choice = self.first_tool_choice if run.turn == 0 else "auto"
                try:
                    step = await self._step(self._request(run.messages, specs, choice), values, sig)
                except StructuredOutputError as unusable:  # the extraction call shapes it
                    run.usage.add(unusable.usage)
                    final = unusable.raw
                    break
                run.usage.add(step.usage)
                if step.is_final:
                    final = step
                    break
                calls = _with_ids(step.native_tool_calls, run.turn)
                run.messages.append(Message("assistant", step.raw, tool_calls=calls))
                run.pending = _Turn(step.raw, calls)
            await self._run_turn(run, path, values, resume)
            resume = None  # answered: later pauses are new ones
            run.turn += 1
        prediction = await self._finish(values, final, run.trajectory, run.messages, run.usage)
        _extend_history(history, run.messages[run.first_new :], prediction.raw, run.messages)
        return prediction

    async def _run_turn(
        self, run: _Run, path: str, values: dict[str, Any], resume: ResumeState | None
    ) -> None:
        """Runs the pending turn's tool calls (concurrently); pauses if one needs approval.

        When the turn resumes, the call the person answered runs as they
        decided (with the arguments they chose, recorded as what ran).
        """
        turn = run.pending
        assert turn is not None
        if resume is not None:
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
            await self._pause(run, path, values, pause)
        for call in turn.calls:
            result = turn.results[call.id]
            run.trajectory.append(_step(turn.thought, call, result, run.turn))
            run.messages.append(result.to_message())
        run.pending = None

    async def _pause(
        self, run: _Run, path: str, values: dict[str, Any], pause: ConfirmationRequired
    ) -> None:
        """Keeps the run in the pause, seals it and raises it (streamed first, non-final)."""
        pause.context.update(run.to_dict(path, values))
        pause.seal_for(self._approval_identity())
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

    async def _finish(
        self,
        values: dict[str, Any],
        final: Prediction | str | None,
        trajectory: list[ReActStep],
        messages: list[Message],
        usage: Usage,
    ) -> ReActPrediction:
        """Returns the outputs: from the final turn, or from the extraction call.

        ``final`` is the last turn's outputs, or its text when it held none in
        shape (the extraction call shapes it), or None when the turns ran out.
        """
        if isinstance(final, Prediction):
            return ReActPrediction(
                final.to_dict(),
                usage=usage,
                raw=final.raw,
                messages=tuple(messages),
                trajectory=trajectory,
            )
        text = render_trajectory(trajectory, final)
        extracted = await self.extract(**values, trajectory=text)
        usage.add(extracted.usage)
        return ReActPrediction(
            extracted.to_dict(),
            usage=usage,
            raw=extracted.raw,
            messages=tuple(messages),
            trajectory=trajectory,
            extracted=True,
        )

    # ---------------------------------------------------------------- helpers
    def _request(
        self, messages: list[Message], specs: tuple[Any, ...], tool_choice: str = "auto"
    ) -> Request:
        return Request(
            messages=tuple(messages),
            options=SamplingOptions(temperature=self.temperature, max_tokens=self.max_tokens),
            tools=specs,
            tool_choice=tool_choice,
            rollout_id=_context.ROLLOUT.get(),
        )

    async def _step(
        self, request: Request, inputs: dict[str, Any], sig: type[Signature]
    ) -> Prediction:
        """Makes one turn with `Predict`'s one step: tool calls (non-final), or the outputs.

        The turn's text streams per output field when a consumer streams (the
        final answer's fields).

        Raises:
            StructuredOutputError: the final reply held no valid outputs even
                after the re-ask (its ``raw`` text goes to the extraction call).
        """
        sink = None
        if is_streaming():
            split = getattr(self.adapter, "stream_fields", None)
            sink = FieldStreamer(module_path(self), split or whole_text("text"))
        return await ask_step(
            self,
            request,
            inputs,
            lambda response: self.adapter.parse(sig, response),
            fields=tuple(sig.output_fields),
            label=f"ReAct ({sig.signature_text()})",
            sink=sink,
            reasks=0,  # an answer out of shape goes to the extraction call, which shapes it
        )

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
        await emit_event(ToolCallEvent(path, call.name, arguments, call.id))
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
        await emit_event(ToolResultEvent(path, call.name, result.content, result.ok, call.id))
        return result

    def _approval_identity(self) -> dict[str, Any]:
        """Returns what a pause of this agent is sealed with, and a resume must match.

        The class, the signature, and each tool's name, argument schema and
        function: an agent that would run something else under the same tool
        name (another function, other arguments) cannot resume the pause.
        The instructions are left out: learning may change them meanwhile.
        """
        return {
            "module": f"{type(self).__module__}.{type(self).__qualname__}",
            "signature": self.signature.signature_text(),
            "tools": [
                {"name": name, "function": _qualified_name(t.func), "schema": t.spec.parameters}
                for name, t in self.tools.items()
            ],
        }

    def _current_signature(self) -> type[Signature]:
        text = str(self.instructions.value)
        cached = self._call_signature
        if cached is None or cached[0] != text:
            cached = (text, self.signature.with_instructions(text))
            self._call_signature = cached
        return cached[1]

    def extra_repr(self) -> str:
        return (
            f"{self.signature!r}, tools=[{', '.join(self.tools)}], alias={self.alias!r}, "
            f"max_iters={self.max_iters}"
        )


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


def _qualified_name(func: Any) -> str:
    """Returns ``module.qualname`` of a tool's function (of its class for a callable object)."""
    named = func if hasattr(func, "__qualname__") else type(func)
    return f"{getattr(named, '__module__', '?')}.{named.__qualname__}"


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
        return ToolResult(
            call.name,
            told,
            ok=False,
            error="repeated",
            call_id=call.id,
        )
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


@dataclass
class _Turn:
    """A model turn whose tool calls are being run; ``results`` holds those done so far."""

    thought: str
    calls: tuple[ToolCall, ...]
    results: dict[str, ToolResult] = field(default_factory=dict)


@dataclass
class _Run:
    """Where a ReAct run is: its conversation, trajectory, usage, turn and pending calls.

    It is what a pause keeps (as JSON data in the exception's ``context``) and
    a resume restores, so no step already taken is asked of the model again.
    """

    messages: list[Message]
    first_new: int
    trajectory: list[ReActStep] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    turn: int = 0
    pending: _Turn | None = None

    @classmethod
    def start(cls, messages: tuple[Message, ...]) -> _Run:
        # the inputs turn is the first message this run adds (to a History)
        return cls(list(messages), first_new=len(messages) - 1)

    def to_dict(self, path: str, values: dict[str, Any]) -> dict[str, Any]:
        pending = self.pending
        return {
            "module": path,
            "inputs": as_json_data(values),
            "messages": [message_to_dict(m) for m in self.messages],
            "first_new": self.first_new,
            "trajectory": [step.to_dict() for step in self.trajectory],
            "usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
                "cost": self.usage.cost,
            },
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
    def restore(cls, data: dict[str, Any]) -> _Run:
        """Rebuilds a run from `to_dict` data (raises ResumeRefusedError naming what is wrong)."""
        try:
            pending = data.get("pending")
            turn = None
            if pending is not None:
                calls = tuple(
                    ToolCall(c["id"], c["name"], c["arguments"]) for c in pending["calls"]
                )
                results = {k: ToolResult(**r) for k, r in pending["results"].items()}
                turn = _Turn(pending["thought"], calls, results)
            return cls(
                messages=[message_from_dict(m, "paused message") for m in data["messages"]],
                first_new=int(data["first_new"]),
                trajectory=[ReActStep(**step) for step in data["trajectory"]],
                usage=Usage(**data["usage"]),
                turn=int(data["turn"]),
                pending=turn,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeRefusedError(f"the paused ReAct state cannot be resumed: {exc!r}") from None


def _call_dict(call: ToolCall) -> dict[str, str]:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}


def _result_dict(result: ToolResult) -> dict[str, Any]:
    return {
        "name": result.name,
        "content": result.content,
        "ok": result.ok,
        "error": result.error,
        "call_id": result.call_id,
    }


def render_trajectory(steps: list[ReActStep], final_text: str | None = None) -> str:
    """Returns the trajectory as text for the extraction call."""
    lines = []
    for i, step in enumerate(steps, 1):
        if step.thought and (i == 1 or steps[i - 2].turn != step.turn):
            lines.append(f"Thought: {step.thought}")
        lines.append(f"Step {i}: called {step.tool}({format_value(step.args)})")
        lines.append(f"Result: {step.result}")
    if final_text:
        lines.append(f"Final reply: {final_text}")
    elif final_text is None:
        lines.append("The step limit was reached; answer with what was found.")
    return "\n".join(lines) if lines else "No tools were called."


def _extend_history(
    history: Any, turns: list[Message], final_text: str, run_messages: Sequence[Message] = ()
) -> None:
    """Appends the run's turns and its final answer to a History-like object."""
    extend = getattr(history, "extend", None)
    if history is None or not hasattr(history, "messages") or not callable(extend):
        return
    extend([*turns, Message("assistant", final_text)])
    record_system(history, run_messages)
