"""Predict: one LLM step described by a signature, with learnable instructions and demos.

``Predict`` has an ``async def forward``: it runs as one node of a program,
with real input values, and makes its call with `plait.execution.generate`
through the run's resources (limits, retries, cache, usage all apply). In a
traced composite, several ``Predict`` nodes with independent inputs run
concurrently like any other nodes.

Its two public helpers are the seam other modules build on:
`Predict.build_request` (inputs → the neutral `Request`) and
`Predict.parse_response` (a `Response` → typed outputs). ReAct, for
example, adds tools to the request and loops; it never re-implements
prompting or parsing. A Predict given ``tools=`` runs the same tool loop
as ReAct (`plait.modules.tool_loop`), approvals included.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from plait import _context
from plait._jsondata import as_json_data
from plait.backends.types import Message, Request, Response, SamplingOptions, as_message
from plait.callbacks import ReportedCall, active_callbacks
from plait.errors import PlaitError, StructuredOutputError
from plait.execution.llm_call import generate
from plait.execution.run import RUN_KEYWORDS, is_batch
from plait.execution.settings import OPTION_NAMES
from plait.execution.structured import Attempt, ask_structured
from plait.module import Module
from plait.modules.prediction import Prediction
from plait.modules.traces import record_trace
from plait.parameter import Parameter
from plait.signatures.adapters import Adapter, JSONAdapter
from plait.signatures.signature import Signature, as_signature
from plait.streaming import FieldStreamer, is_streaming, whole_text
from plait.tools import Tool, tool_table
from plait.values import unwrap

__all__ = ["Predict", "ask_step", "history_messages", "record_system"]

_NOT_INPUTS = frozenset({*RUN_KEYWORDS, "history", "auto_execute_tools"})
"""Keywords of a Predict call that are not input fields (unless the signature has one)."""


class Predict(Module):
    """Asks a model for a signature's outputs given its inputs; returns a `Prediction`.

    Args:
        signature: a `Signature` subclass, or a string such as
            ``"question -> answer: int"``.
        alias: the resource alias to call.
        adapter: how messages are written and replies parsed (default
            `JSONAdapter`, which uses the backend's JSON-schema mode).
        temperature: sampling temperature (None: the provider's default).
        max_tokens: cap on generated tokens (None: the provider's default).
        demos: few-shot examples, each a dict of input and output field values.
        tools: `Tool` objects or functions the model may call. A call then
            runs the tool loop: the model's tool calls run and their results
            go back to it until it answers, in the loop ReAct uses (a tool
            that needs a person's approval pauses it, and ``resume_state=``
            resumes it); the result is a `ReActPrediction`
            with the ``trajectory``. When ``max_turns`` turns have called
            tools, one more turn without tools must answer. Called with
            ``auto_execute_tools=False``, it does *one step* instead: when the
            model asks for tools, the result is a `Prediction` with
            ``is_final == False`` and the calls in ``native_tool_calls``, run
            by nobody.
        max_turns: most model turns of the tool loop (with ``tools=``).

    Learnable parameters (what optimizers change):

    * ``instructions`` — starts as the signature's instructions; the call uses
      ``signature.with_instructions(instructions.value)``.
    * ``demos`` — the list of few-shot example dicts; a structured parameter
      (``value_type`` is a list of the signature's `Signature.demo_model`), so
      an optimizer that rewrites it asks for a list of examples of that shape.

    An invalid reply is re-asked once with the error shown to the model;
    a second invalid reply raises `StructuredOutputError` naming the field.

    Example::

        class QA(Signature):
            \"\"\"Answer with a single number.\"\"\"

            question: str = InputField()
            answer: int = OutputField()

        qa = Predict(QA).bind(ResourceConfig({"llm": {"provider": "local"}}))
        pred = qa.run_sync(question="How many legs has a spider?")
        pred.answer          # an int
        qa.traces()[-1]      # what was sent, what came back, tokens, latency
    """

    thought_fields: frozenset[str] = frozenset()
    """Output fields that are reasoning: streamed as `ThoughtStreamChunk` (ChainOfThought's)."""

    def __init__(
        self,
        signature: type[Signature] | str,
        *,
        alias: str = "llm",
        adapter: Adapter | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        demos: Sequence[Mapping[str, Any]] | None = None,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        max_turns: int = 10,
    ) -> None:
        super().__init__()
        sig = as_signature(signature)
        if not sig.output_fields:
            raise ValueError(
                f"{type(self).__name__} needs a signature with an output field; {sig!r} has none"
            )
        if not isinstance(alias, str) or not alias:
            raise ValueError(f"{type(self).__name__} needs a non-empty alias string, got {alias!r}")
        adapter = JSONAdapter() if adapter is None else adapter
        if not isinstance(adapter, Adapter):
            raise TypeError(
                f"adapter must have format(), response_schema() and parse() "
                f"(an Adapter such as JSONAdapter()), got {type(adapter).__name__}"
            )
        self.signature = sig
        self.alias = alias
        self.adapter = adapter
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.tools = tool_table(tools)
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
            raise ValueError(f"{type(self).__name__} needs max_turns >= 1, got {max_turns!r}")
        self.max_turns = max_turns
        text = sig.signature_text()
        self.instructions = Parameter(
            sig.instructions,
            description=f"Instructions for the step `{text}`: what the model must do.",
        )
        self.demos = Parameter(
            _jsonable(_demo_list(sig, demos or (), "demos")),
            description=(
                f"Few-shot examples for the step `{text}`: a list of examples, each with "
                "a value for every input and output field."
            ),
            value_type=_demo_type(sig),
        )
        self._call_signature: tuple[str, type[Signature]] | None = None

    # ------------------------------------------------------------------ seam
    def current_signature(self) -> type[Signature]:
        """Returns the signature a call uses now: the base one with the current instructions."""
        text = str(self.instructions.value)
        cached = self._call_signature
        if cached is None or cached[0] != text:
            # Deriving a signature builds a class: do it once per instructions text.
            sig = self.signature
            cached = (text, sig if text == sig.instructions else sig.with_instructions(text))
            self._call_signature = cached
        return cached[1]

    def build_request(self, inputs: Mapping[str, Any], history: Any = ()) -> Request:
        """Returns the request for ``inputs``: messages by the adapter, schema, sampling options.

        Args:
            inputs: input values by field name (not checked here; `forward` checks).
            history: earlier turns: a sequence of `Message`, or an object
                with ``.messages`` such as `plait.History`.

        The request carries the context's rollout id. Callers may extend it
        (``dataclasses.replace(request, tools=...)``) before sending it with
        `plait.execution.generate`.
        """
        sig = self.current_signature()
        demos = _demo_list(sig, self.demos.value or (), "demos parameter")
        turns = history_messages(history)
        told = {"signature": sig, "inputs": dict(inputs), "demos": demos}
        with ReportedCall("adapter_format", self.adapter, told, active_callbacks()) as call:
            messages = call.outputs = self.adapter.format(sig, inputs, demos=demos, history=turns)
        if self.tools:
            return self._tools_request(messages)
        return self._answer_request(messages)

    def _tools_request(self, messages: Sequence[Message], tool_choice: str = "auto") -> Request:
        """Returns a turn that may call tools: free text, the tools on offer."""
        return Request(
            messages=tuple(messages),
            options=SamplingOptions(temperature=self.temperature, max_tokens=self.max_tokens),
            tools=tuple(t.spec for t in self.tools.values()),
            tool_choice=tool_choice,
            rollout_id=_context.ROLLOUT.get(),
        )

    def _answer_request(self, messages: Sequence[Message]) -> Request:
        """Returns a turn that must answer: the outputs' schema, no tools."""
        return Request(
            messages=tuple(messages),
            options=SamplingOptions(temperature=self.temperature, max_tokens=self.max_tokens),
            response_schema=self.adapter.response_schema(self.current_signature()),
            rollout_id=_context.ROLLOUT.get(),
        )

    def parse_response(self, response: Response) -> dict[str, Any]:
        """Returns the typed outputs in ``response`` by field name.

        Raises:
            StructuredOutputError: the reply does not hold valid outputs (names the field).
        """
        sig = self.current_signature()
        told = {"signature": sig, "completion": response.text}
        with ReportedCall("adapter_parse", self.adapter, told, active_callbacks()) as call:
            call.outputs = self.adapter.parse(sig, response)
        return call.outputs

    # --------------------------------------------------------------- forward
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Check input names now, so a typo fails where it was written (at trace
        # time in a composite), not later as a failed node. A list as first
        # argument is a batch: its items are checked one by one when they run.
        resuming = kwargs.get("resume_state") is not None  # may take the paused inputs
        if not (resuming or (args and is_batch(args[0]))):
            fields = self.signature.input_fields
            named = {
                k: v
                for k, v in kwargs.items()
                if k in fields or (k not in OPTION_NAMES and k not in _NOT_INPUTS)
            }
            self._input_values(args, named)
        return super().__call__(*args, **kwargs)

    async def forward(
        self, *args: Any, history: Any = None, auto_execute_tools: bool = True, **inputs: Any
    ) -> Prediction:
        """Calls the model on the signature's inputs and returns the typed outputs.

        Inputs are keyword arguments named like the input fields. One
        positional argument is accepted too: the value of the only input
        field, or a dict of all inputs by name (what a batch item or a
        dataset row can be; a dict whose keys are exactly the input fields
        is always taken by name).
        ``history=`` adds earlier turns; when it is a `plait.History`, the new
        user and assistant turns are appended to it. With ``tools=``, the
        tool loop runs unless ``auto_execute_tools=False`` (see the class).

        Raises:
            TypeError: inputs are missing or unknown (all of them are named).
            StructuredOutputError: the reply stayed invalid after one re-ask.
            ConfirmationRequired: a tool call waits for a person's approval.
            ResumeRefusedError: the ``resume_state=`` of the call was refused.
        """
        if history is not None and "history" in self.signature.input_fields:
            inputs["history"], history = history, None  # a field named history is an input
        if self.tools and auto_execute_tools:
            return await self._run_tools(args, inputs, history)
        values = self._values(args, inputs)
        request = self.build_request(values, history if history is not None else ())
        prediction = await self._ask(request, values)
        _extend_history(history, request.messages, prediction.raw)
        return prediction

    def _values(self, args: tuple[Any, ...], inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {name: unwrap(value) for name, value in self._input_values(args, inputs).items()}

    async def _run_tools(
        self, args: tuple[Any, ...], inputs: dict[str, Any], history: Any
    ) -> Prediction:
        """Runs the tool loop until the model answers (its last turn without tools, if need be)."""
        from plait.modules.tool_loop import ToolLoop  # cycle: tool_loop.py imports this module

        turns = () if history is None else history
        loop = ToolLoop(self, self.signature, self.tools, self.max_turns)
        run = await loop.run(
            self._values(args, inputs) if args or inputs else None,
            label=self._label(),
            start=lambda values: self.build_request(values, turns).messages,
            ask=lambda messages, choice, values: self._ask(
                self._tools_request(messages, choice), values
            ),
        )
        if isinstance(run.final, StructuredOutputError):
            raise run.final
        extracted = not isinstance(run.final, Prediction)
        if extracted:  # the turns ran out: one more must answer, with no tools on offer
            run.final = await self._ask(self._answer_request(run.messages), run.values)
            run.usage += run.final.usage
        prediction = run.prediction(run.final, extracted=extracted)
        run.extend_history(history, prediction.raw)
        return prediction

    def _input_values(self, args: tuple[Any, ...], inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Returns the inputs by field name, in the signature's order; raises TypeError if wrong."""
        expected = list(self.signature.input_fields)
        if args:
            # A mapping keyed by exactly the input fields is the inputs by name, even
            # for one field: ``{"question": q}`` asks q (a dataset row), as demos read it.
            by_name = isinstance(args[0], Mapping) and set(args[0]) == set(expected)
            if len(args) == 1 and not inputs and len(expected) == 1 and not by_name:
                inputs = {expected[0]: args[0]}
            elif len(args) == 1 and not inputs and isinstance(args[0], Mapping):
                inputs = args[0]
            else:
                raise TypeError(
                    f"{self._label()} takes its inputs by keyword "
                    f"({', '.join(expected) or 'none'}); got {len(args)} positional "
                    f"argument(s). Call it as {self._example_call(expected)}"
                )
        missing = [name for name in expected if name not in inputs]
        unknown = [name for name in inputs if name not in self.signature.input_fields]
        if missing or unknown:
            problems = []
            if missing:
                problems.append(f"missing input(s): {', '.join(missing)}")
            if unknown:
                problems.append(f"unknown input(s): {', '.join(map(str, unknown))}")
            raise TypeError(
                f"{self._label()}: {'; '.join(problems)}. Expected: {self._example_call(expected)}"
            )
        return {name: inputs[name] for name in expected}

    async def _ask(self, request: Request, inputs: dict[str, Any]) -> Prediction:
        """Makes this module's one step (see `ask_step`)."""
        return await ask_step(
            self,
            request,
            inputs,
            self.parse_response,
            fields=tuple(self.current_signature().output_fields),
            label=self._label(),
            sink=self.stream_sink(),
        )

    def stream_sink(self) -> FieldStreamer | None:
        """Returns what turns this module's reply text into field events, when a consumer streams.

        Fields are read from the growing text by the adapter's
        ``stream_fields`` (JSON keys, or chat markers); fields named in
        ``thought_fields`` stream as `ThoughtStreamChunk`.
        """
        if not is_streaming():
            return None
        split = getattr(self.adapter, "stream_fields", None)
        splitter = whole_text("text") if split is None else split
        return FieldStreamer(self, splitter, self.thought_fields)

    def declared_output_types(self) -> tuple[Any, ...]:
        """Returns `Prediction` (from ``forward``) and the signature's output field types."""
        fields = self.signature.output_fields.values()
        return (*super().declared_output_types(), *(spec.annotation for spec in fields))

    # ---------------------------------------------------------------- labels
    def _label(self) -> str:
        text = self.signature.signature_text()
        if self._name:
            return f"{type(self).__name__} {self._name!r} ({text})"
        return f"{type(self).__name__} ({text})"

    def _example_call(self, expected: list[str]) -> str:
        args = ", ".join(f"{name}=..." for name in expected)
        return f"{self._name or type(self).__name__.lower()}({args})"

    def _call_directly(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise PlaitError(
            f"{self._label()} has no resources: bind them with module.bind(ResourceConfig(...)), "
            "use `async with ExecutionSettings(resources=...)`, or call "
            "plait.run(module, ..., resources=...)"
        )

    def extra_repr(self) -> str:
        parts = [repr(self.signature), f"alias={self.alias!r}"]
        if not isinstance(self.adapter, JSONAdapter):
            parts.append(f"adapter={self.adapter!r}")
        return ", ".join(parts)


# ------------------------------------------------------------------ one step
async def ask_step(
    module: Any,
    request: Request,
    inputs: dict[str, Any],
    parse_outputs: Callable[[Response], dict[str, Any]],
    *,
    fields: tuple[str, ...],
    label: str,
    sink: FieldStreamer | None,
    reasks: int = 1,
) -> Prediction:
    """Makes one step of a signature-driven module: `Predict`'s call, and each `ReAct` turn.

    The request goes through `ask_structured` (``reasks`` re-asks when the
    reply does not hold the outputs), as ``module.alias``, and every request is traced on
    ``module``. When the request offers tools, a reply that calls them is
    accepted as it is and becomes a non-final `Prediction` with its
    ``native_tool_calls``; text is parsed into the outputs. ``sink`` (when a
    consumer streams) gets the reply's text as it is written.

    Raises:
        ReplyCutOffError: the last reply was cut off at its token limit.
        StructuredOutputError: the reply held neither tool calls nor valid
            outputs after the re-ask (``raw`` is the last reply).
    """

    async def complete(request: Request, accept: Callable[[Response], bool]) -> Response:
        if sink is not None and sink.started:
            await sink.restart("the reply was invalid; asked again")
        return await generate(module.alias, request, accept=accept, on_text=sink)

    def parse(response: Response) -> Any:
        if request.tools and response.tool_calls:
            return response.tool_calls
        return parse_outputs(response)

    def trace(attempt: Attempt) -> None:
        output = attempt.value
        if isinstance(output, tuple) and attempt.response is not None:  # a turn calling tools
            output = {"text": attempt.response.text, "tool_calls": [call.name for call in output]}
        record_trace(
            module,
            attempt.request,
            attempt.response,
            started=attempt.started,
            inputs=inputs,
            output=output,
            error=attempt.error,
        )

    reply = await ask_structured(
        complete,
        request,
        parse,
        expected=f"every output field ({', '.join(fields)}) in the format described above",
        label=label,
        reasks=reasks,
        fields=fields,
        on_attempt=trace,
    )
    if sink is not None:
        await sink.finish()
    prediction = functools.partial(
        Prediction, usage=reply.usage, raw=reply.response.text, messages=reply.request.messages
    )
    if isinstance(reply.value, tuple):  # tool calls: one step of an agent
        return prediction(native_tool_calls=reply.value, is_final=False)
    return prediction(reply.value)


# ------------------------------------------------------------------ helpers
def _jsonable(demos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Returns demos as JSON data (models as dicts, enums as values), so state_dict stays JSON."""
    return as_json_data(demos)


def _demo_type(sig: type[Signature]) -> Any:
    """Returns ``list[<signature>Demo]``, or None when a field type has no JSON schema."""
    try:
        return types.GenericAlias(list, sig.demo_model())
    except TypeError:
        return None


def _demo_list(sig: type[Signature], demos: Any, where: str) -> list[dict[str, Any]]:
    """Returns demos as plain dicts; raises ValueError naming a bad demo and its unknown keys."""
    if isinstance(demos, Mapping | str) or not isinstance(demos, Sequence):
        raise ValueError(f"{where} must be a list of dicts, got {type(demos).__name__}")
    out = []
    for i, demo in enumerate(demos):
        if not isinstance(demo, Mapping):
            raise ValueError(
                f"{where}[{i}] must be a dict of field values, got {type(demo).__name__}"
            )
        unknown = [key for key in demo if key not in sig.fields]
        if unknown:
            raise ValueError(
                f"{where}[{i}] has key(s) {', '.join(map(repr, unknown))} that are not fields of "
                f"{sig.signature_text()!r}"
            )
        out.append(dict(demo))
    return out


def history_messages(history: Any) -> tuple[Message, ...]:
    """Returns the turns of a history: Messages, role dicts, or an object with ``.messages``.

    Of a `plait.History`, its `~plait.History.conversation`: the system prompt
    you set, not the system turn an earlier call recorded (which already
    holds a module's task).

    Raises:
        TypeError: it is none of these.
    """
    if history is None:
        return ()
    items = getattr(history, "conversation", None)
    if items is None:
        items = getattr(history, "messages", history)
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise TypeError(
            "history must be a sequence of Message (or role dicts), or an object with "
            f".messages such as plait.History; got {type(history).__name__}"
        )
    return tuple(as_message(item, f"history item {i}") for i, item in enumerate(items))


def _extend_history(history: Any, sent: tuple[Message, ...], reply: str) -> None:
    """Appends the new turns to a History-like object (one with ``.messages`` and ``extend``).

    A `plait.History` also records the system turn that was sent, so the
    history reads as what the model saw.
    """
    if history is None or not hasattr(history, "messages"):
        return
    extend = getattr(history, "extend", None)
    if callable(extend):
        extend([sent[-1], Message("assistant", reply)])
    record_system(history, sent)


def record_system(history: Any, sent: Sequence[Message]) -> None:
    """Notes the system turn of ``sent`` in a History that can record it (`plait.History`)."""
    record = getattr(history, "record_system_prompt", None)
    if callable(record) and sent and sent[0].role == "system":
        record(sent[0].content)
