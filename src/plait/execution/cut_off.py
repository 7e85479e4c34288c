"""A reply cut off at its token limit, as an error that names the field and the fix.

A typed reply or a tool call whose reply ended with ``finish_reason`` "length" is unusable
(half a JSON object, half a tool's arguments). `cut_off_error` says where it was cut: it
reads the unfinished text for the field (or tool argument) that was still being written,
and names it only when the request's own schema or fields know that name, so the message
is plait's text with nothing the model wrote (a server may show it to its clients).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from plait.backends.types import Request, Response
from plait.errors import ReplyCutOffError

__all__ = ["cut_off_error", "open_field"]

_LENGTH_HINT = "Annotated[str, Field(max_length=...)]"


def cut_off_error(
    label: str, request: Request, response: Response, fields: Iterable[str] = ()
) -> ReplyCutOffError:
    """Returns the error of ``response``, cut off at its limit, for the step ``label``.

    Args:
        label: names the step ("ReAct (question -> answer)", "alias 'llm'").
        request: the request the reply answers (its ``max_tokens``, schema and tools).
        response: the reply that ended with ``finish_reason`` "length".
        fields: the step's output field names (for replies written without a schema).
    """
    limit = request.options.max_tokens
    tool = ""
    forced = next((t for t in request.tools if t.name == request.tool_choice), None)
    if response.tool_calls or forced is not None:
        # the last call is the one being written; a forced call a backend could not read
        # back as a call (its JSON unfinished) is still that tool's, its text the arguments
        name = response.tool_calls[-1].name if response.tool_calls else request.tool_choice
        spec = next((t for t in request.tools if t.name == name), None)
        tool = spec.name if spec is not None else ""
        known = set(_property_names(spec.parameters)) if spec is not None else set()
        text = response.tool_calls[-1].arguments if response.tool_calls else response.text
        field = open_field(text, known)
        where = f"a call of tool {tool!r}" if tool else "a tool call"
        if field:
            where = f"argument {field!r} of {where}"
    else:
        known = set(fields)
        if request.response_schema is not None:
            known.update(_property_names(request.response_schema.schema))
        field = open_field(response.text, known)
        where = f"field {field!r}" if field else "the reply"
    said = f"max_tokens={limit}" if limit is not None else "the provider's default max_tokens"
    used = response.usage.output_tokens
    at = f" ({used} tokens)" if used else ""
    fix = f"raise max_tokens{f' above {limit}' if limit is not None else ''}"
    shorter = f"give {field!r} a length limit ({_LENGTH_HINT})" if field else "ask for less"
    reason = (
        f"the reply was cut off at the token limit, {said}{at}, while writing {where}; "
        f"{fix}, or {shorter}"
    )
    return ReplyCutOffError(
        f"{label}: {reason}",
        reason=reason,
        raw=response.text,
        field=field,
        tool=tool,
        limit=limit,
    )


def open_field(text: str, known: set[str]) -> str:
    """Returns the dotted path of the field still being written where ``text`` ends.

    ``text`` is an unfinished JSON object (``{"a": {"b": "unfini``: ``a.b``) or a reply of
    ``[[ ## name ## ]]`` sections (the last header's name). A name not in ``known`` ends
    the path there; "" when no known field was open.
    """
    start = text.find("{")
    if start >= 0:
        path = []
        for key in _open_keys(text, start):
            if key not in known:
                break
            path.append(key)
        return ".".join(path)
    header = text.rfind("[[ ## ")
    if header >= 0:
        name = text[header + 6 :].split(" ## ]]", 1)[0].strip()
        return name if name in known else ""
    return ""


def _open_keys(text: str, start: int) -> list[str]:
    """Returns the keys of the objects that are open where ``text`` ends, outermost first,
    each one's only when its value was being written (after its colon)."""
    frames: list[list[Any]] = []  # [kind, key, after_colon]
    i, n = start, len(text)
    while i < n:
        char = text[i]
        if char == '"':
            end = _string_end(text, i + 1)
            if frames and frames[-1][0] == "{" and not frames[-1][2]:
                frames[-1][1] = text[i + 1 : end]
            i = end + 1
            continue
        if char in "{[":
            frames.append([char, None, False])
        elif char in "}]":
            if frames:
                frames.pop()
        elif char == ":" and frames and frames[-1][0] == "{":
            frames[-1][2] = True
        elif char == "," and frames and frames[-1][0] == "{":
            frames[-1][1], frames[-1][2] = None, False
        i += 1
    return [frame[1] for frame in frames if frame[0] == "{" and frame[2] and frame[1]]


def _string_end(text: str, i: int) -> int:
    """Returns the index of the quote closing a JSON string that starts at ``i`` (or the
    text's end when the string is unfinished)."""
    n = len(text)
    while i < n:
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i
        i += 1
    return n


def _property_names(schema: Any) -> Iterator[str]:
    """Yields every property name a JSON schema declares, at any depth."""
    if isinstance(schema, dict):
        properties = schema.get("properties")
        if isinstance(properties, dict):
            yield from (name for name in properties if isinstance(name, str))
        for value in schema.values():
            yield from _property_names(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _property_names(item)
