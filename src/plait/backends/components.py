"""Components: prompts built from blocks of text and from replies still to come (seed 004).

A `CBlock` is a block of text. A `Component` is a piece of a prompt made of
parts — blocks, other components, and `ModelOutputThunk`s, the replies of
calls that may not have run yet — and renders itself to text with
`Component.format_for_llm` once they have. `generate_walk` finds the thunks a
tree still waits for, and `Backend.do_generate_walk` computes them all
concurrently; `Backend.generate_from_context` does that by itself before it
renders a component given as its action.

Example::

    class Compare(Component):
        def __init__(self, a, b):
            self.a, self.b = a, b

        def parts(self):
            return [CBlock("Which is better?"), self.a, self.b]

    first, second = backend.generate_from_raw(["Write a haiku.", "Write a limerick."])
    thunk, ctx = backend.generate_from_context(Compare(first, second), Context())
    reply = await thunk          # both poems are written concurrently, then compared
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from plait.backends.base import ModelOutputThunk

__all__ = ["CBlock", "Component", "generate_walk", "render"]


class CBlock:
    """A block of text in a prompt (Mellea's content block).

    Args:
        value: the text.
        meta: anything the caller wants to keep with it (not sent).
    """

    __slots__ = ("meta", "value")

    def __init__(self, value: str, meta: dict[str, Any] | None = None) -> None:
        if not isinstance(value, str):
            raise TypeError(f"CBlock holds text, got {type(value).__name__}")
        self.value = value
        self.meta = dict(meta or {})

    def __str__(self) -> str:
        return self.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CBlock) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"CBlock({self.value!r})"


class Component(ABC):
    """A piece of a prompt made of parts, rendered once every reply inside it is known.

    Implement `parts`; override `format_for_llm` to lay the parts out
    otherwise than one per line. A component may carry ``tools`` (an
    iterable of `plait.Tool`s, functions or `ToolSpec`s) offered when it is
    the action of ``generate_from_context(..., tool_calls=True)``.
    """

    @abstractmethod
    def parts(self) -> Sequence[Component | CBlock | ModelOutputThunk]:
        """Returns the parts, in order: blocks, components and thunks."""

    def format_for_llm(self) -> str:
        """Returns the text sent to the model: each part rendered, one per line.

        Override this for another layout (use `render` on parts).

        Raises:
            RuntimeError: a thunk inside has not been computed yet.
        """
        return "\n".join(render(part) for part in self.parts())


def generate_walk(c: CBlock | Component | ModelOutputThunk) -> list[ModelOutputThunk]:
    """Returns the uncomputed thunks reachable from ``c``, depth first over `Component.parts`.

    Raises:
        ValueError: something in the tree is not a CBlock, Component or ModelOutputThunk.
    """
    found: list[ModelOutputThunk] = []
    _walk(c, found, set())
    return found


def _walk(item: Any, found: list[ModelOutputThunk], seen: set[int]) -> None:
    if isinstance(item, ModelOutputThunk):
        if not item.is_computed and id(item) not in seen:
            seen.add(id(item))
            found.append(item)
    elif isinstance(item, Component):
        if id(item) in seen:
            return  # a component reachable twice (or a cycle) is walked once
        seen.add(id(item))
        for part in item.parts():
            _walk(part, found, seen)
    elif not isinstance(item, CBlock):
        raise ValueError(
            f"generate_walk found a {type(item).__name__} ({item!r:.60}); a component's parts "
            "must be CBlocks, Components or ModelOutputThunks (wrap text in CBlock(...))"
        )


def render(item: CBlock | Component | ModelOutputThunk) -> str:
    """Returns the text of a block, a component (`Component.format_for_llm`) or a computed thunk.

    Raises:
        RuntimeError: a thunk has not been computed; resolve the tree first
            (``await backend.do_generate_walk(item)``).
        ValueError: ``item`` is none of these.
    """
    if isinstance(item, CBlock):
        return item.value
    if isinstance(item, Component):
        return item.format_for_llm()
    if isinstance(item, ModelOutputThunk):
        if item.value is None:
            raise RuntimeError(
                "a ModelOutputThunk inside the prompt has not been computed; await it, or "
                "call `await backend.do_generate_walk(component)` before rendering"
            )
        return item.value
    raise ValueError(
        f"cannot render a {type(item).__name__}; expected a CBlock, Component or ModelOutputThunk"
    )
