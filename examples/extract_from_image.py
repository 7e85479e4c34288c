"""Typed extraction from an image: read an invoice the example draws itself.

    OPENAI_API_KEY=... python examples/extract_from_image.py
    # any OpenAI-compatible vision endpoint (vLLM, Ollama, LM Studio ...):
    python examples/extract_from_image.py --base-url http://localhost:11434/v1 --model llava

The invoice is drawn with Pillow when it is installed (``pip install pillow``);
``--image`` reads one of your own instead. The image goes to the model as an
image content part (never as text), and the reply comes back as an `Invoice`,
validated field by field and asked again once if the model gets it wrong.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

from pydantic import BaseModel

from plait import Image, InputField, OutputField, Predict, ResourceConfig, Signature


class LineItem(BaseModel):
    description: str
    amount: float


class ReadInvoice(Signature):
    """Read the invoice in the image. Amounts are numbers without currency signs."""

    scan: Image = InputField(description="a photo or scan of one invoice")
    vendor: str = OutputField(description="who issued the invoice")
    lines: list[LineItem] = OutputField(description="every line of the invoice")
    total: float = OutputField(description="the amount due")


LINES = [("Espresso beans, 1 kg", 24.50), ("Milk frother", 39.90), ("Delivery", 5.00)]


def draw_invoice() -> bytes:
    """Returns a PNG of a small invoice, drawn with Pillow."""
    try:
        from PIL import Image as Canvas
        from PIL import ImageDraw
    except ImportError:
        sys.exit("Drawing the invoice needs Pillow: pip install pillow (or pass --image FILE)")
    canvas = Canvas.new("RGB", (480, 260), "white")
    pen = ImageDraw.Draw(canvas)
    pen.text((20, 16), "INVOICE  No. 2024-117", fill="black")
    pen.text((20, 40), "From: Bean & Co. Roasters", fill="black")
    y = 84
    for description, amount in LINES:
        pen.text((20, y), description, fill="black")
        pen.text((380, y), f"{amount:8.2f}", fill="black")
        y += 26
    pen.line((20, y + 4, 460, y + 4), fill="black")
    pen.text((20, y + 14), "TOTAL DUE", fill="black")
    pen.text((380, y + 14), f"{sum(a for _, a in LINES):8.2f}", fill="black")
    out = io.BytesIO()
    canvas.save(out, format="PNG")
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint (default: OpenAI)")
    parser.add_argument("--model", default="gpt-4o-mini", help="a model that reads images")
    parser.add_argument("--image", help="an invoice image of your own instead of the drawn one")
    args = parser.parse_args()

    endpoint = {"provider": "openai", "model": args.model, "timeout": 120, "max_retries": 2}
    if args.base_url:
        endpoint |= {"base_url": args.base_url, "api_key": os.environ.get("OPENAI_API_KEY", "none")}
    else:
        endpoint["api_key_env"] = "OPENAI_API_KEY"
    scan = Image(args.image or draw_invoice(), detail="high")
    print(f"Reading {scan!r}")

    reader = Predict(ReadInvoice, alias="vision").bind(ResourceConfig({"vision": endpoint}))
    invoice = reader.run_sync(scan=scan)
    print(f"Vendor: {invoice.vendor}")
    for item in invoice.lines:
        print(f"  {item.description:<30} {item.amount:8.2f}")
    print(f"Total:  {invoice.total:.2f}")


if __name__ == "__main__":
    main()
