"""``plait state prune``: rows written long ago leave the state store, on SQLite and on a
real PostgreSQL server, and the command says what it removed."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from plait.resources.state import StateURL, open_store, release_store

from .conftest import plait_cli

DAY = 86_400


def age(url: str, table: str, key: str, days: float) -> None:
    """Makes row ``key`` look written ``days`` ago (the store stamps the time of writing)."""
    parsed = StateURL.parse(url)
    when = time.time() - days * DAY
    if parsed.kind == "sqlite":
        with sqlite3.connect(parsed.target) as db:
            db.execute(f"UPDATE {table} SET created = ? WHERE key = ?", (when, key))
        return
    import psycopg  # the PostgreSQL tests only
    from psycopg import sql

    with psycopg.connect(parsed.target, autocommit=True) as db:
        statement = sql.SQL("UPDATE {} SET created = %s WHERE key = %s")
        db.execute(statement.format(sql.Identifier(parsed.schema, table)), (when, key))


def test_prune_removes_rows_older_than_the_age_and_says_how_many(url: str) -> None:
    store = open_store(url)
    for table in ("responses", "pauses", "checkpoints"):
        store.put(table, "old", b"1")
        store.put(table, "new", b"2")
        age(url, table, "old", 40)
    release_store(store)

    only = plait_cli("state", "prune", "--state", url, "--older-than", "30d", "--table", "pauses")
    assert only.code == 0, only.stderr
    assert only.stdout.splitlines()[0].startswith("pauses: removed 1 rows written before ")
    assert len(only.stdout.splitlines()) == 1

    every = plait_cli("state", "prune", "--state", url, "--older-than", "720h")
    assert every.code == 0, every.stderr
    said = dict(line.split(": ", 1) for line in every.stdout.splitlines())
    assert said["responses"].startswith("removed 1 rows") and said["pauses"].startswith("removed 0")
    assert said["checkpoints"].startswith("removed 1 rows") and set(said) >= {"budgets", "learning"}
    store = open_store(url)
    try:
        for table in ("responses", "pauses", "checkpoints"):
            assert store.get(table, "old") is None and store.get(table, "new") == b"2"
    finally:
        release_store(store)


@pytest.mark.parametrize("wrong", ["30", "30 days", "-1d", "1y", "0m"])
def test_a_wrong_age_is_one_line_saying_what_to_write(tmp_path: Path, wrong: str) -> None:
    done = plait_cli("state", "prune", "--state", str(tmp_path / "s.db"), "--older-than", wrong)
    assert done.code == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "write a number and a unit: 30d (days), 12h" in lines[0]
    assert not (tmp_path / "s.db").exists()  # nothing was opened


def test_prune_without_a_store_says_how_to_name_one() -> None:
    done = plait_cli("state", "prune", "--older-than", "30d")
    assert done.code == 2 and "--state URL" in done.stderr


@pytest.mark.parametrize("given", ["--state", "[state]"])
def test_mcp_refuses_an_unreachable_store_in_one_line(tmp_path: Path, given: str) -> None:
    (tmp_path / "progs.py").write_text(
        "from plait import LLMInference\n\n"
        "def make():\n    return LLMInference('llm', 'Be brief.')\n"
    )
    url = "postgresql://plait:s3cret-word@127.0.0.1:9/plait"
    (tmp_path / "res.toml").write_text(
        '[llm]\nprovider = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'api_key = "k"\ncache = true\n'
        + (f'[state]\nurl = "{url}"\n' if given == "[state]" else "")
    )
    state = ["--state", url] if given == "--state" else []
    done = plait_cli("mcp", "progs.py:make", "-r", "res.toml", *state, cwd=tmp_path)
    assert done.code == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "unreachable at 127.0.0.1:9" in lines[0], lines
    assert "s3cret" not in lines[0]
    if given == "--state":
        alone = plait_cli("mcp", "progs.py:make", "--state", url, cwd=tmp_path)
        assert alone.code == 2
