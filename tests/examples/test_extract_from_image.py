"""examples/extract_from_image.py against the scripted server, as a vision endpoint would see it."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from plait.testing import server_in_thread

EXAMPLE = Path(__file__).parents[2] / "examples" / "extract_from_image.py"

READING = {
    "vendor": "Bean & Co. Roasters",
    "lines": [
        {"description": "Espresso beans, 1 kg", "amount": 24.5},
        {"description": "Milk frother", "amount": 39.9},
        {"description": "Delivery", "amount": 5.0},
    ],
    "total": 69.4,
}


def reply(body: dict[str, Any]) -> str:
    return json.dumps(READING)


def test_the_example_sends_its_invoice_as_an_image_part_and_prints_the_typed_reading():
    with server_in_thread(responder=reply) as server:
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), "--base-url", server.base_url, "--model", "vision-x"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        (record,) = server.stats.log
    assert done.returncode == 0, done.stderr
    assert "Vendor: Bean & Co. Roasters" in done.stdout
    assert "Total:  69.40" in done.stdout
    body = record.body
    assert body["model"] == "vision-x"
    assert body["response_format"]["type"] == "json_schema"
    parts = body["messages"][-1]["content"]
    assert [part["type"] for part in parts] == ["text", "image_url"]
    image = parts[1]["image_url"]
    assert image["detail"] == "high"
    prefix = "data:image/png;base64,"
    assert image["url"].startswith(prefix)
    assert base64.b64decode(image["url"][len(prefix) :]).startswith(b"\x89PNG\r\n\x1a\n")
    assert "base64" not in done.stdout  # the example prints a description, not the bytes
