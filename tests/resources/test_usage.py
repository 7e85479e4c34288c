"""Prices and usage totals."""

from __future__ import annotations

import pytest

from plait.backends.types import Usage
from plait.resources.usage import Price, UsageTotals, price_for


def test_price_table_matches_dated_and_prefixed_names_longest_first() -> None:
    assert price_for("openai", "gpt-4o-mini") == Price(0.15, 0.60)
    assert price_for("openai", "gpt-4o-mini-2024-07-18") == Price(0.15, 0.60)
    assert price_for("openai", "gpt-4o-2024-08-06") == Price(2.50, 10.00)
    assert price_for("openai", "openai/gpt-4.1-mini") == Price(0.40, 1.60)
    assert price_for("anthropic", "claude-3-5-sonnet-20241022") == Price(3.0, 15.0)
    assert price_for("openai", "llama-3-8b") is None
    assert price_for("openai", None) is None
    assert price_for("local", "anything") == Price(0.0, 0.0)


def test_cost_is_dollars_per_million_tokens() -> None:
    assert Price(0.15, 0.60).cost(1_000_000, 0) == pytest.approx(0.15)
    assert Price(2.0, 8.0).cost(1000, 500) == pytest.approx(0.002 + 0.004)


def test_totals_add_calls_and_snapshots_do_not_move() -> None:
    totals = UsageTotals()
    totals.record(Usage(10, 5, 0.01))
    snapshot = totals.snapshot()
    totals.record(Usage(1, 1, 0.5))
    assert (snapshot.input_tokens, snapshot.output_tokens) == (10, 5)
    assert totals.calls == 2 and totals.usage.total_tokens == 17
    assert totals.usage.cost == pytest.approx(0.51)
