"""Anthropic Message Batches, through the official SDK (``client.messages.batches``).

The same interface as `OpenAIBatchClient`, so a `BatchJob` drives either: each
request becomes ``{"custom_id", "params"}`` with the params a live
``messages.create`` would get (built by `_wire.build_body`, whose
plan also reads the reply back); a batch is ``in_progress`` until its
``processing_status`` is ``ended``; its results (``succeeded``, ``errored``,
``canceled``, ``expired``) stream from the SDK's ``results``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from plait.backends._batch_results import BatchReply, ResultFile
from plait.backends._bounded import DEFAULT_MAX_RESPONSE_BYTES
from plait.backends._urls import redact_url
from plait.backends.anthropic._wire import WirePlan, build_body, read_message
from plait.backends.types import Request
from plait.errors import BackendError

__all__ = ["AnthropicBatchClient"]

_MAX_TOKENS_DEFAULT = 1024


class AnthropicBatchClient:
    """Talks to the Message Batches API of Anthropic (or a server that speaks it).

    Args:
        model: the default model.
        base_url: another endpoint (a proxy, or a test server); None is Anthropic's.
        api_key: the key; None lets the SDK read ``ANTHROPIC_API_KEY``.
    """

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None):
        self.model = model
        self.base_url = base_url
        self._api_key = api_key
        self._plans: dict[str, WirePlan] = {}
        self._client: Any = None

    @classmethod
    def from_endpoint(cls, config: Any) -> AnthropicBatchClient:
        """Builds a client from an ``anthropic`` endpoint's configuration."""
        key = config.api_key or (os.environ.get(config.api_key_env) if config.api_key_env else None)
        return cls(config.model or "", base_url=config.base_url, api_key=key)

    def __repr__(self) -> str:
        shown = None if self.base_url is None else redact_url(self.base_url)
        return f"AnthropicBatchClient(model={self.model!r}, base_url={shown!r})"

    def _sdk_client(self) -> Any:
        if self._client is None:
            from anthropic import AsyncAnthropic  # optional extra (plait[anthropic])

            self._client = AsyncAnthropic(
                api_key=self._api_key, base_url=self.base_url, max_retries=0
            )
        return self._client

    def input_line(self, custom_id: str, request: Request) -> bytes:
        """Returns the batch entry of ``request`` as JSON (the bytes a rerun hashes again)."""
        body, plan = build_body(request, model=self.model, max_tokens_default=_MAX_TOKENS_DEFAULT)
        params = {k: v for k, v in body.items() if k != "extra_body"}
        params.update(body.get("extra_body") or {})  # the SDK's create() keyword, plain here
        self._plans[custom_id] = plan
        entry = {"custom_id": custom_id, "params": params}
        return orjson.dumps(entry, option=orjson.OPT_SORT_KEYS)

    async def submit(
        self, lines: Iterable[bytes], metadata: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """Creates the batch; returns it as ``{"id", "status"}``."""
        requests = [orjson.loads(line) for line in lines]
        try:
            batch = await self._sdk_client().messages.batches.create(requests=requests)
        except Exception as exc:
            raise self._error("create a message batch", exc) from None
        return {"id": batch.id, "status": _status(batch)}

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        """Returns ``{"id", "status"}``; status ``completed`` once processing has ended."""
        try:
            batch = await self._sdk_client().messages.batches.retrieve(batch_id)
        except Exception as exc:
            raise self._error(f"read message batch {batch_id}", exc) from None
        return {"id": batch.id, "status": _status(batch)}

    async def results(
        self, batch: Mapping[str, Any], custom_ids: Iterable[str]
    ) -> dict[str, BatchReply]:
        """Returns the reply of each of ``custom_ids`` that an ended batch answered.

        The results stream is read line by line here, not by the SDK's decoder,
        so each line is checked (and capped) as `ResultFile` does OpenAI's.
        """
        where = f"message batch {batch['id']}"
        results = ResultFile(where, custom_ids, lambda key, data: self._reply(key, data, where))
        streamed = self._sdk_client().messages.batches.with_streaming_response
        try:
            async with streamed.results(batch["id"]) as answer:
                await results.read(answer.iter_bytes(), DEFAULT_MAX_RESPONSE_BYTES)
        except BackendError:
            raise
        except Exception as exc:
            raise self._error(f"read the results of {where}", exc) from None
        return results.replies()

    def _reply(self, custom_id: str, data: dict[str, Any], where: str) -> BatchReply:
        """Reads one results line (``{"custom_id", "result": {"type", ...}}``)."""
        given = data.get("result")
        result: dict[str, Any] = given if isinstance(given, dict) else {}
        kind = result.get("type")
        if kind == "succeeded":
            return self._succeeded(custom_id, result.get("message"), where)
        if not isinstance(kind, str):
            error = BackendError(
                f"{where}: the result line of request {custom_id} has no result type: "
                f"{str(given)[:200]!r}"
            )
            return BatchReply(custom_id, error=error)
        outer = result.get("error")
        detail = outer.get("error") if isinstance(outer, dict) else None
        detail = detail if isinstance(detail, dict) else {}
        message = str(detail.get("message") or kind)
        error = BackendError(
            f"{where}: request {custom_id} {kind}: {message}",
            retryable=kind in ("expired", "canceled")
            or detail.get("type") in ("overloaded_error", "api_error"),
            detail=message,
        )
        return BatchReply(custom_id, error=error)

    def _succeeded(self, custom_id: str, message: Any, where: str) -> BatchReply:
        # import time: pydantic loads on first use, not on a plain call
        from pydantic import ValidationError

        from anthropic.types import Message  # optional extra (plait[anthropic])

        try:
            parsed = Message.model_validate(message)
        except ValidationError as exc:
            error = BackendError(
                f"{where}: the answer to request {custom_id} is not a message "
                f"({exc.error_count()} problem(s), the first: {exc.errors()[0]['msg']})"
            )
            return BatchReply(custom_id, error=error)
        plan = self._plans.get(custom_id, WirePlan())
        return BatchReply(custom_id, response=read_message(parsed, plan))

    def _error(self, action: str, exc: Exception) -> BackendError:
        status = getattr(exc, "status_code", None)
        shown = redact_url(self.base_url) if self.base_url else "Anthropic"
        return BackendError(
            f"could not {action} at {shown}: {type(exc).__name__}: {exc}",
            status=status,
            retryable=status is None or status == 429 or status >= 500,
        )

    async def aclose(self) -> None:
        """Closes the SDK client."""
        if self._client is not None:
            await self._client.close()
            self._client = None


_STATUSES = {"ended": "completed", "in_progress": "in_progress", "canceling": "cancelling"}


def _status(batch: Any) -> str:
    """Returns the OpenAI spelling of a Message Batch's status; an unknown one as it came."""
    status = batch.processing_status
    return _STATUSES.get(status, status) if isinstance(status, str) else repr(status)
