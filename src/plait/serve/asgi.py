"""`build_app`: the ASGI app that serves plait programs (FastAPI), and its routes.

Routes: ``POST /programs/{name}/run`` (one per program, typed; ``?stream=true`` or
``Accept: text/event-stream`` for SSE; answered by `plait.serve.run_route.RunRoutes` in
front of FastAPI), ``GET /programs/{name}/runs/{run_id}`` (a paused run),
``POST /programs/{name}/runs/{run_id}/resume`` (the person's answers; JSON or SSE like a run),
``GET /programs``, the OpenAI-compatible ``/v1`` routes (`plait.serve.openai_api`), the chat
page at ``/`` (`plait.serve.page`), and ``/healthz``, ``/readyz``, ``/metrics``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from plait.errors import ConfigError
from plait.module import bound_resources
from plait.serve.errors import error_response, failure_response
from plait.serve.metrics import CONTENT_TYPE, ServerMetrics
from plait.serve.middleware import (
    LOOPBACK_NAMES,
    AccessLog,
    CheckBody,
    CheckHost,
    ObservedRequests,
    RequireApiKey,
)
from plait.serve.openai_api import add_openai_routes
from plait.serve.options import ServeOptions
from plait.serve.owners import owner_of
from plait.serve.page import add_chat_page
from plait.serve.programs import ServedProgram, served_programs
from plait.serve.responses import JsonResponse
from plait.serve.run_route import (
    RunRoutes,
    admit,
    answer_run,
    documented_run_route,
    invalid_input,
    run_failure,
    stream_run,
    wants_stream,
)
from plait.serve.runs import RunService

__all__ = ["ServedApp", "build_app"]

logger = logging.getLogger("plait.serve")


def build_app(programs: Any, resources: Any, options: ServeOptions | None = None) -> FastAPI:
    """Returns the ASGI app serving ``programs`` with one set of ``resources``.

    Raises:
        ConfigError: a program cannot be served, or there are no resources.
    """
    options = options or ServeOptions()
    served = {program.name: program for program in served_programs(programs)}
    service = RunService(served, _resources(resources, served), options)
    access_log = AccessLog() if options.access_log else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.open()
        if not options.api_keys:
            logger.warning("plait serve: API keys are off; only this machine can call it")
        try:
            yield
        finally:
            await service.aclose()
            if access_log is not None:
                access_log.close()  # every line of the requests answered is written

    app = ServedApp(
        title="plait programs",
        summary=f"Serves {', '.join(served)}",
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.runs = service
    app.state.options = options
    metrics = app.state.metrics = ServerMetrics(service)
    _add_error_handlers(app, list(served))
    _add_operations(app, service, metrics)
    for program in served.values():
        _add_program(app, service, program)

    add_openai_routes(app, service)
    if any(program.chat_form is not None for program in served.values()):
        add_chat_page(app)
    app.run_routes = {route.path: route for route in map(documented_run_route, served.values())}
    app.wrap = lambda inner: _layers(inner, app, service, metrics, options, access_log)
    return app


class ServedApp(FastAPI):
    """The FastAPI app of a server, behind plait's own layers (`_layers`): request ids,
    access log and metrics, the Host and Origin check, CORS, API keys, the body's type and
    size, and `RunRoutes`, which answers
    the run requests before FastAPI's per-request machinery would."""

    run_routes: dict[str, APIRoute]
    """The typed run route of each program, by path: described in the OpenAPI document,
    answered by `RunRoutes`."""
    wrap: Callable[[ASGIApp], ASGIApp]
    """Puts plait's layers around FastAPI's own stack (set by `build_app`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A run goes straight to the layers: FastAPI's own __call__ would first ask
        # OpenTelemetry whether to trace the request, on every request (the run's model calls
        # are traced by plait's callbacks). Every other request is FastAPI's as before.
        stack = self.middleware_stack
        if stack is not None and scope["type"] == "http" and scope["path"] in self.run_routes:
            scope["app"] = self
            await stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        return self.wrap(super().build_middleware_stack())

    def openapi(self) -> dict[str, Any]:
        if not self.openapi_schema:
            self.openapi_schema = get_openapi(
                title=self.title,
                version=self.version,
                openapi_version=self.openapi_version,
                summary=self.summary,
                routes=[*self.run_routes.values(), *self.routes],
            )
        return self.openapi_schema


def _layers(
    inner: ASGIApp,
    app: ServedApp,
    service: RunService,
    metrics: ServerMetrics,
    options: ServeOptions,
    access_log: AccessLog | None,
) -> ASGIApp:
    """Returns ``inner`` (FastAPI's stack) inside plait's layers, outermost last here."""
    layered: ASGIApp = RunRoutes(inner, service, app.run_routes)
    layered = CheckBody(layered, max_bytes=options.max_body_bytes)
    if options.api_keys:
        layered = RequireApiKey(layered, keys=options.api_keys)
    if options.cors_origins:
        layered = CORSMiddleware(
            layered,
            allow_origins=list(options.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["x-request-id"],
        )
    if (options.allowed_hosts or not options.api_keys) and "*" not in options.allowed_hosts:
        names = LOOPBACK_NAMES | frozenset(options.allowed_hosts)
        layered = CheckHost(layered, names, options.cors_origins)
    return ObservedRequests(layered, metrics=metrics, access_log=access_log)


def _resources(resources: Any, served: dict[str, ServedProgram]) -> Any:
    """Returns the resources of the server: those given, or the ones every program is bound to."""
    if resources is not None:
        return resources
    bound = {id(found): found for p in served.values() if (found := bound_resources(p.module))}
    if len(bound) == 1 and all(bound_resources(p.module) is not None for p in served.values()):
        return next(iter(bound.values()))
    raise ConfigError(
        "the server has no resources: pass resources= (a ResourceConfig, mapping or file's "
        "config), or --resources res.toml; every request shares them"
    )


def _add_error_handlers(app: FastAPI, names: list[str]) -> None:
    async def invalid(request: Request, exc: RequestValidationError) -> JsonResponse:
        return invalid_input(exc.errors(), request.scope)

    async def http_error(request: Request, exc: HTTPException) -> JsonResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":  # no route, not a run of ours
            message = _no_route(request, names)
        return error_response(exc.status_code, kind, message, request.scope)

    async def unexpected(request: Request, exc: Exception) -> JsonResponse:
        return failure_response(exc, request.scope)

    app.add_exception_handler(RequestValidationError, invalid)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, unexpected)


def _no_route(request: Request, names: list[str]) -> str:
    """Says what a path that matched no route should have been: a program's name, or a route."""
    parts = request.url.path.strip("/").split("/")
    if len(parts) >= 2 and parts[0] == "programs" and parts[1] not in names:
        known = ", ".join(repr(name) for name in names)
        return f"no program named {parts[1]!r} is served here; the programs: {known}"
    return f"no route {request.method} {request.url.path}; /docs lists the routes"


def _add_operations(app: FastAPI, service: RunService, metrics: ServerMetrics) -> None:
    @app.get("/healthz", tags=["operations"], summary="The server is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"], summary="The server takes runs")
    async def readyz() -> JsonResponse:
        if service.is_ready:
            return JsonResponse({"status": "ready"})
        state = "draining" if service.draining else "starting"
        return JsonResponse({"status": state}, status_code=503)

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


def _add_program(app: FastAPI, service: RunService, served: ServedProgram) -> None:
    async def paused_run(request: Request, run_id: str) -> JsonResponse:
        try:
            body = await service.paused(served, run_id, owner_of(request.scope))
        except Exception as exc:  # none waits (404), or its stored pause is refused (409)
            return run_failure(exc, request.scope, service.options.retry_after)
        return JsonResponse(body)

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
        scope = request.scope
        try:  # a place first: a resume refused for want of one leaves the run waiting
            place = await admit(service)
        except Exception as exc:
            return run_failure(exc, scope, service.options.retry_after)
        try:
            resume = await service.claim(served, run_id, body.answers, owner_of(scope))
        except Exception as exc:
            await place.aclose()
            return run_failure(exc, scope, service.options.retry_after)
        arguments = resume.arguments
        if wants_stream(scope, stream):
            return await stream_run(scope, service, served, arguments, resume, place)
        return await answer_run(scope, request.receive, service, served, arguments, resume, place)

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
            "once, with the API key that started it: 409 after that, 410 once it expired, 404 "
            "for an unknown run (or another key's), 422 for answers that do not fit its "
            "pending calls; a resume refused with 429 or 503, or one whose run failed before "
            "the approved call ran, leaves the run waiting. Answers like a run (200, 202 when "
            "it pauses again, SSE with `?stream=true`)."
        ),
        operation_id=f"resume_{served.name}",
        response_class=JsonResponse,
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
