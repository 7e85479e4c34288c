"""Fault rules for the scripted server: which requests fail, and how.

A `Fault` is a small, deterministic rule. The server asks its faults in
order, for each chat-completions request, whether they fire; the first that
fires decides what goes wrong with that request. Randomness comes from the
fault's own seeded generator, so a run with ``rate=0.05, seed=1`` fails the
same requests every time it sees them in the same order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields
from typing import Any, Literal

__all__ = ["Fault", "FaultKind"]

FaultKind = Literal["status", "slow", "drop"]
_KINDS = ("status", "slow", "drop")


@dataclass
class Fault:
    """A rule that makes some requests fail.

    Example::

        Fault(status=429, headers={"Retry-After": "1"}, times=3)  # the next 3 requests
        Fault(status=500, rate=0.05, seed=1)      # 5 % of requests, the same ones each run
        Fault(kind="slow", delay=5.0, times=1)    # answer the next request 5 s late
        Fault(kind="drop", times=1)               # close the next connection unanswered
        Fault(kind="drop", after_chunks=2)        # streams: cut off after 2 SSE events
        Fault(kind="drop", after_chunks=3, rate=0.02, stream=True)  # 2 % of streams only

    With neither ``times`` nor ``rate`` a fault fires on every request until
    it is removed. Status faults answer at once (the server's ``latency`` is
    not applied), with an OpenAI-shaped JSON error body.
    """

    status: int = 500
    """HTTP status of a ``status`` fault."""
    kind: FaultKind = "status"
    """``status`` answers with ``status``; ``slow`` waits ``delay`` seconds and then
    answers normally; ``drop`` closes the connection without (a complete) answer."""
    times: int | None = None
    """Fire on at most this many requests (the next ones that match)."""
    rate: float | None = None
    """Fire on this fraction of requests, chosen by the seeded generator."""
    seed: int = 0
    """Seed of this fault's generator (used with ``rate``)."""
    delay: float = 0.0
    """Extra seconds before a ``slow`` fault answers."""
    headers: dict[str, str] = field(default_factory=dict)
    """Headers sent with a ``status`` fault's answer, e.g. ``{"Retry-After": "2"}``."""
    message: str | None = None
    """The error message in the JSON body; a default names the fault."""
    after_chunks: int = 0
    """For ``drop`` on a streamed request: SSE events sent before the cut."""
    stream: bool | None = None
    """Fire only on streamed requests (True) or only on plain ones (False); None: on both.
    A request it does not apply to does not draw from its generator."""
    fired: int = field(default=0, init=False)
    """How many requests this fault has fired on so far."""
    _rng: random.Random = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems = []
        if self.kind not in _KINDS:
            problems.append(f"kind={self.kind!r} is not one of {', '.join(_KINDS)}")
        if self.kind == "status" and not 400 <= self.status <= 599:
            problems.append(f"status={self.status} is not an HTTP error status (400-599)")
        if self.times is not None and self.times < 0:
            problems.append(f"times={self.times} is negative")
        if self.rate is not None and not 0.0 <= self.rate <= 1.0:
            problems.append(f"rate={self.rate} is outside 0..1")
        if self.delay < 0:
            problems.append(f"delay={self.delay} is negative")
        if problems:
            raise ValueError("invalid Fault: " + "; ".join(problems))
        self._rng = random.Random(self.seed)

    @property
    def is_exhausted(self) -> bool:
        """Whether the fault has fired its ``times`` and will not fire again."""
        return self.times is not None and self.fired >= self.times

    def should_fire(self, stream: bool = False) -> bool:
        """Decides for one request (``stream``: whether it asked for a stream); counts the
        firing. Called once per request, in order."""
        if self.is_exhausted or self.stream not in (None, stream):
            return False
        if self.rate is not None and self._rng.random() >= self.rate:
            return False
        self.fired += 1
        return True

    def describe(self) -> str:
        """Returns a short label for logs: ``status 429``, ``slow 5s``, ``drop``."""
        if self.kind == "status":
            return f"status {self.status}"
        if self.kind == "slow":
            return f"slow {self.delay:g}s"
        return "drop" if not self.after_chunks else f"drop after {self.after_chunks} chunks"

    def as_dict(self) -> dict[str, Any]:
        """Returns the constructor arguments, as JSON-ready data (for another process)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        data["headers"] = dict(self.headers)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fault:
        """Builds a fault from `as_dict` output (or hand-written JSON)."""
        known = [f.name for f in fields(cls) if f.init]
        unknown = sorted(set(data) - set(known) - {"fired"})
        if unknown:
            raise ValueError(
                f"unknown Fault field(s) {', '.join(unknown)}; known: {', '.join(known)}"
            )
        return cls(**{k: v for k, v in data.items() if k != "fired"})
