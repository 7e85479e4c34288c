"""History: the state of a multi-turn conversation.

A `History` is a list of `Message` turns with its system prompt kept apart,
so it always comes first however the turns are added, and `clear` forgets
the conversation but keeps the prompt. It is plain data (no LLM calls): a
module that takes ``history=`` reads the earlier turns from it and appends
the new ones, and the same object carries the conversation to the next call.

A module also records in the history the system turn it sent (its task
added to your system prompt), so ``messages`` reads as what the model saw:
system, user, assistant …, in order. The prompt you set stays
`system_prompt`, and the next call starts from it again, not from the
recorded turn, so the task is never written into the prompt twice. Every
message reads as an OpenAI-style dict too: ``history.messages[0]["role"]``.

Example::

    history = History("You are a terse assistant.")
    history.add_user("What is 2 + 2?")
    history.add_assistant("4")
    [m.role for m in history.messages]   # ['system', 'user', 'assistant']
    len(history)                         # 2 turns (the system prompt is not a turn)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from plait.backends.types import (
    Message,
    ToolCall,
    as_message,
    message_from_dict,
    message_to_dict,
    tool_call_from_dict,
)

__all__ = ["History"]


class History:
    """A conversation: an optional system prompt, then turns in order.

    Args:
        system_prompt: text of the system turn, kept first; None for none.
        messages: turns to start with. A leading ``system`` message is taken
            as the system prompt (when none was given); a system message
            anywhere else is refused, so the prompt cannot end up mid-conversation.

    Raises:
        ValueError: a system message is given after the first turn, or a
            system prompt is given twice.

    ``len(history)`` counts the turns, not the system prompt; iterating
    yields ``messages`` (system prompt first). A History is always truthy, even
    with no turns, so ``if history:`` cannot mistake a fresh conversation for
    "no history given" (test ``history is None`` for that).
    """

    def __init__(self, system_prompt: str | None = None, messages: Iterable[Message] = ()) -> None:
        turns = list(messages)
        if turns and turns[0].role == "system":
            if system_prompt is not None:
                raise ValueError(
                    "History got a system prompt twice: as system_prompt= and as the first "
                    "message; pass only one"
                )
            system_prompt = turns.pop(0).content
        self._system = system_prompt
        self._sent_system: str | None = None
        self._turns: list[Message] = []
        for turn in turns:
            self.add(turn)

    # ---------------------------------------------------------------- prompt
    @property
    def system_prompt(self) -> str | None:
        """The system prompt (None when there is none); assigning replaces it in place."""
        return self._system

    @system_prompt.setter
    def system_prompt(self, text: str | None) -> None:
        self._system = text
        self._sent_system = None

    def set_system_message(self, content: str) -> None:
        """Sets the system prompt, kept first (the method form of assigning `system_prompt`)."""
        self.system_prompt = content

    def add_system_message(self, content: str) -> None:
        """Sets the system prompt of a conversation that has no turns yet.

        A system message is not appended mid-conversation: plait
        keeps one system turn, always first, because that is where every
        provider reads it.

        Raises:
            ValueError: the conversation already has turns; use `set_system_message`.
        """
        if self._turns:
            raise ValueError(
                "History keeps one system prompt, first; this conversation already has turns, "
                "so use history.set_system_message(...) to replace the prompt"
            )
        self.system_prompt = content

    def record_system_prompt(self, text: str) -> None:
        """Notes the system turn a module sent, so `messages` shows what the model saw.

        The prompt set by you (`system_prompt`) is kept: the next call builds
        its system turn from it again.
        """
        self._sent_system = text

    # ----------------------------------------------------------------- turns
    def add(self, message: Message | Mapping[str, Any]) -> None:
        """Appends one turn (a user, assistant or tool message, or its OpenAI-style dict).

        Raises:
            TypeError: ``message`` is neither a Message nor a dict.
            ValueError: ``message`` is a system message; set ``system_prompt`` instead.
        """
        message = as_message(message, "the turn given to History.add()")
        if message.role == "system":
            raise ValueError(
                "History keeps its system prompt first: set history.system_prompt = ... "
                "instead of adding a system message"
            )
        self._turns.append(message)

    def extend(self, messages: Iterable[Message]) -> None:
        """Appends several turns in order."""
        for message in messages:
            self.add(message)

    def add_user(self, text: str) -> None:
        """Appends a user turn (``add_user_message`` is the same, for ported code)."""
        self._turns.append(Message("user", text))

    def add_assistant(
        self, text: str = "", tool_calls: Iterable[ToolCall | Mapping[str, Any]] | None = ()
    ) -> None:
        """Appends an assistant turn, with the tool calls it made if any.

        Tool calls are `ToolCall`s or OpenAI-style dicts (``{"id", "function":
        {"name", "arguments"}}``). ``add_assistant_message`` is the same, for ported code.
        """
        calls = tuple(_tool_call(call, i) for i, call in enumerate(tool_calls or ()))
        self._turns.append(Message("assistant", text, tool_calls=calls))

    add_user_message = add_user
    add_assistant_message = add_assistant

    def add_tool_result(self, call_id: str, content: str, name: str | None = None) -> None:
        """Appends the result of the tool call ``call_id`` (a ``tool`` turn)."""
        self._turns.append(Message("tool", content, tool_call_id=call_id, name=name))

    # ---------------------------------------------------------------- access
    @property
    def messages(self) -> tuple[Message, ...]:
        """All messages, the system turn (if any) first: what the model saw.

        The system turn is the one a module last sent (see
        `record_system_prompt`), else `system_prompt`. Each message reads as
        an OpenAI-style dict too (``message["role"]``, ``dict(message)``).
        """
        system = self._sent_system if self._sent_system is not None else self._system
        head = (Message("system", system),) if system is not None else ()
        return (*head, *self._turns)

    @property
    def conversation(self) -> tuple[Message, ...]:
        """The system prompt you set (if any), then the turns: what a module builds on.

        Unlike `messages`, a system turn recorded by an earlier call is left
        out, since the module adds its own task to the prompt again.
        """
        head = (Message("system", self._system),) if self._system is not None else ()
        return (*head, *self._turns)

    @property
    def turns(self) -> tuple[Message, ...]:
        """The conversation without the system prompt."""
        return tuple(self._turns)

    @property
    def last(self) -> Message | None:
        """The latest turn, or None when there is none."""
        return self._turns[-1] if self._turns else None

    def copy(self) -> History:
        """Returns an independent History with the same prompt and turns (a fork)."""
        fork = History(self._system)
        fork._sent_system = self._sent_system
        fork._turns = list(self._turns)
        return fork

    def clear(self) -> None:
        """Forgets every turn; the system prompt stays."""
        self._turns.clear()

    def to_list(self) -> list[dict[str, Any]]:
        """Returns the messages in OpenAI's chat format (JSON-ready)."""
        return [message_to_dict(message) for message in self.messages]

    @classmethod
    def from_list(cls, items: Iterable[Mapping[str, Any]]) -> History:
        """Builds a History from OpenAI-format message dicts (inverse of `to_list`)."""
        return cls(
            messages=[message_from_dict(item, f"message {i}") for i, item in enumerate(items)]
        )

    def __len__(self) -> int:
        return len(self._turns)

    def __bool__(self) -> bool:
        return True

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, History):
            return NotImplemented
        return self._system == other._system and self._turns == other._turns

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        prompt = f"system_prompt={self._system!r}, " if self._system is not None else ""
        return f"History({prompt}turns={len(self._turns)})"


def _tool_call(call: ToolCall | Mapping[str, Any], index: int) -> ToolCall:
    if isinstance(call, ToolCall):
        return call
    if isinstance(call, Mapping):
        return tool_call_from_dict(call, f"tool call {index}")
    raise TypeError(
        f"tool call {index} is {type(call).__name__}; expected a ToolCall or an OpenAI-style "
        "dict {'id': ..., 'function': {'name': ..., 'arguments': ...}}"
    )
