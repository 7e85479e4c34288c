"""`RetryPolicy`: which failures are retried, and how long to wait before each retry.

The resource layer is the only place plait retries (SDK retries are off), so
this policy is the whole story: retryable `BackendError`s (429, 5xx,
timeouts, dropped connections) are retried up to ``max_retries`` times with
exponential backoff and jitter; a client error (400, 401, 403, 404, 422)
never is, whatever the backend said. The retry runs in place: the caller's
``await`` just takes longer, so graph bookkeeping never sees a requeue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from plait.errors import BackendError

if TYPE_CHECKING:
    import random

__all__ = ["NEVER_RETRIED", "RetryPolicy", "exhausted"]

NEVER_RETRIED = frozenset({400, 401, 403, 404, 422})
"""Statuses that mean the request itself is wrong: repeating it cannot help."""

_RETRIED = frozenset({408, 409, 425, 429})
"""Statuses below 500 that are worth retrying (timeouts, conflicts, too early, rate limits)."""


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for retryable backend failures.

    The delay before retry ``n`` (1-based) is ``min(max_delay, base_delay *
    2 ** (n - 1))``, of which the fraction ``jitter`` is random: 0 gives the
    exact sequence 0.5, 1, 2, 4 …; 1 gives "full jitter", anywhere from 0 to
    the exponential value. A provider's ``Retry-After`` replaces the backoff
    when it is longer (the manager also pauses the whole endpoint for it);
    one longer than ``max_retry_after`` ends the retries, since it means a
    quota that will not come back within the run (and pauses nothing).

    Args:
        max_retries: retries after the first attempt (0 disables retries).
        base_delay: seconds before the first retry.
        max_delay: upper bound of one backoff delay.
        jitter: random fraction of each delay, in [0, 1].
        max_retry_after: the longest ``Retry-After`` worth waiting for.
        seed: seeds the jitter's random generator (for tests); None seeds from the OS.

    Example::

        policy = RetryPolicy(max_retries=3, base_delay=0.5, jitter=0.0)
        [policy.delay(n) for n in (1, 2, 3)]     # [0.5, 1.0, 2.0]
    """

    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 30.0
    jitter: float = 0.5
    max_retry_after: float = 60.0
    seed: int | None = None
    _rng: random.Random | None = field(default=None, init=False, repr=False, compare=False)
    """The jitter's generator, made at the first jittered delay (`random` is not on a
    program's first call)."""

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("base_delay and max_delay must be >= 0")

    @staticmethod
    def is_retryable(error: BaseException) -> bool:
        """Whether ``error`` may succeed if the same request is sent again."""
        if not isinstance(error, BackendError):
            return False
        status = error.status
        if status in NEVER_RETRIED:
            return False
        return error.retryable or status in _RETRIED or (status is not None and status >= 500)

    def should_retry(self, error: BaseException, attempts: int) -> bool:
        """Whether to retry after ``attempts`` attempts have failed, the last with ``error``."""
        if attempts > self.max_retries or not self.is_retryable(error):
            return False
        retry_after = getattr(error, "retry_after", None)
        return retry_after is None or retry_after <= self.max_retry_after

    def backoff(self, attempts: int) -> float:
        """Returns the jittered exponential delay after ``attempts`` failed attempts."""
        exponent = min(attempts - 1, 62)  # 2**62 already exceeds any sane max_delay
        delay = min(self.max_delay, self.base_delay * (2.0**exponent))
        if self.jitter:
            delay *= 1.0 - self.jitter * self._generator().random()
        return delay

    def _generator(self) -> random.Random:
        rng = self._rng
        if rng is None:
            import random  # import time: only a retry with jitter

            rng = random.Random(self.seed)
            object.__setattr__(self, "_rng", rng)
        return rng

    def delay(self, attempts: int, error: BaseException | None = None) -> float:
        """Returns the seconds to wait before the next attempt.

        That is the backoff, or the error's ``retry_after`` when that is longer.
        """
        delay = self.backoff(attempts)
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None and retry_after > delay:
            return float(retry_after)
        return delay

    def with_max_retries(self, max_retries: int) -> RetryPolicy:
        """Returns a copy allowing another number of retries (same delays and generator)."""
        if max_retries == self.max_retries:
            return self
        copy = RetryPolicy(
            max_retries,
            self.base_delay,
            self.max_delay,
            self.jitter,
            self.max_retry_after,
            self.seed,
        )
        object.__setattr__(copy, "_rng", self._rng)
        return copy


def exhausted(error: BackendError, alias: str, attempts: int, policy: RetryPolicy) -> BackendError:
    """Returns ``error`` annotated with alias and attempts, its message saying why it is final.

    The same exception object is returned (its type, status and body are what
    the caller may match on); only ``alias``, ``attempts`` and the message change.
    """
    error.alias = alias
    error.attempts = attempts
    original = str(error.args[0]) if error.args else type(error).__name__
    status = f"HTTP {error.status}" if error.status is not None else type(error).__name__
    if not policy.is_retryable(error):
        reason = f"{status} is not retried"
    elif attempts > policy.max_retries:
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        reason = f"gave up after {tries} (max_retries={policy.max_retries}); last: {status}"
    else:
        reason = (
            f"{status} asked to wait {error.retry_after:g} s (its Retry-After header), longer "
            f"than max_retry_after={policy.max_retry_after:g} s; not retried (raise "
            "max_retry_after in the endpoint's configuration to wait that long)"
        )
    error.args = (f"alias {alias!r}: {reason}: {original}", *error.args[1:])
    return error
