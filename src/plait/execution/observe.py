"""Module calls told to callbacks: the whole program, each graph node, each child of a leaf.

A traced program has no "calls" of its composite modules at run time (their
``forward`` ran once, while tracing); what runs is the program itself, its
leaf nodes, and the children an ``async def forward`` leaf calls. Each of
those is one module call for the callbacks, and everything inside it (LLM
calls, tools, adapters, child calls) sees the callbacks of that call: the
settings' plus the module's own ``callbacks``.

With no callbacks anywhere the cost is a context lookup and an attribute
read per node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from plait import _context
from plait.callbacks import ReportedCall, active_callbacks, callbacks_for
from plait.execution.binding import bind_method
from plait.module import LLMInference

__all__ = ["module_inputs", "observed", "observed_sync", "resolve_callbacks"]

T = TypeVar("T")


def resolve_callbacks() -> Any:
    """Fixes the callbacks of a run in its context (so nodes need not read settings); a token."""
    return _context.CALLBACKS.set(active_callbacks())


def module_inputs(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Returns a module call's arguments by name, as ``on_module_start`` receives them."""
    if isinstance(module, LLMInference):
        prompt = args[0] if args else kwargs.get("prompt", next(iter(kwargs.values()), None))
        return {"prompt": prompt}
    try:
        return bind_method(type(module).forward, module, args, kwargs)
    except TypeError:
        return {"args": args, **kwargs}


async def observed(
    module: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    run: Callable[[], Awaitable[T]],
    path: str = "",
    reported: Callable[[T], Any] = lambda result: result,
) -> T:
    """Awaits ``run()`` as one call of ``module`` (named ``path``), told to its callbacks.

    ``reported`` picks what the callbacks are told the call returned.
    """
    callbacks = callbacks_for(module)
    if not callbacks:
        return await run()
    with _module_call(module, args, kwargs, callbacks, path) as call:
        result = await run()
        call.outputs = reported(result)
    return result


def observed_sync(
    module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run: Callable[[], T], path: str = ""
) -> T:
    """`observed` for a plain-Python leaf, which runs inline."""
    callbacks = callbacks_for(module)
    if not callbacks:
        return run()
    with _module_call(module, args, kwargs, callbacks, path) as call:
        result = call.outputs = run()
    return result


@contextlib.contextmanager
def _module_call(
    module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], callbacks: Any, path: str
) -> Iterator[ReportedCall]:
    """One module call told to ``callbacks``; inside it, ``call_path()`` names the module.

    The module's callbacks become the active ones inside the block, so the
    calls it contains (LLM, tools, adapters) are told to them too.
    """
    path_token = _context.CALL_PATH.set(path or getattr(module, "_name", None) or "")
    try:
        inputs = module_inputs(module, args, kwargs)
        with ReportedCall("module", module, inputs, callbacks) as call:
            callbacks_token = _context.CALLBACKS.set(callbacks)
            try:
                yield call
            finally:
                _context.CALLBACKS.reset(callbacks_token)
    finally:
        _context.CALL_PATH.reset(path_token)
