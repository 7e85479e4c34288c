"""The OpenAI Batch API: upload a JSONL file of requests, create a batch, poll, read results.

The protocol (``/v1/files`` + ``/v1/batches``): each input line is
``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}``;
the batch moves ``validating`` → ``in_progress`` → ``finalizing`` →
``completed`` (or ``failed``, ``expired``, ``cancelled``); its
``output_file_id`` holds one line per answered request
``{"custom_id", "response": {"status_code", "body"}, "error"}`` in any
order, and its ``error_file_id`` the requests that failed (both are read
as one `ResultFile`, which trusts none of their lines). Requests are
built and replies parsed by the same code as live calls (`_wire`),
so a batch asks exactly what the live call would.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from plait.backends._batch_results import BatchReply, ResultFile
from plait.backends._bounded import DEFAULT_MAX_RESPONSE_BYTES, read_body
from plait.backends._urls import join_path, path_segment, redact_url, scrub_text
from plait.backends.openai._proxy import Proxy, ProxyError, proxy_for
from plait.backends.openai._wire import GENERIC, LLAMA_CPP, OPENAI, build_body, parse_completion
from plait.backends.openai.spec import DEFAULT_URL
from plait.backends.types import Request
from plait.errors import BackendError

__all__ = ["BATCH_DONE", "BATCH_RUNNING", "BatchReply", "OpenAIBatchClient"]

BATCH_DONE = frozenset({"completed", "failed", "expired", "cancelled"})
"""Batch statuses after which nothing changes."""

BATCH_RUNNING = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
"""Batch statuses of a batch still at work; any other status is not the Batch API's."""


class OpenAIBatchClient:
    """Talks to one OpenAI-compatible server's Batch API.

    Args:
        model: the default model of the requests.
        base_url: the API root (``https://api.openai.com/v1`` by default).
        api_key: the key; None reads ``api_key_env``.
        api_key_env: the environment variable holding the key.
        headers: extra headers for every request.
        dialect: ``openai`` (default for api.openai.com), ``generic`` or ``llama_cpp``.
        timeout: seconds per HTTP request (not the batch, which may take hours).
        max_response_bytes: the largest answer read, and the longest line of a
            result file (whose whole size is not capped: it is read line by line).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        headers: Mapping[str, str] | None = None,
        dialect: str | None = None,
        timeout: float | None = 300.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self.model = model
        self.base_url = (base_url or DEFAULT_URL).rstrip("/")
        key = api_key or os.environ.get(api_key_env or "") or None
        self._headers = {"Accept": "application/json", **dict(headers or {})}
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        wires = {"openai": OPENAI, "generic": GENERIC, "llama_cpp": LLAMA_CPP}
        default = "openai" if self.base_url == DEFAULT_URL else "generic"
        self._wire = wires[dialect or default]
        self._timeout = timeout
        self._max_bytes = max_response_bytes
        self._session: Any = None
        self._proxy: Proxy | None = None
        """Where requests go through (read from the environment with the session)."""

    @classmethod
    def from_endpoint(cls, config: Any) -> OpenAIBatchClient:
        """Builds a client from an ``openai`` endpoint's configuration."""
        return cls(
            config.model or "",
            base_url=config.base_url,
            api_key=config.api_key,
            api_key_env=config.api_key_env or "OPENAI_API_KEY",
            headers=config.headers,
            dialect=config.dialect,
            max_response_bytes=config.max_response_bytes,
        )

    def __repr__(self) -> str:
        return f"OpenAIBatchClient(model={self.model!r}, base_url={redact_url(self.base_url)!r})"

    # -- requests -----------------------------------------------------------------------

    def input_line(self, custom_id: str, request: Request) -> bytes:
        """Returns the JSONL line asking ``request`` under ``custom_id``."""
        body = build_body(request, self.model, self._wire, stream=False)
        line = {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": body,
        }
        return orjson.dumps(line, option=orjson.OPT_SORT_KEYS)

    async def submit(
        self, lines: Iterable[bytes], metadata: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Uploads the lines as a batch file and creates the batch; returns the batch object."""
        import aiohttp  # import time: aiohttp only for the Batch API

        content = b"\n".join(lines) + b"\n"
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field(
            "file", content, filename="plait-batch.jsonl", content_type="application/jsonl"
        )
        uploaded = await self._call("POST", "/files", data=form)
        body = {
            "input_file_id": self._id_of(uploaded, "POST /files"),
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": dict(metadata or {}),
        }
        batch = await self._call("POST", "/batches", json=body)
        self._id_of(batch, "POST /batches")
        return batch

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        """Returns the batch object (``status``, ``output_file_id``, ``request_counts`` …)."""
        return await self._call("GET", f"/batches/{self._segment('batch id', batch_id)}")

    async def results(
        self, batch: Mapping[str, Any], custom_ids: Iterable[str]
    ) -> dict[str, BatchReply]:
        """Returns the reply of each of ``custom_ids`` that a finished batch answered.

        Its output and error files are read as one result file (`ResultFile`:
        repeated, unknown and unreadable lines are reported, never delivered),
        line by line as they arrive: memory holds the replies, not the file.
        """
        where = f"batch {batch.get('id')} at {redact_url(self.base_url)}"
        results = ResultFile(where, custom_ids, lambda key, data: _reply(key, data, where))
        for key in ("output_file_id", "error_file_id"):
            file_id = batch.get(key)
            if not file_id:
                continue
            segment = self._segment("file id", str(file_id))
            async with self._answer("GET", f"/files/{segment}/content") as answer:
                await results.read(answer.content.iter_any(), self._max_bytes)
        return results.replies()

    # -- HTTP ---------------------------------------------------------------------------

    def _id_of(self, answer: Mapping[str, Any], request: str) -> str:
        """Returns the ``id`` of what the server created; a missing one fails naming the request."""
        value = answer.get("id")
        if not isinstance(value, str) or not value:
            raise BackendError(
                f"{request} at {redact_url(self.base_url)}: the answer has no id (got "
                f"{value!r}); it is not a Batch API server"
            )
        return value

    def _segment(self, what: str, value: str) -> str:
        """Returns an id the server gave, escaped as one path segment (see `path_segment`)."""
        try:
            return path_segment(value)
        except ValueError:
            raise BackendError(
                f"{redact_url(self.base_url)} gave {what} {value!r}, which cannot be put in a "
                "URL path; it is not a batch server plait can talk to"
            ) from None

    @contextlib.asynccontextmanager
    async def _answer(self, method: str, path: str, **kwargs: Any) -> AsyncIterator[Any]:
        """Sends a request and yields its successful answer, body unread; a failure raises."""
        import aiohttp  # import time: aiohttp only for the Batch API

        if self._session is None or self._session.closed:
            self._proxy = self._environment_proxy()
            # the headers go with each request, not as the session's: aiohttp adds a
            # session's headers to what it sends a proxy, the API key among them
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout)
            )
        url = join_path(self.base_url, path)
        shown = f"{method} {redact_url(url)}"
        proxy, headers, through = self._proxy, self._headers, dict[str, Any]()
        if proxy is not None:
            host = f"[{proxy.host}]" if ":" in proxy.host else proxy.host
            through["proxy"] = f"http://{host}:{proxy.port}"
            if proxy.authorization and url.startswith("https:"):  # on the CONNECT
                through["proxy_headers"] = {"Proxy-Authorization": proxy.authorization}
            elif proxy.authorization:  # on each request, which the proxy reads
                headers = {**headers, "Proxy-Authorization": proxy.authorization}
            shown += f" through {proxy.named()}"
        try:
            request = self._session.request(method, url, headers=headers, **through, **kwargs)
            async with request as answer:
                if answer.status >= 400:
                    body = await read_body(answer, self._max_bytes, shown)
                    quoted = body[:300].decode(errors="replace")
                    raise BackendError(
                        f"{shown}: HTTP {answer.status}: {quoted}",
                        status=answer.status,
                        retryable=answer.status in (408, 429) or answer.status >= 500,
                        detail=quoted,
                    )
                yield answer
        except aiohttp.ClientError as exc:
            detail = scrub_text(str(exc), url)
            raise BackendError(f"{shown}: {type(exc).__name__}: {detail}", retryable=True) from exc

    def _environment_proxy(self) -> Proxy | None:
        """Returns the environment's proxy of the base URL, by the one rule of `_proxy` (as
        the chat transport follows it); None without one. Not aiohttp's ``trust_env``: that
        also reads ``~/.netrc``, whose password would clash with the API key's header.

        Raises:
            BackendError: the variable names a proxy plait cannot use.
        """
        parts = urlsplit(self.base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            return proxy_for(parts.scheme, parts.hostname or "", port)
        except ProxyError as exc:
            raise BackendError(f"{redact_url(self.base_url)}: {exc}") from None

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """Returns the JSON object a request is answered with (read within the cap)."""
        shown = f"{method} {redact_url(join_path(self.base_url, path))}"
        async with self._answer(method, path, **kwargs) as answer:
            body = await read_body(answer, self._max_bytes, shown)
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise BackendError(f"{shown}: the answer is not JSON: {body[:200]!r}") from None
        if not isinstance(data, dict):
            raise BackendError(f"{shown}: expected a JSON object, got {type(data).__name__}")
        return data

    async def aclose(self) -> None:
        """Closes the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


def _reply(custom_id: str, data: dict[str, Any], where: str) -> BatchReply:
    """Reads one result line (``{"custom_id", "response": {"status_code", "body"}, "error"}``)."""
    response = data.get("response")
    if response is None:
        response = {}
    if not isinstance(response, dict):
        failure = BackendError(
            f"{where}: the result line of request {custom_id} has a 'response' that is not "
            f"an object: {str(response)[:200]!r}"
        )
        return BatchReply(custom_id, error=failure)
    status = response.get("status_code")
    if data.get("error") or status != 200:
        return BatchReply(custom_id, error=_failure(custom_id, data, response, where))
    try:
        return BatchReply(custom_id, response=parse_completion(response.get("body"), where))
    except BackendError as exc:
        return BatchReply(custom_id, error=exc)


def _failure(
    custom_id: str, data: dict[str, Any], response: dict[str, Any], where: str
) -> BackendError:
    """Returns the error of a request the batch answered with a failure."""
    status = response.get("status_code")
    body = response.get("body")
    error = data.get("error") or (body.get("error") if isinstance(body, dict) else None) or {}
    message = str(error.get("message") if isinstance(error, dict) else error)
    return BackendError(
        f"{where}: request {custom_id} failed: HTTP {status}: {message}",
        status=status if isinstance(status, int) else None,
        retryable=isinstance(status, int) and (status == 429 or status >= 500),
        detail=message,
    )
