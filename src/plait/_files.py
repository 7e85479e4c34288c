"""The one way plait writes files, and reads back the state files it wrote.

Every file plait writes goes through here, because a folder it writes in may
hold names someone else prepared: a checkpoint directory, the folder of an
output. Two ways to write:

* `replacing` / `write_atomically` — a whole file (state, checkpoints, saved
  parameters, reports, traces). The data goes to a new temporary file beside
  the target, with a random name, created exclusively (so a link planted under
  any name is never opened), is flushed to disk, and is then renamed over the
  target. A reader sees the old file or the new one, never half of one; a
  failure leaves the old one and removes the temporary. A replaced file keeps
  its permission bits.
* `open_for_writing` — a file written as work finishes (checkpoint lines,
  output rows), truncated or appended to.

Either way the target itself must be a regular file or missing. A symbolic
link there is refused, not written through (whoever made it would choose the
file plait overwrites) and not replaced (that would silently turn the user's
own link into a plain file): the error names it and says to remove it. Only
the last part of a path is checked; folders on the way are the user's layout.
A directory, FIFO or device there is refused too, and a FIFO never blocks the
open.

Reading plait's own state back (`read_json`, `open_for_reading` and
`read_lines`) refuses the same, and caps what it holds in memory: a file or a
line grown by junk costs at most the cap, never its size, and JSON nested too
deeply to parse is an error naming the file, not a `RecursionError`.

Errors are `plait.errors.FileError` unless the caller names its own class
(``error=CheckpointError`` for a checkpoint directory, for instance).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

from plait import _jsontext as jsontext
from plait.errors import FileError

__all__ = [
    "MAX_STATE_BYTES",
    "check_no_links",
    "open_for_reading",
    "open_for_writing",
    "read_json",
    "read_lines",
    "replacing",
    "write_atomically",
]

MAX_STATE_BYTES = 64 * 1024 * 1024
"""The most `read_json` reads of one state file: far above any plait writes."""

_PIECE = 64 * 1024
"""Bytes `read_lines` reads at a time, so an over-long line is never held whole."""

_NAME_ATTEMPTS = 16
"""Random temporary names tried before giving up (each is taken only if planted)."""

ErrorClass = type[Exception]
Where = str | os.PathLike[str]


# ------------------------------------------------------------------ checks
def _refuse_special(path: Where, mode: int, error: ErrorClass) -> None:
    """Raises ``error`` unless ``mode`` is a regular file's."""
    if stat.S_ISLNK(mode):
        raise error(
            f"{path} is a symbolic link, and plait never reads or writes a file through a "
            "link, nor replaces one: remove the link, or use another path"
        )
    if not stat.S_ISREG(mode):
        raise error(f"{path} is not a regular file; remove it, or use another path")


def _existing_mode(path: Where, error: ErrorClass) -> int | None:
    """Returns the permission bits of the regular file at ``path``, or None if there is none."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise error(f"{path} cannot be written: {exc.strerror or exc}") from None
    _refuse_special(path, mode, error)
    return stat.S_IMODE(mode)


def check_no_links(*paths: Where, error: ErrorClass = FileError) -> None:
    """Raises ``error`` when any of ``paths`` exists as a link or a non-regular file.

    For files another library opens by name (SQLite's database and its
    ``-wal`` / ``-shm`` companions), where plait cannot pass ``O_NOFOLLOW``:
    checked just before they are opened, this keeps a link planted beside a
    program from redirecting its writes.
    """
    for path in paths:
        _existing_mode(path, error)


def _open_regular(path: Where, flags: int, error: ErrorClass) -> int:
    """Opens ``path`` as a regular file without following a link; returns the descriptor.

    What is there is looked at first, for a clear error; ``O_NOFOLLOW`` and the
    check on the opened descriptor then make sure nothing swapped in between is
    used, and ``O_NONBLOCK`` keeps a planted FIFO from blocking the open.
    """
    with contextlib.suppress(FileNotFoundError):
        _refuse_special(path, os.lstat(path).st_mode, error)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _refuse_special(path, stat.S_IFLNK, error)
        raise error(f"{path} cannot be opened: {exc.strerror or exc}") from None
    try:
        _refuse_special(path, os.fstat(fd).st_mode, error)
    except BaseException:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return fd


# ------------------------------------------------------------------ writing
@contextlib.contextmanager
def replacing(
    path: Where, *, binary: bool = False, error: ErrorClass = FileError
) -> Iterator[IO[Any]]:
    """Yields a file to write the whole new contents of ``path`` to; installs it on exit.

    The file is a new temporary beside ``path``; when the block ends normally
    it is flushed to disk and renamed over ``path``. If the block raises, the
    temporary is removed and ``path`` is left as it was.

    Args:
        path: the file to write (its folder must exist).
        binary: yield a binary file instead of UTF-8 text.
        error: the exception class raised for an unusable path.

    Raises:
        error: ``path`` is a symbolic link or not a regular file, or the file
            cannot be created or written (the message names ``path``).

    Example::

        with replacing("state.json") as file:
            json.dump(state, file)
    """
    target = Path(path)
    mode = _existing_mode(target, error)
    fd, temporary = _create_temporary(target, error)
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as file:
            if mode is not None:
                os.fchmod(fd, mode)
            yield file
            file.flush()
            os.fsync(fd)  # the rename must not land before the data, or a crash leaves it empty
        os.replace(temporary, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(exc, OSError) and not isinstance(exc, error):
            raise error(f"{target} cannot be written: {exc.strerror or exc}") from exc
        raise


def _create_temporary(target: Path, error: ErrorClass) -> tuple[int, Path]:
    """Creates a new, empty, exclusively opened file beside ``target``."""
    for _ in range(_NAME_ATTEMPTS):
        # os.urandom, as secrets.token_hex uses, without the 10-15 ms `import secrets`
        # costs (hmac, hashlib and OpenSSL, random) in every command that writes a file
        temporary = target.with_name(f".{target.name}.{os.urandom(6).hex()}.tmp")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(temporary, flags, 0o666), temporary
        except FileExistsError:
            continue  # that name was taken (or planted): another random one
        except OSError as exc:
            raise error(f"{target} cannot be written: {exc.strerror or exc}") from None
    raise error(f"{target} cannot be written: no free temporary name beside it")


def write_atomically(path: Where, data: str | bytes, *, error: ErrorClass = FileError) -> None:
    """Replaces the file at ``path`` with ``data`` (text as UTF-8) through `replacing`.

    Raises:
        error: as `replacing` does.
    """
    with replacing(path, binary=isinstance(data, bytes), error=error) as file:
        file.write(data)


def open_for_writing(
    path: Where,
    *,
    append: bool = False,
    binary: bool = False,
    newline: str | None = None,
    error: ErrorClass = FileError,
) -> IO[Any]:
    """Opens a regular file for writing as work finishes, creating it if missing.

    Args:
        path: the file (its folder must exist).
        append: add to the end instead of truncating.
        binary: a binary file instead of UTF-8 text.
        newline: as for `open` (``""`` for CSV).
        error: the exception class raised for an unusable path.

    Raises:
        error: ``path`` is a symbolic link or not a regular file, or cannot be
            opened (the message names it).
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = _open_regular(path, flags, error)
    if binary:
        return os.fdopen(fd, "ab" if append else "wb")
    return os.fdopen(fd, "a" if append else "w", encoding="utf-8", newline=newline)


# ------------------------------------------------------------------ reading
def open_for_reading(path: Where, *, error: ErrorClass = FileError) -> BinaryIO | None:
    """Opens a regular file for reading in binary, or returns None when nothing is there.

    Raises:
        error: ``path`` is a symbolic link or not a regular file, or cannot be opened.
    """
    if not os.path.lexists(path):
        return None
    return os.fdopen(_open_regular(path, os.O_RDONLY, error), "rb")


def read_lines(file: BinaryIO, limit: int) -> Iterator[bytes | None]:
    """Yields each line of ``file`` (with its newline), or None for one over ``limit`` bytes.

    A line is read in pieces; once it passes ``limit`` its pieces are dropped
    and the rest is skipped, so junk without a newline costs at most
    ``limit`` bytes of memory, whatever its size.
    """
    while piece := file.readline(_PIECE):
        pieces: list[bytes] = []
        size = 0
        while piece:
            size += len(piece)
            if size <= limit:
                pieces.append(piece)
            else:
                pieces.clear()
            if piece.endswith(b"\n"):
                break
            piece = file.readline(_PIECE)
        yield b"".join(pieces) if size <= limit else None


def read_json(
    path: Where,
    *,
    limit: int = MAX_STATE_BYTES,
    error: ErrorClass = FileError,
    remedy: str = "delete it",
) -> Any:
    """Returns the JSON in a state file plait wrote, or None when there is no file.

    Args:
        path: the file.
        limit: the most bytes read; a larger file is refused.
        error: the exception class raised for an unusable file.
        remedy: what the message tells the user to do about contents that
            are not plait's.

    Raises:
        error: the path is a link or not a regular file, or what is there is
            larger than ``limit`` bytes, not UTF-8 JSON, or nested too deeply
            to parse (the message names the file and ends with ``remedy``).
    """
    file = open_for_reading(path, error=error)
    if file is None:
        return None
    with file:
        raw = _read_capped(file, limit)
    if raw is None:
        raise error(f"{path} is larger than {limit:,} bytes, more than plait writes: {remedy}")
    try:
        return jsontext.loads(raw.decode("utf-8"))
    except jsontext.TooDeep:
        raise error(f"{path} is nested too deeply to be plait's: {remedy}") from None
    except ValueError as exc:  # UnicodeDecodeError is one too
        raise error(f"{path} is not valid JSON ({exc}): {remedy}") from None


def _read_capped(file: BinaryIO, limit: int) -> bytes | None:
    """Returns all of ``file``, or None once it passes ``limit`` bytes.

    Read in pieces: ``file.read(limit + 1)`` would set aside ``limit`` bytes
    even for a small file.
    """
    pieces: list[bytes] = []
    size = 0
    while piece := file.read(_PIECE):
        size += len(piece)
        if size > limit:
            return None
        pieces.append(piece)
    return b"".join(pieces)
