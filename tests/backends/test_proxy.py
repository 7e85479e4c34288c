"""The default transport behind a proxy: ``HTTP_PROXY``, ``HTTPS_PROXY`` (a CONNECT tunnel),
``NO_PROXY``, and the error of a proxy that refuses.

A small proxy written here runs on loopback (asyncio: ``CONNECT`` tunnels, and plain
forwarding of absolute-URL requests) with the scripted server behind it. The endpoint's
host, ``scripted.test``, resolves nowhere: only the proxy knows where it is, so a call that
answers went through the proxy. For https a TLS front (a certificate made here, trusted
through ``SSL_CERT_FILE`` as a company's own CA is) stands before the scripted server.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from plait import LLMInference, ResourceConfig, run
from plait.backends.openai import _http
from plait.backends.openai._proxy import proxy_for
from plait.errors import BackendConnectionError
from plait.testing import ScriptedServer

HOST = "scripted.test"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


class LoopbackProxy:
    """An HTTP proxy on 127.0.0.1: ``CONNECT host:port`` opens a tunnel, any other request
    (an absolute URL) is forwarded with its connection; ``hosts`` says where each
    ``host:port`` really is. ``seen`` keeps each connection's first line and headers."""

    def __init__(self, hosts: dict[str, tuple[str, int]], connect_status: int = 200) -> None:
        self.hosts = hosts
        self.connect_status = connect_status
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.port = 0

    async def __aenter__(self) -> LoopbackProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        first, *lines = head.decode("latin-1").split("\r\n")
        pairs = (line.partition(":") for line in lines if line)
        headers = {name.strip().lower(): value.strip() for name, _, value in pairs}
        self.seen.append((first, headers))
        method, target, _ = first.split(" ")
        if method == "CONNECT":
            if self.connect_status != 200:
                writer.write(b"HTTP/1.1 %d No\r\nContent-Length: 0\r\n\r\n" % self.connect_status)
                writer.close()
                return
            up_reader, up_writer = await asyncio.open_connection(*self.hosts[target])
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            up_reader, up_writer = await asyncio.open_connection(
                *self.hosts[urlsplit(target).netloc]
            )
            up_writer.write(head)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


def certificate(folder: Path) -> tuple[Path, Path, Path]:
    """Makes a CA and a certificate it signs for ``scripted.test``; returns the CA's file
    and the certificate's and key's files."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def made(subject: str, issuer: Any, key: Any, signer: Any, ca: bool) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            names = x509.SubjectAlternativeName([x509.DNSName(HOST)])
            builder = builder.add_extension(names, critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "plait test CA")])
    ca = made("plait test CA", ca_name, ca_key, ca_key, ca=True)
    leaf = made(HOST, ca_name, key, ca_key, ca=False)
    pem = serialization.Encoding.PEM
    files = folder / "ca.pem", folder / "leaf.pem", folder / "leaf.key"
    files[0].write_bytes(ca.public_bytes(pem))
    files[1].write_bytes(leaf.public_bytes(pem))
    files[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


async def tls_front(cert: Path, key: Path, behind: int) -> Any:
    """A TLS server on loopback that hands what it decrypts to the port ``behind``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", behind)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)


@pytest.fixture(autouse=True)
def no_proxy_of_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer() as server:
        yield server


def resources(server: ScriptedServer, base_url: str) -> ResourceConfig:
    return ResourceConfig({"llm": server.endpoint(base_url=base_url, max_retries=0)})


async def test_an_http_endpoint_is_reached_through_http_proxy(
    scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = urlsplit(scripted.base_url).port
    async with LoopbackProxy({f"{HOST}:{port}": ("127.0.0.1", port)}) as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://me:s3cret@127.0.0.1:{proxy.port}")
        config = resources(scripted, f"http://{HOST}:{port}/v1")
        answers = await run(LLMInference("llm"), ["one", "two"], resources=config)
    assert answers == ["echo: one", "echo: two"]
    first, headers = proxy.seen[0]
    assert first == f"POST http://{HOST}:{port}/v1/chat/completions HTTP/1.1"
    assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"me:s3cret").decode()
    assert scripted.stats.requests == 2


async def test_the_batch_api_goes_through_the_same_proxy(
    scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = urlsplit(scripted.base_url).port
    async with LoopbackProxy({f"{HOST}:{port}": ("127.0.0.1", port)}) as proxy:
        monkeypatch.setenv("http_proxy", f"http://me:s3cret@127.0.0.1:{proxy.port}")
        config = resources(scripted, f"http://{HOST}:{port}/v1")
        answers = await run(LLMInference("llm"), ["one", "two"], resources=config, batch_api=True)
    assert answers == ["echo: one", "echo: two"]
    basic = "Basic " + base64.b64encode(b"me:s3cret").decode()
    assert {headers["proxy-authorization"] for _, headers in proxy.seen} == {basic}
    assert proxy.seen[0][0] == f"POST http://{HOST}:{port}/v1/files HTTP/1.1"


async def test_an_https_endpoint_is_reached_through_a_connect_tunnel(
    scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ca, cert, key = certificate(tmp_path)
    front = await tls_front(cert, key, urlsplit(scripted.base_url).port)
    front_port = front.sockets[0].getsockname()[1]
    try:
        async with LoopbackProxy({f"{HOST}:443": ("127.0.0.1", front_port)}) as proxy:
            monkeypatch.setenv("https_proxy", f"127.0.0.1:{proxy.port}")  # no scheme: http
            monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # the company's CA, as users add it
            monkeypatch.setattr(_http, "_tls_context", None)  # made again, with that CA
            answer = await run(
                LLMInference("llm"), "hi", resources=resources(scripted, f"https://{HOST}/v1")
            )
    finally:
        front.close()
    assert answer == "echo: hi"
    assert proxy.seen == [(f"CONNECT {HOST}:443 HTTP/1.1", {"host": f"{HOST}:443"})]
    assert scripted.stats.requests == 1


async def test_a_proxy_that_refuses_is_named_with_its_variable_and_no_proxy_goes_around(
    scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with LoopbackProxy({}) as closed:
        pass  # its port now refuses connections
    monkeypatch.setenv("HTTP_PROXY", f"http://me:s3cret@127.0.0.1:{closed.port}")
    config = resources(scripted, f"http://{HOST}:9/v1")
    with pytest.raises(BackendConnectionError) as refused:
        await run(LLMInference("llm"), "hi", resources=config)
    message = str(refused.value)
    assert f"the proxy http://***:***@127.0.0.1:{closed.port} (HTTP_PROXY) refused" in message
    assert "check HTTP_PROXY, or name the host in NO_PROXY" in message
    assert "s3cret" not in message and refused.value.unsent

    monkeypatch.setenv("NO_PROXY", "localhost,.test")
    fresh = resources(scripted, f"http://{HOST}:10/v1")  # read when an endpoint opens
    with pytest.raises(BackendConnectionError) as direct:
        await run(LLMInference("llm"), "hi", resources=fresh)
    assert "proxy" not in str(direct.value)  # it went straight to scripted.test, unknown


async def test_a_tunnel_the_proxy_refuses_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    async with LoopbackProxy({}, connect_status=407) as proxy, ScriptedServer() as server:
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
        with pytest.raises(BackendConnectionError) as refused:
            await run(LLMInference("llm"), "hi", resources=resources(server, f"https://{HOST}/v1"))
    message = str(refused.value)
    assert f"(HTTPS_PROXY) refused the tunnel to {HOST}:443: HTTP 407" in message
    assert "Proxy Authentication Required" in message


def test_which_hosts_go_through_the_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.corp:3128")
    assert proxy_for("https", "api.openai.com", 443).shown == "http://proxy.corp:3128"
    assert proxy_for("http", "api.openai.com", 80) is None  # HTTP_PROXY is not set
    for loopback in ("localhost", "127.0.0.1", "::1", "127.3.2.1"):
        assert proxy_for("https", loopback, 443) is None
    monkeypatch.setenv("no_proxy", "internal.corp, .lan,10.0.0.5")
    assert proxy_for("https", "llm.internal.corp", 443) is None
    assert proxy_for("https", "gpu.lan", 443) is None
    assert proxy_for("https", "10.0.0.5", 443) is None
    assert proxy_for("https", "corp", 443) is not None
    monkeypatch.setenv("no_proxy", "*.example.com:8443,[::2]")
    assert proxy_for("https", "a.example.com", 8443) is None
    assert proxy_for("https", "a.example.com", 443) is not None  # another port
    assert proxy_for("https", "::2", 443) is None
    monkeypatch.setenv("no_proxy", "*")
    assert proxy_for("https", "api.openai.com", 443) is None
