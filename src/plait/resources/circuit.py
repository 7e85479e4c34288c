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

A circuit says what it does: when it opens and closes, the active profiler
(`plait.report.profiling`, through the context variable) and the callbacks of
the call (``on_circuit``: OpenTelemetry adds a span event) are told, and every
call that skips the endpoint is counted for the profiler, so a run's summary
and report name a dead endpoint and when it was given up on. `EndpointStats`
(``/metrics``) reads ``opened_at``, ``openings`` and ``skipped``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from plait import _context
from plait.callbacks import active_callbacks, tell

__all__ = ["Circuit"]


class Circuit:
    """Closed, open or half-open; see the module docstring.

    Args:
        failures: consecutive failed calls that open the circuit.
        cooldown: seconds it stays open before a probe is let through.
        clock: the monotonic clock of the manager's limiters.
        name: the endpoint's name, as reports and spans give it.
    """

    __slots__ = (
        "_clock",
        "_opened_at",
        "_probing",
        "consecutive",
        "cooldown",
        "failures",
        "name",
        "opened_at",
        "openings",
        "skipped",
    )

    def __init__(
        self, failures: int, cooldown: float, clock: Callable[[], float], name: str = ""
    ) -> None:
        self.failures = failures
        self.cooldown = cooldown
        self._clock = clock
        self.name = name
        self.consecutive = 0
        """Failed calls in a row so far."""
        self.opened_at: float | None = None
        """Wall-clock time (epoch seconds) it opened, while it has not closed since."""
        self.openings = 0
        """Times it opened (a failed probe keeps it open: not another opening)."""
        self.skipped = 0
        """Calls that skipped the endpoint while it was open."""
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

    def admit(self, alias: str = "") -> bool | None:
        """Decides whether a call of ``alias`` may use the endpoint now.

        Returns:
            None when the call must skip it (open, or another call is probing);
            True when this call is the probe; False for an ordinary call.
        """
        if self._opened_at is None:
            return False
        if self._probing or self._clock() - self._opened_at < self.cooldown:
            self.skipped += 1
            profiler = _context.PROFILE.get()
            if profiler is not None:
                profiler.record_skip(self.name, alias)
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
        failures = self.consecutive
        self.consecutive = 0
        self._probing = False
        if self._opened_at is not None:
            self._opened_at = None
            self._tell("closed", failures)
            self.opened_at = None

    def failed(self, probe: bool) -> None:
        """A call failed after its retries: count it, and open the circuit when it is time."""
        self.consecutive += 1
        if probe or self.consecutive >= self.failures:
            if self._opened_at is None:
                self.openings += 1
                self.opened_at = time.time()
                self._tell("opened", self.consecutive)
            self._opened_at = self._clock()
        if probe:
            self._probing = False

    def _tell(self, state: str, failures: int) -> None:
        """Tells the active profiler and the call's callbacks that the circuit ``state``."""
        profiler = _context.PROFILE.get()
        if profiler is not None:
            profiler.record_circuit(self.name, state, failures, self.opened_at)
        callbacks = active_callbacks()
        if callbacks:
            facts = {
                "endpoint": self.name,
                "state": state,
                "failures": failures,
                "opened_at": self.opened_at,
                "cooldown": self.cooldown,
            }
            tell("circuit", self, facts, callbacks)

    def abandoned(self, probe: bool) -> None:
        """A call ended without an answer either way (cancelled): a probe may go again."""
        if probe:
            self._probing = False
