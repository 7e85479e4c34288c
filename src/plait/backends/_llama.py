"""The llama-cpp-python side of the local backend.

This module imports ``llama_cpp`` at the top, so only `local.py` imports it,
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

if TYPE_CHECKING:
    from plait.backends.local import GenerationProbe

__all__ = ["HookedLlama", "grammar_of", "load_llama", "renders_tools"]


class HookedLlama(Llama):
    """A `Llama` whose generations can be stopped between tokens, and are counted.

    Every chat handler of llama-cpp-python, template-based or hand-written
    (``chatml-function-calling`` makes several completions per call), ends in
    `Llama.generate`, so hooking it here serves any ``chat_format``. Stopping
    uses llama-cpp-python's own stopping criteria, which it checks after every
    sampled token; the reply then ends as if the model had stopped.
    """

    probe: GenerationProbe | None = None
    """Set by the worker thread for the duration of one call."""

    def generate(  # type: ignore[override]
        self, tokens: Sequence[int], *args: Any, **kwargs: Any
    ) -> Generator[int, Any, None]:
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
        for token in super().generate(tokens, *args, stopping_criteria=criteria, **kwargs):
            # The end-of-turn token is not part of the reply; llama-cpp-python's own
            # usage (non-streamed) leaves it out too.
            if not llama_cpp.llama_vocab_is_eog(vocab, token):
                probe.output_tokens += 1
            yield token


def load_llama(
    path: Path,
    *,
    n_ctx: int,
    n_threads: int | None,
    chat_format: str | None,
    verbose: bool,
) -> HookedLlama:
    """Loads a GGUF file; raises llama-cpp-python's own errors (the caller wraps them)."""
    return HookedLlama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_threads=n_threads,
        chat_format=chat_format,
        verbose=verbose,
    )


def renders_tools(llama: Llama) -> bool:
    """Whether the chat template in use shows ``tools`` and ``tool_calls`` to the model.

    Only the template embedded in the GGUF can be inspected; a named
    ``chat_format`` is assumed not to, so tools are described in the prompt.
    """
    if llama.chat_format != "chat_template.default" or llama.chat_handler is not None:
        return False
    template = llama.metadata.get("tokenizer.chat_template", "")
    return "tools" in template and "tool_calls" in template


@functools.lru_cache(maxsize=64)
def grammar_of(gbnf: str) -> llama_cpp.LlamaGrammar:
    """Returns llama-cpp-python's grammar object for GBNF text (one per text)."""
    return llama_cpp.LlamaGrammar.from_string(gbnf, verbose=False)
