"""RetryPolicy: what is retried, the backoff sequence, and the final message."""

from __future__ import annotations

import random

import pytest

from plait.errors import (
    BackendConnectionError,
    BackendError,
    BackendTimeout,
    BudgetExceededError,
    RateLimitError,
)
from plait.resources import RetryPolicy
from plait.resources.retry import exhausted


def test_backoff_doubles_up_to_max_delay_without_jitter() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=6.0, jitter=0.0)
    assert [policy.backoff(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 6.0, 6.0]
    assert policy.backoff(500) == 6.0


def test_jitter_is_reproducible_from_the_seed() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=100.0, jitter=0.5, seed=42)
    rng = random.Random(42)
    expected = [2.0 ** (n - 1) * (1 - 0.5 * rng.random()) for n in range(1, 6)]
    assert [policy.backoff(n) for n in range(1, 6)] == pytest.approx(expected)
    again = RetryPolicy(base_delay=1.0, max_delay=100.0, jitter=0.5, seed=42)
    assert [again.backoff(n) for n in range(1, 6)] == pytest.approx(expected)
    for n, delay in enumerate(expected, start=1):
        assert 0.5 * 2.0 ** (n - 1) <= delay <= 2.0 ** (n - 1)


@pytest.mark.parametrize(
    "error",
    [
        RateLimitError("slow down"),
        BackendError("bad gateway", status=502),
        BackendError("unavailable", status=503, retryable=True),
        BackendTimeout("late"),
        BackendConnectionError("reset"),
        BackendError("request timeout", status=408),
    ],
)
def test_transient_failures_are_retried_up_to_max_retries(error: BackendError) -> None:
    policy = RetryPolicy(max_retries=2)
    assert policy.should_retry(error, attempts=1)
    assert policy.should_retry(error, attempts=2)
    assert not policy.should_retry(error, attempts=3)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_are_never_retried_whatever_the_backend_says(status: int) -> None:
    error = BackendError("no", status=status, retryable=True)
    assert not RetryPolicy(max_retries=10).should_retry(error, attempts=1)


def test_other_errors_are_not_retried() -> None:
    policy = RetryPolicy()
    assert not policy.should_retry(ValueError("bug"), attempts=1)
    assert not policy.should_retry(BudgetExceededError("spent"), attempts=1)
    assert not policy.should_retry(BackendError("unknown", status=None), attempts=1)


def test_retry_after_is_honoured_and_a_huge_one_ends_retries() -> None:
    policy = RetryPolicy(base_delay=0.5, jitter=0.0, max_retry_after=60)
    assert policy.delay(1, RateLimitError("x", retry_after=7.0)) == 7.0
    assert policy.delay(4, RateLimitError("x", retry_after=1.0)) == 4.0  # backoff is longer
    assert not policy.should_retry(RateLimitError("x", retry_after=3600.0), attempts=1)


def test_exhausted_error_says_alias_attempts_and_last_status() -> None:
    policy = RetryPolicy(max_retries=3)
    error = exhausted(BackendError("upstream crashed", status=500), "fast", 4, policy)
    assert (error.alias, error.attempts) == ("fast", 4)
    assert str(error) == (
        "alias 'fast': gave up after 4 attempts (max_retries=3); last: HTTP 500: upstream crashed"
    )
    final = exhausted(BackendError("bad key", status=401), "fast", 1, policy)
    assert str(final) == "alias 'fast': HTTP 401 is not retried: bad key"
    timeout = exhausted(BackendTimeout("no answer"), "judge", 1, RetryPolicy(max_retries=0))
    assert "gave up after 1 attempt (max_retries=0); last: BackendTimeout" in str(timeout)


def test_with_max_retries_keeps_delays() -> None:
    policy = RetryPolicy(max_retries=3, base_delay=2.0, jitter=0.0)
    assert policy.with_max_retries(3) is policy
    fewer = policy.with_max_retries(0)
    assert fewer.max_retries == 0 and fewer.backoff(2) == 4.0


def test_invalid_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=2.0)
    with pytest.raises(ValueError, match="max_retries"):
        RetryPolicy(max_retries=-1)
