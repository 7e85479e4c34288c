"""A scripted OpenAI-compatible server for tests and benchmarks.

It answers ``POST /v1/chat/completions`` like a real server (JSON or SSE
stream, tool calls, usage, OpenAI-shaped errors) but with everything that
matters to a client under the test's control: a fixed latency, the reply
(``responder``), injected faults (429 with ``Retry-After``, 5xx, slow
answers, dropped connections), and the dialect of structured output it
accepts. It also counts what it saw (`ServerStats`), so tests assert on
server-observed facts (requests received, peak concurrency, the exact body
sent) instead of on timings.

In a test, run it inside the test's event loop::

    async with ScriptedServer(latency=0.05) as server:
        backend = OpenAICompatBackend("any", base_url=server.base_url)
        ...
        assert server.stats.requests == 10

For a benchmark, run it in its own process so it does not share the
client's loop and CPU::

    with start_server_process(latency=0.1) as (process, base_url):
        ...                                    # drive the client
        print(fetch_stats(base_url)["peak_concurrency"])

or from a shell: ``python -m plait.testing.scripted_server --port 0 --latency 0.1``
(prints ``PORT <n>`` as its first line). Besides the chat endpoint it serves
``GET /v1/models``, ``GET /stats`` (``?log=1`` adds the request log),
``POST /stats/reset``, ``GET``/``POST``/``DELETE /faults`` to inspect,
add and clear faults from another process, and the Batch API (``/v1/files``,
``/v1/batches``; see `plait.testing._batches`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import itertools
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from aiohttp import web

from plait.testing._batches import BatchStore
from plait.testing._faults import Fault
from plait.testing._flood import send_flood
from plait.testing._process import fetch_stats, start_server_process
from plait.testing._replies import (
    Flood,
    RawReply,
    Reply,
    Responder,
    build_reply,
    completion_payload,
    default_responder,
    error_payload,
    stream_events,
)

__all__ = [
    "RequestRecord",
    "ScriptedServer",
    "ServerStats",
    "fetch_stats",
    "main",
    "start_server_process",
]

ServerDialect = Literal["openai", "llama_cpp"]

LATENCY_HEADER = "x-scripted-latency"
"""A request header that overrides the server's latency (seconds) for that request."""


@dataclass
class RequestRecord:
    """What the server saw of one chat-completions request."""

    arrived: float
    """``time.monotonic()`` when the request arrived (comparable across processes)."""
    finished: float | None = None
    """``time.monotonic()`` when the handler finished (None while in flight)."""
    body: Any = None
    """The parsed JSON body (None when it was not JSON)."""
    status: int | None = None
    """HTTP status sent; None when no answer was sent (dropped, or the client left)."""
    stream: bool = False
    """Whether the request asked for a stream."""
    fault: str | None = None
    """The fault that fired on this request (`Fault.describe`), if one did."""
    headers: dict[str, str] = field(default_factory=dict)
    """The request headers, names lower-cased (``authorization`` included: a test server)."""
    target: str = ""
    """The path and query the request was sent to, e.g. ``/v1/chat/completions?api-version=1``."""

    def as_dict(self) -> dict[str, Any]:
        """Returns the record as JSON-ready data."""
        return {
            "arrived": self.arrived,
            "finished": self.finished,
            "body": self.body,
            "status": self.status,
            "stream": self.stream,
            "fault": self.fault,
            "headers": self.headers,
            "target": self.target,
        }


@dataclass
class ServerStats:
    """Counters of chat-completions requests (other endpoints are not counted)."""

    requests: int = 0
    """Requests received, including those answered with a fault."""
    in_flight: int = 0
    """Requests being handled right now."""
    peak_concurrency: int = 0
    """The largest ``in_flight`` seen since start or the last reset."""
    log: list[RequestRecord] = field(default_factory=list)
    """One record per request, in arrival order (empty when the server keeps no log)."""

    def reset(self) -> None:
        """Zeroes the counters and the log in place; requests in flight still count."""
        self.requests = 0
        self.peak_concurrency = self.in_flight
        self.log = []

    def as_dict(self, *, include_log: bool = False) -> dict[str, Any]:
        """Returns the counters (and the log, if asked) as JSON-ready data."""
        data: dict[str, Any] = {
            "requests": self.requests,
            "in_flight": self.in_flight,
            "peak_concurrency": self.peak_concurrency,
        }
        if include_log:
            data["log"] = [record.as_dict() for record in self.log]
        return data


class ScriptedServer:
    """An OpenAI-compatible HTTP server whose answers a test scripts.

    Example::

        async def fail_politely(body):
            return {"content": "no", "finish_reason": "content_filter"}

        async with ScriptedServer(
            latency=0.1,
            responder=fail_politely,
            faults=[Fault(status=429, headers={"Retry-After": "1"}, times=2)],
        ) as server:
            ...                       # the first two calls get 429, then "no"
            assert server.stats.log[0].status == 429

    Args:
        latency: seconds every successful answer waits before it is sent;
            a request header ``x-scripted-latency`` overrides it per request.
        responder: ``responder(body) -> str | dict`` (may be async); the
            default answers ``"echo: <last user message>"``. A dict may give
            ``content``, ``tool_calls`` (``[{"name", "arguments"}]``, arguments
            as a dict or JSON text), ``finish_reason`` and ``usage``; a
            `RawReply` is sent exactly as given, and a `Flood` (a body too
            large to hold) is made as it is written. If it raises, the client
            gets a 500 naming the exception.
        faults: `Fault` rules, asked in order for every request.
        host: interface to listen on; loopback by default.
        port: port to listen on; 0 picks a free one (see `port`).
        model: the model name ``/v1/models`` lists and replies carry when the
            request names none.
        dialect: ``"openai"`` accepts ``response_format`` of type ``json_schema``
            and ``json_object``; ``"llama_cpp"`` refuses ``json_schema`` with
            the 500 that llama.cpp's Python server sends, and like it ignores
            ``max_completion_tokens`` and ``stream_options`` (no streamed usage).
        api_key: when set, requests without ``Authorization: Bearer <api_key>``
            get a 401.
        stream_pieces: how many pieces streamed text and tool arguments are cut into.
        keep_log: keep a `RequestRecord` per request (turn off for long benchmarks).
    """

    def __init__(
        self,
        latency: float = 0.0,
        responder: Responder | None = None,
        faults: Sequence[Fault] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        model: str = "scripted",
        dialect: ServerDialect = "openai",
        api_key: str | None = None,
        stream_pieces: int = 3,
        keep_log: bool = True,
    ) -> None:
        if latency < 0:
            raise ValueError(f"ScriptedServer latency must be >= 0 seconds; got {latency}")
        if dialect not in ("openai", "llama_cpp"):
            raise ValueError(
                f"ScriptedServer dialect must be 'openai' or 'llama_cpp'; got {dialect!r}"
            )
        self.latency = latency
        self.responder: Responder = responder or default_responder
        self.faults: list[Fault] = list(faults or [])
        self.host = host
        self.model = model
        self.dialect: ServerDialect = dialect
        self.api_key = api_key
        self.stream_pieces = stream_pieces
        self.keep_log = keep_log
        self.stats = ServerStats()
        self.batch_api = BatchStore()
        """The Batch API's files and batches (``/v1/files``, ``/v1/batches``)."""
        self._requested_port = port
        self._port: int | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._serial = itertools.count(1)

    # -- lifecycle -----------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the server listens on (known once started; kept after `stop`)."""
        if self._port is None:
            raise RuntimeError(
                "ScriptedServer is not running; use `async with ScriptedServer() as server:` "
                "or `await server.start()` first"
            )
        return self._port

    @property
    def base_url(self) -> str:
        """The API root to give a client, e.g. ``http://127.0.0.1:41234/v1``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def endpoint(self, **options: Any) -> dict[str, Any]:
        """Returns `ResourceConfig` settings of an OpenAI-compatible endpoint that is this server.

        Example::

            ResourceConfig({"*": server.endpoint(max_retries=0)})
        """
        return {
            "provider": "openai",
            "model": "scripted-model",
            "base_url": self.base_url,
            "api_key": "test-key",
            **options,
        }

    async def start(self) -> ScriptedServer:
        """Starts listening; returns the server itself."""
        if self._runner is not None:
            raise RuntimeError(f"ScriptedServer is already running at {self.base_url}")
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for prefix in ("/v1", ""):  # some clients leave /v1 out of base_url
            app.router.add_post(f"{prefix}/chat/completions", self._handle_chat)
            app.router.add_get(f"{prefix}/models", self._handle_models)
        self.batch_api.routes(app, self)
        app.router.add_get("/stats", self._handle_stats)
        app.router.add_post("/stats/reset", self._handle_stats_reset)
        app.router.add_get("/faults", self._handle_faults)
        app.router.add_post("/faults", self._handle_faults)
        app.router.add_delete("/faults", self._handle_faults)
        # handler_cancellation: a client that hangs up (say, after its timeout)
        # cancels its handler, so in_flight stays true and a slow fault does
        # not keep the server busy after the test has moved on.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self._requested_port))
            site = web.SockSite(runner, sock, backlog=1024)
            await site.start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        self._port = sock.getsockname()[1]
        self._runner = runner
        return self

    async def stop(self) -> None:
        """Stops the server; requests still being handled are cancelled."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        for task in list(self._tasks):
            task.cancel()
        await runner.cleanup()
        # _port is kept: base_url still names where the server was, which tests
        # of refused connections use.

    async def __aenter__(self) -> ScriptedServer:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- control -------------------------------------------------------------

    def inject(self, *faults: Fault) -> None:
        """Adds faults at run time; they are asked after the ones already present."""
        self.faults.extend(faults)

    def clear_faults(self) -> None:
        """Removes every fault."""
        self.faults.clear()

    def reset_stats(self) -> None:
        """Zeroes the counters and the log (see `ServerStats.reset`)."""
        self.stats.reset()

    def _pick_fault(self, stream: bool) -> Fault | None:
        for fault in self.faults:
            if fault.should_fire(stream):
                return fault
        return None

    # -- handlers ------------------------------------------------------------

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        stats = self.stats
        # Lower-cased plain str: header names are case-insensitive (clients differ
        # in how they spell them), and aiohttp's istr keys are not JSON-encodable.
        headers = {name.lower(): value for name, value in request.headers.items()}
        record = RequestRecord(arrived=time.monotonic(), headers=headers, target=request.path_qs)
        stats.requests += 1
        stats.in_flight += 1
        stats.peak_concurrency = max(stats.peak_concurrency, stats.in_flight)
        if self.keep_log:
            stats.log.append(record)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            return await self._answer(request, record)
        except asyncio.CancelledError:
            record.status = None  # the client hung up, or the server is stopping
            raise
        finally:
            self.stats.in_flight -= 1
            record.finished = time.monotonic()
            if task is not None:
                self._tasks.discard(task)

    async def _answer(self, request: web.Request, record: RequestRecord) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            return self._json(record, 400, error_payload(400, "request body is not a JSON object"))
        record.body = body
        record.stream = bool(body.get("stream"))
        if self.api_key is not None and (
            request.headers.get("Authorization") != f"Bearer {self.api_key}"
        ):
            return self._json(record, 401, error_payload(401, "Incorrect API key provided."))
        fault = self._pick_fault(record.stream)
        drop_after: int | None = None
        if fault is not None:
            record.fault = fault.describe()
            if fault.kind == "status":
                message = fault.message or f"scripted fault: HTTP {fault.status}"
                return self._json(
                    record, fault.status, error_payload(fault.status, message), fault.headers
                )
            if fault.kind == "drop":
                if not (record.stream and fault.after_chunks):
                    return self._drop(request, record, web.Response())
                drop_after = fault.after_chunks
            if fault.kind == "slow":
                await asyncio.sleep(fault.delay)
        rejection = self._reject(body)
        if rejection is not None:
            status, payload = rejection
            return self._json(record, status, payload)
        latency = self._latency_for(request)
        if latency > 0:
            await asyncio.sleep(latency)
        try:
            reply = await self._ask_responder(body)
        except Exception as exc:
            message = f"scripted server responder raised {type(exc).__name__}: {exc}"
            return self._json(record, 500, error_payload(500, message))
        if isinstance(reply, RawReply):
            return await self._send_raw(request, record, reply)
        if isinstance(reply, Flood):
            return await send_flood(request, reply, record)
        request_id = f"chatcmpl-scripted-{next(self._serial)}"
        model = str(body.get("model") or self.model)
        if record.stream:
            # llama_cpp.server ignores stream_options and never streams usage.
            include_usage = self.dialect == "openai" and bool(
                (body.get("stream_options") or {}).get("include_usage")
            )
            events = stream_events(
                reply,
                model=model,
                request_id=request_id,
                created=int(time.time()),
                pieces=self.stream_pieces,
                include_usage=include_usage,
            )
            return await self._stream(request, record, events, drop_after)
        payload = completion_payload(
            reply, model=model, request_id=request_id, created=int(time.time())
        )
        return self._json(record, 200, payload)

    async def _ask_responder(self, body: dict[str, Any]) -> Reply | RawReply | Flood:
        """Returns the responder's answer for ``body``, normalised unless sent as it is."""
        answer = self.responder(body)
        if inspect.isawaitable(answer):
            answer = await answer
        if isinstance(answer, RawReply | Flood):
            return answer
        limits: tuple[str, ...] = ("max_tokens",)
        if self.dialect == "openai":  # llama.cpp's server ignores max_completion_tokens
            limits = ("max_tokens", "max_completion_tokens")
        return build_reply(
            answer,
            body,
            call_id_prefix=f"call_{next(self._serial)}",
            token_limit_fields=limits,
        )

    def _latency_for(self, request: web.Request) -> float:
        override = request.headers.get(LATENCY_HEADER)
        if override is None:
            return self.latency
        try:
            return max(float(override), 0.0)
        except ValueError:
            return self.latency

    def _reject(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        """Returns (status, payload) when a real server would refuse ``body``."""
        if not body.get("model"):
            return 400, error_payload(400, "you must provide a model parameter")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return 400, error_payload(400, "'messages' must be a non-empty array")
        response_format = body.get("response_format")
        if response_format is None:
            return None
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if self.dialect == "llama_cpp" and kind == "json_schema":
            # Exactly how llama_cpp.server 0.3.36 refuses it: its error handler
            # turns the pydantic validation error into a 500 (seen on the wire).
            message = (
                "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', "
                "'response_format', 'type'), 'msg': \"Input should be 'text' or "
                "'json_object'\", 'input': 'json_schema'}"
            )
            return 500, error_payload(500, message)
        if kind not in ("text", "json_object", "json_schema"):
            message = f"Invalid value for 'response_format.type': {kind!r}"
            return 400, error_payload(400, message)
        return None

    def _json(
        self,
        record: RequestRecord,
        status: int,
        payload: Any,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        record.status = status
        return web.Response(
            status=status,
            body=orjson.dumps(payload),
            content_type="application/json",
            headers=headers,
        )

    async def _send_raw(
        self, request: web.Request, record: RequestRecord, raw: RawReply
    ) -> web.StreamResponse:
        if not (record.stream and raw.stream_events is not None):
            record.status = raw.status
            return web.Response(status=raw.status, body=raw.body, headers=dict(raw.headers))
        frames = [b"data: " + event + b"\n\n" for event in raw.stream_events]
        return await self._write_stream(request, record, frames, None)

    def _drop(
        self, request: web.Request, record: RequestRecord, response: web.StreamResponse
    ) -> web.StreamResponse:
        record.status = None
        if request.transport is not None:
            request.transport.abort()
        return response  # goes nowhere: the connection is already closed

    async def _stream(
        self,
        request: web.Request,
        record: RequestRecord,
        events: list[dict[str, Any]],
        drop_after: int | None,
    ) -> web.StreamResponse:
        frames = [b"data: " + orjson.dumps(event) + b"\n\n" for event in events]
        return await self._write_stream(request, record, frames, drop_after)

    async def _write_stream(
        self,
        request: web.Request,
        record: RequestRecord,
        frames: list[bytes],
        drop_after: int | None,
    ) -> web.StreamResponse:
        """Sends the SSE ``frames`` and ``data: [DONE]``; cuts off after ``drop_after`` frames."""
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        record.status = 200
        for sent, frame in enumerate(frames):
            if drop_after is not None and sent >= drop_after:
                return self._drop(request, record, response)
            await response.write(frame)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _handle_models(self, request: web.Request) -> web.Response:
        payload = {
            "object": "list",
            "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "plait"}],
        }
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    async def _handle_stats(self, request: web.Request) -> web.Response:
        include_log = request.query.get("log", "") in ("1", "true", "yes")
        payload = self.stats.as_dict(include_log=include_log)
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    async def _handle_stats_reset(self, request: web.Request) -> web.Response:
        self.reset_stats()
        payload = self.stats.as_dict()
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    async def _handle_faults(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            self.clear_faults()
        elif request.method == "POST":
            try:
                data = orjson.loads(await request.read())
                items = data if isinstance(data, list) else [data]
                self.inject(*(Fault.from_dict(item) for item in items))
            except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
                problem = error_payload(400, f"bad fault: {exc}")
                return web.Response(
                    status=400, body=orjson.dumps(problem), content_type="application/json"
                )
        faults = [{**f.as_dict(), "fired": f.fired} for f in self.faults]
        return web.Response(body=orjson.dumps(faults), content_type="application/json")


def _load_responder(spec: str) -> Responder:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise SystemExit(f"--responder must look like package.module:function; got {spec!r}")
    return getattr(importlib.import_module(module_name), attribute)


async def _serve(args: argparse.Namespace) -> None:
    server = ScriptedServer(
        latency=args.latency,
        responder=_load_responder(args.responder) if args.responder else None,
        faults=[Fault.from_dict(orjson.loads(text)) for text in args.fault],
        host=args.host,
        port=args.port,
        model=args.model,
        dialect=args.dialect,
        api_key=args.api_key,
        keep_log=not args.no_log,
        stream_pieces=args.stream_pieces,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        print(f"PORT {server.port}", flush=True)
        if args.exit_with_parent:
            parent = os.getppid()
            while not stop.is_set() and os.getppid() == parent:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
        else:
            await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """Runs a scripted server until SIGTERM or Ctrl-C; the ``python -m`` entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m plait.testing.scripted_server",
        description="A scripted OpenAI-compatible server; prints 'PORT <n>' once listening.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per answer")
    parser.add_argument(
        "--fault", action="append", default=[], help='a Fault as JSON, e.g. {"status": 429}'
    )
    parser.add_argument("--responder", help="package.module:function to produce replies")
    parser.add_argument("--model", default="scripted")
    parser.add_argument("--dialect", choices=["openai", "llama_cpp"], default="openai")
    parser.add_argument("--api-key", help="require this bearer key")
    parser.add_argument("--no-log", action="store_true", help="keep no per-request log")
    parser.add_argument(
        "--stream-pieces", type=int, default=3, help="pieces a streamed reply is cut into"
    )
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="exit when the parent process dies"
    )
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
