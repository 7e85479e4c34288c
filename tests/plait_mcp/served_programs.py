"""Programs and tools that the tests serve over MCP with ``plait mcp``."""

from __future__ import annotations

from pydantic import BaseModel

from plait import Image, InputField, Module, OutputField, Predict, Signature, tool


class Shout(Module):
    """Shouts the text back, a number of times."""

    def forward(self, text: str, times: int = 1) -> str:
        return " ".join([text.upper()] * times)


class Point(BaseModel):
    x: int
    y: int


class Mirror(Module):
    """Swaps a point's coordinates."""

    async def forward(self, point: Point) -> Point:
        if point.x < 0:
            raise ValueError("x must not be negative")
        return Point(x=point.y, y=point.x)


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


def answerer() -> Predict:
    return Predict("question -> answer")


ALL = [Shout, Mirror(), add]


triage = Predict("ticket -> queue", alias="llm")
qa = Predict("question -> answer", alias="llm")


class ReadInvoice(Signature):
    """Read the invoice."""

    scan: Image = InputField()
    total: float = OutputField()


def invoice_reader() -> Predict:
    return Predict(ReadInvoice)
