"""The proxy of an endpoint, from ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY``, and the
``CONNECT`` tunnel an https request takes through it.

`proxy_for` is asked once per endpoint, when its `ConnectionPool` is made (the URL does not
change afterwards), so a call pays nothing for it; without a proxy variable a connection is
opened as it always was. The variables read as curl and Python's ``urllib`` read them: the
lower-case name first, ``https_proxy`` for an https URL and ``http_proxy`` for an http one,
``no_proxy`` a comma-separated list of host names (a name matches itself and its
subdomains; ``*`` matches every host). A loopback host (``localhost``, ``127.0.0.1``,
``::1``) never goes through a proxy: a proxy elsewhere cannot reach this machine's
loopback, and a model server on it (llama.cpp, vLLM, Ollama) is always meant directly.

An http URL goes to the proxy with its absolute URL as the request target; an https one
asks the proxy to ``CONNECT`` to the host, then speaks TLS to the host through that tunnel,
so the proxy sees neither the request nor the key. The proxy itself is spoken to in plain
HTTP (``http://`` proxies; an ``https://`` or ``socks`` proxy is refused naming the
variable). User info in the proxy's URL becomes ``Proxy-Authorization: Basic``. A proxy
that cannot be reached, or refuses the tunnel, fails with a `ProxyError` naming the proxy
(its credentials masked) and the variable, which the transport reports as a connection
error.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from plait.backends._urls import basic_authorization, redact_url, split_credentials

__all__ = ["Proxy", "ProxyError", "connect", "open_tunnel", "proxy_for"]

_MAX_REPLY = 16 * 1024
"""The most bytes a proxy's answer to ``CONNECT`` (status line and headers) may take."""


class ProxyError(ConnectionError):
    """A proxy could not be reached, or refused the tunnel; the message names the proxy
    and the variable that set it, and what to check.

    Attributes:
        unsent: True when nothing of the request reached anyone (the proxy refused the
            connection, or the tunnel): the call was not made.
    """

    def __init__(self, message: str, *, unsent: bool = True) -> None:
        super().__init__(message)
        self.unsent = unsent


@dataclass(frozen=True, slots=True)
class Proxy:
    """Where an endpoint's connections go instead of its host."""

    host: str
    port: int
    variable: str
    """The environment variable that named it (``HTTPS_PROXY`` …), for messages."""
    shown: str
    """Its URL with the credentials masked, for messages."""
    authorization: str | None = None
    """The ``Proxy-Authorization`` value, from the user info of its URL."""

    def named(self) -> str:
        """How messages name it: ``the proxy http://proxy:3128 (HTTPS_PROXY)``."""
        return f"the proxy {self.shown} ({self.variable})"


def proxy_for(scheme: str, host: str, port: int) -> Proxy | None:
    """Returns the proxy the environment sets for a URL of ``scheme`` on ``host:port``, or
    None when none does (no variable, ``NO_PROXY`` names the host, or it is loopback).

    Raises:
        ProxyError: the variable holds a URL that is not an ``http://`` proxy.
    """
    found = _variable(scheme)
    if found is None or _is_loopback(host):
        return None
    variable, value = found
    bypass = _variable("no")
    if bypass is not None and _bypassed(host, port, bypass[1]):
        return None
    return _parse(variable, value)


def _bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether ``NO_PROXY`` names the host: ``*``, the name itself or a domain above it
    (``example.com`` and ``.example.com`` both match ``api.example.com``), an address
    as written; an entry with ``:port`` matches that port only."""
    host = host.lower().rstrip(".")
    for entry in no_proxy.lower().split(","):
        entry = entry.strip()
        if entry == "*":
            return True
        name, _, wanted = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        name = name.strip("[]").lstrip("*").lstrip(".").rstrip(".")
        if not name or (wanted and wanted != str(port)):
            continue
        if host == name or host.endswith("." + name):
            return True
    return False


def _variable(prefix: str) -> tuple[str, str] | None:
    """Returns the name and value of ``<prefix>_proxy`` (lower case first), or None."""
    for name in (f"{prefix}_proxy", f"{prefix.upper()}_PROXY"):
        value = os.environ.get(name, "").strip()
        if value:
            return name, value
    return None


def _is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name
        return False


def _parse(variable: str, value: str) -> Proxy:
    text = value if "://" in value else f"http://{value}"
    bare, credentials = split_credentials(text)
    shown = redact_url(text)
    try:
        parts = urlsplit(bare)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ProxyError(f"{variable}={shown} is not a proxy URL ({exc})") from None
    if parts.scheme != "http":
        raise ProxyError(
            f"{variable}={shown}: plait speaks to a proxy in plain HTTP (http://host:port); "
            f"a {parts.scheme} proxy is not supported: use transport='sdk', or an http:// proxy"
        )
    if not host:
        raise ProxyError(f"{variable}={shown} names no host; expected http://host:port")
    authorization = basic_authorization(*credentials) if credentials else None
    return Proxy(host, port or 80, variable.upper(), shown, authorization)


async def connect(loop: asyncio.AbstractEventLoop, proxy: Proxy) -> socket.socket:
    """Returns a connected, non-blocking socket to the proxy.

    Raises:
        ProxyError: it cannot be reached (refused, unknown name, unreachable).
    """
    try:
        addresses = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        message = f"{proxy.named()} cannot be found ({exc}); check {proxy.variable}"
        raise ProxyError(message) from exc
    failure: OSError | None = None
    for family, kind, protocol, _, address in addresses:
        sock = socket.socket(family, kind, protocol)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            failure = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise ProxyError(
        f"{proxy.named()} refused the connection or cannot be reached ({failure}); check "
        f"{proxy.variable}, or name the host in NO_PROXY to go around it"
    )


async def open_tunnel(
    loop: asyncio.AbstractEventLoop, proxy: Proxy, host: str, port: int
) -> socket.socket:
    """Returns a socket to ``host:port`` through the proxy (``CONNECT``), ready for TLS.

    Raises:
        ProxyError: the proxy cannot be reached, or did not answer 2xx to ``CONNECT``.
    """
    sock = await connect(loop, proxy)
    try:
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        if proxy.authorization:
            lines.append(f"Proxy-Authorization: {proxy.authorization}")
        await loop.sock_sendall(sock, ("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
        status = await _connect_status(loop, sock, proxy)
    except BaseException:
        sock.close()
        raise
    if not 200 <= status < 300:
        sock.close()
        said = {407: " (Proxy Authentication Required: give user:password in the URL)"}
        raise ProxyError(
            f"{proxy.named()} refused the tunnel to {target}: HTTP {status}"
            f"{said.get(status, '')}; check {proxy.variable}, or name the host in NO_PROXY"
        )
    return sock


async def _connect_status(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, proxy: Proxy
) -> int:
    """Reads the proxy's answer to ``CONNECT`` up to its blank line; returns its status.

    Read a byte at a time (the answer is a few dozen bytes, once per connection), so
    nothing the host sends through the tunnel after it is taken from the socket here.
    """
    reply = b""
    while not reply.endswith(b"\r\n\r\n"):
        chunk = await loop.sock_recv(sock, 1)
        if not chunk:
            raise ProxyError(f"{proxy.named()} closed the connection before answering CONNECT")
        reply += chunk
        if len(reply) > _MAX_REPLY:
            raise ProxyError(f"{proxy.named()} answered CONNECT with over 16 KiB of headers")
    status_line = reply.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split()
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ProxyError(f"{proxy.named()} answered CONNECT with {status_line[:80]!r}, not HTTP")
    return int(parts[1])
