"""A real PostgreSQL server for the tests, started once per session (a pytest plugin).

PostgreSQL refuses to run as root, and the tests run as root on CI, so the
server runs as the ``postgres`` user (``runuser``) when the tests are root,
with its data and Unix socket in a temporary folder of its own and TCP on a
free loopback port. Tests that ask for `postgres_server` are skipped, saying
why, where PostgreSQL or psycopg is missing. `state_url` gives each test a
schema of its own, so tests never see each other's rows.

The state tests (cache, checkpoints, paused runs, budgets) run on both stores
through `url` (an SQLite file, then a PostgreSQL schema) and `store` (it opened).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from plait.resources.state import StateStore, open_store, release_store

__all__ = [
    "PostgresServer",
    "Unavailable",
    "postgres_server",
    "start_for_script",
    "state_url",
    "store",
    "url",
]


def _binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """One running server: `url` for a schema, `restart`, `stop`."""

    def __init__(self, bin_dir: Path, base: Path, user: str | None) -> None:
        self.bin_dir = bin_dir
        self.base = base
        self.data = base / "data"
        self.log = base / "server.log"
        self.socket_dir = base / "socket"
        self.port = _free_port()
        self._user = user

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        return subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def restart(self) -> None:
        """Restarts the server (fast: open connections are cut), same port."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-m", "fast", "-w", "restart"
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def running(self) -> bool:
        """Whether the server is up (a test may have stopped it)."""
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def url(self, schema: str | None = None, *, password: str = "not-needed") -> str:
        """A state URL of this server (the password is ignored: trust auth on loopback)."""
        query = f"?schema={schema}" if schema else ""
        return f"postgresql://postgres:{password}@127.0.0.1:{self.port}/postgres{query}"


class Unavailable(Exception):
    """PostgreSQL cannot be started here; the message says why."""


@contextlib.contextmanager
def start_for_script() -> Iterator[PostgresServer]:
    """Starts a server in a temporary folder and stops it (and removes the folder) after.

    Raises:
        Unavailable: PostgreSQL is missing, or cannot run here.
    """
    bin_dir = _binaries()
    if bin_dir is None:
        raise Unavailable("PostgreSQL is not installed (no initdb; apt-get install postgresql)")
    user = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise Unavailable("running as root and no 'postgres' user to run it as") from None
        if shutil.which("runuser") is None:
            raise Unavailable("running as root and runuser is missing to run it as 'postgres'")
        user = "postgres"
    base = Path(tempfile.mkdtemp(prefix="plait-pg-"))
    try:
        (base / "socket").mkdir()
        if user is not None:
            entry = pwd.getpwnam(user)
            for path in (base, base / "socket"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        server = PostgresServer(bin_dir, base, user)
        try:
            server.init()
            server.start()
        except subprocess.CalledProcessError as exc:
            told = (exc.stderr or exc.stdout or "").strip()[-300:]
            raise Unavailable(f"PostgreSQL could not start: {told}") from None
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for the session; skipped where PostgreSQL or psycopg is missing."""
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'plait[postgres]'")
    pytest.importorskip("psycopg_pool", reason="psycopg_pool is not installed")
    try:
        started = start_for_script()
        server = started.__enter__()
    except Unavailable as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        started.__exit__(None, None, None)


@pytest.fixture
def database(postgres_server: PostgresServer) -> Iterator[PostgresServer]:
    """The session's server, for a test that stops or freezes it: running again after."""
    yield postgres_server
    if not postgres_server.running():
        postgres_server.start()


@pytest.fixture
def state_url(postgres_server: PostgresServer) -> str:
    """A state URL on the session's server, with a schema of this test's own."""
    return postgres_server.url(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A state URL on each store in turn: an SQLite file, then a schema of `state_url`'s."""
    if request.param == "sqlite":
        return str(tmp_path / "state.sqlite")
    return str(request.getfixturevalue("state_url"))


@pytest.fixture
def store(url: str) -> Iterator[StateStore]:
    """The store of `url`, opened for the test and released after it."""
    opened = open_store(url)
    yield opened
    release_store(opened)
