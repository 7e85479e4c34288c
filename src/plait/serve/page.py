"""The browser chat page at ``/``: one self-contained HTML file (``chat.html``: inline script
and style, nothing fetched from elsewhere).

The page holds no data of its own, so it is served without an API key: once loaded it asks
``/programs`` which programs take a conversation (with the key, when the server wants one: the
page asks for it once and keeps it in the tab's ``sessionStorage``), posts the conversation to
``/programs/{name}/run?stream=true`` and shows the events as they come: text, tool calls and
results, and a paused call's question with the arguments it will run and approve / reject
buttons, which post to ``/programs/{name}/runs/{id}/resume?stream=true``. Everything it shows
is set as text, never parsed as HTML; a Content-Security-Policy lets only its own inline script
and style run and lets it talk only to this server.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib import resources

from fastapi import FastAPI
from starlette.responses import HTMLResponse

__all__ = ["PAGE_PATH", "add_chat_page"]

PAGE_PATH = "/"


@cache
def _page() -> tuple[str, str]:
    """Returns the page and its Content-Security-Policy (hashes of its inline script and style)."""
    html = resources.files("plait.serve").joinpath("chat.html").read_text(encoding="utf-8")

    def hashes(tag: str) -> str:
        bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.S)
        digests = (base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() for b in bodies)
        return " ".join(f"'sha256-{digest}'" for digest in digests)

    policy = (
        f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return html, policy


def add_chat_page(app: FastAPI) -> None:
    """Serves the chat page at ``/``."""

    @app.get(PAGE_PATH, include_in_schema=False)
    async def chat_page() -> HTMLResponse:
        html, policy = _page()
        return HTMLResponse(
            html,
            headers={
                "Content-Security-Policy": policy,
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-cache",
            },
        )
