"""Reuse of replies: the response cache around a call, and identical calls in flight shared.

`cached_or_fresh` is what `ResourceManager` runs for a call on one endpoint:
it answers from the endpoint's response cache when that hits (and the
caller's ``accept`` takes the cached reply), waits for an identical call
already in flight instead of paying for it twice, and otherwise makes the
call (`plait.resources.attempts.call_endpoint`), storing the reply only when it was
accepted (finished normally, and ``accept`` said yes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from plait.backends.types import Request, Response
from plait.errors import ConfigError
from plait.resources.attempts import call_endpoint
from plait.resources.config import EndpointConfig
from plait.resources.endpoint import ResponseCache
from plait.resources.usage import active_meters

if TYPE_CHECKING:
    from plait.resources.chunks import TextSink
    from plait.resources.manager import ResourceManager
    from plait.resources.routes import Route

Accept = Callable[[Response], bool]
"""Decides whether a reply is what the caller asked for (see `ResourceManager.complete`)."""

UNFINISHED = frozenset({"length", "content_filter"})
"""Finish reasons of replies that were cut off or withheld: returned, never cached."""


def default_cache_factory(config: EndpointConfig, state: Any = None) -> ResponseCache:
    """Builds an endpoint's response cache with ``plait.resources.cache`` (imported when
    needed), in the ``state`` store when the configuration names one."""
    try:
        module = importlib.import_module("plait.resources.cache")
    except ModuleNotFoundError as exc:
        if exc.name != "plait.resources.cache":
            raise
        raise ConfigError(
            f"alias {config.name!r}: key 'cache' is set but the response cache "
            "(plait.resources.cache) is not available in this installation"
        ) from exc
    cache: ResponseCache = module.create_cache(config, state)
    return cache


async def cached_or_fresh(
    manager: ResourceManager,
    route: Route,
    request: Request,
    cache: bool,
    max_retries: int | None,
    accept: Accept | None,
    on_text: TextSink | None,
) -> Response:
    """Makes one call on ``route``'s endpoint, answered from its cache when that can."""
    endpoint = route.endpoint
    response_cache = endpoint.cache if cache else None
    if response_cache is None:
        response = await call_endpoint(manager, route, request, max_retries, on_text)
        if accept is not None:
            accept(response)
        return response
    key = response_cache.key(endpoint.config, request)
    hit = await response_cache.get(key)
    if hit is not None and accepts(accept, hit):
        return await replay(manager, route, hit, on_text)
    in_flight = manager._in_flight
    shared = await join_in_flight(in_flight, key)
    if shared is not None:
        reply = copy_response(shared)
        if accepts(accept, reply):
            return await replay(manager, route, reply, on_text)
    leader: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
    in_flight[key] = leader
    try:
        response = await call_endpoint(manager, route, request, max_retries, on_text)
        accepted = accepts(accept, response)
        if accepted:
            await response_cache.put(key, response)
    except BaseException:
        leader.cancel()  # followers make their own call
        raise
    finally:
        del in_flight[key]
    if accepted:
        leader.set_result(copy_response(response))
    else:
        leader.cancel()  # a refused reply is not handed on: followers ask themselves
    return response


async def join_in_flight(
    in_flight: dict[str, asyncio.Future[Response]], key: str
) -> Response | None:
    """Waits for an identical cacheable call already in flight; None if there is none.

    A batch with repeated inputs would otherwise pay for each repeat while
    the first answer is still on its way. If that call fails, or its reply
    is refused, the follower gets None and makes its own call.
    """
    leader = in_flight.get(key)
    if leader is None:
        return None
    try:
        return await asyncio.shield(leader)
    except asyncio.CancelledError:
        if leader.cancelled():
            return None
        raise  # this caller itself was cancelled


async def replay(
    manager: ResourceManager, route: Route, response: Response, on_text: TextSink | None
) -> Response:
    """Returns a cached (or shared) reply; a streaming caller gets its text in one piece."""
    if on_text is not None and response.text:
        await on_text.text(response.text)
    return cache_hit(manager, route, response)


def cache_hit(manager: ResourceManager, route: Route, response: Response) -> Response:
    """Counts a reply served from the cache, and marks it as costing nothing and sent by no one.

    It counts in the ``cached`` of the alias's, the endpoint's, the manager's and the
    open meters' usage, as a sent call counts in their tokens and cost.
    """
    for totals in (route.totals, route.endpoint.totals, manager._total):
        totals.usage.cached += 1
    for meter in active_meters():
        meter.usage.cached += 1
    usage = response.usage  # the cache's own copy, or `copy_response`'s: this caller's
    usage.cost = 0.0
    usage.cached = 1
    meta = response.meta
    meta["cached"] = True
    meta["alias"] = route.alias
    meta["endpoint"] = route.endpoint.name
    meta["attempts"] = 0
    meta["latency"] = 0.0
    meta["wait_time"] = 0.0
    return response


def accepts(accept: Accept | None, response: Response) -> bool:
    """Whether ``response`` may be cached and handed to other callers.

    A reply cut off by the token limit or withheld by a content filter is
    returned to its caller (who sees ``finish_reason``) but never cached: a
    later run should ask again rather than replay a truncated answer.
    ``accept`` runs on every response a call returns, so the caller's
    validation sees cache hits too.
    """
    accepted = accept is None or bool(accept(response))
    return accepted and response.finish_reason not in UNFINISHED


def copy_response(response: Response) -> Response:
    """Returns a response another caller may mark and mutate without touching the original."""
    return dataclasses.replace(
        response, usage=dataclasses.replace(response.usage), meta=dict(response.meta)
    )
