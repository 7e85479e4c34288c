"""What every fuzz test shares: the settings, the property, the count of inputs, the mutations.

The property every reader of outside data keeps: whatever the input, it
gives a result or a plait error (or the error type its docstring names),
never another exception, never a hang and never memory out of proportion
to the input. `outcome` (synchronous readers) and `outcome_async` (readers
behind loopback HTTP) check it for one input and count the input under the
parser's name; the counts are printed at the end of the session.

Inputs come from two sources: random bytes or text, and *mutations of valid
inputs* (`mutated_json`, `mutated_bytes`): a real reply, checkpoint line,
config or row file, changed the way a buggy server, a crash or a hostile
editor changes it (truncated, duplicated, types flipped, nested deeply,
huge or odd values, bytes that are not UTF-8).

The default run is derandomized (CI cannot go red by luck) and small;
``pytest --fuzz-long`` or ``PLAIT_FUZZ_LONG=1`` explores randomly with many
more inputs. No example database is written into the checkout.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import resource
import signal
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from plait.errors import PlaitError


def is_long_run() -> bool:
    """Whether this is a deep run (``--fuzz-long`` or ``PLAIT_FUZZ_LONG=1``).

    Read when a test module is imported, not when this one is: the conftest
    that imports it loads before the ``--fuzz-long`` option is seen.
    """
    return os.environ.get("PLAIT_FUZZ_LONG", "") not in ("", "0")


LONG_FACTOR = 50
"""How many times more inputs each test tries in a deep run."""

_QUIET = [
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.large_base_example,
    # One loopback server per test serves all of its inputs: that is the point.
    HealthCheck.function_scoped_fixture,
]
settings.register_profile(
    "plait-fuzz",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=_QUIET,
)
settings.register_profile(
    "plait-fuzz-long", derandomize=False, database=None, deadline=None, suppress_health_check=_QUIET
)


def fuzz(examples: int) -> settings:
    """Returns the settings of one fuzz test: ``examples`` inputs, `LONG_FACTOR` times more
    in a deep run."""
    long_run = is_long_run()
    profile = settings.get_profile("plait-fuzz-long" if long_run else "plait-fuzz")
    return settings(profile, max_examples=examples * (LONG_FACTOR if long_run else 1))


# -- the property ---------------------------------------------------------------------------

TRIED: Counter[str] = Counter()
"""Inputs tried per parser in this session (shrinking included)."""

CPU_SECONDS = 10.0
"""CPU time one input may take before it counts as a hang."""

MEGABYTES = 256
"""How far one input (at most a few MB) may raise the process's peak memory."""


class Hang(AssertionError):
    """An input kept a parser busy longer than `CPU_SECONDS`."""


class MemoryBlowUp(AssertionError):
    """An input made a parser allocate more than `MEGABYTES`."""


def outcome(
    parser: str,
    call: Callable[[], Any],
    *,
    allowed: tuple[type[BaseException], ...] = (PlaitError,),
    megabytes: float = MEGABYTES,
) -> Any:
    """Runs ``call`` on one input; returns its result, or the allowed error it raised.

    Any other exception propagates, so hypothesis reports and shrinks it. A
    run past `CPU_SECONDS` of CPU raises `Hang`; one that raises the
    process's peak memory by more than ``megabytes`` raises `MemoryBlowUp`.
    """
    TRIED[parser] += 1
    with _cpu_limit(CPU_SECONDS), _memory_limit(megabytes):
        try:
            return call()
        except allowed as exc:
            return _checked(exc)


async def outcome_async(
    parser: str,
    call: Callable[[], Awaitable[Any]],
    *,
    allowed: tuple[type[BaseException], ...] = (PlaitError,),
    seconds: float = 20.0,
) -> Any:
    """`outcome` for a coroutine; a wait past ``seconds`` raises `Hang`."""
    TRIED[parser] += 1
    try:
        return await asyncio.wait_for(call(), seconds)
    except TimeoutError:
        raise Hang(f"{parser} did not finish within {seconds} s") from None
    except allowed as exc:
        return _checked(exc)


def _checked(error: BaseException) -> BaseException:
    assert str(error).strip(), f"{type(error).__name__} without a message"
    return error


@contextlib.contextmanager
def _cpu_limit(seconds: float) -> Iterator[None]:
    """Raises `Hang` in the block after ``seconds`` of CPU time.

    A CPU-time timer (SIGVTALRM) leaves SIGALRM to pytest-timeout, which
    bounds the whole test.
    """

    def expire(signum: int, frame: Any) -> None:
        raise Hang(f"one input took more than {seconds} s of CPU")

    previous = signal.signal(signal.SIGVTALRM, expire)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


@contextlib.contextmanager
def _memory_limit(megabytes: float) -> Iterator[None]:
    """Raises `MemoryBlowUp` when the block raised the process's peak memory by ``megabytes``.

    The peak resident size only grows, so this sees an input that needs far
    more than any before it, at no cost per allocation (tracemalloc made
    PyYAML seven times slower).
    """
    before = _peak_megabytes()
    yield
    grown = _peak_megabytes() - before
    if grown > megabytes:
        raise MemoryBlowUp(f"one input raised peak memory by {grown:.0f} MB (limit {megabytes} MB)")


def _peak_megabytes() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KB


# -- inputs ---------------------------------------------------------------------------------

DEEP = 100_000
"""Nesting depth of the deepest documents tried (far past any recursion limit)."""

HUGE_TEXT = "x" * 200_000

ODD_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([-1, 0, 2**63, -(2**64), 10**40]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["", " ", "\x00", "\ud800", "\u202e", "null", "[DONE]", HUGE_TEXT]),
    st.sampled_from(["[" * DEEP, '{"a":' * 5_000, "1" * 5_000]),  # JSON text inside a string
)
"""Values a careless or hostile writer puts where something else belongs."""

JSON_VALUES = st.recursive(
    ODD_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
"""Random JSON data (with NaN, infinities and lone surrogates, which JSON text can spell)."""


class Nest:
    """Stands for a value nested ``depth`` levels deep; spelled out when the JSON is written."""

    def __init__(self, depth: int, opener: str) -> None:
        self.depth = depth
        self.opener = opener

    def text(self) -> str:
        if self.opener == "{":
            return '{"a":' * self.depth + "{}" + "}" * self.depth
        return "[" * self.depth + "1" + "]" * self.depth


def json_text(value: Any) -> bytes:
    """Returns ``value`` as JSON bytes, NaN and lone surrogates included (as JSON spells them)."""
    nests: dict[str, Nest] = {}

    def placeholder(obj: Any) -> str:
        if isinstance(obj, Nest):
            key = f"\x00nest{len(nests)}\x00"
            nests[key] = obj
            return key
        raise TypeError(f"cannot write {type(obj).__name__} as JSON")

    text = json.dumps(value, default=placeholder)
    for key, nest in nests.items():
        text = text.replace(json.dumps(key), nest.text())
    return text.encode("utf-8")


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*path, index))


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


def _flipped(value: Any) -> Any:
    """Returns ``value`` as another JSON type that a reader might mistake for it."""
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list):
        return {str(i): item for i, item in enumerate(value)}
    if isinstance(value, str):
        return [value]
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return {}


_TREE_EDITS = ("replace", "delete", "duplicate", "flip", "wrap", "nest", "huge")


@st.composite
def mutated_json(draw: st.DrawFn, valid: Any, deepest: int = DEEP) -> Any:
    """Returns ``valid`` (JSON data) with one to three edits at random places.

    Edits: replace a value by an odd one, delete it, duplicate it, flip its
    type, wrap it in a list or object, nest it up to ``deepest`` levels deep,
    or make it huge. Write the result with `json_text`.
    """
    value = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(value))))
        edit = draw(st.sampled_from(_TREE_EDITS))
        old = _get(value, path)
        if edit == "replace":
            new = draw(JSON_VALUES)
        elif edit == "flip":
            new = _flipped(old)
        elif edit == "wrap":
            new = draw(st.sampled_from([[old], {"value": old}, [old, old]]))
        elif edit == "nest":
            depth = draw(st.sampled_from([50, 500, 5_000, deepest]))
            new = Nest(min(depth, deepest), draw(st.sampled_from("[{")))
        elif edit == "huge":
            new = draw(st.sampled_from([HUGE_TEXT, [0] * 20_000, 1e308, 2**70]))
        else:
            new = old
        if not path:
            if edit not in ("delete", "duplicate"):
                value = new
            continue
        parent, key = _get(value, path[:-1]), path[-1]
        if edit == "delete":
            del parent[key]
        elif edit == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(old))
        elif edit == "duplicate":
            parent[f"{key}_copy"] = copy.deepcopy(old)
        else:
            parent[key] = new
    return value


ODD_FRAGMENTS = (
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",  # an encoded surrogate: not UTF-8
    b"\x00",
    b"\r",
    b"\n",
    b"\r\n\r\n",
    b'"',
    b"\\",
    b"\xef\xbb\xbf",  # a byte-order mark
    b"NaN",
    b"-Infinity",
    b"1" * 5_000,  # more digits than Python turns into an int
    b"1e999",
)
"""Byte strings that break readers: not UTF-8, control bytes, huge numbers (and deep
nesting, which `mutated_bytes` adds to the depth asked)."""


@st.composite
def mutated_bytes(
    draw: st.DrawFn, valid: bytes, fragments: tuple[bytes, ...] = (), deepest: int = DEEP
) -> bytes:
    """Returns ``valid`` with one to four byte-level edits.

    Edits: truncate, cut a slice out, duplicate a slice, flip a byte, or
    insert random bytes, an `ODD_FRAGMENTS` entry, brackets opened
    ``deepest`` times, or one of ``fragments`` (the family's own tokens,
    e.g. SSE field names or YAML anchors).
    """
    data = bytearray(valid)
    pieces = (*ODD_FRAGMENTS, b"[" * deepest, b'{"a":' * deepest, *fragments)
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(["truncate", "cut", "duplicate", "flip", "insert", "fragment"]))
        at = draw(st.integers(0, len(data)))
        end = draw(st.integers(at, min(len(data), at + 64)))
        if edit == "truncate":
            del data[at:]
        elif edit == "cut":
            del data[at:end]
        elif edit == "duplicate":
            data[at:at] = data[at:end]
        elif edit == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif edit == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            data[at:at] = draw(st.sampled_from(pieces))
    return bytes(data)


def documents(
    valid: Any, fragments: tuple[bytes, ...] = (), deepest: int = DEEP
) -> st.SearchStrategy[bytes]:
    """Returns JSON documents near ``valid``: edited data, edited bytes, or random bytes."""
    valid_bytes = json_text(valid)
    edited = mutated_json(valid, deepest).map(json_text)
    return st.one_of(
        edited,
        mutated_bytes(valid_bytes, fragments, deepest),
        edited.flatmap(lambda b: mutated_bytes(b, fragments, deepest)),
        JSON_VALUES.map(json_text),
        st.binary(max_size=200),
    )


# -- a server that answers anything with the given bytes ------------------------------------


class RawServer:
    """Answers requests on loopback with the status, content type and body a test sets.

    For providers the scripted server does not speak (Anthropic's Messages API
    and its batch results): the official SDK sends real HTTP here and reads
    whatever bytes a test puts on the wire.
    """

    def __init__(self) -> None:
        self.base_url = ""
        self.requests = 0
        """Requests answered so far."""
        self._answers: dict[str | None, tuple[int, str, bytes]] = {None: (200, "text/plain", b"")}
        self._runner: Any = None

    async def __aenter__(self) -> RawServer:
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._runner.cleanup()

    def answer(
        self,
        body: bytes,
        content_type: str = "application/json",
        status: int = 200,
        path: str | None = None,
    ) -> None:
        """Sets what requests for ``path`` (any other path when None) get from now on."""
        self._answers[path] = (status, content_type, body)

    async def _answer(self, request: Any) -> Any:
        from aiohttp import web

        await request.read()
        self.requests += 1
        status, content_type, body = self._answers.get(request.path, self._answers[None])
        return web.Response(status=status, headers={"Content-Type": content_type}, body=body)
