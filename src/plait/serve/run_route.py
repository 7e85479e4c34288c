"""The run endpoint as plain ASGI, and the answers every run route gives (JSON or SSE).

``POST /programs/{name}/run`` is the request a server answers most, so it skips FastAPI's
per-request machinery (routing through every route, dependency solving, the request object,
its exception layers): `RunRoutes` sits in front of the FastAPI app, finds the program by
the exact path in a dict, validates the raw body with pydantic's ``model_validate_json``
(one pass from bytes to the typed model) and answers with orjson. What a client sees is
unchanged: the same JSON bodies and errors (a 422 names the field), the same SSE, the same
OpenAPI document (`documented_run_route` gives FastAPI the typed route to describe; it is
never mounted). Every other route is FastAPI's.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qsl

import orjson
from fastapi import Query
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from plait.errors import (
    BudgetExceededError,
    DeadlineExceededError,
    ReplyCutOffError,
    ResumeRefusedError,
    described,
)
from plait.serve.errors import error_response, failure_id, failure_response
from plait.serve.events import sse
from plait.serve.owners import owner_of
from plait.serve.pending import PendingRunTooLarge, PendingStoreFull, PendingStoreUnavailable
from plait.serve.programs import ServedProgram
from plait.serve.responses import ClientLeft, EventStreamResponse, JsonResponse, until_disconnected
from plait.serve.runs import Draining, NotResumable, Overloaded, Resume, RunService

__all__ = [
    "RunRoutes",
    "admit",
    "admitted_stream",
    "answer_run",
    "documented_run_route",
    "invalid_input",
    "run_failure",
    "stream_run",
    "wants_stream",
]

_TRUE = frozenset({"1", "true", "on", "yes"})
_FALSE = frozenset({"0", "false", "off", "no"})
"""The spellings of ``?stream=`` FastAPI's ``bool`` query parameter took, kept as they were."""


class RunRoutes:
    """Answers ``POST /programs/{name}/run`` of each served program; passes every other
    request (and the lifespan) to ``app``.

    Args:
        app: the FastAPI app's own stack (every other route).
        service: the runs of the server.
        routes: the documented route of each program's run path (its ``path`` is the
            metrics label of the request, as FastAPI's route would have been).
    """

    def __init__(self, app: ASGIApp, service: RunService, routes: dict[str, APIRoute]) -> None:
        self.app = app
        self.service = service
        self.routes = routes
        self.programs = {route.path: service.programs[route.name] for route in routes.values()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            served = self.programs.get(path)
            if served is not None:
                scope["route"] = self.routes[path]
                response = await self._run(served, scope, receive)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _run(self, served: ServedProgram, scope: Scope, receive: Receive) -> Response:
        if scope["method"] != "POST":
            message = f"{scope['method']} is not allowed here; runs are POSTed"
            return error_response(
                405, "method_not_allowed", message, scope, headers={"Allow": "POST"}
            )
        body = await _body(receive)
        if body is None:
            return Response(status_code=499)
        try:
            stream = _stream_query(scope)
            given = served.input_model.model_validate_json(body)
        except ValidationError as exc:
            return invalid_input(exc.errors(include_url=False), scope, where="body")
        arguments = served.arguments(given)
        if wants_stream(scope, stream):
            return await stream_run(scope, self.service, served, arguments)
        return await answer_run(scope, receive, self.service, served, arguments)


async def _body(receive: Receive) -> bytes | None:
    """Returns the whole request body, or None if the client left while sending it."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _stream_query(scope: Scope) -> bool:
    """Reads ``?stream=``.

    Raises:
        ValidationError: it is not a boolean (FastAPI's own check, so the 422 reads the same).
    """
    query = scope.get("query_string", b"")
    if not query:
        return False
    values = [v for k, v in parse_qsl(query.decode("latin-1")) if k == "stream"]
    if not values or values[-1].lower() in _FALSE:
        return False
    if values[-1].lower() in _TRUE:
        return True
    raise ValidationError.from_exception_data(
        "Query",
        [{"type": "bool_parsing", "loc": ("query", "stream"), "input": values[-1]}],
    )


def _accepts_events(scope: Scope) -> bool:
    for key, value in scope.get("headers", ()):
        if key == b"accept":
            return b"text/event-stream" in value
    return False


def wants_stream(scope: Scope, stream: bool) -> bool:
    """Whether the client asked for Server-Sent Events: ``?stream=true`` or an ``Accept``
    header that names ``text/event-stream``."""
    return stream or _accepts_events(scope)


def invalid_input(errors: Any, scope: Scope, where: str | None = None) -> JsonResponse:
    """Returns the 422 of a request that does not fit its schema; the message names the
    first field that is wrong, ``fields`` lists them all.

    Args:
        errors: pydantic's errors (``loc``, ``msg``, ``type`` each).
        where: the part of the request the errors' locations are inside (``body``), put
            in front of each, as FastAPI's own locations have it.
    """
    details = [
        {
            "loc": [where, *error["loc"]] if where and error["loc"][:1] != ("query",) else
            list(error["loc"]),
            "msg": error["msg"],
            "type": error["type"],
        }
        for error in errors
    ]  # fmt: skip
    first = details[0] if details else {"loc": [], "msg": "invalid request"}
    named = ".".join(str(part) for part in first["loc"] if part not in ("body", "query"))
    message = f"{named or 'body'}: {first['msg']}"
    return error_response(422, "invalid_input", message, scope, fields=details)


def run_failure(exc: BaseException, scope: Scope, retry_after: int) -> JsonResponse:
    """Returns the JSON error of a run that did not finish: refused, too slow or failed.

    Args:
        retry_after: seconds a refused client is asked to wait (``Retry-After``).
    """
    retry = {"Retry-After": str(retry_after)}
    if isinstance(exc, Overloaded):
        message = "too many runs are waiting; retry after the time in Retry-After"
        return error_response(429, "overloaded", message, scope, headers=retry)
    if isinstance(exc, Draining):
        message = "the server is stopping; retry on another instance or after a while"
        return error_response(503, "draining", message, scope, headers=retry)
    if isinstance(exc, DeadlineExceededError):
        message = f"the run did not finish within this server's deadline of {exc.deadline:g} s"
        return error_response(504, "deadline_exceeded", message, scope)
    if isinstance(exc, NotResumable):
        return error_response(exc.status, exc.kind, exc.message, scope)
    if isinstance(exc, ResumeRefusedError):  # its message names the approval, never a secret
        return error_response(409, "resume_refused", str(exc), scope)
    if isinstance(exc, PendingRunTooLarge):
        return error_response(507, "pause_too_large", str(exc), scope)
    if isinstance(exc, PendingStoreFull):
        message = f"the run paused, but its pause cannot be kept: {exc}"
        if exc.per_owner:
            return error_response(429, "too_many_paused", message, scope)
        return error_response(503, "pending_store_full", message, scope, headers=retry)
    if isinstance(exc, PendingStoreUnavailable):
        message = f"{exc}; retry after the time in Retry-After"
        return error_response(503, "pending_store_unavailable", message, scope, headers=retry)
    if isinstance(exc, BudgetExceededError):
        error_id = failure_id(exc, scope, "run", expected=True)
        message = f"the server's model budget is spent; quote error id {error_id} to its operator"
        return error_response(503, "budget_exhausted", message, scope, error_id=error_id)
    if isinstance(exc, ReplyCutOffError):  # plait's own words: no model text, no provider body
        error_id = failure_id(exc, scope, "run", expected=True)
        reason = described(exc, index=False)
        message = f"the run failed: {reason}; quote error id {error_id} to its operator"
        return error_response(502, "reply_cut_off", message, scope, error_id=error_id)
    return failure_response(exc, scope, "run")


async def admit(service: RunService) -> contextlib.AsyncExitStack:
    """Returns a held place for one run (`RunService.admitted`), released when the returned
    stack closes: a resume holds it before it takes its run, so a refused one leaves the run
    waiting.

    Raises:
        Draining: the server is stopping.
        Overloaded: too many runs wait already.
    """
    place = contextlib.AsyncExitStack()
    await place.enter_async_context(service.admitted())
    return place


async def answer_run(
    scope: Scope,
    receive: Receive,
    service: RunService,
    served: ServedProgram,
    arguments: dict[str, Any],
    resume: Resume | None = None,
    place: contextlib.AsyncExitStack | None = None,
) -> Response:
    """Runs once and answers with its JSON body: 200 finished or rejected, 202 paused; 499
    (to the log: nobody reads it) when the client left, which cancelled the run.

    Args:
        place: a place held for the run already (`admit`), released when it ends; None
            asks for one first.
    """
    owner = owner_of(scope)
    try:
        async with place or service.admitted():
            run = service.run(served, arguments, resume, owner=owner)
            outcome = await until_disconnected(receive, run)
            name, body = await service.finish(served, arguments, outcome)
    except ClientLeft:
        return Response(status_code=499)
    except Exception as exc:
        return run_failure(exc, scope, service.options.retry_after)
    return JsonResponse(body, status_code=202 if name == "paused" else 200)


async def stream_run(
    scope: Scope,
    service: RunService,
    served: ServedProgram,
    arguments: dict[str, Any],
    resume: Resume | None = None,
    place: contextlib.AsyncExitStack | None = None,
) -> Response:
    """Answers one run as Server-Sent Events of its events (`plait.serve.events`); ``place``
    as for `answer_run`."""
    owner = owner_of(scope)

    async def events() -> AsyncIterator[bytes]:
        async for name, data, _ in service.stream(served, arguments, resume, owner=owner):
            yield sse(name, data)

    return await admitted_stream(scope, service, events(), lambda error: sse("error", error), place)


async def admitted_stream(
    scope: Scope,
    service: RunService,
    events: AsyncIterator[bytes],
    encode_error: Callable[[dict[str, Any]], bytes],
    place: contextlib.AsyncExitStack | None = None,
) -> Response:
    """Admits a run (unless ``place`` holds one already), then answers with its events as
    SSE; a refused run is answered 429/503 before any event, and a run that fails ends its
    stream with ``encode_error`` of the error body (``{"error": {..., "status"}}``)."""
    if place is None:
        try:
            place = await admit(service)
        except Exception as exc:
            return run_failure(exc, scope, service.options.retry_after)

    async def guarded() -> AsyncIterator[bytes]:
        try:
            async for chunk in events:
                yield chunk
        except Exception as exc:
            failure = run_failure(exc, scope, service.options.retry_after)
            error = orjson.loads(bytes(failure.body))
            error["error"]["status"] = failure.status_code
            yield encode_error(error)
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    return EventStreamResponse(guarded(), on_close=place.aclose)


def documented_run_route(served: ServedProgram) -> APIRoute:
    """Returns the typed route FastAPI describes in the OpenAPI document for the program's
    runs: its request body the program's input schema, its answers the result (200) and
    paused (202) schemas, ``?stream=``. `RunRoutes` answers the requests; this route is
    never mounted, and its endpoint never called."""

    async def run_program(body: BaseModel, stream: bool = False) -> Any:
        raise NotImplementedError("RunRoutes answers runs")  # pragma: no cover

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    run_program.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("body", positional, annotation=served.input_model),
            inspect.Parameter(
                "stream",
                inspect.Parameter.KEYWORD_ONLY,
                default=Query(False, description="Answer with Server-Sent Events."),
                annotation=bool,
            ),
        ]
    )
    return APIRoute(
        f"/programs/{served.name}/run",
        run_program,
        methods=["POST"],
        name=served.name,
        tags=["programs"],
        summary=f"Run {served.name}",
        description=_describe(served),
        operation_id=f"run_{served.name}",
        response_class=JsonResponse,
        responses={
            200: {"model": served.result_model, "description": "The run finished."},
            202: {"model": served.paused_model, "description": "The run waits for approval."},
        },
    )


def _describe(served: ServedProgram) -> str:
    doc = inspect.getdoc(type(served.module)) or ""
    first = doc.splitlines()[0] if doc else f"Runs the program {served.name}."
    return (
        f"{first}\n\nAnswers the run's output and usage (200), or its pending tool calls when it "
        "waits for a person's approval (202). With `?stream=true` or `Accept: "
        "text/event-stream`, Server-Sent Events of the run, ending with `output`, `paused`, "
        "`rejected` or `error`."
    )
