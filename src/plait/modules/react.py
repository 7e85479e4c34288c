"""ReAct: an agent that calls tools in a loop until it can answer a signature.

Each turn sends the conversation with the tools attached (native tool
calling, ``tool_choice="auto"``); the calls of a reply run, and their
results go back to the model, in the tool loop shared with `Predict`
(`plait.modules.tool_loop`, where pauses for a person's confirmation and
resumes happen too). The loop ends when the model replies without tool
calls; that reply is parsed into the signature's outputs. When it does not
parse, or after ``max_iters`` turns, one last *extraction* call (a `Predict`
over the inputs plus the trajectory, with the outputs' JSON schema and no
tools) must produce them. A reply cut off at ``max_tokens`` (a tool call's
arguments, or the answer) is not passed on: the run fails at that turn with a
`ReplyCutOffError` naming the field and the limit.

A call that needs a person's approval pauses the run (see `forward`). The
person is asked about a call once in a run: when a later turn repeats a call
they approved or declined (same tool, same arguments), the model is told so
instead of the call being run or asked about again.

Everything goes through the run's resources (`plait.execution.generate`),
and every call is recorded in `Module.traces`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from plait import _context
from plait.backends.types import Message, Request, SamplingOptions
from plait.errors import StructuredOutputError
from plait.module import Module
from plait.modules._wrapping import bind_signature_inputs
from plait.modules.predict import Predict, ask_step, history_messages
from plait.modules.prediction import Prediction
from plait.modules.tool_loop import (
    DECLINE_CHOICES,
    ReActPrediction,
    ReActStep,
    ToolLoop,
    ToolRun,
)
from plait.parameter import Parameter
from plait.signatures.adapters import Adapter, JSONAdapter, format_value
from plait.signatures.signature import InputField, Signature, as_signature
from plait.streaming import FieldStreamer, is_streaming, whole_text
from plait.tools import Tool, tool_table

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
        on_decline: what a person's "no" to a tool call does: ``"tell_model"``
            (the default: the model reads that the user declined, and answers
            otherwise) or ``"raise"`` (`ConfirmationRejected` reaches the
            caller, and nothing more runs).

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
        on_decline: str = "tell_model",
    ) -> None:
        super().__init__()
        sig = as_signature(signature)
        if not isinstance(max_iters, int) or max_iters < 1:
            raise ValueError(f"ReAct needs max_iters >= 1, got {max_iters!r}")
        if on_decline not in DECLINE_CHOICES:
            raise ValueError(
                f"ReAct on_decline must be 'tell_model' or 'raise', got {on_decline!r}"
            )
        self.on_decline = on_decline
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
            ConfirmationRejected: the person declined it (``on_decline="raise"``).
            ResumeRefusedError: the resume state was changed, forged, made by
                another agent or for other inputs, or already used.
            ReplyCutOffError: a turn's reply (a tool call or the answer) was cut
                off at ``max_tokens``; it names the turn's field or tool argument.
            StructuredOutputError: the extraction reply stayed invalid after one re-ask.
            BackendError: a model call failed after the resource layer's retries.
        """
        label = f"ReAct ({self.signature.signature_text()})"
        given = None
        if args or inputs:
            given = bind_signature_inputs(self.signature, args, inputs, label)
        sig = self._current_signature()
        specs = tuple(t.spec for t in self.tools.values())
        turns = history_messages(history)
        loop = ToolLoop(
            self,
            self.signature,
            self.tools,
            self.max_iters,
            first_tool_choice=self.first_tool_choice,
            on_decline=self.on_decline,
        )
        run = await loop.run(
            given,
            label=label,
            start=lambda values: self.adapter.format(sig, values, history=turns),
            ask=lambda messages, choice, values: self._step(
                self._request(messages, specs, choice), values, sig
            ),
        )
        prediction = await self._finish(run)
        run.extend_history(history, prediction.raw)
        return prediction

    async def _finish(self, run: ToolRun) -> ReActPrediction:
        """Returns the outputs: from the final turn, or from the extraction call.

        The extraction call shapes the last reply when it held no outputs in
        shape, and answers from the trajectory when the turns ran out.
        """
        if isinstance(run.final, Prediction):
            return run.prediction(run.final)
        final_text = run.final.raw if isinstance(run.final, StructuredOutputError) else None
        text = render_trajectory(run.trajectory, final_text)
        extracted = await self.extract(**run.values, trajectory=text)
        run.usage += extracted.usage
        return run.prediction(extracted, extracted=True)

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
            sink = FieldStreamer(self, split or whole_text("text"))
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
