"""Mapping HTTP failures onto BackendError: statuses, bodies and Retry-After."""

from __future__ import annotations

import math
from email.utils import formatdate

import pytest

from plait.backends._errors import decode_error_body, error_from_status, parse_retry_after
from plait.errors import BackendError, RateLimitError

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": " 0.5 "}, 0.5),
        ({"retry-after": "-4"}, 0.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # the precise one wins
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
        ({"retry-after": formatdate(NOW + 42, usegmt=True)}, 42.0),
        ({"retry-after": formatdate(NOW - 42, usegmt=True)}, 0.0),
        ({"retry-after": "not a date"}, None),
        ({"retry-after": "inf"}, math.inf),  # longer than any cap, never an overflow
        ({"retry-after": "1e400"}, math.inf),
        ({"retry-after-ms": "Infinity"}, math.inf),
        ({"retry-after": "-inf"}, 0.0),
        ({"retry-after": "nan"}, None),
        ({"retry-after-ms": "NaN", "retry-after": "2"}, 2.0),
        ({"retry-after": "Fri, 31 Dec 99999 23:59:59 GMT"}, None),
    ],
)
def test_parse_retry_after(headers, expected):
    assert parse_retry_after(headers, now=NOW) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"error": {"message": "bad key", "type": "x"}}', "bad key"),
        (b'{"error": "plain error"}', "plain error"),
        (b'{"detail": "not found"}', "not found"),
        (b'{"detail": [{"loc": ["body", "x"]}]}', '[{"loc":["body","x"]}]'),
        (b"<html>bad gateway</html>", "<html>bad gateway</html>"),
        (b"", ""),
    ],
)
def test_decode_error_body_finds_the_message_in_every_common_shape(raw, message):
    assert decode_error_body(raw)[1] == message


def test_error_from_status_picks_the_class_and_retryability():
    where = "OpenAI-compatible endpoint http://h/v1 (model 'm')"
    limited = error_from_status(429, b"{}", {"retry-after": "2"}, where=where)
    assert isinstance(limited, RateLimitError)
    assert (limited.status, limited.retryable, limited.retry_after) == (429, True, 2.0)
    for status, retryable in [(408, True), (500, True), (502, True), (400, False), (409, False)]:
        error = error_from_status(status, None, {}, where=where)
        assert type(error) is BackendError
        assert error.retryable is retryable, status
    missing = error_from_status(404, b'{"error": {"message": "no model"}}', {}, where=where)
    assert str(missing) == (
        "OpenAI-compatible endpoint http://h/v1 (model 'm') answered HTTP 404: no model "
        "(check base_url (it usually ends in /v1) and the model name)"
    )
