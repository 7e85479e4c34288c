"""`build_app`: the ASGI app that serves plait programs (FastAPI), and its typed run routes.

Routes: ``POST /programs/{name}/run`` (one per program, typed; ``?stream=true`` or
``Accept: text/event-stream`` for SSE), ``GET /programs/{name}/runs/{run_id}`` (a paused run),
``POST /programs/{name}/runs/{run_id}/resume`` (the person's answers; JSON or SSE like a run),
``GET /programs``, the OpenAI-compatible ``/v1`` routes (`plait.serve.openai_api`), the chat
page at ``/`` (`plait.serve.page`), and ``/healthz``, ``/readyz``, ``/metrics``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from plait.confirmation import ResumeState
from plait.errors import BudgetExceededError, DeadlineExceededError, ResumeRefusedError
from plait.serve.errors import error_response, failure_id, failure_response
from plait.serve.events import sse
from plait.serve.metrics import CONTENT_TYPE, ServerMetrics
from plait.serve.middleware import LimitBody, ObservedRequests, RequireApiKey
from plait.serve.options import ServeOptions
from plait.serve.pending import PendingRunTooLarge
from plait.serve.programs import ServedProgram, served_programs
from plait.serve.responses import ClientLeft, EventStreamResponse, until_disconnected
from plait.serve.runs import Draining, NotResumable, Overloaded, RunService

__all__ = ["admitted_stream", "build_app", "run_failure"]

logger = logging.getLogger("plait.serve")


def build_app(programs: Any, resources: Any, options: ServeOptions | None = None) -> FastAPI:
    """Returns the ASGI app serving ``programs`` with one set of ``resources``.

    Raises:
        ConfigError: a program cannot be served, or there are no resources.
    """
    options = options or ServeOptions()
    served = {program.name: program for program in served_programs(programs)}
    service = RunService(served, _resources(resources, served), options)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.open()
        if not options.api_keys:
            logger.warning("plait serve: API keys are off; only this machine can call it")
        try:
            yield
        finally:
            await service.aclose()

    app = FastAPI(
        title="plait programs",
        summary=f"Serves {', '.join(served)}",
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.runs = service
    app.state.options = options
    metrics = app.state.metrics = ServerMetrics(service)
    _add_error_handlers(app)
    _add_operations(app, service, metrics)
    for program in served.values():
        _add_program(app, service, program)
    from plait.serve.openai_api import add_openai_routes

    add_openai_routes(app, service)
    if any(program.chat_form is not None for program in served.values()):
        from plait.serve.page import add_chat_page

        add_chat_page(app)
    # add_middleware puts each in front of the last: LimitBody sits innermost.
    app.add_middleware(LimitBody, max_bytes=options.max_body_bytes)
    if options.api_keys:
        app.add_middleware(RequireApiKey, keys=options.api_keys)
    if options.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(options.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["x-request-id"],
        )
    app.add_middleware(ObservedRequests, metrics=metrics, access_log=options.access_log)
    return app


def _resources(resources: Any, served: dict[str, ServedProgram]) -> Any:
    """Returns the resources of the server: those given, or the ones every program is bound to."""
    from plait.errors import ConfigError
    from plait.module import bound_resources

    if resources is not None:
        return resources
    bound = {id(found): found for p in served.values() if (found := bound_resources(p.module))}
    if len(bound) == 1 and all(bound_resources(p.module) is not None for p in served.values()):
        return next(iter(bound.values()))
    raise ConfigError(
        "the server has no resources: pass resources= (a ResourceConfig, mapping or file's "
        "config), or --resources res.toml; every request shares them"
    )


def _add_error_handlers(app: FastAPI) -> None:
    async def invalid_input(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]}
            for error in exc.errors()
        ]
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(part) for part in first["loc"] if part != "body") or "body"
        response = error_response(
            422, "invalid_input", f"{where}: {first['msg']}", request.scope, fields=details
        )
        return response

    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, kind, str(exc.detail), request.scope)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return failure_response(exc, request.scope)

    app.add_exception_handler(RequestValidationError, invalid_input)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, unexpected)


def _add_operations(app: FastAPI, service: RunService, metrics: ServerMetrics) -> None:
    @app.get("/healthz", tags=["operations"], summary="The server is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"], summary="The server takes runs")
    async def readyz() -> JSONResponse:
        if service.is_ready:
            return JSONResponse({"status": "ready"})
        state = "draining" if service.draining else "starting"
        return JSONResponse({"status": state}, status_code=503)

    @app.get("/metrics", tags=["operations"], summary="Prometheus metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/programs", tags=["programs"], summary="The programs served")
    async def programs() -> list[dict[str, Any]]:
        return [
            {
                "name": p.name,
                "run": f"/programs/{p.name}/run",
                "chat": p.chat_form,
                "chat_input": next(iter(p.input_model.model_fields)) if p.chat_form else None,
                "input_schema": p.input_model.model_json_schema(),
            }
            for p in service.programs.values()
        ]


def run_failure(exc: BaseException, scope: Scope, retry_after: int) -> JSONResponse:
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
    if isinstance(exc, BudgetExceededError):
        error_id = failure_id(exc, scope, "run")
        message = f"the server's model budget is spent; quote error id {error_id} to its operator"
        return error_response(503, "budget_exhausted", message, scope, error_id=error_id)
    return failure_response(exc, scope, "run")


def wants_stream(request: Request, stream: bool) -> bool:
    """Whether the client asked for Server-Sent Events: ``?stream=true`` or an ``Accept``
    header that names ``text/event-stream``."""
    return stream or "text/event-stream" in request.headers.get("accept", "")


def _add_program(app: FastAPI, service: RunService, served: ServedProgram) -> None:
    async def run_program(request: Request, body: BaseModel, stream: bool = False) -> Any:
        arguments = served.arguments(body)
        if wants_stream(request, stream):
            return await _stream_response(request, service, served, arguments)
        return await _answer(request, service, served, arguments)

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    run_program.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("request", positional, annotation=Request),
            inspect.Parameter("body", positional, annotation=served.input_model),
            inspect.Parameter(
                "stream",
                inspect.Parameter.KEYWORD_ONLY,
                default=Query(False, description="Answer with Server-Sent Events."),
                annotation=bool,
            ),
        ]
    )
    app.add_api_route(
        f"/programs/{served.name}/run",
        run_program,
        methods=["POST"],
        tags=["programs"],
        summary=f"Run {served.name}",
        description=_describe(served),
        operation_id=f"run_{served.name}",
        response_class=JSONResponse,
        responses={
            200: {"model": served.result_model, "description": "The run finished."},
            202: {"model": served.paused_model, "description": "The run waits for approval."},
        },
    )

    async def paused_run(request: Request, run_id: str) -> JSONResponse:
        pending = await service.pending.get(run_id)
        if pending is None or pending.program != served.name:
            message = f"no run {run_id!r} of {served.name} waits for approval"
            return error_response(404, "not_found", message, request.scope)
        from plait.confirmation import ConfirmationRequired

        pause = ConfirmationRequired.from_dict(pending.pause)
        from plait.serve.runs import pending_call

        body = {
            "run_id": pending.run_id,
            "status": "paused",
            "program": served.name,
            "pending": [pending_call(pause)],
        }
        return JSONResponse(body)

    app.add_api_route(
        f"/programs/{served.name}/runs/{{run_id}}",
        paused_run,
        methods=["GET"],
        tags=["programs"],
        summary=f"A paused run of {served.name}",
        operation_id=f"paused_run_{served.name}",
    )

    async def resume_run(
        request: Request, run_id: str, body: ResumeRequest, stream: bool = False
    ) -> Any:
        try:
            arguments, resume = await service.claim(served, run_id, body.answers)
        except Exception as exc:
            return run_failure(exc, request.scope, service.options.retry_after)
        if wants_stream(request, stream):
            return await _stream_response(request, service, served, arguments, resume)
        return await _answer(request, service, served, arguments, resume)

    app.add_api_route(
        f"/programs/{served.name}/runs/{{run_id}}/resume",
        resume_run,
        methods=["POST"],
        tags=["programs"],
        summary=f"Resume a paused run of {served.name} with the person's answers",
        description=(
            'Answers each pending call (by its `call_id`) with `"yes"`, `"no"` (or the '
            "person's reason, which the model is told) or an object of edited arguments, and "
            "continues the run where it paused, with the inputs it paused on. A run is resumed "
            "once: 409 after that, 410 once it expired, 404 for an unknown run, 422 for "
            "answers that do not fit its pending calls. Answers like a run (200, 202 when it "
            "pauses again, SSE with `?stream=true`)."
        ),
        operation_id=f"resume_{served.name}",
        response_class=JSONResponse,
        responses={
            200: {"model": served.result_model, "description": "The run finished."},
            202: {"model": served.paused_model, "description": "It waits for approval again."},
        },
    )


class ResumeRequest(BaseModel):
    """The person's answers to a paused run's pending calls."""

    model_config = ConfigDict(extra="forbid")

    answers: dict[str, str | dict[str, Any]] = Field(
        description=(
            'One answer per pending call, by its call_id: "yes" (run it as shown), "no" '
            "or any other text (do not run it; the text is the reason the model is told), or "
            "an object of the arguments to run it with instead."
        ),
        examples=[{"call_1": "yes"}, {"call_1": "no"}, {"call_1": {"path": "/tmp/y"}}],
    )


async def _answer(
    request: Request,
    service: RunService,
    served: ServedProgram,
    arguments: dict[str, Any],
    resume: ResumeState | None = None,
) -> Response:
    """Runs once and answers with its JSON body: 200 finished or rejected, 202 paused."""
    try:
        async with service.admitted():
            work = service.run(served, arguments, resume)
            outcome = await until_disconnected(request.receive, work)
            name, body = await service.finish(served, arguments, outcome)
    except ClientLeft:
        return Response(status_code=499)
    except Exception as exc:
        return run_failure(exc, request.scope, service.options.retry_after)
    return JSONResponse(body, status_code=202 if name == "paused" else 200)


def _describe(served: ServedProgram) -> str:
    doc = inspect.getdoc(type(served.module)) or ""
    first = doc.splitlines()[0] if doc else f"Runs the program {served.name}."
    return (
        f"{first}\n\nAnswers the run's output and usage (200), or its pending tool calls when it "
        "waits for a person's approval (202). With `?stream=true` or `Accept: "
        "text/event-stream`, Server-Sent Events of the run, ending with `output`, `paused`, "
        "`rejected` or `error`."
    )


async def _stream_response(
    request: Request,
    service: RunService,
    served: ServedProgram,
    arguments: dict[str, Any],
    resume: ResumeState | None = None,
) -> Any:
    async def events() -> AsyncIterator[bytes]:
        async for name, data, _ in service.stream(served, arguments, resume):
            yield sse(name, data)

    return await admitted_stream(request, service, events(), lambda error: sse("error", error))


async def admitted_stream(
    request: Request,
    service: RunService,
    events: AsyncIterator[bytes],
    encode_error: Callable[[dict[str, Any]], bytes],
) -> Any:
    """Admits a run, then answers with its events as SSE; a refused run is answered 429/503
    before any event, and a run that fails ends its stream with ``encode_error`` of the
    error body (``{"error": {..., "status"}}``)."""
    place = service.admitted()
    try:
        await place.__aenter__()
    except Exception as exc:
        return run_failure(exc, request.scope, service.options.retry_after)

    async def guarded() -> AsyncIterator[bytes]:
        try:
            async for chunk in events:
                yield chunk
        except Exception as exc:
            failure = run_failure(exc, request.scope, service.options.retry_after)
            error = json.loads(bytes(failure.body))
            error["error"]["status"] = failure.status_code
            yield encode_error(error)
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    return EventStreamResponse(guarded(), on_close=lambda: place.__aexit__(None, None, None))
