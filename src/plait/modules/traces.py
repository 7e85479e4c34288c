"""Traces: a record of every LLM call a module makes, to inspect or tabulate.

Program modules call `record_trace` after each call; the records live on the
module in a bounded deque (the last ``module.trace_limit`` calls, 1,000 by
default), and `Module.traces()` gathers them from a module and all its
descendants, oldest first. They answer the questions of debugging and
monitoring: what prompt did this step actually send, what came back, how long
did it take, what did it cost, was it a cache hit.

Example::

    qa = Predict("question -> answer").bind(config)
    await qa(question="What is the capital of France?")
    record = qa.traces()[-1]
    record.messages[-1]["content"], record.output, record.latency
    qa.traces_frame()          # a pandas DataFrame, if pandas is installed
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from plait import _context
from plait._context import module_path
from plait.backends.types import HoldsUsage, Request, Response, Usage, message_to_dict

__all__ = ["DEFAULT_TRACE_LIMIT", "TraceRecord", "get_traces", "record_trace"]

DEFAULT_TRACE_LIMIT = 1000
"""Records kept per module when it sets no ``trace_limit`` of its own."""


@dataclass(slots=True)
class TraceRecord(HoldsUsage):
    """One LLM call made by a module (``input_tokens``, ``cost``, ``cache_hit`` … read its
    ``usage``)."""

    module: str
    """Dotted path of the module when it ran (``pipeline.qa``); its class name at the top level."""
    module_type: str
    """Class name of the module (``Predict``, ``ChainOfThought`` …)."""
    alias: str | None
    """The resource alias the call went to."""
    inputs: dict[str, Any]
    """The module's inputs by name."""
    messages: list[dict[str, Any]]
    """The conversation sent, as OpenAI-style dicts (``role``, ``content`` …)."""
    output: Any
    """The parsed outputs (a dict), or the reply text when it could not be parsed."""
    latency: float
    """Seconds from the request to the reply, waits for limits and retries included."""
    usage: Usage = field(default_factory=Usage)
    """What the call consumed: the reply's `Usage` (its cost 0.0 when the endpoint has no
    price; ``cache_hit`` when the reply came from the response cache, costing nothing)."""
    timestamp: float = field(default_factory=time.time)
    """Wall-clock time (``time.time()``) when the call started."""
    error: str | None = None
    """Why the call (or the parsing of its reply) failed; None when it succeeded."""
    model: str | None = None
    """The model that answered, as the provider reported it."""
    rollout_id: str | None = None
    """The rollout id of the request (set by BestOfN and friends)."""
    index: int | None = None
    """Position of the batch item the call served (None outside a batch)."""

    def as_dict(self) -> dict[str, Any]:
        """Returns the record as a plain dict (one row of `Module.traces_frame`), its usage
        as the columns ``input_tokens``, ``output_tokens``, ``cost``, ``cache_hit``."""
        row: dict[str, Any] = {}
        for name, value in asdict(self).items():
            if name == "usage":
                usage = self.usage
                row["input_tokens"] = usage.input_tokens
                row["output_tokens"] = usage.output_tokens
                row["cost"] = usage.cost
                row["cache_hit"] = usage.cache_hit
            else:
                row[name] = value
        return row


def get_traces(module: Any) -> list[TraceRecord]:
    """Returns the records of every LLM call of ``module`` and its descendants, oldest first.

    The same as ``module.traces()`` (and ``module.get_traces()``), as a
    function for code that reads traces without holding a method;
    ``module.traces_frame()`` gives them as a pandas DataFrame.
    """
    return module.traces()


def record_trace(
    module: Any,
    request: Request,
    response: Response | None,
    *,
    started: float,
    inputs: Mapping[str, Any],
    output: Any = None,
    error: BaseException | str | None = None,
    alias: str | None = None,
) -> TraceRecord:
    """Records one LLM call on ``module`` and returns the record.

    Call it right after the call returns (or fails), from inside the module's
    ``async def forward``, so the module path of the running node is known.

    Args:
        module: the module that made the call; the record is kept on it.
        request: what was sent.
        response: what came back, or None when the call itself failed.
        started: ``time.perf_counter()`` taken just before the call.
        inputs: the module's inputs by name.
        output: the parsed outputs; defaults to the reply text.
        error: why the call or its parsing failed, if it did.
        alias: the alias called; defaults to the response's, then ``module.alias``.
    """
    elapsed = time.perf_counter() - started
    meta = response.meta if response is not None else {}
    if output is None and response is not None:
        output = response.text
    record = TraceRecord(
        module=module_path(module),
        module_type=type(module).__name__,
        alias=alias or meta.get("alias") or getattr(module, "alias", None),
        inputs=dict(inputs),
        messages=[message_to_dict(m) for m in request.messages],
        output=output,
        latency=elapsed,
        usage=response.usage if response is not None else Usage(),
        timestamp=time.time() - elapsed,
        error=None if error is None else _error_text(error),
        model=response.model if response is not None else None,
        rollout_id=request.rollout_id,
        index=_context.NODE_SCOPE.get()[1],
    )
    _store(module, record)
    return record


def _error_text(error: BaseException | str) -> str:
    if isinstance(error, str):
        return error
    return f"{type(error).__name__}: {error}"


def _store(module: Any, record: TraceRecord) -> None:
    limit = getattr(module, "trace_limit", DEFAULT_TRACE_LIMIT)
    records = module.__dict__.get("_traces")
    if records is None or records.maxlen != limit:
        records = deque(records or (), maxlen=limit)
        object.__setattr__(module, "_traces", records)
    records.append(record)
