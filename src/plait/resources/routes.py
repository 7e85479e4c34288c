"""Routes: an alias bound to the endpoint that serves it, and fallback chains over endpoints.

An alias whose entry is a fallback chain (``{"fallback": ["primary",
"backup"]}``) is served by the first of its endpoints that answers: a call
that fails on one after that endpoint's own retries (or whose budget is spent,
or whose circuit is open, `plait.resources.circuit`) goes to the next. Only a
request that would fail anywhere stops the chain: a 400 (which is also how
providers refuse content by policy) or a 422. An auth error (401/403) or an
unknown model (404) is one provider's problem and is passed on.

`fall_back` walks a chain for `ResourceManager.complete`; the streaming walk
(`plait.resources.streaming.stream_chain`) uses the same helpers here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from plait.backends.types import Request, Response
from plait.callbacks import active_callbacks
from plait.errors import BackendError, BudgetExceededError, CircuitOpenError
from plait.resources.circuit import Circuit
from plait.resources.endpoint import Endpoint
from plait.resources.usage import UsageTotals

if TYPE_CHECKING:
    from plait.resources.chunks import TextSink
    from plait.resources.manager import ResourceManager
    from plait.resources.reuse import Accept

logger = logging.getLogger("plait.resources")

STOPS_A_CHAIN = frozenset({400, 422})
"""Statuses that say the request itself is wrong, so another endpoint would refuse it too."""


class Route:
    """An alias as the program names it, bound to the endpoint that serves it.

    An alias that names a fallback chain has one route per endpoint of the
    chain in ``fallbacks`` (sharing the alias's totals); ``endpoint`` is then
    the chain's first.
    """

    __slots__ = ("alias", "endpoint", "fallbacks", "totals")

    def __init__(self, alias: str, endpoint: Endpoint, totals: UsageTotals | None = None) -> None:
        self.alias = alias
        self.endpoint = endpoint
        self.totals = totals or UsageTotals()
        self.fallbacks: tuple[Route, ...] | None = None


async def fall_back(
    manager: ResourceManager,
    route: Route,
    request: Request,
    cache: bool,
    max_retries: int | None,
    accept: Accept | None,
    on_text: TextSink | None,
) -> Response:
    """Makes the call on the first endpoint of ``route``'s chain that answers.

    Each endpoint is a call of its own, told to callbacks and the profiler
    under its own name. A streaming caller that already received text from
    a failed endpoint is told to discard it (``on_text.restart``), as for
    a retry.
    """
    callbacks: tuple[Any, ...] = active_callbacks()
    skipped: list[tuple[str, str]] = []
    last: BackendError | None = None
    for member in route.fallbacks or ():
        circuit, probe = admitted(member, skipped)
        if probe is None:
            continue
        try:
            response = await manager._reported(
                member, request, cache, max_retries, accept, on_text, callbacks
            )
        except BackendError as error:
            if not passed_on(circuit, probe, error):
                raise
            skipped.append((member.endpoint.name, str(error)))
            last = error
            if on_text is not None and on_text.started:
                await on_text.restart(f"fell back from {member.endpoint.name!r}: {error}")
            continue
        except BaseException:
            circuit.abandoned(probe)
            raise
        circuit.succeeded()
        if skipped:
            response.meta["fell_back_from"] = [name for name, _ in skipped]
            logger.info(
                "alias %r: answered by %r after %s",
                route.alias,
                member.endpoint.name,
                "; ".join(f"{name!r}: {why}" for name, why in skipped),
            )
        return response
    raise chain_failed(route.alias, skipped, last)


def passed_on(circuit: Circuit, probe: bool, error: BackendError) -> bool:
    """Notes an endpoint's failure on its circuit; returns whether its chain goes on.

    A 400 or 422 stops the chain (any endpoint would refuse the request), and
    proves the endpoint is up. A spent budget passes the call on without
    counting against the endpoint; anything else counts as a failed call.
    """
    if error.status in STOPS_A_CHAIN:
        circuit.succeeded()
        return False
    if isinstance(error, BudgetExceededError):
        circuit.abandoned(probe)
    else:
        circuit.failed(probe)
    return True


def admitted(member: Route, skipped: list[tuple[str, str]]) -> tuple[Circuit, bool | None]:
    """Asks the circuit of a chain's endpoint whether a call may go (`Circuit.admit`).

    Returns the circuit and its answer; a skip is noted in ``skipped`` with why.
    """
    circuit = member.endpoint.circuit
    assert circuit is not None  # every endpoint a chain lists has one (ResourceManager._route)
    probe = circuit.admit(member.alias)
    if probe is None:
        why = (
            f"skipped: circuit open after {circuit.consecutive} failed calls in a row "
            f"(probed again in {circuit.retry_in():.0f} s)"
        )
        skipped.append((member.endpoint.name, why))
    return circuit, probe


def chain_failed(
    alias: str, skipped: list[tuple[str, str]], last: BackendError | None
) -> BackendError:
    """Returns the error of a call that no endpoint of its chain answered.

    That is the last endpoint's own error (its type and status are what callers
    match on), its message naming what happened on every endpoint; or, when
    every endpoint was skipped, a `CircuitOpenError`.
    """
    own = f"alias {alias!r}: "  # each endpoint's error already names the alias
    story = "; ".join(f"{name!r}: {why.removeprefix(own)}" for name, why in skipped)
    message = f"alias {alias!r}: no endpoint of its fallback chain answered: {story}"
    if last is None:
        return CircuitOpenError(message, alias=alias, attempts=0)
    last.args = (message, *last.args[1:])
    return last
