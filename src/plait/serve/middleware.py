"""The ASGI layers every request passes, outermost first: request ids, access log and metrics
(`ObservedRequests`), CORS when asked, API keys (`RequireApiKey`), the body size limit
(`LimitBody`). Each is plain ASGI, so streamed responses and disconnects pass through untouched.
The access log's lines are written by a thread of their own (`AccessLog`), off the requests'
event loop.
"""

from __future__ import annotations

import hmac
import logging
import queue
import re
import threading
import time
import uuid
from typing import Any

import orjson
from starlette.types import ASGIApp as App
from starlette.types import Message, Receive, Scope, Send

from plait.serve import owners
from plait.serve.errors import error_response, failure_response

__all__ = ["AccessLog", "LimitBody", "ObservedRequests", "RequireApiKey"]

access_logger = logging.getLogger("plait.serve.access")

_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
"""A client's X-Request-ID is kept when it looks like an id (so it cannot forge log lines)."""

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/"})
"""Paths that answer without an API key: an orchestrator's probes carry none, and a browser
opening the chat page cannot send one (the page holds no data; it asks for the key)."""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class AccessLog:
    """Writes one JSON line per request to the logger ``plait.serve.access``, from a thread
    of its own: a request only puts its fields on a queue, and the thread makes the line and
    hands it to the logger's handlers (whose writes may block on a slow terminal or pipe).

    The queue holds at most ``max_queued`` lines, so a log output that stalls for good cannot
    grow the server's memory without end: while it is full, new lines are dropped and
    counted (``dropped``), and the writer says how many were lost in a line of its own
    (``{"dropped_lines": n}``) before the next one it writes.

    The thread starts with the first line and stops, having written every line queued, at
    `close` (the app's shutdown).
    """

    def __init__(self, max_queued: int = 10_000) -> None:
        self._lines: queue.Queue[tuple[Any, ...] | None] = queue.Queue(max_queued)
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0
        """Lines dropped so far because the queue was full."""
        self._dropped_said = 0

    def add(self, fields: tuple[Any, ...]) -> None:
        """Queues one request's ``(request_id, method, path, status, seconds, client)``."""
        if self._writer is None:
            with self._lock:
                if self._writer is None:
                    self._writer = threading.Thread(
                        target=self._write, name="plait-access-log", daemon=True
                    )
                    self._writer.start()
        try:
            self._lines.put_nowait(fields)
        except queue.Full:
            self.dropped += 1  # only the event loop's thread adds: no lock needed

    def close(self, wait: float = 5.0) -> None:
        """Writes the lines queued, then stops the thread (a later line starts another).

        Waits at most about ``wait`` seconds for each of room on the queue and the writer's
        end, so an output stalled for good cannot hold the server's shutdown; the daemon
        writer is then left behind with what it had not written.
        """
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            self._lines.put(None, timeout=wait)
        except queue.Full:
            return
        writer.join(timeout=wait)
        if not writer.is_alive():
            self._say_dropped()

    def _write(self) -> None:
        while (fields := self._lines.get()) is not None:
            self._say_dropped()
            request_id, method, path, status, seconds, client = fields
            line = {
                "request_id": request_id,
                "method": method,
                "path": path,
                "status": status,
                "duration_ms": round(seconds * 1000, 2),
                "client": f"{client[0]}:{client[1]}" if client else None,
            }
            access_logger.info(orjson.dumps(line).decode())

    def _say_dropped(self) -> None:
        dropped = self.dropped
        if dropped > self._dropped_said:
            lost, self._dropped_said = dropped - self._dropped_said, dropped
            access_logger.warning(orjson.dumps({"dropped_lines": lost}).decode())


class ObservedRequests:
    """Gives each request an id (the client's ``X-Request-ID`` when it looks like one),
    returns it in the ``X-Request-ID`` header, counts the request in the metrics, and has
    ``access_log`` write one JSON line when it is answered (when the logger
    ``plait.serve.access`` takes INFO lines). An exception no layer handled becomes the 500
    with an error id (see `plait.serve.errors`). A response that started but never ended
    (an event stream the client left) is counted and logged as 499, as a plain run the
    client left is."""

    def __init__(self, app: App, metrics: Any, access_log: AccessLog | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"x-request-id")
        request_id = given if given and _CLIENT_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        answer = {"status": 500, "started": False, "ended": False}
        start = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                answer["status"], answer["started"] = message["status"], True
                headers = [*message.get("headers", ()), (b"x-request-id", request_id.encode())]
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                answer["ended"] = True
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_with_id)
            if answer["started"] and not answer["ended"]:
                answer["status"] = 499  # a stream the client left: its head said 200
        except Exception as exc:
            if answer["started"]:
                raise  # the answer is under way: the server closes the connection
            await failure_response(exc, scope)(scope, receive, send_with_id)
        finally:
            self.metrics.in_flight.dec()
            seconds = time.perf_counter() - start
            route = _route_of(scope)
            self.metrics.observe(route, scope["method"], answer["status"], seconds)
            if self.access_log is not None and access_logger.isEnabledFor(logging.INFO):
                fields = (request_id, scope["method"], scope["path"], answer["status"])
                self.access_log.add((*fields, seconds, scope.get("client")))


def _route_of(scope: Scope) -> str:
    """Returns the route template that answered (bounded label values), or ``unmatched``."""
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


class RequireApiKey:
    """Answers 401 unless the request carries ``Authorization: Bearer <key>`` with one of the
    keys. Every key is compared, in constant time, so timing tells nothing of any of them.
    The fingerprint of the key that matched is noted in the scope's ``state`` (`owners`): it
    is whose the request's runs are."""

    def __init__(self, app: App, keys: tuple[str, ...]) -> None:
        self.app = app
        self.keys = tuple(key.encode() for key in keys)
        self.owners = tuple(owners.fingerprint(key) for key in keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        owner = self._owner(scope)
        if owner is not None or scope["path"] in OPEN_PATHS:
            if owner is not None:
                scope.setdefault("state", {})[owners.OWNER] = owner
            await self.app(scope, receive, send)
            return
        response = error_response(
            401,
            "unauthorized",
            "missing or wrong API key; send the header Authorization: Bearer <key>",
            scope,
            headers={"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)

    def _owner(self, scope: Scope) -> str | None:
        """Returns the fingerprint of the key the request carries, or None for none of them."""
        header = _header(scope, b"authorization") or ""
        scheme, _, token = header.partition(" ")
        given = token.strip().encode("latin-1") if scheme.lower() == "bearer" else b""
        matched = None
        for key, owner in zip(self.keys, self.owners, strict=True):
            if hmac.compare_digest(key, given):
                matched = owner
        return matched


class LimitBody:
    """Answers 413 to a request whose body is larger than ``max_bytes``: at once when its
    ``Content-Length`` says so, otherwise as soon as it has sent that much. The body is read
    here, whole, before the app sees it (the app reads it whole anyway)."""

    def __init__(self, app: App, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before it finished sending
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # from now on: the disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413,
            "body_too_large",
            f"the request body is larger than {self.max_bytes} bytes, this server's limit",
            scope,
        )
        await response(scope, receive, send)
