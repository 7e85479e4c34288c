"""Tools: schemas from type hints and descriptions, calls that never crash the agent loop."""

from __future__ import annotations

import asyncio
import enum
import threading
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

from plait import Tool, tool
from plait.backends.types import ToolSpec
from plait.tools import ToolResult


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(BaseModel):
    city: str
    title: str = ""  # a *property* called title must survive title-stripping


@tool
def weather(
    place: Place,
    unit: Unit = Unit.CELSIUS,
    days: Annotated[int, Field(description="How many days ahead.", ge=0, le=7)] = 0,
) -> dict[str, object]:
    """Returns the forecast for a place.

    Args:
        place: Where to look.
        unit: Temperature unit,
            celsius by default.
        days: Overridden by the Field description.

    Returns:
        The forecast.
    """
    return {"city": place.city, "unit": unit.value, "days": days, "temp": 21}


def test_schema_comes_from_hints_field_and_docstring() -> None:
    schema = weather.parameters
    props = schema["properties"]
    assert schema["type"] == "object"
    assert schema["required"] == ["place"]
    assert props["days"] == {
        "description": "How many days ahead.",
        "default": 0,
        "maximum": 7,
        "minimum": 0,
        "type": "integer",
    }
    assert props["unit"]["description"] == "Temperature unit, celsius by default."
    assert props["place"]["description"] == "Where to look."
    place = schema["$defs"]["Place"]
    assert set(place["properties"]) == {"city", "title"}  # property named title kept
    assert "title" not in place and "title" not in props["days"]  # generated titles dropped
    assert weather.description == "Returns the forecast for a place."


def test_spec_is_a_toolspec_and_names_and_descriptions_can_be_given() -> None:
    @tool(name="lookup-v2", description="Finds a thing.")
    def lookup(key: str) -> str:
        """Ignored docstring."""
        return key

    assert lookup.spec == ToolSpec(
        name="lookup-v2",
        description="Finds a thing.",
        parameters={
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
            "type": "object",
        },
    )
    manual = Tool(lookup.func, name="find")
    assert manual.name == "find" and manual.description == "Ignored docstring."


def test_field_default_and_literal_and_reserved_names() -> None:
    @tool
    def save(
        json: str = Field(description="Body to save."),
        copy: bool = False,
        mode: Literal["append", "replace"] = "append",
    ) -> str:
        return f"{json}:{copy}:{mode}"

    props = save.parameters["properties"]
    assert props["json"] == {"description": "Body to save.", "type": "string"}
    assert props["mode"]["enum"] == ["append", "replace"]
    assert save.parameters["required"] == ["json"]
    result = asyncio.run(save.call({"json": "x", "copy": True}))
    assert result.ok and result.content == "x:True:append"


async def test_sync_and_async_tools_run_and_render_results() -> None:
    @tool
    async def slow_add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    assert slow_add.is_async and not weather.is_async
    result = await slow_add.call('{"a": 2, "b": "3"}', call_id="call_7")
    assert result == ToolResult("slow_add", "5", value=5, call_id="call_7")
    assert result.to_message().role == "tool"
    assert result.to_message().tool_call_id == "call_7"

    forecast = await weather.call({"place": {"city": "Oslo"}, "unit": "fahrenheit"})
    assert forecast.ok
    assert forecast.content == '{"city":"Oslo","unit":"fahrenheit","days":0,"temp":21}'


async def test_tools_stay_directly_callable() -> None:
    @tool
    async def double(x: int) -> int:
        return 2 * x

    assert weather(Place(city="Rome"))["city"] == "Rome"
    assert await double(4) == 8
    assert double.__name__ == "double"


async def test_validation_errors_name_each_argument() -> None:
    result = await weather.call({"place": {"city": "Oslo"}, "days": 9, "colour": "red"})
    assert not result.ok and result.error == "invalid_arguments"
    assert result.content.startswith("Error: invalid arguments for tool 'weather':")
    assert "argument 'days'" in result.content
    assert "less than or equal to 7" in result.content
    assert "argument 'colour' is not a parameter of this tool (known: place, unit, days)" in (
        result.content
    )

    missing = await weather.call("{}")
    assert "argument 'place' is required but missing" in missing.content

    nested = await weather.call({"place": {"town": "Oslo"}})
    assert "argument 'place.city' is required but missing" in nested.content


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"place": ', "not valid JSON"),
        ("[1, 2]", "expected a JSON object of named arguments, got list"),
        (42, "expected a JSON object, got int"),
    ],
)
async def test_bad_json_is_an_error_result(arguments: object, expected: str) -> None:
    result = await weather.call(arguments)  # type: ignore[arg-type]
    assert not result.ok and expected in result.content


async def test_empty_arguments_mean_none() -> None:
    @tool
    def now() -> str:
        return "noon"

    for empty in (None, "", "  ", {}):
        assert (await now.call(empty)).content == "noon"


async def test_exceptions_become_error_results_for_the_model() -> None:
    @tool
    def divide(a: float, b: float) -> float:
        return a / b

    @tool
    async def fetch(url: str) -> str:
        raise ConnectionError(f"cannot reach {url}")

    result = await divide.call({"a": 1, "b": 0})
    assert not result.ok and result.error == "exception"
    assert result.content == "Error: tool 'divide' raised ZeroDivisionError: float division by zero"
    assert isinstance(result.exception, ZeroDivisionError)

    fetched = await fetch.call({"url": "http://x"})
    assert fetched.content == "Error: tool 'fetch' raised ConnectionError: cannot reach http://x"


async def test_cancellation_is_not_swallowed() -> None:
    started = asyncio.Event()

    @tool
    async def hang() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(hang.call())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_in_thread_runs_a_blocking_tool_off_the_loop() -> None:
    seen: list[str] = []

    @tool(in_thread=True)
    def where() -> str:
        seen.append(threading.current_thread().name)
        return "done"

    assert (await where.call()).content == "done"
    assert seen and seen[0] != threading.main_thread().name


async def test_methods_bind_to_their_instance() -> None:
    class Store:
        def __init__(self) -> None:
            self.items = {"a": 1}

        @tool
        def get(self, key: str) -> int:
            """Reads a key."""
            return self.items[key]

    store = Store()
    assert store.get.parameters["properties"] == {"key": {"type": "string"}}
    assert store.get("a") == 1
    assert (await store.get.call({"key": "a"})).value == 1
    missing = await store.get.call({"key": "b"})
    assert missing.content == "Error: tool 'get' raised KeyError: 'b'"


def test_bad_definitions_are_refused_at_once() -> None:
    with pytest.raises(ValueError, match="not valid: use 1-64 letters"):
        Tool(lambda x: x)
    with pytest.raises(TypeError, match=r"parameter 'rest' is \*args/\*\*kwargs"):

        @tool
        def spread(*rest: int) -> int:
            return sum(rest)

    with pytest.raises(TypeError, match="needs a callable"):
        Tool("not a function")  # type: ignore[arg-type]


async def test_a_slow_tool_times_out_into_an_error_result() -> None:
    @tool(timeout=0.01)
    async def stuck() -> str:
        await asyncio.Event().wait()
        return "never"

    result = await stuck.call()
    assert not result.ok and result.error == "timeout"
    assert result.content == "Error: tool 'stuck' did not finish within 0.01 seconds"


async def test_a_timeout_raised_by_the_tool_itself_is_an_exception_result() -> None:
    @tool
    async def call_api() -> str:
        raise TimeoutError("upstream took too long")

    result = await call_api.call()
    assert result.error == "exception"
    assert result.content == "Error: tool 'call_api' raised TimeoutError: upstream took too long"


async def test_a_long_result_is_cut_for_the_model_but_kept_whole_as_value() -> None:
    @tool(max_result_chars=50)
    def dump(n: int) -> str:
        """Returns n letters."""
        return "x" * n

    result = await dump.call({"n": 500})
    assert result.ok
    assert result.content.startswith("x" * 50)
    assert "[... 450 more characters cut]" in result.content
    assert len(result.value) == 500


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


def _cyclic() -> list[object]:
    items: list[object] = [1]
    items.append(items)
    return items


@pytest.mark.parametrize(
    ("result", "type_name", "problem"),
    [
        (b"\xff\xfe", "bytes", "invalid utf-8"),
        (Unprintable(), "Unprintable", "no text for you"),
        ({"nested": Unprintable()}, "dict", "no text for you"),
        (_cyclic(), "list", "Circular reference"),
    ],
)
async def test_a_result_that_cannot_become_text_is_an_error_result(
    result: object, type_name: str, problem: str
) -> None:
    @tool
    def produce() -> object:
        return result

    outcome = await produce.call()
    assert not outcome.ok and outcome.error == "unserialisable_result"
    assert outcome.content.startswith(
        f"Error: tool 'produce' returned a value of type {type_name} that cannot be turned "
        "into text"
    )
    assert problem in outcome.content and outcome.exception is not None


async def test_an_exception_whose_text_raises_is_still_an_error_result() -> None:
    class Opaque(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    @tool
    def fail() -> str:
        raise Opaque

    outcome = await fail.call()
    assert outcome.error == "exception"
    assert outcome.content == (
        "Error: tool 'fail' raised Opaque: <Opaque whose text cannot be shown>"
    )


async def test_sync_tools_run_in_a_thread_unless_told_to_stay_on_the_loop() -> None:
    def where() -> str:
        return threading.current_thread().name

    assert (await Tool(where).call()).content == "plait-tool-where"
    assert (await Tool(where, in_thread=False).call()).content == threading.current_thread().name
    assert Tool(where, timeout=None).timeout is None
