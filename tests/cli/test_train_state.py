"""``plait train --state URL`` (or a ``[state]`` table): the training checkpoint is kept in the
state store, so a training stopped by its budget in one working folder resumes in another,
sending only what was left; on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import json

import pytest

from .conftest import plait_cli, program
from .test_cli import _training_files


@pytest.mark.parametrize("given", ["--state", "[state]"])
def test_train_stopped_by_its_budget_resumes_from_the_state_store_in_another_folder(
    server, resources, tmp_path, url, given
):
    from tests.optimization.test_trainer import model

    server.responder = model("GOOD")
    train, val = _training_files(tmp_path)
    saved = tmp_path / "learned.json"
    command = ["train", program("Task"), "--train", str(train), "--val", str(val),
               "-r", str(resources), "--batch-size", "2", "--save", str(saved),
               "--no-progress"]  # fmt: skip
    whole = plait_cli(*command)
    assert whole.code == 0, whole.stderr
    total = server.stats.requests
    server.reset_stats()

    if given == "--state":
        command += ["--state", url]
    else:
        with resources.open("a") as file:
            file.write(f'\n[state]\nurl = "{url}"\n')
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    first = plait_cli(*command, "--max-calls", "11", cwd=here)
    assert first.code == 3, first.stderr
    assert "a rerun on the same --state with a larger budget" in first.stderr
    first_calls = server.stats.requests
    server.reset_stats()

    again = plait_cli(*command, cwd=there)
    assert again.code == 0, again.stderr
    report = json.loads(saved.with_name("learned.run.json").read_text())
    assert report["training"]["resumed_from"] == [0, 1]
    # the finished minibatch and validation were not sent again
    assert 0 < server.stats.requests < total < first_calls + server.stats.requests
    assert list(here.iterdir()) == [] and list(there.iterdir()) == []  # no checkpoint file


def test_train_with_an_unreachable_state_store_says_so_in_one_line(server, resources, tmp_path):
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'plait[postgres]'")
    from postgres_server import _free_port

    train, val = _training_files(tmp_path)
    port = _free_port()  # nothing listens there
    url = f"postgresql://bob:hunter2@127.0.0.1:{port}/db?schema=learn"
    done = plait_cli("train", program("Task"), "--train", str(train), "--val", str(val),
                     "-r", str(resources), "--save", str(tmp_path / "learned.json"),
                     "--state", url, "--no-progress")  # fmt: skip
    assert done.code == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("plait: error: "), lines
    assert f"127.0.0.1:{port}" in lines[0] and "unreachable" in lines[0]
    assert "hunter2" not in done.stderr and "bob:***@" in lines[0]
    assert server.stats.requests == 0
