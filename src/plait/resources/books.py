"""The books of a budget: what it has spent, what calls in flight hold, what is left.

The one reading of a budget for ``/metrics`` and the run report, so they need not know how
the budget keeps its books: a run's `Budget` (``max_calls``, ``max_tokens``, ``max_cost``)
and an endpoint's ``budget`` (dollars) read the same. Each result is JSON data:
``{"limits", "spent", "held", "left"}``, each a mapping of ``calls`` / ``tokens`` /
``cost`` (only the limits that are set in ``limits`` and ``left``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plait.resources.budget import Budget

__all__ = ["books_of", "budget_books", "endpoint_books"]


def budget_books(budget: Budget) -> dict[str, Any]:
    """Returns the books of a run's or an endpoint's `plait.resources.budget.Budget`."""
    books = budget.snapshot()
    return {part: books[part] for part in ("limits", "spent", "held", "left")}


def endpoint_books(endpoint: Any) -> dict[str, Any] | None:
    """Returns the books of an endpoint's ``budget`` (None when it has none)."""
    return None if endpoint.ledger is None else budget_books(endpoint.ledger)


def books_of(budget: Any, manager: Any) -> dict[str, dict[str, Any]]:
    """Returns the books of a run's ``budget`` (None: it had none) and of the budgets of
    ``manager``'s endpoints, named as reports name them (``the run``, ``endpoint 'llm'``)."""
    books = {} if budget is None else {"the run": budget_books(budget)}
    for name, stats in manager.stats().items():
        if stats.budget is not None:
            books[f"endpoint {name!r}"] = stats.budget
    return books
