"""The books of a budget: what it has spent, what calls in flight hold, what is left.

The one reading of a budget for ``/metrics`` and the run report, so they need not know how
the budget keeps its books: a run's `Budget` (``max_calls``, ``max_tokens``, ``max_cost``)
and an endpoint's ``budget`` (dollars) read the same. Each result is JSON data:
``{"limits", "spent", "held", "left"}``, each a mapping of ``calls`` / ``tokens`` /
``cost`` (only the limits that are set in ``limits`` and ``left``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["books_of", "budget_books", "endpoint_books"]


def budget_books(budget: Any) -> dict[str, Any]:
    """Returns the books of a `plait.resources.usage.Budget`."""
    snapshot = getattr(budget, "snapshot", None)
    if snapshot is not None:  # a budget that keeps its own books says so itself
        books = snapshot()
        return {part: books[part] for part in ("limits", "spent", "held", "left")}
    spent = budget.spent()
    held = {"tokens": budget._held_tokens, "cost": round(budget._held_cost, 6)}
    left = {
        name: max(limit - spent[name] - held.get(name, 0), 0)
        for name, limit in budget.limits().items()
    }
    return {"limits": budget.limits(), "spent": spent, "held": held, "left": left}


def endpoint_books(endpoint: Any) -> dict[str, Any] | None:
    """Returns the books of an endpoint's ``budget`` (None when it has none)."""
    ledger = getattr(endpoint, "ledger", None)
    if ledger is not None:
        return budget_books(ledger)
    if endpoint.budget is None:
        return None
    spent = round(endpoint.totals.usage.cost, 6)
    return {
        "limits": {"cost": endpoint.budget},
        "spent": {"cost": spent},
        "held": {"cost": 0.0},  # finished calls are all it counts
        "left": {"cost": max(endpoint.budget - spent, 0.0)},
    }


def books_of(budget: Any, manager: Any) -> dict[str, dict[str, Any]]:
    """Returns the books of a run's ``budget`` (None: it had none) and of the budgets of
    ``manager``'s endpoints, named as reports name them (``the run``, ``endpoint 'llm'``)."""
    books = {} if budget is None else {"the run": budget_books(budget)}
    for name, stats in manager.stats().items():
        if stats.budget is not None:
            books[f"endpoint {name!r}"] = stats.budget
    return books
