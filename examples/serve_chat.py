"""Serve a chat program over HTTP, on the embedded model (no key, no network).

    python examples/serve_chat.py            # or: plait serve examples/serve_chat.py:make_chat
    curl -s localhost:8000/programs/chat/run -H 'content-type: application/json' \\
         -d '{"history": [{"role": "user", "content": "Hi!"}]}'
    curl -sN 'localhost:8000/programs/chat/run?stream=true' -H 'content-type: application/json' \\
         -d '{"history": [{"role": "user", "content": "Hi!"}]}'

and with the openai client::

    from openai import OpenAI
    client = OpenAI(base_url="http://localhost:8000/v1", api_key="unused")
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Hi!"}])

The server binds 127.0.0.1 and says that API keys are off; to serve other machines, pass
``--api-key-env NAME`` to ``plait serve`` (and ``--host 0.0.0.0``).
"""

from __future__ import annotations

from plait import History, LLMInference, Module, ResourceConfig


class Chat(Module):
    """Answers the conversation so far in a sentence or two."""

    def __init__(self) -> None:
        super().__init__()
        self.reply = LLMInference(
            "llm", "You are a friendly assistant. Answer in one or two sentences.", max_tokens=96
        )

    def forward(self, history: History) -> str:
        return self.reply(history)


def make_chat() -> Chat:
    """The program, bound to the embedded model (what `plait serve` loads)."""
    return Chat().bind(ResourceConfig({"*": {"provider": "local"}}))


if __name__ == "__main__":
    from plait.serve import app, serve

    serve(app({"chat": make_chat()}))
