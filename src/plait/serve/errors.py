"""The JSON errors the server answers with, and the one place an unexpected failure is told.

Every error body is ``{"error": {"type", "message", "request_id"}}`` (plus ``error_id`` for
failures of the server or the program). A client never sees a stack trace, an exception's
text or a credential: an unexpected failure is answered with a fixed message and an error id
to quote, and the server log has the details under that id.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.types import Scope

from plait.errors import described
from plait.serve.ids import random_id
from plait.serve.responses import JsonResponse

__all__ = ["error_response", "failure_id", "failure_response", "request_id_of"]

logger = logging.getLogger("plait.serve")


def request_id_of(scope: Scope) -> str:
    """Returns the id of the request being answered (set by the request-id middleware)."""
    return str(scope.get("state", {}).get("request_id", ""))


def error_response(
    status: int,
    kind: str,
    message: str,
    scope: Scope,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JsonResponse:
    """Returns the JSON error ``{"error": {"type": kind, "message": ...}}`` with ``status``."""
    body = {"type": kind, "message": message, "request_id": request_id_of(scope), **extra}
    return JsonResponse({"error": body}, status_code=status, headers=headers)


def failure_id(exc: BaseException, scope: Scope, what: str, expected: bool = False) -> str:
    """Logs a failure under a new error id and returns the id: an unexpected one as an error
    with its traceback; an ``expected`` one (a spent budget: the operator's limit doing its
    work) as a one-line warning that names it and where the run stopped."""
    error_id = random_id()[:16]
    log = logger.warning if expected else logger.error
    log(
        "%s failed (error id %s, request %s, %s %s)%s",
        what,
        error_id,
        request_id_of(scope),
        scope.get("method", ""),
        scope.get("path", ""),
        f": {described(exc)}" if expected else "",
        exc_info=None if expected else exc,
    )
    return error_id


def failure_response(exc: BaseException, scope: Scope, what: str = "request") -> Any:
    """Returns the 500 of an unexpected failure: a fixed message and the error id to quote."""
    error_id = failure_id(exc, scope, what)
    return error_response(
        500,
        "internal_error",
        f"the {what} failed on the server; quote error id {error_id} to its operator",
        scope,
        error_id=error_id,
    )
