"""The `Backend` contract: what every provider implements and the resource layer calls.

A backend turns one provider-neutral `Request` (`plait.backends.types`) into
a `Response`, or into a stream of `StreamChunk`s, and releases what it holds
on `aclose`. That is all the resource layer needs to put limits, retries,
the response cache and usage around any provider, built-in or user-written.

`Backend` also answers to Mellea's spelling, ``backend.generate_from_context``
and its siblings, so code written for Mellea runs as written; those methods
forward to `plait.porting.mellea`, imported on first use, which holds that
interface (lazy thunks, contexts, components).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from plait.backends.types import Request, Response, StreamChunk

if TYPE_CHECKING:
    from plait.porting.mellea import Context, ModelOutputThunk

__all__ = ["Backend"]


class Backend(ABC):
    """Talks to one model endpoint in provider-neutral types.

    Implementations must not retry: the resource layer owns retries, limits
    and the cache, and needs to see every failure as a `BackendError`.

    Override `complete` (and `stream`, for real token streaming); override
    `aclose` when the backend holds connections or a model. A user-written
    backend is used like a built-in one: name its class, an instance, or a
    name given to `plait.resources.register_provider` as the ``provider`` of
    a configuration entry, and limits, retries, the cache, usage and streaming
    all apply.
    """

    provider: str = "abstract"

    follows_response_schema: bool = True
    """Whether `complete` constrains replies to ``request.response_schema``. A
    backend that cannot sets it False: a Mellea-style call given ``format=``
    then logs a warning and continues without it (`plait.porting.mellea`);
    modules still validate and re-ask, as for any reply."""

    @abstractmethod
    async def complete(self, request: Request) -> Response:
        """Makes one call and returns the whole reply.

        Raises:
            BackendError: (or a subclass) for every provider failure, with the
                HTTP status and whether it may be retried.
        """

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        """Makes one call and yields the reply as it arrives; the last chunk has usage.

        Override this for real token streaming. The default makes the whole
        call with `complete` and yields it as one chunk, so a backend that only
        implements `complete` still works under ``astream``.
        """
        response = await self.complete(request)
        yield StreamChunk(
            text=response.text,
            tool_calls=response.tool_calls,
            finish_reason=response.finish_reason,
            usage=response.usage,
        )

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Releases connections or models. Override when the backend holds any."""

    @classmethod
    def missing_credential(cls, **settings: Any) -> str | None:
        """Returns what a backend built with ``settings`` lacks to make any call, or None.

        ``settings`` are the constructor's keyword arguments. The resource layer
        asks before an endpoint's first call, and ``plait run`` before a run, so
        a missing key is one error naming the endpoint, found before anything is
        sent, instead of a failure per call. The text starts with what is missing
        and says how to give it ("needs an API key: set the environment variable
        OPENAI_API_KEY, or give api_key"). Override this when the backend needs a
        credential; the constructor should raise `ConfigError` with the same text.
        """
        return None

    # Mellea's spelling: the calls go straight to this backend, bypassing the
    # resource layer's limits, retries and cache (see `plait.porting.mellea`).
    def generate_from_context(self, *args: Any, **kwargs: Any) -> tuple[ModelOutputThunk, Context]:
        """Mellea's ``generate_from_context``: `plait.porting.mellea.generate_from_context`."""
        return _mellea().generate_from_context(self, *args, **kwargs)

    def generate_from_raw(self, *args: Any, **kwargs: Any) -> list[ModelOutputThunk]:
        """Mellea's ``generate_from_raw``: `plait.porting.mellea.generate_from_raw`."""
        return _mellea().generate_from_raw(self, *args, **kwargs)

    async def do_generate_walk(self, action: Any) -> None:
        """Mellea's ``do_generate_walk``: `plait.porting.mellea.compute_thunks` of one tree."""
        await _mellea().compute_thunks([action])

    async def do_generate_walks(self, actions: Any) -> None:
        """Mellea's ``do_generate_walks``: `plait.porting.mellea.compute_thunks`."""
        await _mellea().compute_thunks(actions)


def _mellea() -> ModuleType:
    """`plait.porting.mellea`, which Mellea's spelling of a backend's methods calls."""
    from plait.porting import mellea  # late-bound upward call (ARCHITECTURE.md): porting is above

    return mellea
