"""What a served program takes and gives: its request and response schemas, and its chat form.

A program's inputs are the ones ``plait run`` fills from columns (`plait.cli.programs.inputs_of`:
``forward``'s parameters, or the input fields of its `Signature`); each becomes a field of the
request body, typed by its annotation. An input annotated `History` takes a list of OpenAI-style
messages. The output type is the one the program declares (``forward``'s return annotation, an
``LLMInference``'s response format or text, a `Signature`'s output fields), else any JSON.

A type pydantic cannot describe is served as any JSON rather than refused: the program still
checks what it receives, and the schema then says less, never something false.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    create_model,
    field_validator,
)
from pydantic_core import to_jsonable_python

from plait.backends.types import Usage
from plait.cli.programs import inputs_of, output_type_of
from plait.errors import ConfigError
from plait.execution.graph_cache import trace_cached
from plait.history import History
from plait.media import WITH_CONTENT
from plait.module import LLMInference, Module
from plait.signatures import Signature
from plait.values import ValueRef

__all__ = ["ChatForm", "PendingCall", "RunUsage", "ServedProgram", "json_data", "served_programs"]

ChatForm = Literal["history", "messages", "text"]
"""How a chat conversation reaches a program: a `History`, a list of message dicts (what an
``LLMInference`` takes as one conversation), or the text of the last user message."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _run_usage() -> type[BaseModel]:
    """Returns the schema of a run's ``usage``: what its `UsageMeter` counted (``as_dict``).

    Built from the meter's calls and the fields of `Usage` (the one record of usage,
    typed there), so the schema cannot drift from the record. It declares those; a
    body may carry more (the meter's ``refused``).
    """
    types = typing.get_type_hints(Usage) | {"calls": int}
    described = {
        "calls": "Calls that reached a model (cache hits excluded).",
        "cached": "Calls answered from a response cache.",
        "input_tokens": None,
        "output_tokens": None,
        "cost": "Dollars, at the endpoints' prices (0 when unknown).",
    }
    fields: dict[str, Any] = {
        name: (types[name], Field(description=text)) for name, text in described.items()
    }
    return create_model(
        "RunUsage", __doc__="The model calls one request made, and what they cost.", **fields
    )


RunUsage = _run_usage()


class PendingCall(BaseModel):
    """A tool call waiting for a person's approval."""

    approval_id: str = Field(description="The id of this pause; an approval is used once.")
    call_id: str = Field(description="The model's id of the tool call.")
    tool_name: str | None
    arguments: Any = Field(description="The call's arguments (an object when they were JSON).")
    question: str = Field(description="What to ask the person.")


class _Completed(BaseModel):
    """What every finished run answers besides its output; each program's result extends it."""

    run_id: str
    status: Literal["completed"]


class _Paused(BaseModel):
    """A run waiting for a person's approval; each program's paused answer is named for it
    and adds the run's ``usage`` (`RunUsage`)."""

    run_id: str
    status: Literal["paused"]
    program: str
    pending: list[PendingCall]


class ChatMessage(BaseModel):
    """One turn of a conversation, OpenAI-style: its content text, or parts of text."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        problem = _content_problem(content)
        if problem is not None:
            raise ValueError(problem)
        return content


def _content_problem(content: Any) -> str | None:
    """Returns why a turn's content cannot reach a served program, or None when it can.

    A conversation sent as JSON carries text: a part of another type (``image_url``,
    ``input_audio``, ``file``) has no plait value to become, so it is refused here, by the
    request's check, instead of failing the run on the server (a 500).
    """
    if not isinstance(content, list):
        return None
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text" or not isinstance(part.get("text"), str):
            return (
                f"part {index} is {kind!r}, not a text part: a conversation sent to a served "
                "program holds text ({'type': 'text', 'text': ...}); send an image or a file "
                "as an input of its own to a program that declares one"
            )
    return None


def _checked_conversation(value: Any) -> Any:
    """Returns the prompt of an `LLMInference` served as is; a conversation (a list of
    messages) is checked as `ChatMessage` checks its content.

    Raises:
        ValueError: a message holds a part that is not text, naming the message.
    """
    if isinstance(value, list):
        for index, message in enumerate(value):
            if isinstance(message, dict):
                problem = _content_problem(message.get("content"))
                if problem is not None:
                    raise ValueError(f"message {index}: {problem}")
    return value


@dataclass(frozen=True)
class ServedProgram:
    """One program mounted on the server under ``name``.

    Attributes:
        name: where it is mounted (``/programs/{name}/run``) and its model name on
            ``/v1/chat/completions``.
        module: the program.
        input_model: the request body: one field per input.
        output_type: the declared type of the output (``Any`` when none is declared).
        result_model: the body of a finished run (``run_id``, ``status``, ``output``, ``usage``).
        paused_model: the body of a run waiting for approval.
        chat_form: how a conversation reaches it, or None when it takes no conversation.
    """

    name: str
    module: Module
    input_model: type[BaseModel]
    output_type: Any
    result_model: type[BaseModel]
    paused_model: type[BaseModel]
    chat_form: ChatForm | None
    history_fields: frozenset[str]
    reply_field: str | None = ""
    """Which text field of the reply's module is the chat reply as it streams: ``""`` any
    (the output is text, or undeclared), a name (the output is that one text field), or
    None: the reply is the output as JSON, which no field's text spells, so it comes whole."""

    @classmethod
    def build(cls, name: str, module: Module) -> ServedProgram:
        """Returns ``module`` served as ``name``, its schemas derived from what it declares.

        Raises:
            ConfigError: the name cannot be a URL segment, or the program takes no input.
        """
        if not _NAME.match(name):
            raise ConfigError(
                f"program name {name!r} cannot be served: use letters, digits, '_', '.' or '-' "
                "(at most 64), starting with a letter or digit"
            )
        if not isinstance(module, Module):
            raise ConfigError(
                f"program {name!r} is a {type(module).__name__}, not a plait Module; serve a "
                "Module instance"
            )
        fields, histories = _input_fields(module)
        if not fields:
            raise ConfigError(f"program {name!r} takes no inputs, so a request has nothing to fill")
        prefix = _model_prefix(name)
        described = _input_descriptions(module)
        definitions: dict[str, Any] = {
            name: (annotation, Field(default, description=described.get(name)))
            for name, (annotation, default) in fields.items()
        }
        input_model = create_model(
            f"{prefix}Input", __config__=ConfigDict(extra="forbid"), **definitions
        )
        output_type = _describable(output_type_of(module))
        result_model = create_model(
            f"{prefix}Result",
            __base__=_Completed,
            output=(output_type, ...),
            usage=(RunUsage, ...),
        )
        paused_model = create_model(f"{prefix}Paused", __base__=_Paused, usage=(RunUsage, ...))
        return cls(
            name,
            module,
            input_model,
            output_type,
            result_model,
            paused_model,
            _chat_form(module, fields, histories),
            frozenset(histories),
            _reply_field(output_type),
        )

    def arguments(self, body: BaseModel) -> dict[str, Any]:
        """Returns the keyword arguments of ``forward`` for a validated request body."""
        arguments = {name: getattr(body, name) for name in body.model_fields_set}
        for name in self.history_fields & arguments.keys():
            turns = arguments[name]
            arguments[name] = History.from_list(
                turn.model_dump(exclude_none=True) for turn in turns
            )
        return arguments

    def chat_arguments(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """Returns the keyword arguments of ``forward`` for a chat conversation.

        Raises:
            ValueError: the program takes only text and the conversation has no user turn.
        """
        (name,) = self.input_model.model_fields
        if self.chat_form == "history":
            return {name: History.from_list(messages)}
        if self.chat_form == "messages":
            return {name: messages}
        for message in reversed(messages):
            if message.get("role") == "user":
                return {name: _text_of(message.get("content"))}
        raise ValueError("the conversation has no user message for the program to answer")

    def reply_streams(self, arguments: dict[str, Any]) -> tuple[Module, str] | None:
        """Returns the module and field whose streamed text is this run's chat reply as it
        is written (field ``""``: any), or None when the reply can only come whole.

        That module is the program itself, or, when its ``forward`` returns one inner call's
        output as it is (``return self.llm(history)``), that call's module, if the program
        calls it only there: the text of the other calls (a draft, a judge) is not the reply.
        """
        if self.reply_field is None:
            return None
        return _reply_module(self.module, arguments), self.reply_field

    def reply_text(self, output: Any) -> str:
        """Returns the output as the text of a chat reply: text as it is, a single text field
        as its text, anything else as JSON."""
        data = json_data(output)
        if isinstance(data, dict) and len(data) == 1:
            (only,) = data.values()
            if isinstance(only, str):
                return only
        if isinstance(data, str):
            return data

        return json.dumps(data, ensure_ascii=False)


def served_programs(programs: Any) -> list[ServedProgram]:
    """Returns the programs to mount: one Module (named after its class), a mapping of
    ``name -> Module``, or a list of Modules (named after their classes).

    Raises:
        ConfigError: no program, two programs with one name, or one that cannot be served.
    """
    if isinstance(programs, Module):
        pairs = [(type(programs).__name__, programs)]
    elif isinstance(programs, Mapping):
        pairs = [(str(name), module) for name, module in programs.items()]
    else:
        pairs = [(type(module).__name__, module) for module in programs]
    if not pairs:
        raise ConfigError("no program to serve; pass a Module, a list or a name -> Module mapping")
    names = [name for name, _ in pairs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(
            f"two programs are named {twice[0]!r}; give each its own name with "
            "{'name': program} (or NAME=PROGRAM on the command line)"
        )
    return [ServedProgram.build(name, module) for name, module in pairs]


def json_data(value: Any, *, content: bool = False) -> Any:
    """Returns a value as JSON data: a `Prediction` or mapping as an object, a `History` (also
    inside a mapping or list) as its messages, a pydantic model or dataclass as its fields,
    anything else JSON cannot hold as its text.

    Args:
        content: images, audio and documents as their content (a ``data:`` URI or their URL,
            what a request gives; `plait.media.as_data`) rather than their summary: the
            inputs a paused run keeps, to validate again when it is resumed.
    """
    if value is None or type(value) in _JSON_SCALARS:
        return value  # what most programs answer: as it is, without pydantic's walk
    if isinstance(value, History):
        return value.to_list()
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and isinstance(value, Mapping):
        value = to_dict()
    elif isinstance(value, Mapping):
        value = dict(value)
    if content:
        return to_jsonable_python(value, fallback=_json_fallback, context=WITH_CONTENT)
    return to_jsonable_python(value, fallback=_json_fallback)


_JSON_SCALARS = frozenset({str, int, float, bool})
"""Types JSON holds as they are (their subclasses, enums among them, go through pydantic)."""


def _json_fallback(value: Any) -> Any:
    """A `History` inside other data as its messages (so a stored request can be read back
    as one); any other value JSON cannot hold as its text."""
    if isinstance(value, History):
        return value.to_list()
    return str(value)


def _input_fields(module: Module) -> tuple[dict[str, Any], list[str]]:
    """Returns pydantic field definitions of the program's inputs, and those that are Histories."""
    inputs = inputs_of(module)
    annotations = _input_annotations(module)
    fields: dict[str, Any] = {}
    histories = []
    for name in inputs.names:
        annotation = annotations.get(name, Any)
        if _is_history(annotation):
            histories.append(name)
            annotation = list[ChatMessage]
        annotation = _describable(annotation)
        if isinstance(module, LLMInference):  # a conversation as a list of messages
            annotation = Annotated[annotation, AfterValidator(_checked_conversation)]
        default = ... if name in inputs.required else _default_of(module, name)
        fields[name] = (annotation, default)
    return fields, histories


def _input_descriptions(module: Module) -> dict[str, str]:
    """Returns the descriptions of the program's inputs that its `Signature` gives (so the
    OpenAPI schema says what each field is, as ``plait mcp``'s tool schema does)."""
    signature = getattr(module, "signature", None)
    if isinstance(signature, type) and issubclass(signature, Signature):
        return {n: s.description for n, s in signature.input_fields.items() if s.description}
    wrapped = getattr(module, "module", None)
    return _input_descriptions(wrapped) if isinstance(wrapped, Module) else {}


def _input_annotations(module: Module) -> dict[str, Any]:
    signature = getattr(module, "signature", None)
    if isinstance(signature, type) and issubclass(signature, Signature):
        specs = signature.input_fields
        if any(p.kind is p.VAR_KEYWORD for p in _parameters(module)):
            return {name: spec.annotation for name, spec in specs.items()}
    wrapped = getattr(module, "module", None)
    if isinstance(wrapped, Module) and any(p.kind is p.VAR_KEYWORD for p in _parameters(module)):
        return _input_annotations(wrapped)
    try:
        return typing.get_type_hints(type(module).forward)
    except Exception:  # an annotation naming something missing: take the ones that are types
        return {
            p.name: p.annotation
            for p in _parameters(module)
            if p.annotation is not p.empty and not isinstance(p.annotation, str)
        }


def _parameters(module: Module) -> list[inspect.Parameter]:
    return list(inspect.signature(module.forward).parameters.values())


def _default_of(module: Module, name: str) -> Any:
    parameter = inspect.signature(module.forward).parameters.get(name)
    if parameter is None or parameter.default is parameter.empty:
        return None
    return parameter.default


def _is_history(annotation: Any) -> bool:
    if annotation is History:
        return True
    return History in typing.get_args(annotation) and type(None) in typing.get_args(annotation)


def _describable(annotation: Any) -> Any:
    """Returns ``annotation`` when pydantic can validate and describe it, else ``Any``."""
    if annotation is inspect.Parameter.empty:
        return Any
    try:
        TypeAdapter(annotation).json_schema()
    except Exception:  # a class pydantic knows nothing about: served as any JSON
        return Any
    return annotation


def _reply_field(output_type: Any) -> str | None:
    """Returns `ServedProgram.reply_field` for a program's declared output type."""
    if output_type in (str, Any):
        return ""
    if isinstance(output_type, type) and issubclass(output_type, BaseModel):
        fields = output_type.model_fields
        if len(fields) == 1 and next(iter(fields.values())).annotation is str:
            return next(iter(fields))
    return None


def _reply_module(module: Module, arguments: dict[str, Any]) -> Module:
    """Returns the module whose output is the program's output as it is (see
    `ServedProgram.reply_streams`): the one call its traced graph returns, else itself."""
    try:
        graph = trace_cached(module, (), arguments)
    except Exception:  # not traceable here (the run will say why): stream its own text only
        return module
    node = graph.nodes.get(graph.output.ref) if isinstance(graph.output, ValueRef) else None
    if node is None or node.kind != "call":
        return module
    calls = [other for other in graph if other.kind == "call" and other.module is node.module]
    return node.module if len(calls) == 1 else module


def _chat_form(module: Module, fields: dict[str, Any], histories: list[str]) -> ChatForm | None:
    """Returns how a conversation reaches the program, or None: it must take exactly one
    required input, a History, a conversation (an ``LLMInference``) or text."""
    required = [name for name, (_, default) in fields.items() if default is ...]
    if len(fields) != 1 or len(required) != 1:
        return None
    if histories:
        return "history"
    if isinstance(module, LLMInference):
        return "messages"
    annotation = fields[required[0]][0]
    return "text" if annotation in (str, Any) else None


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _model_prefix(name: str) -> str:
    """Returns a schema name prefix from a program name: ``my-qa.v2`` -> ``MyQaV2``."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[_.-]+", name) if part)
