"""`Circuit`: the breaker a fallback chain keeps for each of its endpoints.

A chain would otherwise send every call to an endpoint that is down, and wait
through its retries and timeouts each time before moving on. The circuit
counts an endpoint's consecutive failed calls; after ``failures`` of them it
opens, and the chain skips the endpoint for ``cooldown`` seconds. Then one
call is let through as a probe (half-open) while the others still skip it:
its success closes the circuit, its failure opens it for another cool-down.

Only chains keep circuits: an alias served by one endpoint has nothing to
skip to, so its calls go on trying (within their own retries) and pay for no
bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Circuit"]


class Circuit:
    """Closed, open or half-open; see the module docstring.

    Args:
        failures: consecutive failed calls that open the circuit.
        cooldown: seconds it stays open before a probe is let through.
        clock: the monotonic clock of the manager's limiters.
    """

    __slots__ = ("_clock", "_opened_at", "_probing", "consecutive", "cooldown", "failures")

    def __init__(self, failures: int, cooldown: float, clock: Callable[[], float]) -> None:
        self.failures = failures
        self.cooldown = cooldown
        self._clock = clock
        self.consecutive = 0
        """Failed calls in a row so far."""
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half-open"`` (cool-down over, or a probe in flight)."""
        if self._opened_at is None:
            return "closed"
        if self._probing or self._clock() - self._opened_at >= self.cooldown:
            return "half-open"
        return "open"

    def admit(self) -> bool | None:
        """Decides whether a call may use the endpoint now.

        Returns:
            None when the call must skip it (open, or another call is probing);
            True when this call is the probe; False for an ordinary call.
        """
        if self._opened_at is None:
            return False
        if self._probing or self._clock() - self._opened_at < self.cooldown:
            return None
        self._probing = True
        return True

    def retry_in(self) -> float:
        """Seconds left of the cool-down (0 once a probe may go)."""
        if self._opened_at is None:
            return 0.0
        return max(0.0, self.cooldown - (self._clock() - self._opened_at))

    def succeeded(self) -> None:
        """The endpoint answered: the circuit closes and the count starts again."""
        self.consecutive = 0
        self._opened_at = None
        self._probing = False

    def failed(self, probe: bool) -> None:
        """A call failed after its retries: count it, and open the circuit when it is time."""
        self.consecutive += 1
        if probe or self.consecutive >= self.failures:
            self._opened_at = self._clock()
        if probe:
            self._probing = False

    def abandoned(self, probe: bool) -> None:
        """A call ended without an answer either way (cancelled): a probe may go again."""
        if probe:
            self._probing = False
