"""The llama-cpp-python side of the local backend.

This module imports ``llama_cpp`` at the top, so only `backend.py` imports it,
and only when a model is first loaded: ``import plait`` stays free of the
compiled library.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import Llama

from plait.backends.local._prompt import ChatTurns

__all__ = ["RenderingLlama", "chat_turns", "format_hint", "grammar_of", "load_llama", "render"]


class RenderingLlama(Llama):
    """A `Llama` that renders chat calls into completions and never generates itself.

    Every chat handler of llama-cpp-python ends by asking for a completion
    (`Llama.create_completion`) with the prompt tokens its chat format
    renders, its stop strings and grammar, and the sampling settings. Here
    that request is captured instead of run: `render` hands it to the batch
    decoder (`_decoder.BatchDecoder`), which generates every call in flight
    together. So any ``chat_format`` whose handler asks for one completion
    serves, and `chat_turns` sees what a format renders the same way.
    """

    def create_completion(self, *args: Any, **kwargs: Any) -> Any:
        raise _Rendered(kwargs)


def load_llama(
    path: Path, *, n_threads: int, chat_format: str | None, verbose: bool
) -> RenderingLlama:
    """Loads a GGUF file; raises llama-cpp-python's own errors (the caller wraps them).

    Its own context is a small one it never decodes with: generation runs in
    the batch decoder's context, sized there.
    """
    return RenderingLlama(
        model_path=str(path),
        n_ctx=_OWN_CONTEXT,
        n_batch=_OWN_CONTEXT,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        chat_format=chat_format,
        verbose=verbose,
    )


_OWN_CONTEXT = 256
"""Tokens of the context every `Llama` makes and this one leaves unused."""


def render(llama: RenderingLlama, chat: dict[str, Any]) -> dict[str, Any]:
    """Returns the completion call that ``create_chat_completion(**chat)`` would make.

    Its keys are those of `Llama.create_completion`: ``prompt`` (tokens),
    ``max_tokens``, ``stop`` (the caller's and the chat format's), ``grammar``
    (from ``response_format``), the sampling settings and ``seed``.

    Raises:
        ValueError: the chat handler made no completion (it refused the messages).
    """
    try:
        llama.create_chat_completion(**chat)
    except _Rendered as rendered:
        return rendered.completion
    raise ValueError(f"the chat format {llama.chat_format!r} made no completion to run")


def chat_turns(llama: RenderingLlama) -> ChatTurns:
    """Finds which turns the model's chat format shows, by rendering two small conversations.

    Rendering stops before the prompt is evaluated, so this costs a
    tokenisation, not a generation.
    """
    system = _rendered_prompt(llama, [_turn("system"), _turn("user")])
    with_tool = [_turn("user"), _turn("assistant"), _turn("tool"), _turn("user")]
    tool = _rendered_prompt(llama, with_tool)
    return ChatTurns(
        tools=_renders_tools(llama),
        system=_PROBE["system"] in system,
        tool_results=_PROBE["tool"] in tool,
    )


_PROBE = {role: f"plait-probe-{role}-turn" for role in ("system", "user", "assistant", "tool")}
"""Text of each probe turn, looked for in the rendered prompt."""


def _turn(role: str) -> dict[str, str]:
    turn = {"role": role, "content": _PROBE[role]}
    return {**turn, "tool_call_id": "call_probe"} if role == "tool" else turn


class _Rendered(Exception):
    """Carries a completion's keyword arguments out of `RenderingLlama.create_completion`."""

    def __init__(self, completion: dict[str, Any]) -> None:
        super().__init__("rendered")
        self.completion = completion


def _rendered_prompt(llama: RenderingLlama, messages: list[dict[str, str]]) -> str:
    """Returns the prompt the chat format makes of ``messages`` ("" if it refuses them)."""
    try:
        tokens = render(llama, {"messages": messages, "max_tokens": 1})["prompt"]
    except Exception:  # a template may raise on a role it does not take (some refuse "system")
        return ""
    return llama.detokenize(list(tokens), special=True).decode("utf-8", "replace")


def _renders_tools(llama: Llama) -> bool:
    """Whether the chat template in use shows ``tools`` and ``tool_calls`` to the model.

    Only the template embedded in the GGUF can be inspected; a named
    ``chat_format`` is assumed not to, so tools are described in the prompt.
    """
    if llama.chat_format != "chat_template.default" or llama.chat_handler is not None:
        return False
    template = llama.metadata.get("tokenizer.chat_template", "")
    return "tools" in template and "tool_calls" in template


_FORMAT_MARKERS = {
    "<|im_start|>": "chatml",
    "<start_of_turn>": "gemma",
    "<|start_header_id|>": "llama-3",
    "[INST]": "mistral-instruct",
}
"""Special tokens that mark a chat format, and llama-cpp-python's name for that format."""


def format_hint(llama: Llama) -> str | None:
    """Returns the chat format a model's vocabulary points to, or None.

    A turn marker that the tokenizer holds as one special token says which
    format the model was trained with.
    """
    for marker, name in _FORMAT_MARKERS.items():
        if len(llama.tokenize(marker.encode(), add_bos=False, special=True)) == 1:
            return name
    return None


@functools.lru_cache(maxsize=64)
def grammar_of(gbnf: str) -> llama_cpp.LlamaGrammar:
    """Returns llama-cpp-python's grammar object for GBNF text (one per text)."""
    return llama_cpp.LlamaGrammar.from_string(gbnf, verbose=False)
