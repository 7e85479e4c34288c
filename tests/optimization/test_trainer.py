"""Trainer against the scripted OpenAI-compatible server.

The task program is one LLM call whose system prompt is learnable. The
server plays the model: it answers every task input correctly when the
system prompt says GOOD, wrongly when it says BAD, and "no" otherwise (so
the starting accuracy on an alternating yes/no set is 0.5). The optimizer's
update calls append a scripted word to the prompt.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from plait import LLMInference, Parameter, ResourceConfig, ResourceManager
from plait.execution.checkpoint import CheckpointError
from plait.optimization import SFAOptimizer, Trainer, TrainingStep
from plait.testing import ScriptedServer


def schema_of(body: dict[str, Any]) -> str | None:
    response_format = body.get("response_format") or {}
    return (response_format.get("json_schema") or {}).get("name")


def system_of(body: dict[str, Any]) -> str:
    return next((m["content"] for m in body["messages"] if m["role"] == "system"), "")


def user_of(body: dict[str, Any]) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def task_answer(body: dict[str, Any]) -> str:
    """The simulated model: right with GOOD in the system prompt, wrong with BAD, else 'no'."""
    right = user_of(body).rsplit(":", 1)[1]
    wrong = "no" if right == "yes" else "yes"
    system = system_of(body)
    return right if "GOOD" in system else wrong if "BAD" in system else "no"


def model(word: str) -> Callable[[dict[str, Any]], str]:
    """A responder whose optimizer updates append ``word`` to the prompt."""

    def respond(body: dict[str, Any]) -> str:
        schema = schema_of(body)
        if schema == "FeedbackSummary":
            return json.dumps({"summary": "Wrong answers.", "changes": ["Answer correctly."]})
        if schema == "ParameterUpdate":
            current = re.search(r"<<<\n(.*?)\n>>>", user_of(body), re.DOTALL).group(1)
            return json.dumps({"new_value": f"{current} {word}", "rationale": "feedback"})
        return task_answer(body)

    return respond


def examples(prefix: str, count: int) -> list[dict[str, str]]:
    """``count`` examples ``<prefix><i>:<yes|no>``, alternating targets."""
    out = []
    for i in range(count):
        target = "yes" if i % 2 else "no"
        out.append({"input": f"{prefix}{i}:{target}", "target": target})
    return out


def task_inputs(server: ScriptedServer, prefix: str) -> list[str]:
    """The task inputs starting with ``prefix`` that the server saw, in arrival order."""
    return [
        user_of(r.body)
        for r in server.stats.log
        if r.body and schema_of(r.body) is None and user_of(r.body).startswith(prefix)
    ]


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(responder=model("GOOD")) as running:
        yield running


@pytest.fixture
async def manager(server: ScriptedServer) -> AsyncIterator[ResourceManager]:
    config = ResourceConfig({"*": server.endpoint(max_retries=0)})
    async with ResourceManager(config) as running:
        yield running


def program() -> LLMInference:
    return LLMInference("task", system_prompt=Parameter("PLAIN", description="task instructions"))


def exact(output: Any, target: Any) -> bool:
    return output == target


def trainer_for(task: LLMInference, manager: ResourceManager, **options: Any) -> Trainer:
    settings: dict[str, Any] = {
        "train_set": examples("t", 4),
        "val_set": examples("v", 4),
        "metric": exact,
        "batch_size": 2,
        "progress": False,
        **options,
    }
    optimizer = settings.pop("optimizer", None) or SFAOptimizer(
        task.named_parameters(), conservatism=0
    )
    return Trainer(task, exact, optimizer, resources=manager, **settings)


# --------------------------------------------------------------- keep-best
async def test_training_keeps_an_update_that_improves_validation(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    task = program()
    report = await trainer_for(task, manager).fit()

    assert (report.initial_score, report.best_score, report.best_epoch) == (0.5, 1.0, 1)
    assert report.scores == [1.0] and report.steps == 2 and report.accepted == 2
    assert (
        report.discarded == 0
        and report.reason == "kept the parameters of epoch 1: validation 0.5 -> 1"
    )
    assert task.system_prompt.value == "PLAIN GOOD GOOD"
    assert not task.training


async def test_training_that_hurts_ends_with_the_initial_parameters(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    server.responder = model("BAD")
    task = program()
    report = await trainer_for(task, manager, epochs=2).fit()

    assert report.initial_score == 0.5 and report.scores == [0.0, 0.0]
    assert (report.best_score, report.best_epoch) == (0.5, 0)
    assert task.system_prompt.value == "PLAIN"  # the initial state was the best candidate
    # Four updates were applied and then undone by keep-best: none counts as accepted.
    assert (report.accepted, report.discarded, report.rejected) == (0, 4, 0)
    assert [(h["accepted"], h["discarded"]) for h in report.history] == [(0, 1)] * 4
    assert report.reason == (
        "kept the initial parameters: validation after each epoch (0, 0) never beat the "
        "start (0.5); the 4 update(s) applied during training were discarded"
    )


async def test_training_whose_updates_were_all_rejected_says_why(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    good = model("GOOD")

    def refusing(body: dict[str, Any]) -> str:
        return "I will not" if schema_of(body) == "ParameterUpdate" else good(body)

    server.responder = refusing
    report = await trainer_for(program(), manager).fit()

    assert report.rejected == 2 and report.best_epoch == 0
    (why, times), *_ = report.not_applied.items()
    assert times == 2 and "ParameterUpdate" in why
    assert report.reason.startswith(
        "kept the initial parameters: the optimizer applied no update (2 rejected): "
    )
    assert why[:100] in report.reason and report.reason.endswith("… (2 times)")  # cut short
    assert "optimizer.history" not in report.reason


async def test_a_training_step_can_be_given_instead_of_program_and_loss(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    task = program()
    step = TrainingStep(task, exact)
    optimizer = SFAOptimizer(task.named_parameters(), conservatism=0)
    trainer = Trainer(
        step,
        None,
        optimizer,
        resources=manager,
        train_set=[(e["input"], e["target"]) for e in examples("t", 2)],
        val_set=examples("v", 2),
        progress=False,
    )
    report = await trainer.fit()
    assert report.best_score == 1.0 and optimizer.resources is manager


# -------------------------------------------------------------- concurrency
async def test_the_examples_of_a_minibatch_run_concurrently(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    arrived: list[str] = []
    all_four = asyncio.Event()

    async def respond(body: dict[str, Any]) -> str:
        if schema_of(body) is None and user_of(body).startswith("t"):
            arrived.append(user_of(body))
            if len(arrived) >= 4:
                all_four.set()
            # Only requests in flight together get past: a sequential client would time out.
            await asyncio.wait_for(all_four.wait(), timeout=10)
        return model("GOOD")(body)

    server.responder = respond
    task = program()
    await trainer_for(task, manager, batch_size=4, val_set=examples("v", 1)).fit()
    assert server.stats.peak_concurrency >= 4
    assert sorted(arrived[:4]) == sorted(e["input"] for e in examples("t", 4))


# ------------------------------------------------------------- checkpoints
class Interrupted(Exception):
    """Stands for a crash in the middle of training."""


async def test_a_new_trainer_resumes_at_the_saved_position(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path
) -> None:
    validations: list[str] = []
    task = program()

    async def crash_on_third_call() -> float:
        validations.append(task.system_prompt.value)
        if len(validations) == 3:  # after the second minibatch's update
            raise Interrupted
        return 1.0

    first = trainer_for(
        task,
        manager,
        checkpoint_dir=tmp_path,
        optimizer=SFAOptimizer(
            task.named_parameters(), conservatism=0, validate=crash_on_third_call
        ),
    )
    with pytest.raises(Interrupted):
        await first.fit()
    order = [first.train_set[i][0] for i in first._order(0)]
    assert task_inputs(server, "t") == order  # both minibatches ran once
    saved = json.loads((tmp_path / "trainer.json").read_text())
    assert (saved["epoch"], saved["batch"]) == (0, 1)
    assert saved["parameters"] == {"system_prompt": "PLAIN GOOD"}
    server.stats.reset()

    # A new program, optimizer and trainer on the same directory continue from there.
    again = program()
    optimizer = SFAOptimizer(again.named_parameters(), conservatism=0)
    report = await trainer_for(again, manager, checkpoint_dir=tmp_path, optimizer=optimizer).fit()

    assert report.resumed_from == (0, 1) and report.initial_score == 0.5
    assert task_inputs(server, "t") == order[2:]  # only the second minibatch
    trained = [r.body for r in server.stats.log if user_of(r.body).startswith("t")]
    assert {system_of(body) for body in trained} == {"PLAIN GOOD"}  # parameters were loaded
    assert len(task_inputs(server, "v")) == 4  # one validation, no second "before" pass
    assert optimizer.step_count == 2 and len(optimizer.history["system_prompt"]) == 2
    assert again.system_prompt.value == "PLAIN GOOD GOOD" and report.best_epoch == 1

    # Asking for more epochs continues after the last finished one.
    server.stats.reset()
    more = await trainer_for(program(), manager, checkpoint_dir=tmp_path, epochs=2).fit()
    assert more.resumed_from == (1, 0) and len(more.scores) == 2
    assert len(task_inputs(server, "t")) == 4


async def test_a_finished_run_resumed_makes_no_calls(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path
) -> None:
    await trainer_for(program(), manager, checkpoint_dir=tmp_path).fit()
    server.stats.reset()
    task = program()
    report = await trainer_for(task, manager, checkpoint_dir=tmp_path).fit()
    assert server.stats.requests == 0
    assert report.best_score == 1.0 and task.system_prompt.value == "PLAIN GOOD GOOD"


async def test_a_checkpoint_of_other_settings_is_refused(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path
) -> None:
    await trainer_for(program(), manager, checkpoint_dir=tmp_path).fit()
    with pytest.raises(ValueError, match=r"batch_size=2 \(this Trainer has 3\)"):
        await trainer_for(program(), manager, checkpoint_dir=tmp_path, batch_size=3).fit()


@pytest.mark.parametrize(
    ("data", "told"),
    [
        ({"train_set": examples("u", 4)}, "another training set"),  # as many rows, other ones
        ({"val_set": examples("w", 4)}, "another validation set"),
    ],
    ids=["training set", "validation set"],
)
async def test_a_checkpoint_of_other_data_is_refused_before_any_call(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path, data: Any, told: str
) -> None:
    # resumed on other examples, the saved scores and position would mean nothing
    await trainer_for(program(), manager, checkpoint_dir=tmp_path).fit()
    server.reset_stats()
    refused = f"trainer.json was written for {told}; use another checkpoint_dir"
    with pytest.raises(ValueError, match=refused):
        await trainer_for(program(), manager, checkpoint_dir=tmp_path, **data).fit()
    assert server.stats.requests == 0


async def test_a_checkpoint_written_before_the_data_were_digested_still_resumes(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path
) -> None:
    await trainer_for(program(), manager, checkpoint_dir=tmp_path, epochs=1).fit()
    saved = tmp_path / "trainer.json"
    data = json.loads(saved.read_text())
    for key in ("train_set", "val_set"):
        del data["settings"][key]
    saved.write_text(json.dumps(data))
    report = await trainer_for(program(), manager, checkpoint_dir=tmp_path, epochs=2).fit()
    assert report.resumed_from is not None


async def test_links_planted_in_the_checkpoint_dir_are_never_written_through(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    at_temporary = tmp_path / "temporary"
    at_temporary.mkdir()
    (at_temporary / "trainer.json.tmp").symlink_to(victim)  # the temporary name plait once used
    await trainer_for(program(), manager, checkpoint_dir=at_temporary).fit()
    saved = at_temporary / "trainer.json"
    assert not saved.is_symlink() and json.loads(saved.read_text())["epoch"] == 1

    at_target = tmp_path / "target"
    at_target.mkdir()
    (at_target / "trainer.json").symlink_to(victim)
    with pytest.raises(CheckpointError, match=r"trainer\.json is a symbolic link"):
        await trainer_for(program(), manager, checkpoint_dir=at_target).fit()
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda data: data.pop("optimizer"), id="a key removed"),
        pytest.param(lambda data: data.update(parameters=[1, 2]), id="parameters not a mapping"),
        pytest.param(lambda data: data.update(optimizer="{not json"), id="optimizer not JSON"),
    ],
)
async def test_an_edited_trainer_checkpoint_is_a_checkpoint_error_naming_the_file(
    server: ScriptedServer, manager: ResourceManager, tmp_path: Path, edit: Any
) -> None:
    await trainer_for(program(), manager, checkpoint_dir=tmp_path).fit()
    saved = tmp_path / "trainer.json"
    data = json.loads(saved.read_text())
    edit(data)
    saved.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"trainer\.json"):
        await trainer_for(program(), manager, checkpoint_dir=tmp_path).fit()


# --------------------------------------------------------------- arguments
def test_trainer_arguments_are_checked(manager: ResourceManager) -> None:
    task = program()
    optimizer = SFAOptimizer(task.named_parameters())
    data = examples("t", 2)
    with pytest.raises(ValueError, match="needs a loss_fn"):
        Trainer(task, None, optimizer, resources=manager, train_set=data, val_set=data)
    with pytest.raises(ValueError, match="the step has its loss"):
        step = TrainingStep(task, exact)
        Trainer(step, exact, optimizer, resources=manager, train_set=data, val_set=data)
    with pytest.raises(ValueError, match="non-empty"):
        Trainer(task, exact, optimizer, resources=manager, train_set=[], val_set=data)
    with pytest.raises(ValueError, match="example 0"):
        Trainer(task, exact, optimizer, resources=manager, train_set=["x"], val_set=data)


async def test_a_cancelled_fit_keeps_the_best_validated_parameters_and_says_so(
    server: ScriptedServer, manager: ResourceManager
) -> None:
    # the first minibatch's update is applied; the second minibatch's calls hang, and
    # the fit is cancelled there (Ctrl-C in `plait train`)
    hanging = asyncio.Event()
    updated = model("GOOD")

    async def respond(body: dict[str, Any]) -> str:
        if schema_of(body) is None and "GOOD" in system_of(body):
            hanging.set()
            await asyncio.Event().wait()
        return updated(body)

    server.responder = respond
    task = program()
    trainer = trainer_for(task, manager)
    fit = asyncio.ensure_future(trainer.fit())
    await hanging.wait()
    assert task.system_prompt.value == "PLAIN GOOD"  # applied, never validated
    fit.cancel()
    with pytest.raises(asyncio.CancelledError):
        await fit

    assert task.system_prompt.value == "PLAIN"  # the best validated: the start
    assert trainer.report is not None and trainer.report.initial_score == 0.5
    assert trainer.report.reason.startswith("cancelled: ")
    assert "1 update(s) applied during training were never validated" in trainer.report.reason
