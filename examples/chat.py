"""A terminal chat on the embedded model: replies stream as they are written, and saving
a note stops to ask you first.

Type a message and press Enter; the reply is printed token by token as the model
writes it (``astream``). A message that starts with ``note:`` goes to a small agent
with one tool, ``save_note``, which writes to a file — a side effect, so the tool
requires confirmation: the agent stops, the chat asks ``[y/n]`` (and asks again
until you answer y or n, so a message typed there is never taken for an answer),
and after your answer the agent resumes where it stopped (the model is not asked
again for the call it already made). Answer ``n`` and the model is told you
declined. Each note is asked about once and saved at most once: when the model
repeats the call you already answered (small models do), the agent tells it so
instead of asking you again.

Why a ``note:`` prefix instead of letting the model decide: SmolLM2-135M does not
choose tools on its own reliably (asked "Save a note that says: buy milk" it chose
to chat), so the agent's first turn is a forced call of ``save_note``, whose
arguments the model still writes. With a larger model, drop the prefix and give a
``ReAct`` the tool with ``first_tool_choice="auto"``.

    python examples/chat.py [--notes notes.txt] [--base-url http://host/v1 --model m]

With ``--base-url`` it talks to an OpenAI-compatible server instead of the embedded
model. Ctrl-D (end of input) quits.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from plait import (
    ConfirmationRequired,
    History,
    LLMInference,
    OutputStreamChunk,
    Prediction,
    ReAct,
    ResourceConfig,
    ResumeState,
    tool,
)

NOTE_PREFIX = "note:"


def note_taker(notes: Path) -> ReAct:
    """Returns the agent that saves notes; each save waits for the user's yes."""

    # No description of `text`: SmolLM2 copies argument descriptions into the call.
    @tool(require_confirmation=True)
    def save_note(text: str) -> str:
        """Saves a short note for the user in their notes file."""
        with notes.open("a", encoding="utf-8") as file:
            file.write(text.strip() + "\n")
        return f"Saved the note: {text.strip()}"

    return ReAct(
        "request -> reply",
        tools=[save_note],
        first_tool_choice="save_note",
        max_iters=2,
        temperature=0.0,
        max_tokens=96,
    )


async def ask(prompt: str) -> str | None:
    """Reads one line from the terminal without blocking the event loop; None at end of input."""
    print(prompt, end="", flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    return None if line == "" else line.rstrip("\n")


async def confirm(question: str) -> bool:
    """Asks a yes/no question until the answer is y or n; end of input declines."""
    while (answer := await ask(f"{question} [y/n] ")) is not None:
        word = answer.strip().lower()
        if word in ("y", "yes", "n", "no"):
            return word.startswith("y")
        print("Please answer y or n.")
    return False


async def chat_turn(talk: LLMInference, history: History, message: str) -> None:
    """Streams the model's reply to ``message``, then keeps both turns in the history."""
    history.add_user(message)
    reply = ""
    async for event in talk.astream(history):
        if isinstance(event, OutputStreamChunk):
            print(event.delta, end="", flush=True)
        elif isinstance(event, str):
            reply = event
    print()
    history.add_assistant(reply)


async def note_turn(agent: ReAct, request: str) -> None:
    """Runs the note agent, stopping for [y/n] before the note is written."""
    resume: ResumeState | None = None
    while True:
        async for event in agent.astream(request=request, resume_state=resume):
            if isinstance(event, Prediction) and not event.is_final:
                pending: ConfirmationRequired = event.confirmation
                approved = await confirm(pending.question)
                resume = ResumeState(pending, "yes" if approved else "no")
                break
            elif isinstance(event, Prediction):
                print(f"assistant: {event.reply}")
                return
        else:
            return


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notes", type=Path, default=Path("notes.txt"))
    parser.add_argument("--base-url", help="an OpenAI-compatible server instead of the local model")
    parser.add_argument("--model", default="chat")
    args = parser.parse_args()
    endpoint = (
        {"provider": "openai", "base_url": args.base_url, "model": args.model, "api_key": "none"}
        if args.base_url
        else {"provider": "local"}
    )
    resources = ResourceConfig({"*": endpoint})
    talk = LLMInference(
        "llm", "You are a friendly assistant. Answer in one or two sentences.", max_tokens=96
    ).bind(resources)
    agent = note_taker(args.notes).bind(resources)
    history = History()
    print(f"Chat; start a message with '{NOTE_PREFIX}' to save a note. Ctrl-D quits.")
    while (message := await ask("you: ")) is not None:
        if not message.strip():
            continue
        if message.lower().startswith(NOTE_PREFIX):
            await note_turn(agent, message[len(NOTE_PREFIX) :].strip())
        else:
            print("assistant: ", end="", flush=True)
            await chat_turn(talk, history, message)


if __name__ == "__main__":
    asyncio.run(main())
