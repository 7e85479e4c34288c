"""The local model's decode loop: every call in flight decoded together, one batch a step.

One llama.cpp context holds a KV cache of ``n_seq_max`` sequences, a stream
of cells per sequence; each call gets a sequence id of its own for as long as
it runs (continuous batching: a call joins at the next step after it arrives
and leaves at the step it ends). A sequence keeps the cells of its last call
after it ends: a new call takes the free sequence whose cells hold the
longest start of its prompt (the chat template's opening, a program's
instructions, a conversation so far) and reads only the rest. A step reads one chunk of
a joining call's prompt (in a decode of its own, see `BatchDecoder._step`),
then decodes the last token of every generating call in one ``llama_decode``
and samples each from that call's own sampler chain: its penalties, its
grammar, greedy or top-k/typical/top-p/min-p/temperature with its own seed,
in the order llama-cpp-python 0.3.36 builds them (`Llama._init_sampler`), so
a call samples as it would alone. Stop strings, ``max_tokens`` and streamed
text are handled per call here.

Every call's cells are bounded: prompt plus reply fit its stream,
``n_ctx / n_seq_max`` tokens (llama.cpp's ``llama_n_ctx_seq``), so the cache
can never overflow, and a prompt too long for it is refused with a clear
error.

All of this runs on the model's one decode thread (`run`); calls reach it
through a queue and report back through their `Call` (a future, and a text
callback when streamed). A model is not re-entrant, so nothing else touches
the context. This module imports ``llama_cpp``: only `backend.py` loads it,
when a model is first used.
"""

from __future__ import annotations

import codecs
import heapq
import queue
import random
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import llama_cpp
from llama_cpp import Llama

from plait.backends.types import Usage
from plait.errors import BackendError

__all__ = ["BatchDecoder", "Call", "Finished"]


@dataclass(frozen=True, slots=True)
class Finished:
    """How a call ended: its whole text, why it stopped, and its tokens (the one usage record)."""

    text: str
    finish_reason: str
    usage: Usage


class Call:
    """One call's way into the batch and back out.

    ``prepare`` runs on the decode thread when the call joins and returns the
    keyword arguments of the completion its chat format asks for
    (`_llama.render`); ``on_text`` (streaming) receives text as it becomes
    final, on the decode thread. Setting ``cancel`` ends the call at the next
    step.
    """

    __slots__ = ("cancel", "future", "on_text", "prepare")

    def __init__(
        self,
        prepare: Callable[[Llama], dict[str, Any]],
        on_text: Callable[[str], None] | None = None,
    ) -> None:
        self.prepare = prepare
        self.on_text = on_text
        self.cancel = threading.Event()
        self.future: Future[Finished] = Future()


_UNSUPPORTED = {"logits_processor": None, "logit_bias": None, "mirostat_mode": 0}
"""Completion options the batch cannot honour, with the value that means "unused".

Chat handlers pass these unused (plait sets none of them). A handler's own
``stopping_criteria`` (a template's stop on its end-of-turn token) is not
needed: a call ends on every end-of-generation token of the vocabulary.
"""


class _Sequence:
    """A call in the batch: its sequence id, sampler chain and reply so far."""

    def __init__(self, call: Call, seq_id: int, prompt: list[int], options: dict[str, Any]):
        self.call = call
        self.seq_id = seq_id
        self.prompt = prompt
        self.fed = 0
        """Prompt tokens already decoded."""
        self.pos = 0
        """Next position in this sequence."""
        self.last: int | None = None
        """The token sampled last, to be decoded in the next step."""
        self.outputs: list[int] = []
        """The tokens sampled so far."""
        self.output_tokens = 0
        self.text = ""
        self.sent = 0
        """Characters of ``text`` handed to ``on_text``."""
        self.utf8 = codecs.getincrementaldecoder("utf-8")("ignore")
        self.stop: list[str] = [s for s in options.get("stop") or [] if s]
        self.max_tokens: int | None = options.get("max_tokens")
        self.chain: Any = None


class BatchDecoder:
    """Decodes every call in flight together, on the thread that calls `run`.

    Args:
        llama: the loaded model (its tokenizer and chat format render prompts).
        n_ctx: KV cache cells in all; each call has ``n_ctx // n_seq_max`` of them.
        n_seq_max: calls decoded together; more wait for a free sequence.
        n_batch: most tokens in one decode step (prompts are fed in chunks).
        n_threads: CPU threads for decode steps of a few tokens.
        n_threads_batch: CPU threads for steps that read prompts.
        name: the model, for error messages.
    """

    def __init__(
        self,
        llama: Llama,
        *,
        n_ctx: int,
        n_seq_max: int,
        n_batch: int,
        n_threads: int,
        n_threads_batch: int,
        name: str,
    ) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max
        params.n_threads = n_threads
        params.n_threads_batch = n_threads_batch
        # A KV stream per sequence: each call's cells are its own n_ctx / n_seq_max, and its
        # attention is computed as it would be alone (see `_step`).
        params.kv_unified = False
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as Llama() sets it
        ctx = llama_cpp.llama_init_from_model(llama.model, params)
        if ctx is None:
            raise BackendError(f"llama.cpp could not make a context of {n_ctx} tokens for {name}")
        self._llama = llama
        self._ctx = ctx
        self._memory = llama_cpp.llama_get_memory(ctx)
        self._vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self._n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._n_batch = n_batch
        self.share = llama_cpp.llama_n_ctx_seq(ctx)
        """Tokens one call may use, prompt and reply together."""
        self._name = name
        self._free = list(range(n_seq_max))
        """Free sequence ids, a heap: the lowest is taken first."""
        self._active: list[_Sequence] = []
        self._kept: dict[int, list[int]] = {}
        """The tokens whose cells a free sequence still holds (its last call's prompt
        and reply), so a call that starts alike reads only the rest."""

    def close(self) -> None:
        """Frees the context, the batch and the model; call it on the decode thread."""
        for seq in list(self._active):
            self._leave(seq, "stop")
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self._ctx)
        self._llama.close()

    def run(self, inbox: queue.SimpleQueue[Call | None], waiting: deque[Call]) -> None:
        """Decodes until ``None`` arrives and every call before it has ended."""
        closing = False
        while True:
            if not self._active and not waiting:
                if closing:
                    return
                item = inbox.get()
                if item is None:
                    return
                waiting.append(item)
            while True:
                try:
                    item = inbox.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                else:
                    waiting.append(item)
            while waiting and self._free:
                self._join(waiting.popleft())
            for seq in [s for s in self._active if s.call.cancel.is_set()]:
                self._leave(seq, "stop")
            if self._active:
                self._step()

    def _join(self, call: Call) -> None:
        """Gives a call a sequence; its prompt is read from the next step on."""
        if not call.future.set_running_or_notify_cancel():
            return
        if call.cancel.is_set():  # given up while it waited
            call.future.set_result(Finished("", "stop", Usage()))
            return
        try:
            options = call.prepare(self._llama)
            prompt = list(options["prompt"])
            self._check(options, len(prompt))
            chain = self._sampler(options)
        except Exception as exc:  # the call's own error; the batch goes on
            call.future.set_exception(exc)
            return
        seq = _Sequence(call, self._place(prompt), prompt, options)
        seq.fed = seq.pos = len(self._kept.pop(seq.seq_id, ()))
        room = self.share - len(prompt)
        asked = seq.max_tokens
        seq.max_tokens = room if asked is None or asked <= 0 else min(asked, room)
        seq.chain = chain
        self._active.append(seq)

    def _place(self, prompt: list[int]) -> int:
        """Takes the free sequence whose cells hold the longest start of ``prompt``.

        Its cells past that start are dropped; what is kept is noted in
        ``_kept`` for `_join`. At least the prompt's last two tokens are read
        again (`_REREAD`). (A prefix read in one decode and the rest in another
        gave the same logits as one decode, bit for bit, on SmolLM2 here.)
        """
        best, shared = self._free[0], 0
        for seq_id in sorted(self._free):
            n = _common_start(self._kept.get(seq_id, []), prompt)
            if n > shared:
                best, shared = seq_id, n
        self._free.remove(best)
        heapq.heapify(self._free)
        reuse = max(0, min(shared, len(prompt) - _REREAD))
        llama_cpp.llama_memory_seq_rm(self._memory, best, reuse, -1)
        if reuse:
            self._kept[best] = prompt[:reuse]
        else:
            self._kept.pop(best, None)
        return best

    def _check(self, options: dict[str, Any], n_prompt: int) -> None:
        for key, unused in _UNSUPPORTED.items():
            if options.get(key, unused) != unused:
                raise BackendError(
                    f"{self._name}: the chat format asked for {key}={options[key]!r}, "
                    "which the batched decoder does not support"
                )
        if n_prompt >= self.share:
            raise BackendError(
                f"{self._name}: the prompt of {n_prompt} tokens does not fit the context window "
                f"of a call, n_ctx {self.share} tokens (prompt and reply together). Shorten the "
                f"conversation, or build LocalBackend(n_ctx=...) larger than {self.share}."
            )

    def _sampler(self, options: dict[str, Any]) -> Any:
        """The call's sampler chain, built as llama-cpp-python builds it for one call."""
        lib = llama_cpp
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())

        def add(sampler: Any) -> None:
            lib.llama_sampler_chain_add(chain, sampler)

        add(
            lib.llama_sampler_init_penalties(
                self._n_vocab,
                self._llama.last_n_tokens_size,
                options.get("repeat_penalty", 1.0),
                options.get("frequency_penalty", 0.0),
                options.get("presence_penalty", 0.0),
            )
        )
        grammar = options.get("grammar")
        if grammar is not None:
            # LlamaGrammar keeps its GBNF text and root rule in these two attributes;
            # llama-cpp-python's own sampler reads them the same way.
            constrained = lib.llama_sampler_init_grammar(
                self._vocab, grammar._grammar.encode(), grammar._root.encode()
            )
            if not constrained:
                lib.llama_sampler_free(chain)
                raise BackendError(f"{self._name}: llama.cpp could not parse the reply's grammar")
            add(constrained)
        seed = options.get("seed")
        seed = random.getrandbits(32) if seed is None else seed
        temperature = options.get("temperature", 0.8)
        if temperature < 0.0:
            add(lib.llama_sampler_init_dist(seed))
        elif temperature == 0.0:
            add(lib.llama_sampler_init_greedy())
        else:
            add(lib.llama_sampler_init_top_k(options.get("top_k", 40)))
            add(lib.llama_sampler_init_typical(options.get("typical_p", 1.0), 1))
            add(lib.llama_sampler_init_top_p(options.get("top_p", 0.95), 1))
            add(lib.llama_sampler_init_min_p(options.get("min_p", 0.05), 1))
            add(lib.llama_sampler_init_temp(temperature))
            add(lib.llama_sampler_init_dist(seed))
        return chain

    def _step(self) -> None:
        """Reads one chunk of a joining call's prompt, then decodes every generating call once.

        A prompt is read in a decode of its own, in the chunks it would have
        alone: mixed with other tokens, llama.cpp computes its attention in
        other shapes, and the logits move in low digits (enough to change a
        greedy reply now and then). Generating calls, one token each, share
        one decode; with a KV stream per sequence each one's attention is then
        computed as it is alone.
        """
        joining = next((s for s in self._active if s.fed < len(s.prompt)), None)
        if joining is not None:
            chunk = joining.prompt[joining.fed : joining.fed + self._n_batch]
            joining.fed += len(chunk)
            self._decode([(joining, chunk)], sample=joining.fed == len(joining.prompt))
        # In order of sequence id: llama.cpp puts consecutive ids in one pass when it can.
        generating = sorted(
            (s for s in self._active if s.fed == len(s.prompt) and s is not joining),
            key=lambda s: s.seq_id,
        )
        if generating:
            self._decode([(s, [s.last]) for s in generating if s.last is not None], sample=True)

    def _decode(self, feeds: list[tuple[_Sequence, list[int]]], *, sample: bool) -> None:
        """One ``llama_decode`` of each sequence's tokens; then a sample for each, if asked."""
        batch = self._batch
        batch.n_tokens = 0
        sampled: list[tuple[_Sequence, int]] = []
        for seq, tokens in feeds:
            for offset, token in enumerate(tokens):
                i = batch.n_tokens
                batch.token[i] = token
                batch.pos[i] = seq.pos + offset
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq.seq_id
                batch.logits[i] = sample and offset == len(tokens) - 1
                batch.n_tokens += 1
            seq.pos += len(tokens)
            if sample:
                sampled.append((seq, batch.n_tokens - 1))
        code = llama_cpp.llama_decode(self._ctx, batch)
        if code != 0:
            error = BackendError(f"{self._name}: llama_decode failed (code {code})")
            for seq, _ in feeds:
                self._leave(seq, None, error)
            return
        for seq, index in sampled:
            token = llama_cpp.llama_sampler_sample(seq.chain, self._ctx, index)
            self._take(seq, token)

    def _take(self, seq: _Sequence, token: int) -> None:
        """Adds a sampled token to its call's reply; ends the call when it is done."""
        if llama_cpp.llama_vocab_is_eog(self._vocab, token):
            self._leave(seq, "stop")
            return
        seq.last = token
        seq.outputs.append(token)
        seq.output_tokens += 1
        seq.text += seq.utf8.decode(self._llama.detokenize([token]))
        cut = _first_stop(seq.text, seq.stop)
        if cut is not None:
            seq.text = seq.text[:cut]
            self._leave(seq, "stop")
            return
        if seq.max_tokens is not None and seq.output_tokens >= seq.max_tokens:
            self._leave(seq, "length")
            return
        if seq.call.on_text is not None:
            final = len(seq.text) - _held_back(seq.text, seq.stop)
            if final > seq.sent:
                seq.call.on_text(seq.text[seq.sent : final])
                seq.sent = final

    def _leave(
        self, seq: _Sequence, reason: str | None, error: BaseException | None = None
    ) -> None:
        """Ends a call: keeps its cells for a call that starts alike, and reports how it ended."""
        self._active.remove(seq)
        if error is None and seq.fed == len(seq.prompt):
            decoded = seq.outputs[: seq.pos - len(seq.prompt)]
            self._kept[seq.seq_id] = seq.prompt + decoded
        else:
            llama_cpp.llama_memory_seq_rm(self._memory, seq.seq_id, -1, -1)
            self._kept.pop(seq.seq_id, None)
        llama_cpp.llama_sampler_free(seq.chain)
        heapq.heappush(self._free, seq.seq_id)
        call = seq.call
        if error is not None:
            call.future.set_exception(error)
            return
        if call.on_text is not None and len(seq.text) > seq.sent:
            call.on_text(seq.text[seq.sent :])
        call.future.set_result(
            Finished(seq.text, reason or "stop", Usage(len(seq.prompt), seq.output_tokens))
        )


_REREAD = 2
"""Prompt tokens a call reads even when a sequence holds its whole prompt.

One is needed for the logits of the reply's first token. With only that one
read (a decode of a single token), 3 of 70 greedy replies on SmolLM2 later
differed from the reply on a fresh model, after calls with the same prompts
had run 4 in flight (`tests/backends/test_local_batch.py`); with two, none
did. The cause inside llama.cpp was not found; a token more costs little.
"""


def _common_start(a: list[int], b: list[int]) -> int:
    """How many tokens ``a`` and ``b`` share from their start."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _first_stop(text: str, stops: list[str]) -> int | None:
    """Where the earliest stop string begins in ``text``, or None."""
    found = [at for at in (text.find(s) for s in stops) if at != -1]
    return min(found) if found else None


def _held_back(text: str, stops: list[str]) -> int:
    """How many characters at the end of ``text`` could begin a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest
