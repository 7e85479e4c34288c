"""Tools from MCP servers: an `MCPToolset` turns a server's tools into plait `Tool`s.

A server is a command run as a subprocess (stdio) or a URL (streamable
HTTP). Opened with ``async with``, the toolset starts or connects to it, lists
its tools, and gives one `MCPTool` per tool, described by the JSON schema the
server sent; they go wherever a `Tool` goes: ``Predict(tools=...)``, `ReAct`,
or plain code (``await tool(path="a.txt")``). Closing it ends the session and,
for a command, the process (the SDK closes its input, then terminates the
process group), also when the block is left by a cancellation.

Whatever goes wrong with the server (it does not start, crashes, hangs past
the tool's timeout, answers something that is not MCP, or reports that its
tool failed) raises `plait.errors.MCPError` naming the server and the tool;
in an agent's tool loop that becomes the tool's error result, which the model
reads, as for any tool that raises.

The SDK's connection lives in task groups that must be left by the task that
entered them, while an agent calls its tools from other tasks; so one task of
the toolset's own holds the connection for as long as it is open, and calls
from any task go through the session it holds.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import os
import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from plait import __version__
from plait.errors import MCPError, MediaError
from plait.media import Image
from plait.module import Module
from plait.tools import DEFAULT_TIMEOUT, Tool

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "MCPTool",
    "MCPToolOutput",
    "MCPToolset",
    "WithServers",
]

DEFAULT_CONNECT_TIMEOUT = 30.0
"""Seconds a server may take to start (or be reached) and list its tools."""

_CLOSE_TIMEOUT = 15.0
"""Seconds closing may take before the holding task is cancelled. The SDK bounds its own
shutdown of a process (close its input, then SIGTERM, then SIGKILL, about 6 s at worst)."""

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")

_WINDING_DOWN: set[asyncio.Task[None]] = set()
"""Holding tasks of connections that did not start in time, kept until their shutdown ends
(the event loop keeps only weak references to tasks)."""


class _StartTimedOut(MCPError):
    """The server did not start and list its tools within ``connect_timeout``."""


@dataclass(frozen=True, slots=True)
class MCPToolOutput:
    """What a tool returned when its result carries images.

    A result without images is returned as its text (a `str`), or as its
    structured content when it has no text; this holds the rest.
    """

    text: str
    """The result's text blocks, joined by newlines."""
    images: tuple[Image, ...] = ()
    """The images, in the order the server sent them; an agent shows them to the model."""
    structured: Any = None
    """The structured content, when the server sent one."""

    def __str__(self) -> str:
        notes = [f"[{image.describe()}]" for image in self.images]
        return "\n".join(part for part in (self.text, *notes) if part)


class MCPToolset:
    """The tools of one MCP server, usable while the toolset is open.

    Args:
        server: a URL (``http://…`` or ``https://…``: streamable HTTP), or the
            command that starts the server over stdio, as a list of arguments
            or one string split like a shell does (``"uvx mcp-server-git"``).
        name: what errors call the server; defaults to the command's program
            name or the URL's host.
        env: environment variables for the command, over the few the SDK
            passes on (``PATH``, ``HOME`` …); the rest are not inherited.
        cwd: working directory of the command.
        headers: HTTP headers sent with every request to a URL (e.g.
            ``{"Authorization": "Bearer …"}``).
        timeout: seconds one tool call may take (None: no limit); a slower
            call raises `MCPError` (and the model is told).
        connect_timeout: seconds the server may take to start and list its tools.
        require_confirmation: True to ask a person before every call of this
            server's tools, or the names (as the server spells them) of those
            that need it; the calls pause as any plait tool's do
            (`plait.confirmation`).
        prefix: put before every tool name (e.g. ``"git_"``), so that two
            servers with a tool of one name can serve one agent.
        max_result_chars: longest result text shown to the model.

    Raises:
        ValueError: ``server`` is empty, or options of the other transport are given.

    Example::

        files = MCPToolset(["python", "files_server.py"], require_confirmation={"delete"})
        async with files:
            agent = ReAct("request -> answer", tools=files.tools)
            await agent.bind(resources)(request="tidy up /tmp/notes")
        # the server's process has ended here

    Opening is counted: entered again (by nested blocks, or by the items of a
    batch through `WithServers`) while open, it shares the one connection, which
    closes when the last block is left. A toolset can be opened again after it
    closed; its `tools` stay the same objects, so an agent built once keeps
    working, and a call made while it is closed raises `MCPError`.
    """

    def __init__(
        self,
        server: str | Sequence[str],
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        require_confirmation: bool | Collection[str] = False,
        prefix: str = "",
        max_result_chars: int = 8000,
    ) -> None:
        self.url, self.command = _target_of(server)
        if self.url is not None and (env is not None or cwd is not None):
            raise ValueError(f"env= and cwd= are for a command, not a URL ({self.url})")
        if self.command is not None and headers is not None:
            raise ValueError("headers= are for a URL, not a command")
        self.name = name or _default_name(self.url, self.command)
        self.env = dict(env) if env is not None else None
        self.cwd = None if cwd is None else Path(cwd)
        self.headers = dict(headers) if headers is not None else None
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.require_confirmation = (
            require_confirmation
            if isinstance(require_confirmation, bool)
            else frozenset(require_confirmation)
        )
        self.prefix = prefix
        self.max_result_chars = max_result_chars
        self._tools: dict[str, MCPTool] | None = None
        self._users = 0
        self._ready: asyncio.Future[Any] | None = None
        self._closing: asyncio.Event | None = None
        self._holder: asyncio.Task[None] | None = None
        self._client: Any = None

    # ---------------------------------------------------------------- the tools
    @property
    def tools(self) -> list[MCPTool]:
        """The server's tools, in the order it listed them.

        Raises:
            MCPError: the toolset was never opened, so its tools are not known yet.
        """
        if self._tools is None:
            raise MCPError(
                f"the tools of MCP server {self.name!r} are not known until it is opened: "
                "use them inside `async with toolset:` (or get them with "
                "`await toolset.list_tools()`)"
            )
        return list(self._tools.values())

    def __iter__(self) -> Any:
        return iter(self.tools)

    async def list_tools(self) -> list[MCPTool]:
        """Returns the server's tools, opening it for as long as it takes if it is closed."""
        async with self:
            return self.tools

    # ----------------------------------------------------------------- lifetime
    @property
    def is_open(self) -> bool:
        """Whether a connection is held (it may still have ended, if the server crashed)."""
        return self._client is not None

    async def __aenter__(self) -> MCPToolset:
        self._users += 1
        try:
            if self._ready is None:
                self._start()
            assert self._ready is not None
            await self._wait_until_ready(self._ready)
        except BaseException as exc:
            await self._leave(wait=not isinstance(exc, _StartTimedOut))
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._leave()

    def _start(self) -> None:
        # The SDK is imported (seconds on a busy machine, blocking the loop) before the
        # connect_timeout clock starts: that clock is the server's, to start and answer.
        client = self._sdk_client()
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._closing = asyncio.Event()
        self._holder = loop.create_task(
            self._hold(client, self._ready, self._closing), name=f"plait-mcp-{self.name}"
        )

    async def _wait_until_ready(self, ready: asyncio.Future[Any]) -> None:
        try:
            async with asyncio.timeout(self.connect_timeout):
                await asyncio.shield(ready)
        except TimeoutError:
            if ready.done() and ready.exception() is not None:
                raise  # the server's own timeout, already explained
            raise _StartTimedOut(
                f"MCP server {self.name!r} did not start and list its tools within "
                f"{self.connect_timeout:g} seconds; check {self._target()} "
                "(or raise connect_timeout=)"
            ) from None

    async def _leave(self, wait: bool = True) -> None:
        self._users -= 1
        if self._users == 0:
            await self._close(wait)

    async def _close(self, wait: bool = True) -> None:
        """Ends the connection and waits for the holding task, even when cancelled meanwhile.

        Waiting is what makes "the process has ended" true when the block is
        left; a cancellation that arrives while waiting is raised afterwards. A
        connection still starting is cancelled at once (it does not watch for the close
        yet); one that did not start within ``connect_timeout`` is not waited for
        (``wait=False``): its error is due now, while the SDK's shutdown of a server hung
        in ``initialize`` (close its input, wait 2 s, then signal it) finishes in the
        background.
        """
        holder, closing, ready = self._holder, self._closing, self._ready
        self._ready = self._closing = self._holder = None
        self._client = None
        if holder is None or closing is None:
            return
        if ready is None or not ready.done():
            holder.cancel()
            if not wait:
                _WINDING_DOWN.add(holder)
                holder.add_done_callback(_WINDING_DOWN.discard)
                return
        closing.set()
        cancelled = False
        while not holder.done():
            try:
                await asyncio.wait({holder}, timeout=_CLOSE_TIMEOUT)
            except asyncio.CancelledError:
                cancelled = True
                continue
            if not holder.done():  # the SDK's bounded shutdown did not finish: stop it
                holder.cancel()
        if cancelled:
            raise asyncio.CancelledError

    async def _hold(
        self, sdk_client: Any, ready: asyncio.Future[Any], closing: asyncio.Event
    ) -> None:
        """Holds the connection: connects, lists the tools, then waits for the close."""
        try:
            async with sdk_client as client:
                listed = await _all_tools(client)
                tools = self._tools_of(listed)
                self._client = client
                self._tools = tools
                ready.set_result(None)
                try:
                    await closing.wait()
                finally:  # closed, or the connection broke: calls must not reach a dead client
                    if self._client is client:
                        self._client = None
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(self._start_error(exc))
                ready.exception()  # retrieved: a cancelled opener must not leave it unread
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise

    def _sdk_client(self) -> Any:
        sdk = _sdk()
        if self.url is not None:
            transport: Any = self.url
            if self.headers is not None:
                transport = sdk.streamable_http_client(
                    self.url, http_client=sdk.create_mcp_http_client(headers=self.headers)
                )
        else:
            assert self.command is not None
            transport = sdk.StdioServerParameters(
                command=self.command[0],
                args=self.command[1:],
                env=self.env,
                cwd=self.cwd,
            )
        info = sdk.Implementation(name="plait", version=__version__)
        return sdk.Client(transport, client_info=info)

    def _tools_of(self, listed: Sequence[Any]) -> dict[str, MCPTool]:
        """Returns the plait tools of a listing: same objects as before when reopened."""
        server_names = {info.name for info in listed}
        if not isinstance(self.require_confirmation, bool):
            unknown = sorted(self.require_confirmation - server_names)
            if unknown:
                raise MCPError(
                    f"require_confirmation names {', '.join(map(repr, unknown))}, which MCP "
                    f"server {self.name!r} does not have; its tools: "
                    f"{', '.join(sorted(server_names)) or '(none)'}"
                )
        previous = {tool.server_name: tool for tool in (self._tools or {}).values()}
        tools: dict[str, MCPTool] = {}
        for info in listed:
            tool = previous.get(info.name)
            if tool is None or tool.parameters != info.input_schema:
                tool = MCPTool(self, info, self._plait_name(info.name))
            if tool.name in tools:
                raise MCPError(
                    f"MCP server {self.name!r} has tools {tools[tool.name].server_name!r} and "
                    f"{info.name!r}, which both become {tool.name!r} as plait tool names "
                    "(letters, digits, '_' and '-'); they cannot both be offered"
                )
            tools[tool.name] = tool
        return tools

    def _plait_name(self, server_name: str) -> str:
        return _UNSAFE_NAME.sub("_", f"{self.prefix}{server_name}")[:64] or "_"

    def _needs_confirmation(self, server_name: str) -> bool:
        if isinstance(self.require_confirmation, bool):
            return self.require_confirmation
        return server_name in self.require_confirmation

    def _start_error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, MCPError | asyncio.CancelledError):
            return exc
        cause = _innermost(exc)
        if isinstance(cause, MCPError):
            return cause
        return MCPError(
            f"MCP server {self.name!r} could not be started or reached "
            f"({type(cause).__name__}: {cause}); check {self._target()}"
        )

    def _target(self) -> str:
        if self.url is not None:
            return f"that it serves MCP at {self.url}"
        return f"the command {shlex.join(self.command or [])}"

    def _connected_client(self, tool: str) -> Any:
        if self._ready is None:
            raise MCPError(
                f"MCP server {self.name!r} is not open, so its tool {tool!r} cannot be called; "
                "call it inside `async with toolset:` (or run the program through WithServers)"
            )
        if self._client is None:
            raise MCPError(
                f"MCP server {self.name!r}, tool {tool!r}: the connection to the server ended "
                "(it may have crashed); open the toolset again to restart it"
            )
        return self._client

    def __repr__(self) -> str:
        return f"MCPToolset({self.name!r}, {'open' if self.is_open else 'closed'})"


class MCPTool(Tool):
    """One tool of an MCP server, as a plait `Tool`.

    Its arguments are described and checked by the JSON schema the server
    gave (`parameters`), not by a Python signature. Calling it (``await
    tool(**arguments)``, or `Tool.call` from an agent) sends ``tools/call``
    to the server and returns the result: its text (a `str`), its structured
    content when it has no text, or an `MCPToolOutput` when it carries images.

    Attributes:
        server_name: the tool's name on the server (``name`` is the plait name:
            the toolset's prefix added, characters a model API refuses replaced).
        toolset: the `MCPToolset` it belongs to.
        output_schema: the JSON schema of its structured content, if the server gave one.
    """

    def __init__(self, toolset: MCPToolset, info: Any, name: str) -> None:
        # Not Tool.__init__: that one reads a Python function's signature.
        self.toolset = toolset
        self.server_name = info.name
        self.func = self._call_server
        self.name = name
        self.description = info.description or ""
        self.in_thread = False
        self.timeout = toolset.timeout
        self.max_result_chars = toolset.max_result_chars
        self.require_confirmation = toolset._needs_confirmation(info.name)
        self._is_async = True
        self.parameters: dict[str, Any] = dict(info.input_schema)
        self.output_schema = info.output_schema
        self._validator = _validator_of(self.parameters, toolset.name, info.name)

    def __get__(self, instance: Any, owner: type | None = None) -> MCPTool:
        return self

    def validate_arguments(self, data: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """Checks the arguments against the server's schema, naming each problem's place.

        A schema whose ``$ref`` loops makes every check of the value it describes recurse
        without end: that is a problem of the call (the model is told), never a
        `RecursionError` that would end the agent's run."""
        problems = []
        try:
            errors = sorted(self._validator.iter_errors(data), key=lambda e: list(map(str, e.path)))
        except RecursionError:  # a $ref that leads back to itself: checking never ends
            return {}, (
                f"the arguments cannot be checked: MCP server {self.toolset.name!r} describes "
                f"its tool {self.server_name!r} with a JSON schema whose $ref leads back to "
                "itself in a loop; the server must be fixed before this tool can be called"
            )
        for error in errors:
            where = ".".join(str(part) for part in error.absolute_path)
            problems.append(f"argument '{where}': {error.message}" if where else error.message)
        return (data, None) if not problems else ({}, "; ".join(problems))

    def render_result(self, value: Any) -> str:
        if isinstance(value, MCPToolOutput):
            return str(value)
        return super().render_result(value)

    def result_media(self, value: Any) -> tuple[Any, ...]:
        if isinstance(value, MCPToolOutput):
            return value.images
        return super().result_media(value)

    async def _call_server(self, **arguments: Any) -> Any:
        """Sends one ``tools/call`` and returns its output.

        Raises:
            MCPError: the toolset is closed, the server crashed, timed out,
                answered something that is not a tool result, or said its tool failed.
        """
        sdk = _sdk()
        client = self.toolset._connected_client(self.server_name)
        where = f"MCP server {self.toolset.name!r}, tool {self.server_name!r}"
        try:
            async with asyncio.timeout(self.timeout):
                result = await client.call_tool(self.server_name, arguments)
        except TimeoutError:
            raise MCPError(
                f"{where}: no answer within {self.timeout:g} seconds; the call was given up "
                "(raise timeout= on the toolset if the tool is slow)"
            ) from None
        except sdk.SDKError as exc:
            if exc.code == sdk.CONNECTION_CLOSED:
                raise MCPError(
                    f"{where}: the connection to the server ended (it may have crashed); "
                    "open the toolset again to restart it"
                ) from exc
            raise MCPError(f"{where}: the server answered with an error: {exc.message}") from exc
        except sdk.ValidationError as exc:
            raise MCPError(
                f"{where}: the server's answer is not an MCP tool result "
                f"({exc.error_count()} problem(s), first: {_first_problem(exc)})"
            ) from None
        except (OSError, RuntimeError, ValueError) as exc:  # the SDK's transport and checks
            raise MCPError(f"{where}: the call failed ({type(exc).__name__}: {exc})") from exc
        return _output_of(result, where)

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r}, server={self.toolset.name!r})"


class WithServers(Module):
    """Runs a module with MCP toolsets open for each call, and closed when it ends.

    The servers start when a call begins and stop when it returns, fails or
    is cancelled; the items of a batch share one connection per server.

    Args:
        module: the module to run (an agent whose tools are the toolsets').
        *toolsets: the `MCPToolset`s it uses.

    Example::

        files = MCPToolset(["python", "files_server.py"])
        agent = ReAct("request -> answer", tools=await files.list_tools())
        program = WithServers(agent, files).bind(resources)
        await program(request="list the notes")
    """

    def __init__(self, module: Module, *toolsets: MCPToolset) -> None:
        super().__init__()
        self.module = module
        self.toolsets = tuple(toolsets)

    async def forward(self, *args: Any, **kwargs: Any) -> Any:
        async with contextlib.AsyncExitStack() as stack:
            for toolset in self.toolsets:
                await stack.enter_async_context(toolset)
            return await self.module(*args, **kwargs)


# ------------------------------------------------------------------ helpers
def _sdk() -> ModuleType:
    """`plait.mcp._sdk`, the SDK's names; a clear ImportError when the ``mcp`` extra is missing."""
    from plait.mcp import _sdk  # optional extra (plait[mcp]), ~600 modules: loaded on first open

    return _sdk


def _target_of(server: str | Sequence[str]) -> tuple[str | None, list[str] | None]:
    """Returns (url, None) or (None, command argv)."""
    if isinstance(server, str):
        if server.startswith(("http://", "https://")):
            return server, None
        command = shlex.split(server)
    else:
        command = [os.fspath(part) for part in server]
    if not command or not command[0]:
        raise ValueError("MCPToolset needs a URL or a command to start the server; got nothing")
    return None, command


def _default_name(url: str | None, command: list[str] | None) -> str:
    if url is not None:
        return urlsplit(url).hostname or url
    assert command is not None
    program = os.path.basename(command[0])
    # "python server.py": the script says more than the interpreter
    if program.startswith("python") and len(command) > 1 and not command[1].startswith("-"):
        return os.path.basename(command[1])
    return program


async def _all_tools(client: Any) -> list[Any]:
    """Returns every tool of the server, following the listing's pages (at most 100)."""
    tools: list[Any] = []
    cursor = None
    for _ in range(100):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _validator_of(schema: dict[str, Any], server: str, tool: str) -> Any:
    sdk = _sdk()
    cls = sdk.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except sdk.SchemaError as exc:
        raise MCPError(
            f"MCP server {server!r} describes the arguments of its tool {tool!r} with a JSON "
            f"schema that is not valid ({exc.message}); fix the server"
        ) from None
    return cls(schema)


def _output_of(result: Any, where: str) -> Any:
    """Returns a tool result as plait gives it: its text; its structured content when it has
    no text (servers usually send both, the text being the content as JSON); or an
    `MCPToolOutput` when it carries images."""
    texts: list[str] = []
    images: list[Image] = []
    for block in result.content:
        kind = block.type
        if kind == "text":
            texts.append(block.text)
        elif kind == "image":
            images.append(_image(_decoded(block.data, where), where))
        elif kind == "audio":
            texts.append(f"[audio: {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif kind == "resource_link":
            texts.append(f"[resource: {block.uri}]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            texts.append(text if text is not None else f"[resource: {resource.uri}]")
    text = "\n".join(texts)
    if result.is_error:
        raise MCPError(f"{where}: the tool failed: {text or '(no message)'}")
    if images:
        return MCPToolOutput(text, tuple(images), result.structured_content)
    if texts or result.structured_content is None:
        return text
    return result.structured_content  # data with no text rendering of it


def _image(data: bytes, where: str) -> Image:
    """Returns an image a server sent, its format read from its bytes (not the type it named)."""
    try:
        return Image(data)
    except MediaError as exc:
        raise MCPError(f"{where}: the tool sent an image plait cannot read: {exc}") from None


def _decoded(data: str, where: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise MCPError(f"{where}: the server sent an image whose data is not base64") from None


def _first_problem(exc: Any) -> str:
    error = exc.errors()[0]
    place = ".".join(str(part) for part in error["loc"]) or "(the result)"
    return f"{place}: {error['msg']}"


def _innermost(exc: BaseException) -> BaseException:
    """Returns the first leaf of nested exception groups (the SDK's task groups wrap failures)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
