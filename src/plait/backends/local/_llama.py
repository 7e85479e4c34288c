"""The llama-cpp-python side of the local backend.

This module imports ``llama_cpp`` at the top, so only `backend.py` imports it,
and only when a model is first loaded: ``import plait`` stays free of the
compiled library.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llama_cpp
from llama_cpp import Llama, StoppingCriteriaList

from plait.backends.local._prompt import ChatTurns

if TYPE_CHECKING:
    from plait.backends.local.backend import GenerationProbe

__all__ = ["HookedLlama", "chat_turns", "format_hint", "grammar_of", "load_llama"]


class HookedLlama(Llama):
    """A `Llama` whose generations can be stopped between tokens, and are counted.

    Every chat handler of llama-cpp-python, template-based or hand-written
    (``chatml-function-calling`` makes several completions per call), ends in
    `Llama.generate`, so hooking it here serves any ``chat_format``. Stopping
    uses llama-cpp-python's own stopping criteria, which it checks after every
    sampled token; the reply then ends as if the model had stopped. With
    ``render_only`` set it hands back the prompt it was given instead of
    evaluating it: that is how `chat_turns` sees what a chat format renders.
    """

    probe: GenerationProbe | None = None
    """Set by the worker thread for the duration of one call."""
    render_only: bool = False
    """Set by `rendered_prompt`: hand the prompt back instead of evaluating it."""

    def generate(
        self, tokens: Sequence[int], *args: Any, **kwargs: Any
    ) -> Generator[int, Any, None]:
        if self.render_only:
            raise _Rendered(tokens)
        probe = self.probe
        if probe is None:
            yield from super().generate(tokens, *args, **kwargs)
            return
        probe.prompt_tokens += len(tokens)

        def is_stopped(_input_ids: Any, _logits: Any) -> bool:
            return probe.stop.is_set()

        criteria = StoppingCriteriaList(
            [is_stopped, *(kwargs.pop("stopping_criteria", None) or [])]
        )
        vocab = self._model.vocab
        kwargs["stopping_criteria"] = criteria
        for token in super().generate(tokens, *args, **kwargs):
            # The end-of-turn token is not part of the reply; llama-cpp-python's own
            # usage (non-streamed) leaves it out too.
            if not llama_cpp.llama_vocab_is_eog(vocab, token):
                probe.output_tokens += 1
            yield token


def load_llama(
    path: Path,
    *,
    n_ctx: int,
    n_threads: int,
    n_threads_batch: int,
    chat_format: str | None,
    verbose: bool,
) -> HookedLlama:
    """Loads a GGUF file; raises llama-cpp-python's own errors (the caller wraps them)."""
    return HookedLlama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_threads=n_threads,
        n_threads_batch=n_threads_batch,
        chat_format=chat_format,
        verbose=verbose,
    )


def chat_turns(llama: HookedLlama) -> ChatTurns:
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
    """Carries the prompt tokens out of `HookedLlama.generate` when only rendering."""

    def __init__(self, tokens: Sequence[int]) -> None:
        super().__init__("rendered")
        self.tokens = list(tokens)


def _rendered_prompt(llama: HookedLlama, messages: list[dict[str, str]]) -> str:
    """Returns the prompt the chat format makes of ``messages`` ("" if it refuses them)."""
    llama.render_only = True
    try:
        llama.create_chat_completion(messages=messages, max_tokens=1)  # type: ignore[arg-type]
    except _Rendered as rendered:
        return llama.detokenize(rendered.tokens, special=True).decode("utf-8", "replace")
    except Exception:  # a template may raise on a role it does not take (some refuse "system")
        return ""
    finally:
        llama.render_only = False
    return ""


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
