"""Text exports of an InferenceGraph: Mermaid and Graphviz DOT."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plait.tracing.graph import InferenceGraph, Node

__all__ = ["to_dot", "to_mermaid"]


def _mermaid_ids(graph: InferenceGraph) -> dict[str, str]:
    """Returns a Mermaid-safe id for each node, unique within the graph.

    Replacing punctuation can merge ids (``input:text`` and a module named
    ``input_text``), and Mermaid cannot parse a node called ``end``; either
    case gets a numeric suffix.
    """
    ids: dict[str, str] = {}
    used: set[str] = set()
    for node_id in graph.nodes:
        base = candidate = re.sub(r"\W", "_", node_id)
        n = 2
        while candidate in used or candidate.lower() == "end":
            candidate = f"{base}_{n}"
            n += 1
        used.add(candidate)
        ids[node_id] = candidate
    return ids


def _label(node: Node) -> str:
    if node.kind == "input":
        return node.id
    if node.kind == "op":
        return f"{node.id}" + (f" in {node.module_path}" if node.module_path else "")
    return f"{node.id}\n{node.name}"


def to_mermaid(graph: InferenceGraph) -> str:
    """Returns a Mermaid ``graph TD`` flowchart: one box per node, one arrow per dependency."""
    ids = _mermaid_ids(graph)
    lines = ["graph TD"]
    for node in graph:
        label = _label(node).replace("\n", "<br/>").replace('"', "#quot;")
        shape = f'(["{label}"])' if node.kind == "input" else f'["{label}"]'
        lines.append(f"    {ids[node.id]}{shape}")
    for node in graph:
        for dep in node.dependencies:
            lines.append(f"    {ids[dep]} --> {ids[node.id]}")
    return "\n".join(lines)


def to_dot(graph: InferenceGraph) -> str:
    """Returns a Graphviz ``digraph``: inputs as ellipses, calls as boxes, ops as notes."""
    shapes = {"input": "ellipse", "call": "box", "op": "note"}
    lines = ["digraph plait {", "    rankdir=TB;"]
    for node in graph:
        label = _dot_quote(_label(node))
        lines.append(f"    {_dot_quote(node.id)} [label={label}, shape={shapes[node.kind]}];")
    for node in graph:
        for dep in node.dependencies:
            lines.append(f"    {_dot_quote(dep)} -> {_dot_quote(node.id)};")
    lines.append("}")
    return "\n".join(lines)


def _dot_quote(text: str) -> str:
    """Returns ``text`` as a DOT quoted string (ids come from user keys and may hold quotes)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
