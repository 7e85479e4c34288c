"""InferenceGraph: the flat dataflow graph a traced program becomes.

Nodes are the leaf calls of the program (LLM calls, functional ops, leaf
modules) plus one node per input. A node's recorded arguments keep their
structure; where they read another node's result they hold a `ValueRef`,
and where they hold text built from results (an f-string, ``"".join``) they
hold a `Template`. Execution substitutes both with real data.

Example::

    graph = Tracer().trace(Synthesizer(), "some text")
    print(graph.to_mermaid())
    # graph TD
    #     input_text["input:text"]
    #     analyzer_technical["analyzer.technical<br/>LLMInference"]
    #     ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from plait.module import LLMInference
from plait.tracing.export import to_dot, to_mermaid
from plait.values import ValueRef

__all__ = ["InferenceGraph", "Node", "Scope", "Slot", "Template", "iter_refs", "substitute"]

NodeKind = Literal["input", "call", "op"]


@dataclass(frozen=True, slots=True)
class Slot:
    """A hole in a `Template`: the text of node ``ref`` (``str`` or ``repr`` of it).

    A traced value that went through ``json.dumps`` leaves its placeholder
    JSON-escaped; such a slot (``json`` set) writes the text JSON-escaped the
    same way, so the rendered string is what ``json.dumps`` of the real value
    would have given.
    """

    ref: str
    mode: str = "s"
    """``s`` formats with ``format(payload, spec)``, ``r`` with ``format(repr(payload), spec)``,
    ``v`` (the traced value itself, not text made from it) like ``s``."""
    spec: str = ""
    json: str = ""
    """``""`` (plain text), ``"ascii"`` or ``"unicode"``: escape the text as ``json.dumps``
    does with ``ensure_ascii`` true or false."""
    quoted: bool = False
    """The slot is a whole JSON string, quotes included: it renders as ``json.dumps`` of the
    text, or, in mode ``v``, of the payload itself (a dict becomes a JSON object)."""

    def render(self, payload: Any) -> str:
        """Returns the text this slot stands for, given its node's payload."""
        if not self.json:
            return format(repr(payload) if self.mode == "r" else payload, self.spec)
        import json  # import time: only a slot inside JSON text, which few programs build

        if self.quoted and self.mode == "v":
            try:
                return json.dumps(payload, ensure_ascii=self.json == "ascii")
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"json.dumps of the output of {self.ref} (a {type(payload).__name__}) "
                    f"failed at run time: {exc}; as in plain Python, json.dumps writes only "
                    "JSON data. Give the call a dict or list response_format, or do the step "
                    "in an `async def forward` with real values"
                ) from exc
        text = format(repr(payload) if self.mode == "r" else payload, self.spec)
        escaped = json.dumps(text, ensure_ascii=self.json == "ascii")
        return escaped if self.quoted else escaped[1:-1]


@dataclass(frozen=True, slots=True)
class Template:
    """Text built from literal pieces and node results, recorded from an f-string or join."""

    parts: tuple[str | Slot, ...]

    @property
    def refs(self) -> list[str]:
        """Returns the refs the text reads, in order, once each."""
        return list(dict.fromkeys(p.ref for p in self.parts if isinstance(p, Slot)))

    def render(self, lookup: Callable[[str], Any]) -> str:
        """Returns the text with every slot filled from ``lookup(ref)`` (a raw payload)."""
        return "".join(
            part if isinstance(part, str) else part.render(lookup(part.ref)) for part in self.parts
        )

    def __repr__(self) -> str:
        text = "".join(p if isinstance(p, str) else _slot_label(p) for p in self.parts)
        return f"Template({text!r})"


def _slot_label(slot: Slot) -> str:
    if not slot.json:
        return f"{{{slot.ref}}}"
    return f"{{json({slot.ref})}}" if slot.quoted else f"{{json_text({slot.ref})}}"


def substitute(obj: Any, lookup: Callable[[str], Any]) -> Any:
    """Returns ``obj`` with each ValueRef replaced by ``lookup(ref)`` and each Template rendered.

    ``lookup`` returns a raw payload; containers keep their shape.
    """
    if isinstance(obj, ValueRef):
        return lookup(obj.ref)
    if isinstance(obj, Template):
        return obj.render(lookup)
    if isinstance(obj, list):
        return [substitute(item, lookup) for item in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(substitute(item, lookup) for item in obj)
    if isinstance(obj, dict):
        return {key: substitute(item, lookup) for key, item in obj.items()}
    return obj


@dataclass(eq=False, slots=True)
class Node:
    """One step of the graph.

    Attributes:
        id: unique, readable id (``stage3.synthesizer``, ``F.select_2``, ``input:text``).
        kind: ``input``, ``call`` (a leaf module) or ``op`` (a functional op).
        module: the leaf module called (None for inputs and ops).
        module_path: dotted path of the module (for ops: the module whose forward ran it).
        args: recorded positional arguments (ValueRef / Template where data flows in).
        kwargs: recorded keyword arguments.
        dependencies: ids of the nodes whose results this node reads, in first-use order.
        parameters: ``param:<name>`` refs this node reads through its arguments.
        op: the function of an ``op`` node.
        name: a display name (class name or ``F.<op>``).
        source: ``file.py:line`` of the call in user code, when known.
        input_path: for input nodes, the argument name and keys that reach the input.
    """

    id: str
    kind: NodeKind
    module: Any = None
    module_path: str = ""
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    dependencies: tuple[str, ...] = ()
    parameters: tuple[str, ...] = ()
    op: Callable[..., Any] | None = None
    name: str = ""
    source: str | None = None
    input_path: tuple[Any, ...] = ()

    def __repr__(self) -> str:
        deps = ", ".join(self.dependencies)
        return f"Node({self.id!r}, {self.kind}, {self.name}, deps=[{deps}])"


@dataclass(frozen=True, slots=True)
class Scope:
    """The call of a composite module that overrides ``backward``: its nodes answer to it.

    Tracing follows a composite's ``forward``, so its calls become ordinary
    nodes; when the composite defines its own ``backward``, backward visits
    the scope as one step instead of its nodes (see
    `plait.optimization.training.backward`). Its nodes are contiguous in recording order.
    """

    id: str
    """The composite's path, ``backward:<path>``."""
    module: Any
    module_path: str
    args: tuple[Any, ...]
    """Recorded positional arguments of the composite's call (ValueRef / Template inside)."""
    kwargs: dict[str, Any]
    output: Any
    """What its ``forward`` returned, recorded."""
    node_ids: tuple[str, ...]
    """The nodes recorded while its ``forward`` ran."""

    @property
    def kind(self) -> str:
        """Returns ``"scope"`` (a `Node`'s kind is input, call or op)."""
        return "scope"


class InferenceGraph:
    """A traced program: nodes in recording order (a topological order) plus outputs.

    Attributes:
        nodes: id → `Node`, in the order they were recorded.
        input_ids: ids of the input nodes.
        output: the structure ``forward`` returned, with ValueRef / Template inside.
        output_ids: ids of the nodes the output reads, in order.
        scopes: calls of composites with their own ``backward``, outermost only.
    """

    def __init__(
        self,
        nodes: dict[str, Node],
        input_ids: list[str],
        output: Any,
        output_ids: list[str],
        root: Any = None,
        scopes: tuple[Scope, ...] = (),
    ) -> None:
        self.nodes = nodes
        self.input_ids = input_ids
        self.output = output
        self.output_ids = output_ids
        self.root = root
        self.scopes = scopes
        self._dependents: dict[str, list[str]] | None = None
        self._heights: dict[str, int] | None = None
        self._unbound_dependencies: dict[str, int] | None = None
        self._hash: str | None = None

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def __repr__(self) -> str:
        return (
            f"InferenceGraph({len(self.nodes)} nodes, inputs={self.input_ids}, "
            f"outputs={self.output_ids})"
        )

    # ---------------------------------------------------------------- queries
    @property
    def dependents(self) -> dict[str, list[str]]:
        """Returns id → ids of nodes that read it (computed once)."""
        if self._dependents is None:
            dependents: dict[str, list[str]] = {node_id: [] for node_id in self.nodes}
            for node in self.nodes.values():
                for dep in node.dependencies:
                    dependents[dep].append(node.id)
            self._dependents = dependents
        return self._dependents

    @property
    def heights(self) -> dict[str, int]:
        """Returns id → the number of nodes on the longest path from it to a node
        nothing reads (those 1; computed once): the work still to come once it runs.
        The executor runs the calls with the most work after them first."""
        if self._heights is None:
            heights: dict[str, int] = {}
            for node_id in reversed(self.nodes):  # recording order is topological
                after = (heights[d] for d in self.dependents[node_id])
                heights[node_id] = 1 + max(after, default=0)
            self._heights = heights
        return self._heights

    @property
    def unbound_dependencies(self) -> dict[str, int]:
        """Returns id → how many of the node's dependencies are not graph inputs, for every
        node but the inputs (computed once): what a run waits for before the node may start.
        Copy it before counting down."""
        if self._unbound_dependencies is None:
            inputs = set(self.input_ids)
            self._unbound_dependencies = {
                node.id: sum(dep not in inputs for dep in node.dependencies)
                for node in self.nodes.values()
                if node.kind != "input"
            }
        return self._unbound_dependencies

    def topological_order(self) -> list[str]:
        """Returns node ids so that every node comes after its dependencies.

        Recording order already has this property; it is checked by `lint`.
        """
        return list(self.nodes)

    def ancestors(self, node_id: str) -> set[str]:
        """Returns ids of every node ``node_id`` depends on, directly or not."""
        return self._walk(node_id, lambda n: self.nodes[n].dependencies)

    def descendants(self, node_id: str) -> set[str]:
        """Returns ids of every node that depends on ``node_id``, directly or not."""
        return self._walk(node_id, lambda n: self.dependents[n])

    def _walk(self, start: str, step: Callable[[str], Any]) -> set[str]:
        if start not in self.nodes:
            raise KeyError(f"no node {start!r} in graph; nodes: {', '.join(self.nodes)}")
        found: set[str] = set()
        stack = list(step(start))
        while stack:
            node_id = stack.pop()
            if node_id not in found:
                found.add(node_id)
                stack.extend(step(node_id))
        return found

    def llm_nodes(self) -> list[Node]:
        """Returns the nodes that call an LLM (LLMInference leaves), in order."""
        return [n for n in self.nodes.values() if isinstance(n.module, LLMInference)]

    # ------------------------------------------------------------- integrity
    def lint(self) -> None:
        """Checks the graph is well formed; raises ``ValueError`` listing every problem.

        Checks: dependencies exist and come earlier, recorded refs are declared
        dependencies, outputs exist.
        """
        problems: list[str] = []
        position = {node_id: i for i, node_id in enumerate(self.nodes)}
        for node in self.nodes.values():
            for dep in node.dependencies:
                if dep not in position:
                    problems.append(f"{node.id}: unknown dependency {dep!r}")
                elif position[dep] >= position[node.id]:
                    problems.append(f"{node.id}: dependency {dep!r} is not earlier")
            used = set(iter_refs((node.args, node.kwargs)))
            undeclared = {r for r in used if not r.startswith("param:")} - set(node.dependencies)
            if undeclared:
                problems.append(f"{node.id}: reads undeclared {sorted(undeclared)}")
        for ref in self.output_ids:
            if ref not in position and not ref.startswith("param:"):
                problems.append(f"output reads unknown node {ref!r}")
        if problems:
            raise ValueError("malformed InferenceGraph:\n  " + "\n  ".join(problems))

    def structural_hash(self) -> str:
        """Returns a SHA-256 over the graph's structure (ids, types, deps, recorded args).

        Equal hashes mean the same program shape; checkpoints use it to refuse
        results written by a different program.
        """
        if self._hash is None:
            # import time: only a checkpoint asks, not a program's first call
            from hashlib import sha256

            digest = sha256()
            for node in self.nodes.values():
                kind_name = node.name or node.kind
                digest.update(
                    repr(
                        (
                            node.id,
                            node.kind,
                            kind_name,
                            node.module_path,
                            node.dependencies,
                            _stable(node.args),
                            _stable(node.kwargs),
                            node.input_path,
                        )
                    ).encode()
                )
                if node.module is not None:
                    digest.update(_module_fingerprint(node.module).encode())
            digest.update(repr(_stable(self.output)).encode())
            self._hash = digest.hexdigest()
        return self._hash

    # ---------------------------------------------------------------- export
    def to_mermaid(self) -> str:
        """Returns a Mermaid flowchart of the graph."""
        return to_mermaid(self)

    def to_dot(self) -> str:
        """Returns a Graphviz DOT description of the graph."""
        return to_dot(self)


def iter_refs(obj: Any) -> Iterator[str]:
    """Yields the refs a recorded argument reads (ValueRefs and Template slots)."""
    if isinstance(obj, ValueRef):
        yield obj.ref
    elif isinstance(obj, Template):
        yield from obj.refs
    elif isinstance(obj, list | tuple):
        for item in obj:
            yield from iter_refs(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from iter_refs(item)


def _stable(obj: Any) -> Any:
    """Returns a repr-stable form of recorded arguments (no memory addresses)."""
    if isinstance(obj, list | tuple):
        return tuple(_stable(item) for item in obj)
    if isinstance(obj, dict):
        return tuple((repr(k), _stable(v)) for k, v in obj.items())
    if isinstance(obj, ValueRef | Template | Slot | str | int | float | bool | type(None)):
        return obj
    return type(obj).__qualname__


def _module_fingerprint(module: Any) -> str:
    """Returns the settings of a leaf module that change what its call does."""
    settings = {
        key: value
        for key, value in vars(module).items()
        if not key.startswith("_") and isinstance(value, str | int | float | bool | type(None))
    }
    fmt = _type_name(getattr(module, "response_format", None))
    return f"{type(module).__qualname__}{sorted(settings.items())}{fmt}"


def _type_name(fmt: Any) -> str:
    """Returns a stable name for a response format.

    A generic alias's ``__name__`` drops its arguments (``list[str]`` and
    ``list[int]`` are both ``list``), so anything but a class is named by its repr.
    """
    if isinstance(fmt, type):
        return f"{fmt.__module__}.{fmt.__qualname__}"
    return repr(fmt)
