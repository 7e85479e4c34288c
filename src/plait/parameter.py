"""Parameter: learnable state of a module (a prompt, instructions, demos).

Parameters are state, not data: they are not Values. When a parameter takes
part in a computation (formatted into a prompt, passed to a module) it is
lifted into a Value whose ref is ``param:<dotted.name>``, so the graph knows
which nodes read it and backward can route feedback to it.
"""

from __future__ import annotations

import weakref
from typing import Any

from plait._context import current_trace
from plait.values import placeholder

__all__ = ["Parameter", "module_parent"]


class Parameter:
    """A learnable value optimised by textual feedback instead of gradients.

    Args:
        value: the current value, usually a string; JSON-compatible data
            (e.g. a list of few-shot demos) is allowed.
        description: what the parameter is for. Required when
            ``requires_grad`` is true, because an optimizer rewriting it must
            know its role.
        requires_grad: whether backward passes collect feedback for it.
        value_type: the type of the value when it is structured data, e.g.
            ``list[Demo]`` for few-shot demos (anything pydantic can describe
            as a JSON schema). Optimizers then ask for a new value in exactly
            that shape (a grammar on the local backend), never as free text.

    Raises:
        ValueError: a learnable parameter has no description.

    Parameters are equal only to themselves (`==`, `hash`): optimizers keep
    their state per parameter, and two parameters holding the same text are
    still two parameters. `same_as` compares what two parameters hold.

    Example::

        >>> p = Parameter("Be concise.", description="Tone of the summary.")
        >>> str(p)
        'Be concise.'
    """

    _is_plait_parameter = True

    __slots__ = (
        "_feedback_buffer",
        "_name",
        "_owner",
        "description",
        "dropped_feedback",
        "graph_level",
        "requires_grad",
        "value",
        "value_type",
    )

    def __init__(
        self,
        value: Any,
        description: str | None = None,
        requires_grad: bool = True,
        *,
        value_type: Any = None,
    ) -> None:
        if requires_grad and not (description and description.strip()):
            from plait.feedback import clip  # import time: only this mistake needs it

            shown = clip(repr(value), 60)
            raise ValueError(
                f"Parameter({shown}) is learnable but has no description of its role, which "
                f"an optimizer rewriting it needs: write Parameter({shown}, description="
                "'Instructions for the summarizer'), or pass requires_grad=False for a fixed value"
            )
        self.value = value
        self.value_type = value_type
        self.description = description
        self.requires_grad = requires_grad
        self._name: str | None = None
        self._owner: weakref.ref[Any] | None = None
        """The module that registered it under ``_name`` (weak: a parameter does not keep
        its module alive); None until registered."""
        self._feedback_buffer: list[str] = []
        """Feedback collected since the last update."""
        self.dropped_feedback = 0
        """Feedback items dropped since the last update because the buffer was full."""
        self.graph_level: int | None = None
        """Level in the graph of the earliest node that read it in the backward passes
        since the last update (0 reads only the inputs); optimizers update lower levels first."""

    @property
    def name(self) -> str:
        """The attribute name it was registered under (``"<unnamed>"`` before that)."""
        return self._name or "<unnamed>"

    @property
    def path(self) -> str:
        """The dotted name from the root of its module tree: ``"stage1.llm.system_prompt"``.

        What `named_parameters` of the root calls it, and the ref
        ``param:<path>`` that `plait.valueify` gives it outside a trace (inside
        one, names are relative to the traced program). `name` when it is
        not registered in a module.
        """
        owner = self._owner() if self._owner is not None else None
        if owner is None or owner.__dict__.get("_parameters", {}).get(self._name) is not self:
            return self.name
        parts = [self.name]
        seen = {id(owner)}
        parent = module_parent(owner)
        while parent is not None and id(parent) not in seen:
            parts.append(owner._name)
            seen.add(id(parent))
            owner, parent = parent, module_parent(parent)
        return ".".join(reversed(parts))

    def is_owned_by(self, module: Any) -> bool:
        """Whether ``module`` is the module this parameter is registered in (under its name)."""
        owner = self._owner() if self._owner is not None else None
        return owner is module and module.__dict__.get("_parameters", {}).get(self._name) is self

    # Pickles and deep copies leave the owner out (a weak reference cannot be
    # pickled, and a copy's owner is the copied module, which re-links it).
    def __getstate__(self) -> dict[str, Any]:
        return {slot: getattr(self, slot) for slot in self.__slots__ if slot != "_owner"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for slot, value in state.items():
            object.__setattr__(self, slot, value)
        self._owner = None

    # Parameters are identified by identity: two equal prompts are still two
    # parameters, and containers must never confuse them.
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def same_as(self, other: object) -> bool:
        """Whether ``other`` is a parameter holding the same value and settings.

        Compares value, description, requires_grad and value_type: what makes
        two parameters teach a model the same thing, not the name each is
        registered under nor the feedback collected so far. (``==`` itself is identity.)
        """
        return isinstance(other, Parameter) and (
            self.value,
            self.description,
            self.requires_grad,
            self.value_type,
        ) == (other.value, other.description, other.requires_grad, other.value_type)

    def __str__(self) -> str:
        session = current_trace()
        if session is not None:
            return placeholder(session.param_ref(self))
        return str(self.value)

    def __format__(self, spec: str) -> str:
        session = current_trace()
        if session is not None:
            return placeholder(session.param_ref(self), "s", spec)
        return format(self.value, spec)

    def __repr__(self) -> str:
        flag = "" if self.requires_grad else ", requires_grad=False"
        return f"Parameter({self.value!r}{flag})"

    # ---------------------------------------------------------------- feedback
    max_feedback = 16
    """Most feedback items kept between updates; older ones are dropped (and counted)."""
    max_feedback_chars = 2000
    """Longest single feedback item kept; longer ones are cut."""

    def accumulate_feedback(self, feedback: str) -> None:
        """Stores feedback from a backward pass (ignored when frozen).

        The buffer is bounded (`max_feedback` items of at most
        `max_feedback_chars`), so an optimizer prompt built from it stays
        small however long training runs; the newest items are kept.
        """
        if not self.requires_grad:
            return
        text = str(feedback)
        if len(text) > self.max_feedback_chars:
            text = text[: self.max_feedback_chars] + " …[cut]"
        self._feedback_buffer.append(text)
        if len(self._feedback_buffer) > self.max_feedback:
            del self._feedback_buffer[0]
            self.dropped_feedback += 1

    def get_accumulated_feedback(self) -> list[str]:
        """Returns a copy of the feedback collected since the last update."""
        return list(self._feedback_buffer)

    def apply_update(self, new_value: Any) -> None:
        """Sets an optimizer-computed value and clears the consumed feedback."""
        self.value = new_value
        self.zero_feedback()

    def zero_feedback(self) -> None:
        """Clears collected feedback, like ``zero_grad``."""
        self._feedback_buffer.clear()
        self.dropped_feedback = 0
        self.graph_level = None


def module_parent(module: Any) -> Any:
    """Returns the module that holds ``module`` as a child (under its name), or None.

    Modules note their parent when they are assigned (weakly, so a child does
    not keep a discarded parent alive). The link counts only while the
    parent still holds the module under that name, so a module that was
    removed, replaced or deep-copied on its own is a root again.
    """
    ref = module.__dict__.get("_parent")
    parent = ref() if ref is not None else None
    if parent is None or parent.__dict__.get("_children", {}).get(module._name) is not module:
        return None
    return parent
