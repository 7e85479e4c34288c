"""Streams: `ResourceManager.stream`'s path, one endpoint's stream and a fallback chain's.

A stream holds its endpoint's slot (and its budget hold) until it ends or is
closed. A failure before the first chunk is retried like a call; after a
chunk was yielded it is raised, since the caller has already seen part of the
reply, and a fallback chain goes to its next endpoint only while nothing was
yielded. The last chunk's usage is priced before the caller sees it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from plait.backends.types import Request, StreamChunk, Usage
from plait.errors import BackendError, BackendTimeout, MediaError
from plait.resources.attempts import after_failure, begin_attempt, end_attempt, plan, unsent
from plait.resources.chunks import within
from plait.resources.routes import Route, admitted, chain_failed, passed_on

if TYPE_CHECKING:
    from plait.resources.manager import ResourceManager


async def stream_chain(
    manager: ResourceManager, route: Route, request: Request, max_retries: int | None
) -> AsyncGenerator[StreamChunk, None]:
    """Streams from the first endpoint of ``route``'s chain that answers before its first chunk."""
    skipped: list[tuple[str, str]] = []
    last: BackendError | None = None
    for member in route.fallbacks or ():
        circuit, probe = admitted(member, skipped)
        if probe is None:
            continue
        yielded = False
        try:
            async with contextlib.aclosing(
                stream_from(manager, member, request, max_retries)
            ) as chunks:
                async for chunk in chunks:
                    yielded = True
                    yield chunk
        except BackendError as error:
            if yielded:  # the caller has part of this endpoint's reply: no other may follow
                circuit.failed(probe)
                raise
            if not passed_on(circuit, probe, error):
                raise
            skipped.append((member.endpoint.name, str(error)))
            last = error
            continue
        except BaseException:
            circuit.abandoned(probe)
            raise
        circuit.succeeded()
        return
    raise chain_failed(route.alias, skipped, last)


async def stream_from(
    manager: ResourceManager, route: Route, request: Request, max_retries: int | None
) -> AsyncGenerator[StreamChunk, None]:
    """Streams one call from ``route``'s endpoint, retrying before the first chunk."""
    alias = route.alias
    endpoint = route.endpoint
    backend, policy, timeout, reserved = plan(route, request, max_retries)
    attempts = 0
    while True:
        attempts += 1
        _, held = await begin_attempt(manager, route, reserved, request)
        chunks = within(backend.stream(request), timeout)
        usage: Usage | None = None
        yielded = False
        try:
            async for chunk in chunks:
                if chunk.usage is not None:
                    usage = chunk.usage
                    if endpoint.price is not None:  # priced before the caller sees it
                        usage.cost = endpoint.price.cost(usage.input_tokens, usage.output_tokens)
                yielded = True
                yield chunk
        except TimeoutError as exc:
            error: BackendError = BackendTimeout(
                f"stream not finished within {timeout:g} s", alias=alias
            )
            error.__cause__ = exc
        except BackendError as exc:
            error = exc
        except MediaError as exc:
            unsent(route, reserved, held)
            raise MediaError(f"alias {alias!r}: {exc}") from None
        except BaseException:
            endpoint.limiter.release(reserved, 0)
            if held is not None:
                held.settle(None)
            raise
        else:
            end_attempt(manager, route, reserved, usage or Usage(), held)
            return
        finally:
            await chunks.aclose()
        if held is not None:  # a refused connection sent nothing: its room comes back
            held.release() if getattr(error, "unsent", False) else held.settle(None)
        if yielded:  # the caller has part of the reply: a retry would repeat it
            endpoint.limiter.release(reserved, None)
            endpoint.failures += 1
            error.alias, error.attempts = alias, attempts
            error.args = (f"alias {alias!r}: stream broke after its first chunk: {error}",)
            raise error
        await after_failure(manager, route, error, attempts, policy, reserved)
