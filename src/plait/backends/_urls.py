"""Credentials inside URLs: showing a ``base_url`` without them, and keeping them out of errors.

A key may travel inside the URL itself: as user info (``https://user:key@host/v1``)
or as a query parameter (``?api-key=...``, Azure's and many proxies' way). Every
repr, log line and error message that shows an endpoint's URL shows
`redact_url` of it, and every foreign exception text that is copied into a
plait message, or chained under one, goes through `scrub_text` / `scrub_cause`
first, because aiohttp, yarl and the SDKs print the URL they were given. An error told to
someone outside (a failing program's text over MCP) goes through `without_addresses`, which
leaves out every URL and network address, credentials and all.

Only the standard library is imported here: the resource configuration uses
this module while ``import plait`` runs.
"""

from __future__ import annotations

import base64
import re
from urllib.parse import quote, unquote, unquote_plus

__all__ = [
    "MASK",
    "RedactedError",
    "basic_authorization",
    "join_path",
    "path_segment",
    "redact_url",
    "scrub_cause",
    "scrub_text",
    "split_credentials",
    "without_addresses",
]

MASK = "***"
"""What a credential is replaced with."""

# A query parameter whose name contains one of these (case-insensitively) holds
# a credential: api-key, apikey, api_key, key, token, access_token, sig,
# signature, secret, password, auth, credential ... Masking a harmless one
# costs a less informative message; showing a key costs the key.
_SENSITIVE_WORDS = ("key", "token", "secret", "pass", "sig", "auth", "credential")

# Secrets shorter than this are not searched for in free text: replacing every
# "ab" in a message would garble it, and so short a value protects nothing.
_MIN_SCRUBBED = 4

# How deep `scrub_cause` follows a chain of causes.
_MAX_CHAIN = 8


class RedactedError(Exception):
    """Stands in for a foreign exception whose text held a credential from a URL.

    It keeps the original's type name, its text with the credentials masked,
    its traceback and its (scrubbed) cause, so a chained traceback still shows
    what failed and where, without the secret.
    """


def _authority_bounds(head: str) -> tuple[int, int]:
    """Returns where the user info of ``head`` (a URL without query) starts and ends.

    The end is the last ``@``: a password with an unescaped ``/`` in it must
    still be masked whole. (-1 when there is no user info.)
    """
    scheme_end = head.find("://")
    start = scheme_end + 3 if scheme_end >= 0 else (2 if head.startswith("//") else 0)
    return start, head.rfind("@", start)


def _split_query(url: str) -> tuple[str, str]:
    """Returns ``url`` cut where its query or fragment starts: (before, from there on)."""
    cuts = [i for i in (url.find("?"), url.find("#")) if i >= 0]
    cut = min(cuts, default=len(url))
    return url[:cut], url[cut:]


def _is_sensitive(name: str) -> bool:
    lowered = unquote_plus(name).lower()
    return any(word in lowered for word in _SENSITIVE_WORDS)


def _redact_params(text: str) -> str:
    parts = []
    for part in text.split("&"):
        name, equals, _ = part.partition("=")
        parts.append(f"{name}={MASK}" if equals and _is_sensitive(name) else part)
    return "&".join(parts)


def redact_url(url: str) -> str:
    """Returns ``url`` with its user info and credential-bearing query values masked.

    Never raises, whatever the string: it is used on URLs that failed to parse.

    Example::

        redact_url("https://me:s3cret@host/v1?api-version=2024&api-key=s3cret")
        # 'https://***:***@host/v1?api-version=2024&api-key=***'
    """
    head, hash_mark, fragment = url.partition("#")
    head, question_mark, query = head.partition("?")
    start, at = _authority_bounds(head)
    if at >= 0:
        masked = f"{MASK}:{MASK}" if ":" in head[start:at] else MASK
        head = f"{head[:start]}{masked}{head[at:]}"
    if question_mark:
        query = _redact_params(query)
    if hash_mark:  # OAuth-style fragments carry access_token=... too
        fragment = _redact_params(fragment)
    return f"{head}{question_mark}{query}{hash_mark}{fragment}"


def _secrets_of(url: str) -> list[str]:
    """Returns the credentials in ``url`` as they may appear in text, longest first."""
    head, _, query = url.partition("#")[0].partition("?")
    found: set[str] = set()
    start, at = _authority_bounds(head)
    if at >= 0:
        userinfo = head[start:at]
        user, colon, password = userinfo.partition(":")
        # With a password the user name is usually just a name; without one
        # it is the token itself (https://<token>@host).
        for value in (userinfo, password) if colon else (user,):
            found.update((value, unquote(value)))
    for part in query.split("&"):
        name, equals, value = part.partition("=")
        if equals and _is_sensitive(name):
            found.update((value, unquote_plus(value)))
    return sorted((s for s in found if len(s) >= _MIN_SCRUBBED), key=len, reverse=True)


def scrub_text(text: str, url: str | None) -> str:
    """Returns ``text`` with ``url`` shown redacted and every credential of it masked.

    Used on text plait did not write (exception messages of aiohttp, yarl,
    httpx, the SDKs, and error bodies), which may echo the URL whole, in a
    normalised form, or just the key.
    """
    if not url or not text:
        return text
    text = text.replace(url, redact_url(url))
    for secret in _secrets_of(url):
        text = text.replace(secret, MASK)
    return text


def scrub_cause(exc: BaseException, url: str | None, _depth: int = 0) -> BaseException:
    """Returns ``exc`` to chain under a plait error, with ``url``'s credentials kept out.

    ``exc`` itself when neither its text nor its causes mention a credential;
    otherwise a `RedactedError` with the same traceback stands in for each
    exception of the chain whose text does. (The exception being handled is
    still reachable as ``__context__`` of an error raised inside ``except``;
    tracebacks do not show it once a cause is given.)
    """
    cause = exc.__cause__
    clean_cause = None
    if cause is not None and _depth < _MAX_CHAIN:
        clean_cause = scrub_cause(cause, url, _depth + 1)
    text = str(exc)
    clean = scrub_text(text, url)
    if clean == text:
        if clean_cause is not cause:
            exc.__cause__ = clean_cause
        return exc
    stand_in = RedactedError(f"{type(exc).__module__}.{type(exc).__qualname__}: {clean}")
    stand_in.__cause__ = clean_cause
    return stand_in.with_traceback(exc.__traceback__)


_ADDRESS = re.compile(
    r"(?i)\b[a-z][a-z0-9+.-]*://[^\s'\"<>]+"  # a URL, user info and query included
    r"|\[[0-9a-f:.]+\](?::\d{1,5})?"  # [IPv6]:port
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b"  # IPv4:port
    r"|\b(?:localhost|[a-z0-9-]+(?:\.[a-z0-9-]+)+):\d{1,5}\b"  # host:port
)


def without_addresses(text: str) -> str:
    """Returns ``text`` with every URL and network address in it (``host:port``, an IP
    address) replaced by ``<address>``: the reason of an error stays, where it went does
    not. A sentence's last ``.`` or ``,`` after a URL stays in the text."""

    def replace(match: re.Match[str]) -> str:
        found = match.group(0)
        kept = found.rstrip(".,;:)")
        return "<address>" + found[len(kept) :]

    return _ADDRESS.sub(replace, text)


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """Returns ``url`` without its user info, and the (user, password) it held, decoded.

    HTTP clients turn ``https://user:password@host`` into Basic authentication
    anyway; taking the pair out first keeps it out of every URL a foreign
    library stores and prints. (None when the URL holds no user info.)
    """
    head, tail = _split_query(url)
    start, at = _authority_bounds(head)
    if at < 0:
        return url, None
    user, _, password = head[start:at].partition(":")
    return f"{head[:start]}{head[at + 1 :]}{tail}", (unquote(user), unquote(password))


def basic_authorization(user: str, password: str) -> str:
    """Returns the ``Authorization`` header value of HTTP Basic authentication (RFC 7617)."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"


def join_path(base_url: str, path: str) -> str:
    """Returns ``base_url`` with ``path`` appended to its path, before any query.

    ``https://x.azure.com/openai/v1?api-version=2024`` + ``/chat/completions``
    is ``https://x.azure.com/openai/v1/chat/completions?api-version=2024``;
    plain concatenation would put the path inside the query.
    """
    head, question_mark, query = base_url.partition("#")[0].partition("?")
    return f"{head.rstrip('/')}{path}{question_mark}{query}"


def path_segment(value: str) -> str:
    """Returns ``value`` escaped to be exactly one segment of a URL path.

    Ids a server hands out (a batch id, a file id) go back into URLs; escaped
    whole (``/``, ``?``, ``#`` and ``%`` included), ``../files/x`` cannot reach
    another path.

    Raises:
        ValueError: ``value`` is empty, ``.`` or ``..``, which a URL resolves
            away however it is escaped.
    """
    if value in ("", ".", ".."):
        raise ValueError(f"{value!r} cannot be one segment of a URL path")
    return quote(value, safe="")
