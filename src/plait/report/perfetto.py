"""A run's spans as a Chrome / Perfetto trace (the JSON "Trace Event Format").

Complete events (``"ph": "X"``, microseconds) on one process per endpoint
and one per module; overlapping spans are spread over numbered lanes (one
thread each), because a thread's spans must nest. On an endpoint, the spans
of one call share a lane: ``wait`` (for a slot, a rate or a pause), the
``request`` (named by its status when it failed: ``429``, ``500``,
``timeout``), a ``backoff`` before each retry, and the retried requests
(``retry 1``, …). Open the file in ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

__all__ = ["trace_events"]

_US = 1_000_000


def _lanes(spans: list[tuple[float, float, Any]]) -> list[tuple[int, Any]]:
    """Assigns each ``(start, end, item)`` the lowest lane free at its start."""
    busy: list[tuple[float, int]] = []  # (end, lane) of spans still open
    free: list[int] = []
    placed = []
    count = 0
    for start, end, item in sorted(spans, key=lambda s: (s[0], s[1])):
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane, count = count, count + 1
        heapq.heappush(busy, (end, lane))
        placed.append((lane, item))
    return placed


def _meta(pid: int, name: str, lanes: int, lane_label: str, sort: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}},
        {
            "ph": "M",
            "pid": pid,
            "tid": 0,
            "name": "process_sort_index",
            "args": {"sort_index": sort},
        },
    ]
    for lane in range(lanes):
        events.append(
            {
                "ph": "M",
                "pid": pid,
                "tid": lane,
                "name": "thread_name",
                "args": {"name": f"{lane_label} {lane}"},
            }
        )
    return events


def _span(
    name: str, cat: str, pid: int, tid: int, start: float, end: float, **args: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": round(start * _US, 1),
        "dur": round(max(0.0, end - start) * _US, 1),
        "args": args,
    }


def _attempt_name(request: dict[str, Any]) -> str:
    if request.get("error") is None:
        return "request" if request["attempt"] == 1 else f"retry {request['attempt'] - 1}"
    status = request.get("status")
    if status is None:
        kind = str(request["error"]).split(":", 1)[0]
        return "timeout" if "Timeout" in kind else kind
    return str(status)


def _endpoint_events(pid: int, endpoint: str, requests: list[dict[str, Any]]) -> list[dict]:
    calls: dict[int, list[dict[str, Any]]] = {}
    for request in requests:
        calls.setdefault(request["call"], []).append(request)
    spans = []
    for attempts in calls.values():
        attempts.sort(key=lambda r: r["attempt"])
        spans.append((attempts[0]["queued"], attempts[-1]["end"], attempts))
    placed = _lanes(spans)
    events = _meta(pid, f"endpoint {endpoint}", max((lane for lane, _ in placed), default=-1) + 1,
                   "lane", pid)  # fmt: skip
    for lane, attempts in placed:
        previous_end = None
        for r in attempts:
            if previous_end is not None and r["queued"] > previous_end:
                events.append(
                    _span("backoff", "retry", pid, lane, previous_end, r["queued"], call=r["call"])
                )
            if r["sent"] > r["queued"]:
                events.append(
                    _span("wait", "wait", pid, lane, r["queued"], r["sent"], alias=r["alias"])
                )
            events.append(
                _span(
                    _attempt_name(r),
                    "request" if r["attempt"] == 1 else "retry",
                    pid,
                    lane,
                    r["sent"],
                    r["end"],
                    alias=r["alias"],
                    attempt=r["attempt"],
                    status=r.get("status"),
                    error=r.get("error"),
                    input_tokens=r.get("input_tokens", 0),
                    output_tokens=r.get("output_tokens", 0),
                    cost=r.get("cost", 0.0),
                )
            )
            previous_end = r["end"]
    return events


def _module_events(pid: int, path: str, nodes: list[dict[str, Any]]) -> list[dict]:
    placed = _lanes([(n["start"], n["end"], n) for n in nodes])
    events = _meta(pid, f"module {path}", max((lane for lane, _ in placed), default=-1) + 1,
                   "lane", pid)  # fmt: skip
    for lane, n in placed:
        events.append(
            _span(
                n["node_id"],
                "node",
                pid,
                lane,
                n["start"],
                n["end"],
                input_index=n.get("input_index"),
                input_tokens=n.get("input_tokens", 0),
                output_tokens=n.get("output_tokens", 0),
                cost=n.get("cost", 0.0),
                cache_hit=n.get("cache_hit", False),
            )
        )
    return events


def trace_events(
    nodes: Iterable[dict[str, Any]], requests: Iterable[dict[str, Any]], started_at: float = 0.0
) -> dict[str, Any]:
    """Returns node and request spans (`RunReport.spans`) as a Chrome / Perfetto trace.

    Args:
        nodes: `NodeTiming` records as dicts (seconds since the run started).
        requests: `RequestTiming` records as dicts.
        started_at: epoch seconds of the run's start, kept in the trace's metadata.
    """
    by_endpoint: dict[str, list[dict[str, Any]]] = {}
    for request in requests:
        by_endpoint.setdefault(request["endpoint"], []).append(request)
    by_module: dict[str, list[dict[str, Any]]] = {}
    for node in nodes:
        by_module.setdefault(node.get("module_path") or node["node_id"], []).append(node)
    events: list[dict[str, Any]] = []
    pid = 1
    for endpoint in sorted(by_endpoint):
        events += _endpoint_events(pid, endpoint, by_endpoint[endpoint])
        pid += 1
    for path in sorted(by_module):
        events += _module_events(pid, path, by_module[path])
        pid += 1
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "plait", "started_at": started_at},
    }
