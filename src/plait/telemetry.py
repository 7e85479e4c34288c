"""OpenTelemetry spans for plait runs, following the GenAI semantic conventions.

`OpenTelemetryCallback` is a `plait.callbacks.BaseCallback`: configure it like
any callback and every module call, LLM call and tool call becomes a span,
nested as they ran (an LLM span under the module call that made it, a
graph node under the program). Any OpenTelemetry backend then shows plait
runs: Jaeger, Honeycomb, Langfuse, Opik, MLflow …

Attributes follow the OpenTelemetry GenAI conventions: ``gen_ai.operation.name``
(``chat``, ``execute_tool``), ``gen_ai.provider.name``, ``gen_ai.request.model``,
the request's sampling options, ``gen_ai.response.model``,
``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` /
``output_tokens``, ``gen_ai.tool.name`` / ``gen_ai.tool.call.id``, and
``error.type`` on failure. Prompts and completions (``gen_ai.input.messages``,
``gen_ai.output.messages``, tool arguments and results) are recorded only with
``capture_content=True``: they may hold personal data.

Needs ``pip install 'plait[otel]'`` (opentelemetry-api and -sdk)::

    from plait.telemetry import OpenTelemetryCallback
    plait.settings.configure(callbacks=[OpenTelemetryCallback()])
"""

from __future__ import annotations

import json
from typing import Any

from plait.callbacks import BaseCallback, active_call_id, call_path

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
            from opentelemetry import trace
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
            attributes["plait.cache_hit"] = bool(outputs.meta.get("cached", False))
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
            span.set_attribute("error.type", type(exception).__name__)
            span.record_exception(exception)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(exception)))
        span.end()


def _json(value: Any) -> str:
    from pydantic_core import to_jsonable_python

    return json.dumps(to_jsonable_python(value, fallback=repr), ensure_ascii=False)
