"""Serving plait programs and tools over MCP, so other agents and apps can call them.

`server(...)` makes a `ProgramServer`: one MCP tool per program (named after
its class, or by the name a mapping gives it; arguments from ``forward``'s
parameters, or from the input fields of the `Signature` that drives it, with
their types and descriptions) and one per plait `Tool` (its own schema). A
program's result comes back as text (a string as it is, anything else as JSON)
and, when it is data, as structured content too; a program that declares its
output type (a `Signature`'s output fields, a return annotation, a response
format) lists it as the tool's ``outputSchema``, which its structured content
follows. A failure (bad arguments, an error in the program) is a tool result
marked as an error whose text says what went wrong, which the calling model can
read, with every URL and network address in it left out (an upstream's address,
a key inside a URL: the server's log has them); the server goes on serving. A
call that stops to ask a person (a tool that needs confirmation, served alone or
inside a program) is such an error too, saying why: nobody on an MCP call can
answer.

It runs over stdio (what Claude Desktop and IDEs start) or streamable HTTP;
``plait mcp prog.py:Prog`` does the same from the command line.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic_core import to_jsonable_python

from plait import __version__
from plait.backends._urls import without_addresses
from plait.cli.programs import (
    ProgramError,
    inputs_of,
    load_object,
    one_line,
    output_type_of,
    program_of,
)
from plait.confirmation import ConfirmationRequired
from plait.errors import ConfigError, described
from plait.mcp._sdk import (
    INVALID_PARAMS,
    CallToolResult,
    ListToolsResult,
    SDKError,
    Server,
    TextContent,
    ToolInfo,
    anyio,
    stdio_server,
    uvicorn,
)
from plait.module import Module
from plait.serve.http_protocol import http_protocol
from plait.serve.middleware import RequireApiKey
from plait.serve.options import ServeOptions, is_loopback
from plait.tools import Tool

__all__ = ["ProgramServer", "check_exposure", "load_named", "load_served", "server"]

logger = logging.getLogger("plait.mcp")

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""What a name given to a program may be: what model APIs accept as a tool name (and '.')."""


@dataclass(frozen=True)
class _Entry:
    """One MCP tool the server offers: how it is described and how it runs."""

    name: str
    description: str
    input_schema: dict[str, Any]
    target: Module | Tool
    arguments: Any = None
    """The pydantic model that checks a program's arguments (None for a `Tool`)."""
    output_schema: dict[str, Any] | None = None
    """MCP's ``outputSchema`` of a typed program: what its ``structuredContent`` holds;
    None when its output is text or undeclared."""
    wrapped: bool = False
    """Whether the structured content is ``{"result": output}`` (an output that is not a
    JSON object: a number, a list, a label)."""


class ProgramServer:
    """An MCP server offering plait programs and tools; see `server`.

    Attributes:
        sdk_server: the SDK's low-level ``mcp.server.Server``, for running it
            your own way (e.g. mounting its ``streamable_http_app()``).
    """

    def __init__(self, entries: list[_Entry], name: str) -> None:
        self.name = name
        self.entries = {entry.name: entry for entry in entries}
        self.sdk_server = Server(
            name,
            version=__version__,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    # ------------------------------------------------------------------ serving
    async def serve_stdio(self) -> None:
        """Serves one client on this process's stdin and stdout until it closes them."""
        async with stdio_server() as (read_stream, write_stream):
            await self.sdk_server.run(
                read_stream, write_stream, self.sdk_server.create_initialization_options()
            )

    async def serve_http(
        self, host: str = "127.0.0.1", port: int = 8000, *, api_keys: Sequence[str] = ()
    ) -> None:
        """Serves streamable HTTP at ``http://host:port/mcp`` until cancelled (or Ctrl-C).

        With ``api_keys``, a request must carry ``Authorization: Bearer <one of them>``
        (else 401), as `plait serve` asks; without any, only this machine may connect. A
        request head over 64 KiB is answered 431, and a request not sent within its time
        408, as by `plait serve` (`plait.serve.http_protocol`).

        Raises:
            ConfigError: ``host`` is reachable from other machines and no key is given.
        """
        check_exposure(host, api_keys)
        app: Any = self.sdk_server.streamable_http_app(host=host)
        if api_keys:
            app = RequireApiKey(app, tuple(api_keys))
        # a request's head and the time to send it bounded as `plait serve` bounds them
        http = http_protocol(ServeOptions())
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", http=http)
        await uvicorn.Server(config).serve()

    def run(
        self,
        transport: str = "stdio",
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        api_keys: Sequence[str] = (),
    ) -> None:
        """Serves until the client leaves (stdio) or the process is stopped (http; see
        `serve_http` for ``api_keys``).

        Raises:
            ValueError: ``transport`` is neither ``"stdio"`` nor ``"http"``.
            ConfigError: over HTTP, ``host`` is reachable from other machines and no key
                is given.
        """
        if transport == "stdio":
            anyio.run(self.serve_stdio)
        elif transport == "http":
            check_exposure(host, api_keys)
            anyio.run(lambda: self.serve_http(host, port, api_keys=api_keys))
        else:
            raise ValueError(f"transport must be 'stdio' or 'http', got {transport!r}")

    # ----------------------------------------------------------------- handlers
    async def _list_tools(self, ctx: Any, params: Any) -> Any:
        tools = [
            ToolInfo(
                name=e.name,
                description=e.description,
                input_schema=e.input_schema,
                output_schema=e.output_schema,
            )
            for e in self.entries.values()
        ]
        return ListToolsResult(tools=tools)

    async def _call_tool(self, ctx: Any, params: Any) -> Any:
        entry = self.entries.get(params.name)
        if entry is None:
            known = ", ".join(self.entries) or "none"
            raise SDKError(INVALID_PARAMS, f"no tool named {params.name!r}; the tools: {known}")
        arguments = dict(params.arguments or {})
        if isinstance(entry.target, Tool):
            return await _call_plait_tool(entry, entry.target, arguments)
        return await _call_program(entry, arguments)

    def __repr__(self) -> str:
        return f"ProgramServer({self.name!r}, tools=[{', '.join(self.entries)}])"


def check_exposure(host: str, api_keys: Sequence[str]) -> None:
    """Refuses to serve MCP over HTTP on a host other machines reach, without API keys.

    Raises:
        ConfigError: ``host`` is not loopback and no key is given.
    """
    if api_keys or is_loopback(host):
        return
    raise ConfigError(
        f"refusing to serve MCP on {host} without API keys: anyone who can reach it could "
        "run the programs at your expense; pass --api-key-env NAME or --api-key-file PATH, "
        "or bind 127.0.0.1"
    )


def server(
    programs: Module | Tool | Iterable[Module | Tool] | Mapping[str, Module | Tool],
    resources: Any = None,
    *,
    name: str = "plait",
) -> ProgramServer:
    """Returns an MCP server offering programs and tools, ready to ``run()``.

    Args:
        programs: a `Module`, a `Tool`, or several of them; each becomes one
            MCP tool. A program is named after its class, a tool keeps its name;
            a mapping of ``name -> program or tool`` names each (two programs of
            one class, say two ``Predict``s, need names).
        resources: what the programs' LLM calls use (a ``ResourceConfig``, a
            mapping, or a manager), bound to every program; None leaves each
            program as it is (bound already, or making no LLM calls).
        name: the server's name, as clients show it.

    Raises:
        TypeError: something given is neither a Module nor a Tool.
        ValueError: two of them would have one tool name, or a name given is not one.

    Example::

        plait.mcp.server(Summarize(), ResourceConfig.from_file("res.toml")).run()
        plait.mcp.server({"triage": triage, "qa": qa}, resources).run("http", port=8000)
    """
    if isinstance(programs, Mapping):
        named: list[tuple[str | None, Any]] = [(str(key), item) for key, item in programs.items()]
    elif isinstance(programs, Module | Tool):
        named = [(None, programs)]
    else:
        named = [(None, item) for item in programs]
    entries: list[_Entry] = []
    for given, item in named:
        if given is not None and not _TOOL_NAME.match(given):
            raise ValueError(
                f"{given!r} cannot name an MCP tool: use 1 to 64 letters, digits, '_', '-' or '.'"
            )
        entry = _entry_of(item, resources, given)
        if any(other.name == entry.name for other in entries):
            raise ValueError(_named_twice(entry.name))
        entries.append(entry)
    return ProgramServer(entries, name)


def load_served(specs: Iterable[str]) -> list[Module | Tool]:
    """Returns what ``plait mcp`` serves: for each ``pkg.module:Name`` (or ``file.py:Name``),
    a program (a Module, a Module class or a function building one), a `Tool`, or a
    list of those.

    Raises:
        ProgramError: a spec names nothing servable, on one line (as `load_program`).
    """
    served: list[Module | Tool] = []
    for spec in specs:
        obj = load_object(spec)
        items = obj if isinstance(obj, list | tuple) else [obj]
        for item in items:
            served.append(item if isinstance(item, Tool) else program_of(item, spec))
    return served


def load_named(specs: Iterable[str]) -> list[Module | Tool] | dict[str, Module | Tool]:
    """Returns what ``plait mcp`` serves, as `load_served`, with the names that
    ``NAME=PROGRAM`` specs give: a mapping when any spec names its program (the others
    keep their class's or tool's name), else the list.

    Raises:
        ProgramError: a spec names nothing servable, or a name is given to a list.
    """
    named: list[tuple[str | None, Module | Tool]] = []
    for spec in specs:
        given, sep, target = spec.partition("=")
        if not sep or ":" in given:  # a plain spec (a path may hold '=' after its ':')
            named.extend((None, item) for item in load_served([spec]))
            continue
        items = load_served([target])
        if len(items) != 1:
            raise ProgramError(
                f"{spec!r}: NAME=PROGRAM names one program, but {target} holds "
                f"{len(items)}; serve the list as it is, or name each program of it"
            )
        named.append((given, items[0]))
    if all(label is None for label, _ in named):
        return [item for _, item in named]
    by_name: dict[str, Module | Tool] = {}
    for label, item in named:
        key = label or (item.name if isinstance(item, Tool) else type(item).__name__)
        if key in by_name:
            raise ProgramError(_named_twice(key))
        by_name[key] = item
    return by_name


def _named_twice(name: str) -> str:
    return (
        f"two programs or tools would both be the MCP tool {name!r}; name them (on the "
        f"command line NAME=PROGRAM, e.g. {name.lower()}2=prog.py:Name; in Python a mapping "
        "of name -> program, or Tool(fn, name=...))"
    )


# ------------------------------------------------------------------ entries
def _entry_of(item: Any, resources: Any, name: str | None = None) -> _Entry:
    if isinstance(item, Tool):
        return _Entry(name or item.name, item.description, dict(item.parameters), item)
    if not isinstance(item, Module):
        raise TypeError(
            f"plait.mcp.server serves Modules and Tools, got {type(item).__name__}; wrap a "
            "function with plait.tool"
        )
    if resources is not None:
        item.bind(resources)
    model = _arguments_model(item)
    schema = _without_titles(model.model_json_schema())
    output, wrapped = _output_schema(item)
    return _Entry(
        name or type(item).__name__,
        _description_of(item),
        schema,
        item,
        model,
        output_schema=output,
        wrapped=wrapped,
    )


def _output_schema(program: Module) -> tuple[dict[str, Any] | None, bool]:
    """Returns MCP's ``outputSchema`` of the program's declared output, and whether it
    wraps the output as ``{"result": ...}`` (MCP wants an object there); ``(None, False)``
    for text or an output that declares nothing (or that pydantic cannot describe)."""
    output = output_type_of(program)
    if output is str or output is Any:
        return None, False
    try:
        schema = _without_titles(TypeAdapter(output).json_schema())
    except Exception:  # a class pydantic knows nothing about: no schema to promise
        return None, False
    if schema.get("type") == "object":
        return schema, False
    definitions = schema.pop("$defs", None)
    wrapper = {"type": "object", "properties": {"result": schema}, "required": ["result"]}
    if definitions:
        wrapper["$defs"] = definitions  # a "$ref" resolves within the document's root
    return wrapper, True


def _arguments_model(program: Module) -> Any:
    """Returns a pydantic model of the program's inputs: names, types, defaults, descriptions."""
    names, required, _ = inputs_of(program)
    signature = getattr(program, "signature", None)
    fields_of_signature = getattr(signature, "input_fields", None)
    declared = (
        dict(fields_of_signature)
        if isinstance(fields_of_signature, Mapping) and list(fields_of_signature) == names
        else None
    )
    parameters = inspect.signature(program.forward).parameters
    hints = _hints_of(program.forward)
    fields: dict[str, Any] = {}
    for name in names:
        if declared is not None:
            spec = declared[name]
            fields[name] = (spec.annotation, Field(description=spec.description or None))
            continue
        default = ... if name in required else parameters[name].default
        fields[name] = (hints.get(name, Any), Field(default))
    config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    return create_model(f"{type(program).__name__}_inputs", __config__=config, **fields)


def _hints_of(function: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function)
    except Exception:  # a hint that cannot be resolved: that input takes any JSON value
        return {}


def _description_of(program: Module) -> str:
    doc = inspect.getdoc(type(program))
    if doc and type(program).__module__.split(".")[0] != "plait":
        return doc.split("\n\n")[0].strip()
    signature = getattr(program, "signature", None)
    text = getattr(signature, "signature_text", None)
    instructions = getattr(signature, "instructions", None)
    parts = [str(instructions)] if isinstance(instructions, str) and instructions else []
    if callable(text):
        parts.append(f"({text()})")
    return " ".join(parts) or f"Runs the plait program {type(program).__name__}."


def _without_titles(schema: Any) -> Any:
    """Returns the schema without pydantic's generated ``title`` keys (a property named
    ``title`` stays)."""
    if isinstance(schema, list):
        return [_without_titles(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs"):
            out[key] = {name: _without_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _without_titles(value)
    return out


# ------------------------------------------------------------------ calling
async def _call_program(entry: _Entry, arguments: dict[str, Any]) -> Any:
    try:
        checked = entry.arguments.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"argument '{'.'.join(map(str, e['loc'])) or '(arguments)'}': {e['msg']}"
            for e in exc.errors()
        )
        return _error_result(f"invalid arguments for {entry.name}: {problems}")
    kwargs = {name: getattr(checked, name) for name in type(checked).model_fields}
    try:
        output = entry.target(**kwargs)
        if inspect.isawaitable(output):
            output = await output
    except ConfirmationRequired as pause:  # no person on the other end to answer it
        return _cannot_pause(entry.name, pause)
    except Exception as exc:  # the program's failure goes back to the caller, not up the server
        reason = described(exc)
        logger.warning("%s failed: %s", entry.name, reason)
        return _error_result(f"{entry.name} failed: {without_addresses(reason)}")
    return _result_of(output, wrapped=entry.wrapped if entry.output_schema else None)


async def _call_plait_tool(entry: _Entry, tool: Tool, arguments: dict[str, Any]) -> Any:
    try:
        result = await tool.call(arguments)
    except ConfirmationRequired as pause:  # a tool of its own that needs a person's yes
        return _cannot_pause(entry.name, pause)
    if not result.ok:
        return _error_result(without_addresses(result.content.removeprefix("Error: ")))
    return _result_of(result.value, text=result.content)


def _cannot_pause(name: str, pause: ConfirmationRequired) -> Any:
    """Returns the error result of a call that stopped to ask a person, saying what to do."""
    return _error_result(
        f"{name} stopped to ask a person: {one_line(str(pause))} A call over MCP "
        "cannot pause for an answer; serve the program with plait serve (which keeps the "
        "run for its approval), or make the tool without require_confirmation"
    )


def _result_of(output: Any, text: str | None = None, wrapped: bool | None = None) -> Any:
    """Returns a ``CallToolResult``: the output as text, and as structured content when it
    is data (an object; anything else is wrapped as ``{"result": ...}``).

    Args:
        wrapped: for a program with an ``outputSchema``, whether that schema wraps the
            output (so the content fits the schema whatever the value); None: decide by
            the value.
    """
    if hasattr(output, "to_dict") and callable(output.to_dict):  # a Prediction
        output = output.to_dict()
    data = to_jsonable_python(output, fallback=str)
    if text is None:
        text = output if isinstance(output, str) else _json_text(data)
    structured = None
    if wrapped is not None:
        structured = {"result": data} if wrapped else data
    elif not isinstance(output, str):
        structured = data if isinstance(data, dict) else {"result": data}
    return CallToolResult(content=[TextContent(text=text)], structured_content=structured)


def _json_text(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False)


def _error_result(message: str) -> Any:
    return CallToolResult(content=[TextContent(text=message)], is_error=True)
