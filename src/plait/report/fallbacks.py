"""What each endpoint of a fallback chain served and failed, when its circuit opened, and
what each budget spent, holds and has left: as report data and as lines for a terminal.

A chain that silently serves every call from its backup hides that the primary is down;
these lines say so (``'primary' served 0 calls, 8 failed, 404 skipped: circuit open since
12:03:04 after 8 failed calls in a row`` / ``'backup' served 412 calls``). `RunReport`
keeps the data (``fallbacks``, ``budgets``), its summary and HTML page show it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plait.report.profiling import Profiler

__all__ = ["budget_lines", "fallback_data", "fallback_lines"]


def fallback_data(profiler: Profiler) -> dict[str, list[dict[str, Any]]]:
    """Returns, per alias whose calls went to (or skipped) more than one endpoint, or
    that has an endpoint whose circuit opened, each endpoint in the chain's order with
    what it served, failed and skipped and its circuit's news (`Profiler.endpoints`)."""
    chains: dict[str, list[dict[str, Any]]] = {}
    for alias, members in profiler.chains.items():
        news = [{"endpoint": name, **profiler.endpoints[name]} for name in members]
        if len(members) > 1 or any(n["circuit_openings"] or n["skipped"] for n in news):
            chains[alias] = news
    return chains


def fallback_lines(fallbacks: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Returns the terminal lines of `fallback_data`: one per chain, one per endpoint."""
    lines = []
    for alias, members in fallbacks.items():
        lines.append(f"fallback {alias!r}:")
        lines.extend(f"  {_member_text(member)}" for member in members)
    return lines


def _member_text(member: dict[str, Any]) -> str:
    text = f"{member['endpoint']!r} served {member['served']} calls"
    if member["failed"]:
        text += f", {member['failed']} failed"
    if member["skipped"]:
        text += f", {member['skipped']} skipped"
    opened_at = member.get("circuit_opened_at")
    if opened_at is not None:
        since = time.strftime("%H:%M:%S", time.localtime(opened_at))
        text += (
            f": circuit open since {since} after {member['circuit_failures']} failed calls in a row"
        )
    elif member.get("circuit_openings"):
        text += f": circuit opened {member['circuit_openings']} times, closed again"
    return text


def budget_lines(budgets: dict[str, dict[str, Any]]) -> list[str]:
    """Returns one line per budget: what it spent, holds for calls in flight and has left
    of each limit it sets (``budget of the run: spent 8 calls, $0.0100; held $0.0020;
    left 2 calls, $0.0880``)."""
    lines = []
    for name, books in budgets.items():
        limits = books.get("limits", {})
        parts = [
            f"{part} {_amounts(books.get(part, {}), limits)}" for part in ("spent", "held", "left")
        ]
        lines.append(f"budget of {name}: " + "; ".join(parts))
    return lines


def _amounts(amounts: dict[str, Any], limits: dict[str, Any]) -> str:
    shown = []
    for kind in ("calls", "tokens", "cost"):
        value = amounts.get(kind)
        if value is None or (kind not in limits and not value):
            continue
        shown.append(f"${value:.4f}" if kind == "cost" else f"{int(value)} {kind}")
    return ", ".join(shown) or "nothing"
