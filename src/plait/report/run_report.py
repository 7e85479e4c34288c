"""`RunReport`: what one run did, as plain data that saves to and loads from JSON.

Built from a `Profiler` (`RunReport.from_profiler`), it holds exact totals
(per alias: calls, requests, retries, 429s, failures, tokens, cost), a
per-second timeline per endpoint (mean requests in flight and waiting,
requests, 429s, errors), a latency summary per module (with the part of it
spent waiting for limits), the failed items, the aliases that have no price, what each endpoint of a
fallback chain served and failed and when its circuit opened, each budget's books,
optionally the program graph and training scores, and a sample of spans
for the trace. A report read back with `RunReport.load` is data only: JSON
numbers, strings, lists and mappings, never code, each field plait reads
checked for its type first (`report._shape`).
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from plait import _files
from plait import _jsontext as jsontext
from plait.errors import PlaitError
from plait.report.fallbacks import budget_lines, fallback_data, fallback_lines
from plait.report.perfetto import trace_events
from plait.report.profiling import Profiler
from plait.resources.books import budget_books
from plait.resources.usage import active_budgets

__all__ = ["FORMAT", "RunReport", "RunReportError", "graph_data"]

FORMAT = "plait.run/1"
PRICE_HINT = 'add "price": {"input": <$ per Mtok>, "output": <$ per Mtok>} to its endpoints'
"""What to do when a run's cost is unknown."""
_SAMPLES_PER_MODULE = 2000
"""Latencies kept per module for the distribution plot."""


class RunReportError(PlaitError, ValueError):
    """A run.json cannot be read as a report; the message names the file and the line,
    column or field that is wrong."""


def graph_data(graph: Any) -> dict[str, Any]:
    """Returns an `InferenceGraph` as JSON-ready data: nodes, edges, outputs and Mermaid text."""
    nodes = [
        {
            "id": node.id,
            "kind": str(node.kind),
            "name": node.name or node.id,
            "module_path": node.module_path,
            "llm": getattr(node.module, "alias", None) is not None,
            "dependencies": list(node.dependencies),
        }
        for node in graph.nodes.values()
    ]
    return {"nodes": nodes, "outputs": list(graph.output_ids), "mermaid": graph.to_mermaid()}


def _percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    position = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[position]


@dataclass
class RunReport:
    """Usage, cost, timings, retries and errors of one run.

    Example::

        with profile() as prof:
            outputs = program.run_sync(rows)
        report = prof.report(program="Summarize")
        report.usage["cost"], report.items["failed"]
    """

    program: str | None = None
    """What ran (``pkg.module:Program`` from the CLI, else the class name)."""
    kind: str = "run"
    """``run``, ``eval`` or ``train``."""
    started_at: float = 0.0
    """Epoch seconds when profiling started."""
    wall_time: float = 0.0
    """Seconds from the start of profiling to the report."""
    items: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0, "restored": 0})
    """Batch items that finished, that failed, of the finished ones those whose output
    was read back from a checkpoint instead of run (``restored``), and, when a budget
    refused calls, of the failed ones those it left undone (``refused``)."""
    aliases: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per alias: calls, cache_hits, requests, retries, rate_limited, failures, tokens, cost."""
    modules: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per module path: count, mean, p50, p90, p99, max seconds of its calls, and their
    ``samples``; ``wait`` (mean, p50, p90, p99, max) and ``wait_samples`` (one per sample),
    the part of each call spent waiting for limits (a slot, a rate, a pause) — the rest is
    the request and the module's own work."""
    timeline: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per endpoint: ``step`` (seconds per bucket), ``t`` (bucket starts), ``in_flight``
    and ``waiting`` (mean requests), ``requests``, ``rate_limited``, ``errors`` per bucket."""
    failures: list[dict[str, Any]] = field(default_factory=list)
    """The first failed items: index, error_type, message, node."""
    graph: dict[str, Any] | None = None
    """The program graph (`graph_data`)."""
    training: dict[str, Any] | None = None
    """For a training run (a `TrainReport` as data): ``initial_score``, ``scores`` per epoch,
    ``best_epoch``, ``accepted`` (kept), ``discarded`` (undone by keep-best), ``rejected``,
    ``reason``, and ``history`` (per optimizer step: epoch, accepted, discarded, rejected)."""
    learning: list[dict[str, Any]] | None = None
    """For a run that learned (`plait.report.learning.LearningLog.steps`): one entry per
    learning step, in order: ``id``, ``parent`` (the step it happened in), ``kind``
    (``optimize``, ``round``, ``candidate``, ``proposal``, ``backward``, ``decision``,
    ``update``), ``inputs`` and ``outputs`` (its facts: scores, evidence, sizes), ``error``."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """Anything else a caller adds (the CLI: ``score`` of an evaluation, file names)."""
    unpriced: list[str] = field(default_factory=list)
    """Aliases whose endpoint has no price: their cost is unknown, not zero."""
    spans: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {"nodes": [], "requests": []}
    )
    """Node and request spans (a uniform sample when ``sampled``) for the trace."""
    sampled: bool = False
    """Whether ``spans`` is a sample of the run (profiling with ``max_records``)."""
    fallbacks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per alias whose fallback chain was at work: each endpoint in order, with ``served``,
    ``failed``, ``skipped`` calls and its circuit's ``circuit_opened_at`` (epoch seconds,
    while open), ``circuit_failures``, ``circuit_openings`` (`report.fallbacks`)."""
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per budget (``the run``, ``endpoint 'llm'``): its books at the end, ``limits``,
    ``spent``, ``held``, ``left`` (`plait.resources.books`)."""

    # -- building ---------------------------------------------------------------------

    @classmethod
    def from_profiler(
        cls,
        profiler: Profiler,
        *,
        program: str | None = None,
        kind: str = "run",
        graph: Any = None,
        training: dict[str, Any] | None = None,
        learning: list[dict[str, Any]] | None = None,
        metrics: dict[str, Any] | None = None,
        budgets: dict[str, dict[str, Any]] | None = None,
    ) -> RunReport:
        """Builds the report of everything ``profiler`` saw.

        Args:
            profiler: the profiler that was active during the run.
            program: a name for what ran.
            kind: ``run``, ``eval`` or ``train``.
            graph: the program's `InferenceGraph` (or `graph_data` of it).
            training: training scores and updates (see the ``training`` field).
            learning: the learning steps (see the ``learning`` field).
            metrics: extra figures to keep.
            budgets: the books of the budgets the run was held to, by name (see the
                ``budgets`` field); by default those of the budgets open here.
        """
        nodes = [r.span() for r in profiler.records]
        requests = [r.span() for r in profiler.requests]
        if graph is not None and not isinstance(graph, dict):
            graph = graph_data(graph)
        return cls(
            program=program,
            kind=kind,
            started_at=profiler.started_at,
            wall_time=profiler.now(),
            items={
                "ok": profiler.items_ok,
                "failed": profiler.items_failed,
                "restored": profiler.items_restored,
            }
            | ({"refused": profiler.items_refused} if profiler.items_refused else {}),
            aliases={alias: dict(t) for alias, t in sorted(profiler.alias_totals.items())},
            modules=_module_latencies(profiler),
            timeline=_timelines(profiler),
            failures=[asdict(f) for f in profiler.failures],
            graph=graph,
            training=training,
            learning=learning,
            metrics=dict(metrics or {}),
            unpriced=sorted(profiler.unpriced),
            spans={"nodes": nodes, "requests": requests},
            sampled=profiler.nodes_seen > len(nodes)
            or sum(t["requests"] for t in profiler.alias_totals.values()) > len(requests),
            fallbacks=fallback_data(profiler),
            budgets=budgets
            if budgets is not None
            else {
                "the run" if n == 0 else f"the run ({n + 1})": budget_books(b)
                for n, b in enumerate(active_budgets())
            },
        )

    # -- reading ----------------------------------------------------------------------

    @property
    def usage(self) -> dict[str, float]:
        """Totals over all aliases: calls, cache_hits, requests, retries, 429s, failures,
        tokens and cost."""
        total: dict[str, float] = {}
        for numbers in self.aliases.values():
            for key, value in numbers.items():
                total[key] = total.get(key, 0) + value
        for key in ("calls", "requests", "retries", "rate_limited", "failures", "cost"):
            total.setdefault(key, 0)
        total.setdefault("input_tokens", 0)
        total.setdefault("output_tokens", 0)
        return total

    def summary(self) -> str:
        """Returns a few lines for a terminal: items, calls, tokens, cost, retries, failures,
        what each endpoint of a fallback chain served and failed, and each budget's books."""
        u = self.usage
        items = self.items
        lines = [
            f"{items['ok'] + items['failed']} items: {self.items_text()} in {self.wall_time:.1f} s",
            f"{int(u['calls'])} LLM calls ({int(u.get('cache_hits', 0))} from cache), "
            f"{int(u['requests'])} requests, {int(u['retries'])} retries, "
            f"{int(u['rate_limited'])} rate-limited, {int(u['failures'])} failed calls",
            f"tokens: {int(u['input_tokens'])} in, {int(u['output_tokens'])} out; "
            f"cost {self.cost_text()}",
        ]
        lines += fallback_lines(self.fallbacks) + budget_lines(self.budgets)
        for name, value in self.metrics.items():
            if isinstance(value, int | float | str):
                lines.append(f"{name}: {value}")
        return "\n".join(lines)

    def items_text(self) -> str:
        """Returns ``"6 ok (4 from the checkpoint), 1 failed"``: the items as they finished
        (``", 3 left undone by the budget"`` after it, when a budget refused their calls)."""
        items = self.items
        restored, refused = items.get("restored", 0), items.get("refused", 0)
        from_checkpoint = f" ({restored} from the checkpoint)" if restored else ""
        undone = f", {refused} left undone by the budget" if refused else ""
        return f"{items['ok']} ok{from_checkpoint}, {items['failed'] - refused} failed{undone}"

    def cost_text(self) -> str:
        """Returns the cost as far as it is known: ``$0.0123``, naming the aliases that have
        no price, or ``unknown: no prices set ...`` when none has one ($0 would be untrue)."""
        priced = [alias for alias in self.aliases if alias not in self.unpriced]
        if self.unpriced and not priced:
            return f"unknown: no prices set ({PRICE_HINT})"
        cost = f"${self.usage['cost']:.4f}"
        if self.unpriced:
            return f"{cost} (no price set for {', '.join(self.unpriced)})"
        return cost

    # -- files ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Returns the report as JSON-ready data (with its ``format``)."""
        return {"format": FORMAT, **asdict(self)}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the report as JSON to ``path``, replacing it whole.

        Raises:
            FileError: ``path`` is a symbolic link (never written through) or
                not a regular file, or cannot be written.
        """
        with _files.replacing(path) as file:
            json.dump(self.to_dict(), file, ensure_ascii=False, default=str)
            file.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RunReport:
        """Reads a report written by `save`, checking the type of every field plait reads.

        Raises:
            RunReportError: the file is not a plait run report, is not JSON, nests
                deeper than a report does, or has a field of the wrong type; the
                message names the file and the line and column or the field.
        """
        # import time: pydantic, only when reading a file
        from plait.report._shape import shape_problem

        try:
            text = Path(path).read_text(encoding="utf-8")
            data = jsontext.loads(text)
        except json.JSONDecodeError as exc:
            raise RunReportError(
                f"{path}:{exc.lineno}:{exc.colno}: not a readable run report ({exc.msg})"
            ) from None
        except (OSError, ValueError) as exc:
            raise RunReportError(f"{path}: not a readable run report ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise RunReportError(
                f"{path}: not a plait run report (format {found!r}, expected {FORMAT!r}); "
                "write one with `plait run ... --output out.jsonl` or RunReport.save"
            )
        problem = shape_problem(data)
        if problem is not None:
            raise RunReportError(
                f"{path}: {problem}; the file was edited or damaged: write it again with "
                "`plait run` or RunReport.save"
            )
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def trace_events(self) -> dict[str, Any]:
        """Returns the spans as a Chrome / Perfetto trace (``{"traceEvents": [...]}``)."""
        return trace_events(self.spans["nodes"], self.spans["requests"], self.started_at)

    def save_trace(self, path: str | os.PathLike[str]) -> None:
        """Writes `trace_events` as JSON to ``path`` (open it in ui.perfetto.dev).

        Raises:
            FileError: as `save` does.
        """
        with _files.replacing(path) as file:
            json.dump(self.trace_events(), file, separators=(",", ":"))


def _module_latencies(profiler: Profiler) -> dict[str, dict[str, Any]]:
    by_module: dict[str, list[tuple[float, float]]] = {}
    for record in profiler.records:
        if not record.cache_hit:
            path = record.module_path or record.node_id
            by_module.setdefault(path, []).append((record.duration, record.wait))
    summary: dict[str, dict[str, Any]] = {}
    for path, timings in sorted(by_module.items()):
        durations = [duration for duration, _ in timings]
        waits = [wait for _, wait in timings]
        step = max(1, len(timings) // _SAMPLES_PER_MODULE)
        summary[path] = {
            "count": len(timings),
            **_spread(durations),
            "samples": [round(d, 6) for d in durations[::step]],
            "wait": _spread(waits),
            "wait_samples": [round(w, 6) for w in waits[::step]],
        }
    return summary


def _spread(values: list[float]) -> dict[str, float]:
    """Returns the mean, p50, p90, p99 and max of ``values`` (not empty)."""
    ordered = sorted(values)
    return {
        "mean": statistics.fmean(ordered),
        "p50": _percentile(ordered, 0.5),
        "p90": _percentile(ordered, 0.9),
        "p99": _percentile(ordered, 0.99),
        "max": ordered[-1],
    }


def _timelines(profiler: Profiler) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for endpoint, tl in sorted(profiler.timelines.items()):
        step = tl.step
        buckets = set(tl.busy) | set(tl.waiting) | set(tl.requests)
        if not buckets:
            continue
        span = range(min(buckets), max(buckets) + 1)
        out[endpoint] = {
            "step": step,
            "t": [round(b * step, 6) for b in span],
            "in_flight": [round(tl.busy.get(b, 0.0) / step, 3) for b in span],
            "waiting": [round(tl.waiting.get(b, 0.0) / step, 3) for b in span],
            "requests": [tl.requests.get(b, 0) for b in span],
            "rate_limited": [tl.rate_limited.get(b, 0) for b in span],
            "errors": [tl.errors.get(b, 0) for b in span],
        }
    return out
