"""Search and Trainer checkpoints kept in a state store (``state=``, ``plait train --state``).

With a state store and no checkpoint path, a search's or a Trainer's
checkpoint is one key of the store's table ``learning``: a run stopped
part-way (its budget, a crash) and rerun with the same ``state=`` sends only
the work not finished (the scripted server counts it), on SQLite and on a
real PostgreSQL server; a checkpoint there of another program is refused
before any call, as a file's is; no file is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from plait import LLMInference, Module, Parameter, ResourceConfig, ResourceManager
from plait.execution.checkpoint_codec import CheckpointError
from plait.optimization import SFAOptimizer
from plait.optimization.evaluation import evaluate
from plait.resources.state import open_store, release_store
from plait.testing import ScriptedServer

from . import test_trainer as trained
from .test_budget import TRAIN, VAL, program
from .test_search_resume import SEARCHES, WHOLE, outcome


def learning_keys(url: str) -> list[str]:
    store = open_store(url)
    try:
        return [key for key, _ in store.scan("learning", "")]
    finally:
        release_store(store)


@pytest.mark.parametrize(("name", "cut"), [("RandomSearch", 41), ("ReflectiveSearch", 55)])
async def test_a_search_stopped_by_its_budget_resumes_from_the_state_store(
    server: ScriptedServer,
    config: ResourceConfig,
    url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    cut: int,
) -> None:
    monkeypatch.chdir(tmp_path)
    make = SEARCHES[name]
    whole_program = program()
    whole = await make(max_calls=WHOLE.get(name)).compile(
        whole_program, trainset=TRAIN, valset=VAL, resources=config
    )
    total = server.stats.requests
    server.reset_stats()

    first = await make(max_calls=cut, state=url).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    assert first.stopped_by_budget and server.stats.requests == cut
    assert [k.split("/")[:2] for k in learning_keys(url)] == [["search", name]]
    server.reset_stats()

    again = program()
    resumed = await make(max_calls=WHOLE.get(name, 1000), state=url).compile(
        again, trainset=TRAIN, valset=VAL, resources=config
    )
    # what the store held was not sent again, and the rest was sent once
    assert 0 < resumed.resumed_calls <= cut
    assert server.stats.requests == total - resumed.resumed_calls
    assert outcome(resumed, again) == outcome(whole, whole_program)
    assert sorted(p.name for p in tmp_path.iterdir()) == (
        ["state.sqlite"] if not url.startswith("postgres") else []
    )  # no checkpoint file anywhere


async def test_a_search_checkpoint_in_the_store_of_another_program_is_refused(
    server: ScriptedServer, config: ResourceConfig, url: str
) -> None:
    await SEARCHES["BootstrapFewShot"](max_calls=14, state=url).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    server.reset_stats()
    other = program()
    other.instructions.value = "Say odd."
    with pytest.raises(ValueError, match="another program") as refused:
        await SEARCHES["BootstrapFewShot"](state=url).compile(
            other, trainset=TRAIN, valset=VAL, resources=config
        )
    told = str(refused.value)
    assert "table learning, key search/BootstrapFewShot/" in told and "\n" not in told
    assert "postgresql://" not in told or ":***@" in told or "@" not in told
    assert server.stats.requests == 0


async def test_a_checkpoint_path_wins_over_the_state_store(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Path
) -> None:
    url = str(tmp_path / "state.sqlite")
    checkpoint = tmp_path / "search.json"
    await SEARCHES["BootstrapFewShot"](checkpoint=checkpoint, state=url).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    assert json.loads(checkpoint.read_text())["search"] == "BootstrapFewShot"
    assert learning_keys(url) == []


# ------------------------------------------------------------------ Trainer
@pytest.fixture
async def manager() -> AsyncIterator[ResourceManager]:
    async with (
        ScriptedServer(responder=trained.model("GOOD")) as running,
        ResourceManager(ResourceConfig({"*": running.endpoint(max_retries=0)})) as manager,
    ):
        manager.server = running  # type: ignore[attr-defined]
        yield manager


async def test_a_trainer_stopped_by_a_crash_resumes_from_the_state_store(
    manager: ResourceManager, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    server: ScriptedServer = manager.server  # type: ignore[attr-defined]
    validations: list[str] = []
    task = trained.program()

    async def crash_on_third_call() -> float:
        validations.append(task.system_prompt.value)
        if len(validations) == 3:  # after the second minibatch's update
            raise trained.Interrupted
        return 1.0

    first = trained.trainer_for(
        task,
        manager,
        state=url,
        optimizer=SFAOptimizer(
            task.named_parameters(), conservatism=0, validate=crash_on_third_call
        ),
    )
    with pytest.raises(trained.Interrupted):
        await first.fit()
    order = [first.train_set[i][0] for i in first._order(0)]
    assert trained.task_inputs(server, "t") == order  # both minibatches ran once
    assert [key.split("/")[0] for key in learning_keys(url)] == ["trainer"]
    server.stats.reset()

    again = trained.program()
    optimizer = SFAOptimizer(again.named_parameters(), conservatism=0)
    report = await trained.trainer_for(again, manager, state=url, optimizer=optimizer).fit()
    assert report.resumed_from == (0, 1) and report.initial_score == 0.5
    assert trained.task_inputs(server, "t") == order[2:]  # only the second minibatch
    assert again.system_prompt.value == "PLAIN GOOD GOOD" and report.best_epoch == 1
    assert not (tmp_path / "trainer.json").exists()


class Wrapped(Module):
    """Another program: its parameter has another name."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = LLMInference("task", system_prompt=Parameter("PLAIN", description="task"))

    def forward(self, text: str) -> Any:
        return self.inner(text)


async def test_a_trainer_checkpoint_in_the_store_of_another_program_is_refused(
    manager: ResourceManager, url: str
) -> None:
    server: ScriptedServer = manager.server  # type: ignore[attr-defined]
    await trained.trainer_for(trained.program(), manager, state=url, max_calls=6).fit()
    server.stats.reset()
    other = Wrapped()
    with pytest.raises(CheckpointError, match="cannot be restored") as refused:
        await trained.trainer_for(other, manager, state=url).fit()  # type: ignore[arg-type]
    assert "table learning, key trainer/" in str(refused.value)
    assert server.stats.requests == 0


async def test_evaluate_with_state_runs_only_the_examples_not_done(
    server: ScriptedServer, config: ResourceConfig, url: str
) -> None:
    first = await evaluate(program(), VAL, resources=config, state=url, max_calls=4)
    assert first.unevaluated == len(VAL) - 4
    server.reset_stats()
    again = await evaluate(program(), VAL, resources=config, state=url)
    assert server.stats.requests == len(VAL) - 4 and again.unevaluated == 0
    assert os.fspath(url)  # the same store both times


@pytest.mark.parametrize(
    ("value", "told"),
    [(b'{"format": "plait.search/1"', "is not valid JSON"), (b"[" * 5000, "too deeply")],
)
async def test_a_stored_value_plait_did_not_write_is_refused_naming_the_store_and_key(
    server: ScriptedServer, config: ResourceConfig, url: str, value: bytes, told: str
) -> None:
    await SEARCHES["BootstrapFewShot"](max_calls=14, state=url).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    (key,) = learning_keys(url)
    store = open_store(url)
    store.put("learning", key, value)
    release_store(store)
    server.reset_stats()
    with pytest.raises(CheckpointError, match=told) as refused:
        await SEARCHES["BootstrapFewShot"](state=url).compile(
            program(), trainset=TRAIN, valset=VAL, resources=config
        )
    assert f"key {key}" in str(refused.value) and "\n" not in str(refused.value)
    assert server.stats.requests == 0
