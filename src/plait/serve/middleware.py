"""The ASGI layers every request passes, outermost first: request ids, access log and metrics
(`ObservedRequests`), the Host and Origin check (`CheckHost`: on without API keys), CORS when
asked, API keys (`RequireApiKey`), the body's type and size (`CheckBody`). Each is plain ASGI,
so streamed responses and disconnects pass through untouched. The access log's lines are
written by a thread of their own (`AccessLog`), off the requests' event loop.
"""

from __future__ import annotations

import hmac
import logging
import re
import threading
import time
from collections import deque
from typing import Any

import orjson
from starlette.types import ASGIApp as App
from starlette.types import Message, Receive, Scope, Send

from plait.serve import owners
from plait.serve.errors import error_response, failure_response
from plait.serve.ids import random_id

__all__ = [
    "LOOPBACK_NAMES",
    "AccessLog",
    "CheckBody",
    "CheckHost",
    "ObservedRequests",
    "RequireApiKey",
]

access_logger = logging.getLogger("plait.serve.access")

_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
"""A client's X-Request-ID is kept when it looks like an id (so it cannot forge log lines)."""

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/"})
"""Paths that answer without an API key: an orchestrator's probes carry none, and a browser
opening the chat page cannot send one (the page holds no data; it asks for the key)."""

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
"""The names a server without API keys answers to (with any port): only this machine's own
programs reach it by them, and no web page elsewhere can take them as its own name."""

_SHOWN = 100
"""Characters of a client's Host or Origin an error repeats (the rest is cut)."""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class AccessLog:
    """Writes one JSON line per request to the logger ``plait.serve.access``, from a thread
    of its own: a request only appends its fields to a queue, and the thread, waking every
    ``interval`` seconds (50 ms), makes the lines of all the requests queued and hands them
    to the logger's handlers (whose writes may block on a slow terminal or pipe), then
    flushes them once. A request wakes no thread and takes no lock: a line costs the
    event loop an append.

    The queue holds at most ``max_queued`` lines, so a log output that stalls for good cannot
    grow the server's memory without end: while it is full, new lines are dropped and
    counted (``dropped``), and the writer says how many were lost in a line of its own
    (``{"dropped_lines": n}``) before the next one it writes.

    The thread starts with the first line and stops, having written every line queued, at
    `close` (the app's shutdown).
    """

    def __init__(self, max_queued: int = 10_000, interval: float = 0.05) -> None:
        self._lines: deque[tuple[Any, ...]] = deque()
        self._max_queued = max_queued
        self._interval = interval
        self._writer: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.dropped = 0
        """Lines dropped so far because the queue was full."""
        self._dropped_said = 0

    def add(self, fields: tuple[Any, ...]) -> None:
        """Queues one request's ``(request_id, method, path, status, seconds, client)``."""
        if self._writer is None:
            with self._lock:
                if self._writer is None:
                    self._stop = threading.Event()
                    self._writer = threading.Thread(
                        target=self._write,
                        args=(self._stop,),
                        name="plait-access-log",
                        daemon=True,
                    )
                    self._writer.start()
        if len(self._lines) >= self._max_queued:
            self.dropped += 1  # only the event loop's thread adds: no lock needed
        else:
            self._lines.append(fields)  # a deque's append and popleft are thread-safe

    def close(self, wait: float = 5.0) -> None:
        """Writes the lines queued, then stops the thread (a later line starts another).

        Waits at most about ``wait`` seconds for the writer's end, so an output stalled for
        good cannot hold the server's shutdown; the daemon writer is then left behind with
        what it had not written.
        """
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is None:
            return
        self._stop.set()
        writer.join(timeout=wait)
        if not writer.is_alive():
            self._say_dropped()
            _flush(access_logger)

    def _write(self, stop: threading.Event) -> None:
        while True:
            stopping = stop.wait(self._interval)
            while self._lines:
                self._say_dropped()
                lines = []
                for _ in range(len(self._lines)):  # those queued now; later ones, next turn
                    request_id, method, path, status, seconds, client = self._lines.popleft()
                    line = {
                        "request_id": request_id,
                        "method": method,
                        "path": path,
                        "status": status,
                        "duration_ms": round(seconds * 1000, 2),
                        "client": f"{client[0]}:{client[1]}" if client else None,
                    }
                    lines.append(orjson.dumps(line).decode())
                _log_lines(lines)
            _flush(access_logger)
            if stopping:
                return

    def _say_dropped(self) -> None:
        dropped = self.dropped
        if dropped > self._dropped_said:
            lost, self._dropped_said = dropped - self._dropped_said, dropped
            access_logger.warning(orjson.dumps({"dropped_lines": lost}).decode())


MESSAGE_ONLY = logging.Formatter("%(message)s")
"""The access log's format on standard error (`plait.serve.server.log_access_to_stderr`): a
line is its message, the JSON object."""


def _log_lines(lines: list[str]) -> None:
    """Hands access-log lines to the logger ``plait.serve.access``.

    When its one handler is a `BatchedStreamHandler` whose format is `MESSAGE_ONLY` (what
    `plait serve` sets up) and nothing filters, the lines go to it as they are: the same text
    it would write, without a `logging.LogRecord` each (making one, with the caller's frame,
    thread and process, took most of the writer's time). Any other set-up of the logger
    gets every line through `logging` as usual.
    """
    handlers = access_logger.handlers
    handler = handlers[0] if len(handlers) == 1 else None
    if (
        isinstance(handler, BatchedStreamHandler)
        and handler.formatter is MESSAGE_ONLY
        and handler.level <= logging.INFO
        and not handler.filters
        and not access_logger.filters
    ):
        handler.add_lines(lines)
        return
    for line in lines:
        access_logger.info(line)


class BatchedStreamHandler(logging.StreamHandler):
    """A `logging.StreamHandler` that keeps its lines until flushed, then writes them to its
    stream at once: the `AccessLog` writer flushes once per batch of lines, so standard
    error takes one write per batch instead of one per request."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._pending: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._pending.append(self.format(record) + self.terminator)
        except Exception:
            self.handleError(record)

    def add_lines(self, lines: list[str]) -> None:
        """Keeps ``lines``, formatted already, to write at the next flush."""
        terminator = self.terminator
        with self.lock:  # type: ignore[union-attr]
            self._pending.extend(line + terminator for line in lines)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            pending, self._pending = self._pending, []
            if pending:
                self.stream.write("".join(pending))
            super().flush()


def _flush(logger: logging.Logger) -> None:
    """Flushes the handlers of ``logger`` (a `BatchedStreamHandler` writes its buffer)."""
    for handler in logger.handlers:
        handler.flush()


class ObservedRequests:
    """Gives each request an id (the client's ``X-Request-ID`` when it looks like one),
    returns it in the ``X-Request-ID`` header, counts the request in the metrics, and has
    ``access_log`` write one JSON line when it is answered (when the logger
    ``plait.serve.access`` takes INFO lines). An exception no layer handled becomes the 500
    with an error id (see `plait.serve.errors`). A request answered in part or not at all
    (an event stream the client left, a body it never finished sending) is counted and
    logged as 499, as a plain run the client left is."""

    def __init__(self, app: App, metrics: Any, access_log: AccessLog | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"x-request-id")
        request_id = given if given and _CLIENT_ID.match(given) else random_id()
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

        self.metrics.in_flight += 1
        try:
            await self.app(scope, receive, send_with_id)
            if not answer["ended"]:
                # the client left: a stream (its head said 200), or a body it did not finish
                # sending (or not in time: the server answered 408 itself)
                answer["status"] = 499
        except Exception as exc:
            if answer["started"]:
                raise  # the answer is under way: the server closes the connection
            await failure_response(exc, scope)(scope, receive, send_with_id)
        finally:
            self.metrics.in_flight -= 1
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


class CheckHost:
    """Answers 421 to a request whose ``Host`` is not one of ``names`` (any port), and 403 to
    one whose ``Origin`` is a page elsewhere: neither a name in ``names`` nor one of
    ``origins``.

    This keeps web pages from calling a server without API keys. A page the user opens can
    have its own name resolve to 127.0.0.1 (DNS rebinding) and then call the server as its
    own origin, reading the answers; its requests still name the page's host in ``Host``,
    and in ``Origin`` when it posts. A page elsewhere that posts across origins without a
    preflight names itself in ``Origin``. A request without ``Host`` is refused too; one
    without ``Origin`` (a program's, not a browser's) is not.

    Args:
        names: host names as a ``Host`` header spells them without its port, in lower case.
        origins: origins a browser may call from besides pages on ``names`` (CORS's), or
            ``"*"`` for any.
    """

    def __init__(self, app: App, names: frozenset[str], origins: tuple[str, ...] = ()) -> None:
        self.app = app
        self.names = names
        self.origins = frozenset(origins)
        self.any_origin = "*" in self.origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host: str | None = None
        origin: str | None = None
        for key, value in scope["headers"]:
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
        if host is None or _host_name(host) not in self.names:
            known = ", ".join(sorted(self.names))
            message = (
                f"Host {(host or '')[:_SHOWN]!r} is not a name of this server, which answers "
                f"only {known} (any port), so that no web page elsewhere can call it; name "
                "it so, or start it with --allowed-host NAME (allowed_hosts=)"
            )
            response = error_response(421, "unknown_host", message, scope)
        elif origin is not None and not self._allowed(origin):
            message = (
                f"Origin {origin[:_SHOWN]!r}: this server answers pages on its own names "
                "only; let a page elsewhere call it with --cors-origin ORIGIN (cors_origins=)"
            )
            response = error_response(403, "cross_origin", message, scope)
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)

    def _allowed(self, origin: str) -> bool:
        if self.any_origin or origin in self.origins:
            return True
        scheme, separator, authority = origin.partition("://")
        return (
            separator == "://"
            and scheme.lower() in ("http", "https")
            and "/" not in authority
            and _host_name(authority) in self.names
        )


def _host_name(authority: str) -> str:
    """Returns the host name of a ``Host`` header or an origin's authority, without its
    port, in lower case (an IPv6 address keeps its brackets)."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[: authority.find("]") + 1] or authority
    return authority.partition(":")[0]


def _is_json(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` names JSON: ``application/json`` or an ``application/…+json``
    type, any parameters (a browser can send neither across origins without a preflight)."""
    if content_type is None:
        return False
    essence = content_type.partition(";")[0].strip().lower()
    return essence == "application/json" or (
        essence.startswith("application/") and essence.endswith("+json")
    )


class CheckBody:
    """Answers 415 to a POST whose body is not JSON by its ``Content-Type``, and 413 to a
    request whose body is larger than ``max_bytes``: at once when its ``Content-Length`` says
    so, otherwise as soon as it has sent that much. The body is read here, whole, before the
    app sees it (the app reads it whole anyway).

    Every POST this server takes (a run, a resume, a chat completion) is JSON, and a web page
    can post only text, a form or no type at all to another origin without asking first (a
    CORS preflight, which this server answers only for ``cors_origins``). So no page the user
    visits can start a run or resume a paused one with the user's browser.
    """

    def __init__(self, app: App, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: bytes | None = None
        kind: str | None = None
        for key, value in scope["headers"]:
            if key == b"content-length":
                declared = value
            elif key == b"content-type":
                kind = value.decode("latin-1")
        if scope["method"] == "POST" and not _is_json(kind):
            got = f"got {kind[:_SHOWN]!r}" if kind is not None else "none was sent"
            said = f"the body must be JSON: send the header Content-Type: application/json ({got})"
            await error_response(415, "unsupported_media_type", said, scope)(scope, receive, send)
            return
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
