"""A method call's arguments by parameter name, read from its signature once, not per call.

`inspect.Signature.bind` costs a few microseconds a call, and every run binds its inputs
(``program(text=...)`` and served requests bind by keyword); for a method whose
parameters after ``self`` are plain (no ``*args`` or ``**kwargs``) the names are read once
per function and a call's arguments are matched to them directly. A call that does not
fit so (or a method that is not plain) goes through `inspect.Signature.bind`, which says
what is wrong in its `TypeError`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, NamedTuple

__all__ = ["bind_method"]


class _Binder(NamedTuple):
    signature: inspect.Signature
    positional: tuple[str, ...] | None
    """Names given by position, after ``self``; None: not a plain method."""
    keywords: frozenset[str]
    """Names that may be given by keyword."""
    required: frozenset[str]
    """Names without a default."""


@functools.lru_cache(maxsize=256)
def _binder(function: Any) -> _Binder:
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())
    plain = bool(parameters) and parameters[0].kind != parameters[0].VAR_POSITIONAL
    positional, keywords, required = [], set(), set()
    for parameter in parameters[1:]:
        kind = parameter.kind
        if kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            plain = False
        if kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            positional.append(parameter.name)
        if kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            keywords.add(parameter.name)
        if parameter.default is parameter.empty:
            required.add(parameter.name)
    return _Binder(
        signature,
        tuple(positional) if plain else None,
        frozenset(keywords),
        frozenset(required),
    )


def bind_method(
    function: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Returns the arguments of ``function(instance, *args, **kwargs)`` by name, ``self``
    left out, as `inspect.Signature.bind` gives them (defaults not filled in).

    Raises:
        TypeError: the arguments do not fit the method's parameters.
    """
    binder = _binder(function)
    names = binder.positional
    if names is not None and len(args) <= len(names):
        arguments = dict(zip(names, args, strict=False))
        fits = True
        for name, value in kwargs.items():
            if name not in binder.keywords or name in arguments:
                fits = False
                break
            arguments[name] = value
        if fits and binder.required <= arguments.keys():
            return arguments
    bound = binder.signature.bind(instance, *args, **kwargs).arguments
    first = next(iter(binder.signature.parameters), None)
    return {name: value for name, value in bound.items() if name != first}
