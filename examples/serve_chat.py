"""Serve a chat and a note-taking agent over HTTP, on the embedded model (no key, no network).

    python examples/serve_chat.py            # then open http://localhost:8000/ for the chat page
    # or: plait serve chat=examples/serve_chat.py:make_chat notes=examples/serve_chat.py:make_notes
    curl -s localhost:8000/programs/chat/run -H 'content-type: application/json' \\
         -d '{"history": [{"role": "user", "content": "Hi!"}]}'
    curl -sN 'localhost:8000/programs/chat/run?stream=true' -H 'content-type: application/json' \\
         -d '{"history": [{"role": "user", "content": "Hi!"}]}'

``notes`` saves a note only after a person says yes: its run pauses (202, with the pending
call and a run id), and the answer resumes it::

    curl -s localhost:8000/programs/notes/run -H 'content-type: application/json' \\
         -d '{"request": "buy milk"}'
    # {"run_id": "9a1e…", "status": "paused", "pending": [{"call_id": "call_…", …}], …}
    curl -s localhost:8000/programs/notes/runs/9a1e…/resume -H 'content-type: application/json' \\
         -d '{"answers": {"call_…": "yes"}}'       # or "no", or {"text": "buy oat milk"}

The chat page at ``/`` does the same with approve / reject buttons. With the openai client::

    from openai import OpenAI
    client = OpenAI(base_url="http://localhost:8000/v1", api_key="unused")
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Hi!"}])

The server binds 127.0.0.1 and says that API keys are off; to serve other machines, pass
``--api-key-env NAME`` to ``plait serve`` (and ``--host 0.0.0.0``). Run here, paused runs are
kept in memory; ``plait serve`` keeps them in a file (``--pending-db``) that outlives restarts.
"""

from __future__ import annotations

from pathlib import Path

from plait import History, LLMInference, Module, ReAct, ResourceConfig, tool

LOCAL = ResourceConfig({"*": {"provider": "local"}})


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
    """The chat, bound to the embedded model (what `plait serve` loads)."""
    return Chat().bind(LOCAL)


def make_notes(notes: Path = Path("notes.txt")) -> ReAct:
    """An agent that saves a note to ``notes``, each save waiting for a person's yes.

    SmolLM2-135M does not choose tools reliably, so its first turn is a forced call of
    ``save_note`` (whose argument the model writes); with a larger model, drop
    ``first_tool_choice``.
    """

    @tool(require_confirmation=True)
    def save_note(text: str) -> str:
        """Saves a short note for the user in their notes file."""
        with notes.open("a", encoding="utf-8") as file:
            file.write(text.strip() + "\n")
        return f"Saved the note: {text.strip()}"

    agent = ReAct(
        "request -> reply",
        tools=[save_note],
        first_tool_choice="save_note",
        max_iters=2,
        temperature=0.0,
        max_tokens=96,
    )
    return agent.bind(LOCAL)


if __name__ == "__main__":
    from plait.serve import app, serve

    serve(app({"chat": make_chat(), "notes": make_notes()}))
