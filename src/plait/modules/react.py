"""ReAct: an agent that calls tools in a loop until it can answer a signature.

Each turn sends the conversation with the tools attached (native tool
calling, ``tool_choice="auto"``). Every tool call of the reply is run — the
calls of one turn concurrently — and its result, or its error explained,
goes back to the model as a ``tool`` message. The loop ends when the model
replies without tool calls; that reply is parsed into the signature's
outputs. When it does not parse, or after ``max_iters`` turns, one last
*extraction* call (a `Predict` over the inputs plus the trajectory, with the
outputs' JSON schema and no tools) must produce them.

Everything goes through the run's resources (`plait.execution.generate`),
and every call is recorded in `Module.traces`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from plait import _context
from plait.backends.types import Message, Request, Response, SamplingOptions, ToolCall, Usage
from plait.errors import StructuredOutputError
from plait.execution.llm_call import generate
from plait.module import Module
from plait.modules._wrapping import bind_signature_inputs
from plait.modules.predict import Predict, history_messages
from plait.modules.prediction import Prediction
from plait.modules.traces import record_trace
from plait.parameter import Parameter
from plait.signatures.adapters import Adapter, JSONAdapter, format_value
from plait.signatures.signature import InputField, Signature, as_signature
from plait.tools import Tool, ToolResult

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
        adapter: Adapter | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        super().__init__()
        sig = as_signature(signature)
        if not isinstance(max_iters, int) or max_iters < 1:
            raise ValueError(f"ReAct needs max_iters >= 1, got {max_iters!r}")
        self.signature = sig
        self.tools = _tool_table(tools)
        self.alias = alias
        self.max_iters = max_iters
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

        Raises:
            TypeError: inputs are missing or unknown.
            StructuredOutputError: the extraction reply stayed invalid after one re-ask.
            BackendError: a model call failed after the resource layer's retries.
        """
        label = f"ReAct ({self.signature.signature_text()})"
        values = bind_signature_inputs(self.signature, args, inputs, label)
        sig = self._current_signature()
        messages = list(self.adapter.format(sig, values, history=history_messages(history)))
        first_new = len(messages) - 1  # the inputs turn: what this run adds to a History
        specs = tuple(t.spec for t in self.tools.values())
        trajectory: list[ReActStep] = []
        usage = Usage()
        final: Response | None = None
        for turn in range(self.max_iters):
            request = self._request(messages, specs)
            response = await self._generate(request, values)
            usage.add(response.usage)
            if not response.tool_calls:
                final = response
                break
            calls = _with_ids(response.tool_calls, turn)
            messages.append(Message("assistant", response.text, tool_calls=calls))
            results = await asyncio.gather(*(self._run_tool(call) for call in calls))
            for call, result in zip(calls, results, strict=True):
                trajectory.append(_step(response.text, call, result, turn))
                messages.append(result.to_message())

        prediction = await self._finish(values, sig, final, trajectory, messages, usage)
        _extend_history(history, messages[first_new:], prediction.raw)
        return prediction

    async def _finish(
        self,
        values: dict[str, Any],
        sig: type[Signature],
        final: Response | None,
        trajectory: list[ReActStep],
        messages: list[Message],
        usage: Usage,
    ) -> ReActPrediction:
        """Returns the outputs: parsed from the final reply, or from the extraction call."""
        if final is not None:
            try:
                outputs = self.adapter.parse(sig, final)
            except StructuredOutputError:
                pass  # the answer is there but not in shape: the extraction call shapes it
            else:
                return ReActPrediction(
                    outputs,
                    usage=usage,
                    raw=final.text,
                    messages=tuple(messages),
                    trajectory=trajectory,
                )
        text = render_trajectory(trajectory, final.text if final is not None else None)
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
    def _request(self, messages: list[Message], specs: tuple[Any, ...]) -> Request:
        return Request(
            messages=tuple(messages),
            options=SamplingOptions(temperature=self.temperature, max_tokens=self.max_tokens),
            tools=specs,
            tool_choice="auto",
            rollout_id=_context.ROLLOUT.get(),
        )

    async def _generate(self, request: Request, inputs: dict[str, Any]) -> Response:
        started = time.perf_counter()
        try:
            response = await generate(self.alias, request)
        except Exception as exc:
            record_trace(self, request, None, started=started, inputs=inputs, error=exc)
            raise
        output: Any = response.text
        if response.tool_calls:
            output = {"text": response.text, "tool_calls": [c.name for c in response.tool_calls]}
        record_trace(self, request, response, started=started, inputs=inputs, output=output)
        return response

    async def _run_tool(self, call: ToolCall) -> ToolResult:
        """Runs one call; an unknown tool is an error result, like any failed call."""
        found = self.tools.get(call.name)
        if found is None:
            known = ", ".join(self.tools) or "none"
            return ToolResult(
                call.name,
                f"Error: there is no tool named '{call.name}'; the tools are: {known}",
                ok=False,
                error="unknown_tool",
                call_id=call.id,
            )
        return await found.call(call.arguments, call_id=call.id)

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
def _tool_table(tools: Iterable[Tool | Callable[..., Any]]) -> dict[str, Tool]:
    if isinstance(tools, Tool) or callable(tools):
        tools = [tools]  # type: ignore[list-item]
    table: dict[str, Tool] = {}
    for item in tools:
        wrapped = item if isinstance(item, Tool) else Tool(item)
        if wrapped.name in table:
            raise ValueError(
                f"ReAct got two tools named {wrapped.name!r}; give one another name with "
                "Tool(fn, name=...)"
            )
        table[wrapped.name] = wrapped
    return table


def _with_ids(calls: tuple[ToolCall, ...], turn: int) -> tuple[ToolCall, ...]:
    """Returns the calls with an id each (a provider may omit them; results pair by id)."""
    return tuple(
        call if call.id else ToolCall(f"call_{turn}_{i}", call.name, call.arguments)
        for i, call in enumerate(calls)
    )


def _step(thought: str, call: ToolCall, result: ToolResult, turn: int) -> ReActStep:
    try:
        args: Any = orjson.loads(call.arguments) if call.arguments.strip() else {}
    except orjson.JSONDecodeError:
        args = call.arguments
    return ReActStep(
        thought=thought,
        tool=call.name,
        args=args,
        result=result.content,
        ok=result.ok,
        call_id=call.id,
        turn=turn,
    )


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


def _extend_history(history: Any, turns: list[Message], final_text: str) -> None:
    """Appends the run's turns and its final answer to a History-like object."""
    extend = getattr(history, "extend", None)
    if history is None or not hasattr(history, "messages") or not callable(extend):
        return
    extend([*turns, Message("assistant", final_text)])
