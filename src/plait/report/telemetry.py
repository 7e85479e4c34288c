"""OpenTelemetry spans for plait runs, following the GenAI semantic conventions.

`OpenTelemetryCallback` is a `plait.callbacks.BaseCallback`: configure it like
any callback and every module call, LLM call and tool call becomes a span,
nested as they ran (an LLM span under the module call that made it, a
graph node under the program). Any OpenTelemetry backend then shows plait
runs: Jaeger, Honeycomb, Langfuse, Opik, MLflow …

Attributes follow the OpenTelemetry GenAI conventions: ``gen_ai.operation.name``
(``chat``, ``execute_tool``), ``gen_ai.provider.name``, ``gen_ai.request.model``,
the request's sampling options, ``plait.alias`` and ``plait.endpoint`` (the alias the
program used and the endpoint that was called: after a fallback, one span per
endpoint tried), ``gen_ai.response.model``,
``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` /
``output_tokens``, ``gen_ai.tool.name`` / ``gen_ai.tool.call.id``, and
``error.type`` (with ``http.response.status_code`` for a provider's HTTP
failure) on failure. When the circuit of a fallback chain's endpoint opens (the chain
gives up on it for a cool-down) or closes again, the span the call ran in gets an event
``plait.circuit.opened`` / ``plait.circuit.closed`` (``plait.endpoint``,
``plait.circuit.failures`` in a row, ``plait.circuit.opened_at``). Prompts and
completions (``gen_ai.input.messages``, ``gen_ai.output.messages``, tool arguments and
results) are recorded only with
``capture_content=True``: they may hold personal data. So is the provider's
own text inside an error (an error body that may echo the prompt, the start of
a malformed reply: `BackendError.detail`): without capture, a failed span's
status and exception event carry plait's message with that text withheld.

Learning is traced too: an optimisation run (a search's ``compile``,
``Trainer.fit``) is a span ``optimize <Search>``; its rounds, candidate
evaluations (``evaluate <Program>`` inside each), proposals (the model calls
that proposed inside) and backward passes are child spans, and its
accept/reject decisions and parameter updates are span events
(``plait.learning.decision``, ``plait.learning.update``) on the step they
happened in. Their facts are ``plait.learning.*`` attributes: scores, sizes,
calls, costs, wins/losses and p-values, the rule that decided. The text of
proposals and updates (``plait.learning.proposed``, ``.old``, ``.new``,
a candidate's ``.params``) is recorded only with ``capture_content=True``;
without it an update shows the lengths and short SHA-256 hashes of its values.

Needs ``pip install 'plait[otel]'`` (opentelemetry-api and -sdk)::

    from plait.report.telemetry import OpenTelemetryCallback
    plait.settings.configure(callbacks=[OpenTelemetryCallback()])
"""

from __future__ import annotations

import json
import traceback
from typing import Any

from plait._jsondata import as_json_data
from plait.callbacks import CONTENT_KEYS, BaseCallback, active_call_id, call_path

__all__ = ["OpenTelemetryCallback"]

_OPTION_ATTRIBUTES = {
    "temperature": "gen_ai.request.temperature",
    "max_tokens": "gen_ai.request.max_tokens",
    "top_p": "gen_ai.request.top_p",
    "seed": "gen_ai.request.seed",
    "stop": "gen_ai.request.stop_sequences",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
}


class OpenTelemetryCallback(BaseCallback):
    """Turns module, LLM and tool calls into OpenTelemetry spans.

    Args:
        tracer_provider: where spans go; the global provider when None.
        capture_content: also record prompts, completions and tool data.

    Raises:
        ImportError: opentelemetry is not installed (says how to install it).
    """

    def __init__(self, tracer_provider: Any = None, *, capture_content: bool = False) -> None:
        try:
            from opentelemetry import trace  # optional extra (plait[otel])
        except ImportError as exc:
            raise ImportError(
                "OpenTelemetryCallback needs OpenTelemetry: pip install 'plait[otel]'"
            ) from exc
        self._trace = trace
        self._tracer = trace.get_tracer("plait", tracer_provider=tracer_provider)
        self.capture_content = capture_content
        self._spans: dict[str, Any] = {}

    # -------------------------------------------------------------- modules
    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        path = call_path()
        name = type(instance).__name__
        attributes = {"plait.module.type": name, "plait.module.path": path}
        if self.capture_content:
            attributes["plait.module.inputs"] = _json(inputs)
        self._start(call_id, f"{name} {path}".strip(), attributes, kind="INTERNAL")

    def on_module_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        extra = {"plait.module.outputs": _json(outputs)} if self.capture_content else {}
        self._end(call_id, extra, exception)

    # -------------------------------------------------------------- LLM calls
    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        model = inputs.get("model") or ""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": inputs.get("provider", ""),
            "gen_ai.request.model": model,
            "plait.alias": inputs.get("alias", ""),
            "plait.endpoint": inputs.get("endpoint", ""),
        }
        for option, attribute in _OPTION_ATTRIBUTES.items():
            if inputs.get(option) is not None:
                attributes[attribute] = inputs[option]
        if self.capture_content:
            attributes["gen_ai.input.messages"] = _json(inputs.get("messages", []))
        self._start(call_id, f"chat {model}".strip(), attributes, kind="CLIENT")

    def on_lm_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        attributes: dict[str, Any] = {}
        if outputs is not None:
            usage = outputs.usage
            attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
            attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
            if outputs.finish_reason:
                attributes["gen_ai.response.finish_reasons"] = [outputs.finish_reason]
            if outputs.model:
                attributes["gen_ai.response.model"] = outputs.model
            attributes["plait.cache_hit"] = usage.cache_hit
            if self.capture_content:
                message = {"role": "assistant", "content": outputs.text}
                if outputs.tool_calls:
                    message["tool_calls"] = [call.name for call in outputs.tool_calls]
                attributes["gen_ai.output.messages"] = _json([message])
        self._end(call_id, attributes, exception)

    # -------------------------------------------------------------- tools
    def on_tool_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        name = getattr(instance, "name", type(instance).__name__)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.type": "function",
        }
        if inputs.get("call_id"):
            attributes["gen_ai.tool.call.id"] = inputs["call_id"]
        if self.capture_content:
            attributes["gen_ai.tool.call.arguments"] = _json(inputs.get("arguments"))
        self._start(call_id, f"execute_tool {name}", attributes, kind="INTERNAL")

    def on_tool_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        attributes: dict[str, Any] = {}
        if outputs is not None and not outputs.ok:
            attributes["error.type"] = outputs.error or "tool_error"
        if outputs is not None and self.capture_content:
            attributes["gen_ai.tool.call.result"] = outputs.content
        self._end(call_id, attributes, exception)

    # -------------------------------------------------------------- evaluation
    def on_evaluate_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        attributes = {"plait.evaluate.n": len(inputs.get("devset") or ())}
        self._start(call_id, f"evaluate {type(instance).__name__}", attributes, kind="INTERNAL")

    def on_evaluate_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        attributes: dict[str, Any] = {}
        if outputs is not None:
            attributes = {
                "plait.evaluate.score": float(outputs),
                "plait.evaluate.calls": outputs.calls,
                "plait.evaluate.cost": outputs.cost,
            }
        self._end(call_id, attributes, exception)

    # -------------------------------------------------------------- learning
    def on_optimize_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._step_start(call_id, f"optimize {inputs.get('optimizer', '')}".strip(), inputs)

    def on_optimize_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        self._step_end(call_id, outputs, exception)

    def on_round_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._step_start(call_id, f"round {inputs.get('round', '')}".strip(), inputs)

    def on_round_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        self._step_end(call_id, outputs, exception)

    def on_candidate_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        number = inputs.get("candidate")
        self._step_start(call_id, "candidate" if number is None else f"candidate {number}", inputs)

    def on_candidate_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        self._step_end(call_id, outputs, exception)

    def on_proposal_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._step_start(call_id, f"proposal {inputs.get('parameter', '')}".strip(), inputs)

    def on_proposal_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        self._step_end(call_id, outputs, exception)

    def on_backward_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._step_start(call_id, "backward", inputs)

    def on_backward_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        self._step_end(call_id, outputs, exception)

    def on_decision(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._event("plait.learning.decision", inputs)

    def on_update(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._event("plait.learning.update", inputs)

    def on_circuit(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        """A fallback chain's endpoint given up on (``plait.circuit.opened``) or back
        (``plait.circuit.closed``): an event on the span of the call it happened in."""
        attributes = {
            "plait.endpoint": inputs["endpoint"],
            "plait.circuit.failures": inputs["failures"],
            "plait.circuit.cooldown": inputs["cooldown"],
        }
        if inputs.get("opened_at") is not None:
            attributes["plait.circuit.opened_at"] = inputs["opened_at"]
        name = f"plait.circuit.{inputs['state']}"
        parent = self._spans.get(active_call_id() or "")
        if parent is not None:
            parent.add_event(name, attributes)
            return
        self._tracer.start_span(name, attributes=attributes).end()

    def _step_start(self, call_id: str, name: str, inputs: dict[str, Any]) -> None:
        self._start(call_id, name, self._learning_attributes(inputs), kind="INTERNAL")

    def _step_end(self, call_id: str, outputs: Any, exception: Exception | None) -> None:
        self._end(call_id, self._learning_attributes(outputs or {}), exception)

    def _event(self, name: str, inputs: dict[str, Any]) -> None:
        """Adds a point of a learning step to the span it happened in (its own span if none)."""
        attributes = self._learning_attributes(inputs)
        parent = self._spans.get(active_call_id() or "")
        if parent is not None:
            parent.add_event(name, attributes)
            return
        self._tracer.start_span(name, attributes=attributes).end()

    def _learning_attributes(self, facts: dict[str, Any]) -> dict[str, Any]:
        """Returns ``facts`` as ``plait.learning.*`` attributes (the program's text if captured)."""
        return {
            f"plait.learning.{key}": _attribute(value)
            for key, value in facts.items()
            if value is not None and (self.capture_content or key not in CONTENT_KEYS)
        }

    # -------------------------------------------------------------- spans
    def _start(self, call_id: str, name: str, attributes: dict[str, Any], kind: str) -> None:
        parent = self._spans.get(active_call_id() or "")
        context = self._trace.set_span_in_context(parent) if parent is not None else None
        self._spans[call_id] = self._tracer.start_span(
            name,
            context=context,
            kind=getattr(self._trace.SpanKind, kind),
            attributes=attributes,
        )

    def _end(self, call_id: str, attributes: dict[str, Any], exception: Exception | None) -> None:
        span = self._spans.pop(call_id, None)
        if span is None:
            return
        for key, value in attributes.items():
            span.set_attribute(key, value)
        if exception is not None:
            self._failed(span, exception)
        span.end()

    def _failed(self, span: Any, exception: Exception) -> None:
        """Marks ``span`` failed; the provider's text in the error only when content is captured."""
        span.set_attribute("error.type", type(exception).__name__)
        status = getattr(exception, "status", None)
        if isinstance(status, int):
            span.set_attribute("http.response.status_code", status)
        if self.capture_content:
            description = str(exception)
            span.record_exception(exception)
        else:
            description = _withheld(exception)
            trace = "".join(traceback.format_tb(exception.__traceback__))
            span.record_exception(
                exception,
                attributes={
                    "exception.message": description,
                    "exception.stacktrace": f"{trace}{type(exception).__name__}: {description}",
                },
            )
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, description))


def _attribute(value: Any) -> Any:
    """Returns a value OpenTelemetry takes: a scalar, a list of text or numbers, else JSON."""
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    return _json(value)


def _json(value: Any) -> str:
    return json.dumps(as_json_data(value, fallback=repr), ensure_ascii=False)


_WITHHELD = "[provider text withheld: capture_content=True records it]"
_MAX_CHAIN = 8


def _withheld(exception: BaseException) -> str:
    """Returns the message of ``exception`` with the provider text of its chain withheld.

    Wrapping errors may quote the errors they wrap (``cause``, ``__cause__``), so every
    ``detail`` down the chain of causes is taken out.
    """
    text = str(exception)
    seen: BaseException | None = exception
    for _ in range(_MAX_CHAIN):
        if seen is None:
            break
        detail = getattr(seen, "detail", None)
        if isinstance(detail, str) and detail:
            text = text.replace(detail, _WITHHELD)
        seen = getattr(seen, "cause", None) or seen.__cause__
    return text
