"""Prediction: the typed outputs of one module call, with what it cost and what was sent."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from plait.backends.types import Message, ToolCall, Usage
from plait.streaming import StreamEvent

__all__ = ["Prediction"]


class Prediction(Mapping[str, Any], StreamEvent):
    """Read-only outputs by field name, reachable as attributes or keys.

    Args:
        outputs: the output values by field name (or pass them as keywords).
        usage: tokens and cost of every LLM call that produced it (re-asks included).
        raw: the text of the reply the outputs were parsed from.
        messages: the conversation that was sent for that reply.
        native_tool_calls: tool calls the model asked for (a `Predict` with
            ``tools=`` called with ``auto_execute_tools=False`` returns them
            instead of outputs).
        is_final: False while the model still wants tools run (its calls are in
            ``native_tool_calls``), or while a tool waits for a person's
            confirmation (``confirmation`` says which).
        confirmation: the `ConfirmationRequired` a non-final prediction waits on.

    Example::

        pred = Prediction({"answer": "Paris", "confidence": 0.9})
        pred.answer, pred["confidence"]     # ('Paris', 0.9)
        list(pred)                          # ['answer', 'confidence']
        pred.to_dict()                      # {'answer': 'Paris', 'confidence': 0.9}

    An output named like one of the attributes above (``usage``, ``raw``,
    ``messages``, ``to_dict``, ``keys`` …) is still reachable as ``pred["usage"]``.
    It is a `Mapping`, not a dict, so a program's output keeps its type
    through execution and ``pred.answer`` works on traced values too. It is
    also a `StreamEvent`: the last item ``astream`` yields, so a consumer
    filtering events by type still receives the final answer.
    """

    __slots__ = (
        "_outputs",
        "confirmation",
        "is_final",
        "messages",
        "native_tool_calls",
        "raw",
        "usage",
    )

    _outputs: dict[str, Any]
    usage: Usage
    raw: str
    messages: tuple[Message, ...]
    native_tool_calls: tuple[ToolCall, ...]
    is_final: bool
    confirmation: Any

    def __init__(
        self,
        outputs: Mapping[str, Any] | None = None,
        /,
        *,
        usage: Usage | None = None,
        raw: str = "",
        messages: Sequence[Message] = (),
        native_tool_calls: Sequence[ToolCall] = (),
        is_final: bool = True,
        confirmation: Any = None,
        **fields: Any,
    ) -> None:
        object.__setattr__(self, "_outputs", {**(outputs or {}), **fields})
        object.__setattr__(self, "usage", usage if usage is not None else Usage())
        object.__setattr__(self, "raw", raw)
        object.__setattr__(self, "messages", tuple(messages))
        object.__setattr__(self, "native_tool_calls", tuple(native_tool_calls))
        object.__setattr__(self, "is_final", is_final)
        object.__setattr__(self, "confirmation", confirmation)

    # ----------------------------------------------------------- mapping API
    def __getitem__(self, name: str) -> Any:
        return self._outputs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._outputs)

    def __len__(self) -> int:
        return len(self._outputs)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: fields are not attributes.
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._outputs[name]
        except KeyError:
            fields = ", ".join(self._outputs) or "none"
            raise AttributeError(
                f"Prediction has no field {name!r}; its fields: {fields}"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"Prediction is read-only; build a new one: Prediction({{**pred, {name!r}: ...}})"
        )

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Prediction is read-only")

    def to_dict(self) -> dict[str, Any]:
        """Returns the outputs as a new plain dict (values are not copied)."""
        return dict(self._outputs)

    # ----------------------------------------------------------- copy, print
    def __reduce__(self) -> tuple[Any, ...]:
        state = (self.native_tool_calls, self.is_final, self.confirmation)
        return (_rebuild, (self._outputs, self.usage, self.raw, self.messages, *state))

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={value!r}" for name, value in self._outputs.items())
        if not self.is_final:
            calls = ", ".join(call.name for call in self.native_tool_calls)
            inner = f"{inner}, " if inner else ""
            inner += f"is_final=False, native_tool_calls=[{calls}]"
        return f"{type(self).__name__}({inner})"

    __hash__ = None  # type: ignore[assignment]  # like a dict


def _rebuild(
    outputs: dict[str, Any],
    usage: Usage,
    raw: str,
    messages: tuple[Message, ...],
    native_tool_calls: tuple[ToolCall, ...] = (),
    is_final: bool = True,
    confirmation: Any = None,
) -> Prediction:
    return Prediction(
        outputs,
        usage=usage,
        raw=raw,
        messages=messages,
        native_tool_calls=native_tool_calls,
        is_final=is_final,
        confirmation=confirmation,
    )
