"""Tracer: turns a module's ``forward`` into one flat `InferenceGraph`.

Tracing calls ``forward`` with symbolic Values. Calls to *composite* children
are followed (their ``forward`` runs with the same symbolic inputs), so the
nesting of modules disappears and only *leaf* calls become nodes:

* `LLMInference` and other modules marked ``_plait_leaf``;
* modules with ``async def forward`` (they run eagerly, with real values);
* modules with no LLM call anywhere below them (plain Python, run as one step).

Strings that contain placeholders of traced values (f-strings, ``+``,
``"".join``, ``str(dict)``, ``json.dumps``) are recorded as `Template`
arguments, so the node reading them depends exactly on the nodes whose text it
consumes. Every string that reaches a module call or the output is searched
for what is left of a placeholder: text that holds one changed by some other
function (escaped, quoted, re-cased, wrapped) raises `TracingError` naming the
module and line, since its real text could not be put back at run time.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import os
import re
import sys
from types import FrameType
from typing import Any, NoReturn

from plait import _context
from plait.errors import TracingError
from plait.module import LLMInference, Module, has_own_backward, is_async_module
from plait.parameter import Parameter
from plait.tracing.graph import InferenceGraph, Node, Scope, Slot, Template
from plait.values import (
    JSON_TOKEN_REGEX,
    SYMBOLIC,
    TOKEN_DIGITS,
    TOKEN_REGEX,
    Value,
    ValueKind,
    ValueRef,
    symbolic,
)

__all__ = ["MAX_INPUT_DEPTH", "Tracer", "input_signature", "is_leaf_module"]

_PLAIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_leaf_module(module: Module) -> bool:
    """Whether tracing records ``module`` as one node instead of following its forward."""
    return module._plait_leaf or is_async_module(module) or not _calls_llm(module)


def _calls_llm(module: Module) -> bool:
    """Whether any module below ``module`` may call an LLM (an LLMInference or async leaf)."""
    return any(
        isinstance(m, LLMInference) or (m is not module and is_async_module(m))
        for m in module.modules()
    )


MAX_INPUT_DEPTH = 100
"""Most containers (lists, tuples, dicts) an input may nest inside each other.

Tracing walks inputs recursively, so without a limit a deep or self-containing
structure ends in a bare ``RecursionError`` somewhere inside plait; real inputs
are a few levels deep."""


class _TooDeep(Exception):
    """Raised inside `_shape` when an input nests deeper than `MAX_INPUT_DEPTH`."""


def input_signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Returns a hashable description of the shape of call arguments.

    Text and unknown objects become inputs of the graph (only their position
    matters); numbers, booleans and None are baked into the graph as
    constants, so their values are part of the signature.

    Raises:
        TracingError: an argument nests containers more than `MAX_INPUT_DEPTH` deep.
    """
    try:
        return (
            tuple(_shape(a, 0) for a in args),
            tuple((k, _shape(v, 0)) for k, v in kwargs.items()),
        )
    except _TooDeep:
        arguments = [(f"positional argument {i}", f"args[{i}]", a) for i, a in enumerate(args)]
        arguments += [(f"argument {k!r}", k, v) for k, v in kwargs.items()]
        for label, name, value in arguments:
            keys = _deep_path(value)
            if keys is not None:
                raise _too_deep(label, name, keys) from None
        raise  # unreachable: some argument was too deep


def _shape(x: Any, depth: int) -> Any:
    if isinstance(x, str | Value):
        return "v"
    if isinstance(x, bool | int | float | type(None)):
        return ("c", type(x).__name__, x)
    if isinstance(x, list | tuple | dict) and depth >= MAX_INPUT_DEPTH:
        raise _TooDeep
    if isinstance(x, list):
        return ("l", *(_shape(item, depth + 1) for item in x))
    if isinstance(x, tuple):
        return ("t", *(_shape(item, depth + 1) for item in x))
    if isinstance(x, dict):
        return ("d", *((k, _shape(v, depth + 1)) for k, v in x.items()))
    return "v"


def _deep_path(value: Any) -> list[Any] | None:
    """Returns the keys down to the first container nested `MAX_INPUT_DEPTH` deep, if any.

    Iterative, so it works on the very structures that are too deep to recurse into.
    """
    stack: list[tuple[Any, list[Any]]] = [(value, [])]
    while stack:
        item, keys = stack.pop()
        if not isinstance(item, list | tuple | dict):
            continue
        if len(keys) >= MAX_INPUT_DEPTH:
            return keys
        children = list(item.items() if isinstance(item, dict) else enumerate(item))
        stack.extend((child, [*keys, key]) for key, child in reversed(children))
    return None


def _too_deep(label: str, name: str, keys: list[Any]) -> TracingError:
    """Returns the error for argument ``name`` nested deeper than `MAX_INPUT_DEPTH` at ``keys``."""
    shown = name + "".join(f"[{key!r}]" for key in keys[:6]) + ("[…]" if len(keys) > 6 else "")
    return TracingError(
        f"{label} nests lists, tuples or dicts more than {MAX_INPUT_DEPTH} levels deep "
        f"(at {shown}, level {len(keys) + 1}); plait walks every level of an input "
        "while tracing, so it refuses structures this deep or that contain themselves. "
        "Flatten the structure, or pass it as one value (e.g. JSON text)."
    )


class Tracer:
    """Records the graph of a module.

    Example::

        graph = Tracer().trace(DeepPipeline(), "a long document")
        [n.module_path for n in graph.llm_nodes()]
        # ['stage1.summarizer', 'stage1.analyzer', 'stage2.technical', ...]
    """

    def trace(self, module: Module, *args: Any, **kwargs: Any) -> InferenceGraph:
        """Traces ``module.forward(*args, **kwargs)`` into a graph.

        Text arguments become input nodes; numbers, booleans and None are
        constants of the graph. Raises `TracingError` when ``forward`` makes a
        Python decision on a traced value.
        """
        session = _TraceSession(module)
        token = _context.TRACE.set(session)
        try:
            symbolic_args, symbolic_kwargs = session.bind_inputs(args, kwargs)
            output = session.record_call(module, symbolic_args, symbolic_kwargs, root=True)
        finally:
            _context.TRACE.reset(token)
        return session.finish(output)


class _TraceSession:
    """State of one trace: node table, module paths, the stack of modules being followed."""

    def __init__(self, root: Module) -> None:
        self.root = root
        self.nodes: dict[str, Node] = {}
        self.input_ids: list[str] = []
        self.module_paths = {id(m): path for path, m in root.named_modules()}
        self.param_paths = {id(p): name for name, p in root.named_parameters()}
        self.scope: list[str] = []
        self.scopes: list[Scope] = []
        self._in_override = False
        self._leaf_cache: dict[int, bool] = {}
        self._id_counts: dict[str, int] = {}
        self._sites: dict[tuple[str, int], str] = {}
        """Cache of ``file.py:line`` by (filename, line) of frames outside plait."""

    # ----------------------------------------------------------------- inputs
    def bind_inputs(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Replaces text arguments by symbolic input Values, keeping structure."""
        try:
            bound = inspect.signature(self.root.forward).bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{type(self.root).__name__}.forward(): {exc}") from None
        params = inspect.signature(self.root.forward).parameters
        for name, value in list(bound.arguments.items()):
            if params[name].kind is inspect.Parameter.VAR_POSITIONAL:
                bound.arguments[name] = tuple(
                    self._symbolize(v, (name, i)) for i, v in enumerate(value)
                )
            elif params[name].kind is inspect.Parameter.VAR_KEYWORD:
                bound.arguments[name] = {k: self._symbolize(v, (name, k)) for k, v in value.items()}
            else:
                bound.arguments[name] = self._symbolize(value, (name,))
        return bound.args, bound.kwargs

    def _symbolize(self, x: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(x, bool | int | float | type(None)):
            return x
        if isinstance(x, list | tuple | dict) and len(path) > MAX_INPUT_DEPTH:
            raise _too_deep(f"argument {path[0]!r}", path[0], list(path[1:]))
        if isinstance(x, list | tuple) and not hasattr(x, "_fields"):
            items = [self._symbolize(item, (*path, i)) for i, item in enumerate(x)]
            return items if isinstance(x, list) else tuple(items)
        if isinstance(x, dict):
            return {k: self._symbolize(v, (*path, k)) for k, v in x.items()}
        node_id = "input:" + ".".join(str(p) for p in path)
        self.nodes[node_id] = Node(id=node_id, kind="input", name="input", input_path=path)
        self.input_ids.append(node_id)
        kind = x.kind if isinstance(x, Value) else _kind_of(x)
        return symbolic(kind, node_id)

    # ------------------------------------------------------------------ calls
    def record_call(
        self, module: Module, args: tuple[Any, ...], kwargs: dict[str, Any], root: bool = False
    ) -> Any:
        """Records a leaf call as a node, or follows a composite's forward."""
        path = self._path_of(module)
        if self._is_leaf(module):
            return self._add_node("call", path, module, None, args, kwargs)
        if not self._in_override and has_own_backward(module):
            return self._record_scope(module, path, args, kwargs)
        self.scope.append(path)
        try:
            return module.forward(*args, **kwargs)
        finally:
            self.scope.pop()

    def _record_scope(
        self, module: Module, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Follows a composite that overrides ``backward``, noting its inputs, output and nodes."""
        first = len(self.nodes)
        self.scope.append(path)
        self._in_override = True
        try:
            output = module.forward(*args, **kwargs)
        finally:
            self._in_override = False
            self.scope.pop()
        refs: dict[str, None] = {}
        try:
            recorded = (
                tuple(self._record(a, refs) for a in args),
                {k: self._record(v, refs) for k, v in kwargs.items()},
                self._record(output, refs),
            )
        except _DamagedToken:
            self.fail_damaged(path or type(module).__name__)
        node_ids = tuple(list(self.nodes)[first:])
        self.scopes.append(
            Scope(f"backward:{path or type(module).__name__}", module, path, *recorded, node_ids)
        )
        return output

    def record_op(self, name: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
        """Records one functional-op node."""
        return self._add_node(
            "op", self.scope[-1] if self.scope else "", None, (name, fn), args, kwargs
        )

    def _add_node(
        self,
        kind: str,
        path: str,
        module: Module | None,
        op: tuple[str, Any] | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Value:
        # Refs are gathered while recording (one pass, no generators): this is
        # the hot path of tracing, run once per node (benchmarks/trace_bench.py).
        refs: dict[str, None] = {}
        record = self._record
        try:
            rec_args = tuple([record(a, refs) for a in args])
            rec_kwargs = {k: record(v, refs) for k, v in kwargs.items()}
        except _DamagedToken:
            self.fail_damaged(op[0] if op is not None else path or type(module).__name__)
        deps: list[str] = []
        params: list[str] = []
        for ref in refs:
            (params if ref.startswith("param:") else deps).append(ref)
        if op is not None:
            base, name, fn = op[0], op[0], op[1]
        else:
            assert module is not None
            base, name, fn = path or type(module).__name__, type(module).__name__, None
        node_id = self._unique(base)
        self.nodes[node_id] = Node(
            id=node_id,
            kind=kind,  # type: ignore[arg-type]
            module=module,
            module_path=path,
            args=rec_args,
            kwargs=rec_kwargs,
            dependencies=tuple(deps),
            parameters=tuple(params),
            op=fn,
            name=name,
            source=self._call_site(),
        )
        return symbolic(_output_kind(module), node_id)

    def _unique(self, base: str) -> str:
        """Returns ``base``, or ``base_2``, ``base_3`` … for repeats, never an id already taken.

        A module may itself be called ``llm_2``; its id must not collide with
        the second call of ``llm``.
        """
        count = self._id_counts.get(base, 0) + 1
        node_id = base if count == 1 else f"{base}_{count}"
        while node_id in self.nodes:
            count += 1
            node_id = f"{base}_{count}"
        self._id_counts[base] = count
        return node_id

    def _is_leaf(self, module: Module) -> bool:
        cached = self._leaf_cache.get(id(module))
        if cached is None:
            cached = self._leaf_cache[id(module)] = is_leaf_module(module)
        return cached

    def _path_of(self, module: Module) -> str:
        path = self.module_paths.get(id(module))
        if path is not None:
            return path
        # A module built inside forward or passed in: name it under the caller.
        scope = self.scope[-1] if self.scope else ""
        local = module._name or type(module).__name__.lower()
        return f"{scope}.{local}" if scope else local

    # ------------------------------------------------------- recorded values
    def _record(self, x: Any, refs: dict[str, None]) -> Any:
        """Returns the recorded form of an argument (refs, templates, constants).

        Adds the refs it reads to ``refs``, in the order `iter_refs` would yield them.
        Raises `_DamagedToken` for text holding what is left of a placeholder token.
        """
        if isinstance(x, Value):
            ref = x.ref
            if x.payload is SYMBOLIC or (ref is not None and ref.startswith("param:")):
                refs[ref] = None  # type: ignore[index]
                return ValueRef(ref)  # type: ignore[arg-type]
            if isinstance(x.payload, list | tuple | dict):
                # A record built in forward around traced data, such as
                # valueify({"text": text}), reads that data: its payload is
                # recorded in its place, so the node gets the data itself,
                # as it gets every traced result (a payload, not a Value).
                inner: dict[str, None] = {}
                recorded = self._record(x.payload, inner)
                if inner:
                    refs.update(inner)
                    return recorded
            return x
        if isinstance(x, str):
            # The fast path of every string a module receives: a token's digits
            # survive any escaping or case change, its private-use marks survive
            # the rest; checking for an ASCII string's lack of them costs ~nothing.
            if "\ue000" not in x and "\ue001" not in x and TOKEN_DIGITS not in x:
                return x
            recorded = _template_of(x)
            if isinstance(recorded, Template):
                for part in recorded.parts:
                    if isinstance(part, Slot):
                        refs[part.ref] = None
            return recorded
        if isinstance(x, Parameter):
            ref = self.param_ref(x)
            refs[ref] = None
            return ValueRef(ref)
        if isinstance(x, list):
            return [self._record(item, refs) for item in x]
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return tuple([self._record(item, refs) for item in x])
        if isinstance(x, dict):
            return {_checked_key(k): self._record(v, refs) for k, v in x.items()}
        if isinstance(x, bytes | bytearray) and _TOKEN_DIGITS_BYTES in x:
            raise _DamagedToken  # text built from a traced value, encoded
        return x

    def param_ref(self, param: Any) -> str:
        name = self.param_paths.get(id(param))
        if name is None:
            name = param.name
        return f"param:{name}"

    def finish(self, output: Any) -> InferenceGraph:
        """Builds the graph once forward returned ``output``."""
        refs: dict[str, None] = {}
        try:
            recorded = self._record(output, refs)
        except _DamagedToken:
            self.fail_damaged(None)
        return InferenceGraph(
            self.nodes,
            self.input_ids,
            recorded,
            list(refs),
            root=self.root,
            scopes=tuple(self.scopes),
        )

    # ----------------------------------------------------------------- errors
    def fail(self, value: Value, action: str) -> NoReturn:
        """Raises TracingError for a Python decision on a traced value."""
        where, line = self._location()
        source = self.nodes[value.ref].id if value.ref in self.nodes else value.ref
        message = (
            f"{where} used a traced value in {action}; its value "
            f"(the output of {source}) is unknown until run time. Make `forward` async "
            "(`async def forward`) to work with real values, or express the step with an "
            "`F.*` op (F.select, F.coerce, F.map_values, F.unwrap_or, ...)."
        )
        raise TracingError(message + (f"\n    {line}" if line else ""))

    def fail_damaged(self, target: str | None) -> NoReturn:
        """Raises TracingError for text holding a placeholder token that was escaped or changed.

        Args:
            target: the node the text was passed to (None: ``forward`` returned it).
        """
        if target is None:  # forward has returned: no line of it is running any more
            where, line, what = type(self.root).__name__, None, "returned"
        else:
            (where, line), what = self._location(), f"passed {target}"
        message = (
            f"{where} {what} a string in which a traced value's placeholder was changed by an "
            "escaping or transforming function, so plait cannot put the real text in at run "
            "time. Likely culprits: repr() or str() of a container holding a string built "
            "from a traced value, urllib.parse.quote, html.escape, textwrap, .upper(), "
            ".lower(), .split() or .encode() of such a string; only f-strings, str.format, "
            "+, join and json.dumps keep traced text intact. Make `forward` async (`async def "
            "forward`) to work with real values, or express the step with an `F.*` op."
        )
        raise TracingError(message + (f"\n    {line}" if line else ""))

    def _location(self) -> tuple[str, str | None]:
        """Returns "<module path> (<file:line>)" of the user code running, and its source."""
        where = (self.scope[-1] if self.scope else "") or type(self.root).__name__
        site, line, inside = _user_site()
        if inside:
            site = f"{site or 'unknown line'}, inside {inside}"
        return f"{where} ({site or 'unknown line'})", line

    def _call_site(self) -> str | None:
        """Returns ``file.py:line`` of the innermost frame outside plait (the user's call)."""
        frame: FrameType | None = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            key = (code.co_filename, frame.f_lineno)
            site = self._sites.get(key)
            if site is not None:
                return site
            if not code.co_filename.startswith(_PLAIT_DIR):
                site = self._sites[key] = f"{os.path.basename(code.co_filename)}:{frame.f_lineno}"
                return site
            frame = frame.f_back
        return None


def _user_site() -> tuple[str | None, str | None, str | None]:
    """Returns ``file.py:line`` and the code of the innermost user frame, and the library
    function it called, if the frame below it is in the standard library.

    ``html.escape(traced)`` fails inside the ``html`` module; the user wants to see their
    own line and what it called, not ``__init__.py:19``.
    """
    frame: FrameType | None = sys._getframe(1)
    inside: str | None = None
    fallback: Any = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PLAIT_DIR):
            fallback = fallback or frame
            if not _is_stdlib(filename):
                line = linecache.getline(filename, frame.f_lineno).strip()
                return f"{os.path.basename(filename)}:{frame.f_lineno}", line or None, inside
            module = frame.f_globals.get("__name__", "")
            inside = f"{module}.{frame.f_code.co_qualname}" if module else frame.f_code.co_name
        frame = frame.f_back
    if fallback is None:
        return None, None, None
    filename = fallback.f_code.co_filename
    line = linecache.getline(filename, fallback.f_lineno).strip()
    return f"{os.path.basename(filename)}:{fallback.f_lineno}", line or None, None


@functools.cache
def _stdlib_dirs() -> tuple[str, ...]:
    import sysconfig  # import time: only for an error's message (~14 ms in a cold process)

    paths = {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
    return tuple(os.path.join(path, "") for path in paths if path)


def _is_stdlib(filename: str) -> bool:
    if filename.startswith("<frozen "):
        return True
    if "site-packages" in filename or "dist-packages" in filename:
        return False
    return filename.startswith(_stdlib_dirs())


_TOKEN_DIGITS_BYTES = TOKEN_DIGITS.encode()
TOKEN_PATTERN = re.compile(TOKEN_REGEX)
"""A placeholder token (`plait.values.TOKEN_REGEX`)."""
JSON_TOKEN_PATTERN = re.compile(JSON_TOKEN_REGEX)
"""A placeholder token inside a JSON string (`plait.values.JSON_TOKEN_REGEX`)."""


class _DamagedToken(Exception):
    """Raised while recording when text holds what is left of a token, not a whole one."""


def _template_of(text: str) -> str | Template:
    """Returns ``text`` as a `Template` of its tokens (plain or JSON-escaped), or as is.

    Raises `_DamagedToken` when a piece between the tokens still holds a token's
    marks or digits: some other function escaped or transformed a token.
    """
    parts: list[str | Slot] = []
    last = 0
    for match in TOKEN_PATTERN.finditer(text):  # inline: the hot path of string building
        start = match.start()
        if start > last:
            _add_literal(parts, text[last:start])
        mode, spec, ref = match.groups()
        parts.append(Slot(ref, mode, spec))
        last = match.end()
    if last < len(text):
        _add_literal(parts, text[last:])
    if len(parts) == 1 and isinstance(parts[0], str):
        return text
    return Template(tuple(parts))


def _add_literal(parts: list[str | Slot], piece: str) -> None:
    """Appends the text between plain tokens, with the JSON-escaped tokens it holds as slots.

    Raises `_DamagedToken` when the text left around them still holds a token's marks.
    """
    if not _holds_mark(piece):
        parts.append(piece)
        return
    last = 0
    for match in JSON_TOKEN_PATTERN.finditer(piece):
        made = _json_slot(match, piece)
        if made is None:
            continue  # left in the text, so reported as damaged
        slot, start, end = made
        if _holds_mark(piece[last:start]):
            raise _DamagedToken
        if start > last:
            parts.append(piece[last:start])
        parts.append(slot)
        last = end
    if _holds_mark(piece[last:]):
        raise _DamagedToken
    if last < len(piece):
        parts.append(piece[last:])


def _holds_mark(text: str) -> bool:
    """Whether ``text`` holds a token's private-use marks or digits, whole or not."""
    return "\ue000" in text or "\ue001" in text or TOKEN_DIGITS in text


def _json_slot(match: re.Match[str], text: str) -> tuple[Slot, int, int] | None:
    """Returns the slot of a JSON-escaped token, taking in its quotes when it is a whole string."""
    import json  # import time: only text with JSON-escaped tokens, which few programs build

    opening, mode, escaped = match.groups()
    try:
        spec, ref = json.loads(f'"{escaped}"').split("|", 1)
    except ValueError:
        return None  # not what json.dumps writes: left as text, reported as damaged
    encoding = "unicode" if opening == "\ue000" else "ascii"
    start, end = match.start(), match.end()
    if _is_quoted(text, start, end):
        return Slot(ref, mode, spec, json=encoding, quoted=True), start - 1, end + 1
    return Slot(ref, mode, spec, json=encoding), start, end


def _is_quoted(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is a whole JSON string: an unescaped quote on each side."""
    if start == 0 or end == len(text) or text[start - 1] != '"' or text[end] != '"':
        return False
    backslashes = len(text[: start - 1]) - len(text[: start - 1].rstrip("\\"))
    return backslashes % 2 == 0


def _checked_key(key: Any) -> Any:
    """Returns a dict key of a recorded argument; a key built from a traced value is refused.

    Keys are not substituted at run time, so such a key would reach the module as a token.
    """
    if isinstance(key, str) and _holds_mark(key):
        raise _DamagedToken
    return key


def _kind_of(x: Any) -> ValueKind:
    return ValueKind.TEXT if isinstance(x, str) else ValueKind.STRUCTURED


def _output_kind(module: Module | None) -> ValueKind:
    if isinstance(module, LLMInference):
        return ValueKind.RESPONSE if module.response_format is None else ValueKind.STRUCTURED
    return ValueKind.OTHER
