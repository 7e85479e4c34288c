"""`bind_method` agrees with `inspect.Signature.bind` on every call, fitting or not."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from plait.execution.binding import bind_method


class Program:
    def plain(self, text, kind="short", *, tone="calm"): ...
    def required_keyword(self, text, *, tone): ...
    def positional_only(self, text, /, kind="k"): ...
    def variadic(self, text, *rest, **more): ...
    def nothing(self): ...


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    (("a",), {}),
    (("a", "b"), {}),
    (("a", "b", "c"), {}),
    ((), {"text": "a"}),
    (("a",), {"kind": "b", "tone": "c"}),
    (("a",), {"text": "again"}),
    ((), {"text": "a", "tone": "c"}),
    ((), {"unknown": 1}),
    (("a",), {"tone": "c", "extra": 2}),
]


def expected(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        bound = inspect.signature(function).bind(Program(), *args, **kwargs).arguments
    except TypeError:
        return TypeError
    return {name: value for name, value in bound.items() if name != "self"}


METHODS = ["plain", "required_keyword", "positional_only", "variadic", "nothing"]


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_bind_method_gives_what_inspect_gives(name, args, kwargs):
    function = getattr(Program, name)
    want = expected(function, args, kwargs)
    if want is TypeError:
        with pytest.raises(TypeError):
            bind_method(function, Program(), args, kwargs)
    else:
        assert bind_method(function, Program(), args, kwargs) == want
