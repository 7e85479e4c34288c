"""Text exports of an InferenceGraph: Mermaid and Graphviz DOT."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plait.tracing.graph import InferenceGraph, Node

__all__ = ["to_dot", "to_mermaid"]


def _safe_id(node_id: str) -> str:
    return re.sub(r"\W", "_", node_id)


def _label(node: Node) -> str:
    if node.kind == "input":
        return node.id
    if node.kind == "op":
        return f"{node.id}" + (f" in {node.module_path}" if node.module_path else "")
    return f"{node.id}\n{node.name}"


def to_mermaid(graph: InferenceGraph) -> str:
    """Returns a Mermaid ``graph TD`` flowchart: one box per node, one arrow per dependency."""
    lines = ["graph TD"]
    for node in graph:
        label = _label(node).replace("\n", "<br/>").replace('"', "#quot;")
        shape = f'(["{label}"])' if node.kind == "input" else f'["{label}"]'
        lines.append(f"    {_safe_id(node.id)}{shape}")
    for node in graph:
        for dep in node.dependencies:
            lines.append(f"    {_safe_id(dep)} --> {_safe_id(node.id)}")
    return "\n".join(lines)


def to_dot(graph: InferenceGraph) -> str:
    """Returns a Graphviz ``digraph``: inputs as ellipses, calls as boxes, ops as notes."""
    shapes = {"input": "ellipse", "call": "box", "op": "note"}
    lines = ["digraph plait {", "    rankdir=TB;"]
    for node in graph:
        label = _label(node).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lines.append(f'    "{node.id}" [label="{label}", shape={shapes[node.kind]}];')
    for node in graph:
        for dep in node.dependencies:
            lines.append(f'    "{dep}" -> "{node.id}";')
    lines.append("}")
    return "\n".join(lines)
