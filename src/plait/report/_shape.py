"""The shape of a run.json: every field the summary, the page and the trace read.

`RunReport.load` checks a file against `RunReportData` before anything reads
it, so a hand-edited or damaged file is refused with the field that is wrong
instead of failing somewhere inside plotly (or drawing text where a number
belongs). Fields plait does not read may hold anything, and keys it does not
know are left alone.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, NotRequired

from pydantic import AllowInfNan, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic reads typing's TypedDict only from 3.12

__all__ = ["RunReportData", "shape_problem"]

Total = Annotated[float, AllowInfNan(False)]
"""A finite number: alias totals are summed and shown as whole numbers."""


class Items(TypedDict):
    ok: int
    failed: int
    restored: NotRequired[int]  # reports written before it counted them have none
    refused: NotRequired[int]  # nor these: failed items a budget left undone


class ModuleLatency(TypedDict):
    samples: list[float]
    wait_samples: NotRequired[list[float]]  # reports written before it was kept have none


class Timeline(TypedDict):
    step: NotRequired[float]
    t: list[float]
    in_flight: list[float]
    waiting: list[float]
    rate_limited: list[float]


class Failure(TypedDict):
    index: int | None
    error_type: str
    message: str
    node: NotRequired[str | None]


class GraphNode(TypedDict):
    id: str
    kind: str
    name: str
    llm: bool
    dependencies: list[str]


class Graph(TypedDict):
    nodes: list[GraphNode]
    mermaid: NotRequired[str]


class TrainingStep(TypedDict):
    accepted: int
    rejected: int


class Training(TypedDict, total=False):
    initial_score: float | None
    scores: list[float | None]
    history: list[TrainingStep]


class LearningStep(TypedDict):
    id: int
    parent: int | None
    kind: str
    inputs: dict[str, Any]
    outputs: NotRequired[dict[str, Any] | None]
    error: NotRequired[str | None]


class NodeSpan(TypedDict):
    node_id: str
    module_path: NotRequired[str | None]
    start: float
    end: float
    input_index: NotRequired[int | None]
    input_tokens: NotRequired[int]
    output_tokens: NotRequired[int]
    cost: NotRequired[float]
    cache_hit: NotRequired[bool]


class RequestSpan(TypedDict):
    endpoint: str
    alias: str
    call: int
    attempt: int
    queued: float
    sent: float
    end: float
    status: NotRequired[int | None]
    error: str | None
    input_tokens: NotRequired[int]
    output_tokens: NotRequired[int]
    cost: NotRequired[float]


class Spans(TypedDict):
    nodes: list[NodeSpan]
    requests: list[RequestSpan]


class ChainMember(TypedDict):
    endpoint: str
    served: int
    failed: int
    skipped: int
    circuit_openings: int
    circuit_failures: int
    circuit_opened_at: float | None


class Books(TypedDict):
    limits: dict[str, Total]
    spent: dict[str, Total]
    held: dict[str, Total]
    left: dict[str, Total]


class RunReportData(TypedDict, total=False):
    """A run.json (`RunReport.to_dict`); a field left out takes `RunReport`'s default."""

    program: str | None
    kind: str
    started_at: float
    wall_time: float
    items: Items
    aliases: dict[str, dict[str, Total]]
    modules: dict[str, ModuleLatency]
    timeline: dict[str, Timeline]
    failures: list[Failure]
    graph: Graph | None
    training: Training | None
    learning: list[LearningStep] | None
    metrics: dict[str, Any]
    unpriced: list[str]
    spans: Spans
    sampled: bool
    fallbacks: dict[str, list[ChainMember]]
    budgets: dict[str, Books]


@functools.cache
def _adapter() -> TypeAdapter[RunReportData]:
    return TypeAdapter(RunReportData)


def shape_problem(data: dict[str, Any]) -> str | None:
    """Returns what is wrong with the shape of run.json ``data`` (the first field, and how
    many more), or None when every field plait reads has its type.

    Strict: text is never taken for a number, nor a number for text or a flag.
    """
    try:
        _adapter().validate_python(data, strict=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        return f"{_field(first['loc'])} {_what(first)}{more}"
    return None


def _field(loc: tuple[int | str, ...]) -> str:
    """Returns a field's place as Python would spell it: ``failures[0].index``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part.isidentifier():
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return text


def _what(error: Any) -> str:
    if error["type"] == "missing":
        return "is missing"
    found = error["input"]
    shown = f" {found!r:.60}" if isinstance(found, str | int | float) else ""
    return f"{error['msg'].removeprefix('Input ')}, not {type(found).__name__}{shown}"
