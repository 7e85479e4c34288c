"""Searches stopped by their budget resume from their checkpoint, and ReflectiveSearch pipelines.

A search given ``checkpoint=`` writes what it finished (trials evaluated in
full, a bootstrap pass, instruction proposals, ReflectiveSearch's pool and
rounds); a rerun with the same file and a larger budget sends only the work
that was not finished — the scripted server counts it — and ends where a run
without a budget ends. A checkpoint of another program, data or settings is
refused before any call, and so is a file that is not one plait wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from plait import ResourceConfig
from plait.execution.checkpoint_codec import CheckpointError
from plait.optimization import (
    BootstrapFewShot,
    GridSearch,
    LabeledFewShot,
    RandomSearch,
    ReflectiveSearch,
    SearchReport,
)
from plait.testing import ScriptedServer

from .test_budget import TRAIN, VAL, examples, program, respond

SEARCHES: dict[str, Callable[..., Any]] = {
    "LabeledFewShot": lambda **budget: LabeledFewShot(k=2, seed=3, **budget),
    "BootstrapFewShot": lambda **budget: BootstrapFewShot(max_demos=2, seed=3, **budget),
    "RandomSearch": lambda **budget: RandomSearch(num_candidates=4, propose=2, seed=3, **budget),
    "ReflectiveSearch": lambda **budget: ReflectiveSearch(
        minibatch=4, proposals=2, merge_every=2, seed=3, **budget
    ),
}
"""Each search, made with a budget; ReflectiveSearch's max_calls is also where it stops."""

WHOLE = {"ReflectiveSearch": 110}
"""The budget of a whole run (None: no budget)."""
CUTS = [
    ("LabeledFewShot", 14),  # in the candidate's evaluation
    ("BootstrapFewShot", 14),  # in the bootstrap pass
    ("BootstrapFewShot", 24),  # in the candidate's evaluation
    ("RandomSearch", 15),  # in the bootstrap pass
    ("RandomSearch", 41),  # in the candidates' evaluations
    ("ReflectiveSearch", 6),  # in trial 0
    ("ReflectiveSearch", 55),  # in a round
]
"""Budgets that stop each search part-way."""


def outcome(report: SearchReport, compiled: Any) -> dict[str, Any]:
    """What must be the same after a resumed run as after a whole one."""
    return {
        "program": compiled.state_dict(),
        "best": report.best.number,
        "trials": [(t.number, t.params, t.scores, t.parameters) for t in report.trials],
    }


@pytest.mark.parametrize(("name", "cut"), CUTS, ids=[f"{name}-{cut}" for name, cut in CUTS])
async def test_a_search_stopped_by_its_budget_resumes_with_only_the_work_left(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Any, name: str, cut: int
) -> None:
    make = SEARCHES[name]
    whole_program = program()
    whole = await make(max_calls=WHOLE.get(name)).compile(
        whole_program, trainset=TRAIN, valset=VAL, resources=config
    )
    total = server.stats.requests
    server.reset_stats()

    checkpoint = tmp_path / "search.json"
    first = await make(max_calls=cut, checkpoint=checkpoint).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    assert first.stopped_by_budget and server.stats.requests == cut
    sent_first = server.stats.requests
    server.reset_stats()

    again = program()
    resumed = await make(max_calls=WHOLE.get(name, 1000), checkpoint=checkpoint).compile(
        again, trainset=TRAIN, valset=VAL, resources=config
    )
    # what the checkpoint held was not sent again, and the rest was sent once
    assert 0 < resumed.resumed_calls <= sent_first
    assert server.stats.requests == total - resumed.resumed_calls
    if name != "ReflectiveSearch":  # its unit is a step: the step cut short runs again
        assert resumed.resumed_calls == sent_first  # nothing answered was asked again
    assert outcome(resumed, again) == outcome(whole, whole_program)
    assert resumed.stopped_by_budget == whole.stopped_by_budget


async def test_a_rerun_on_the_program_the_stopped_search_changed_starts_from_trial_0(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Any
) -> None:
    def make(**budget: Any) -> RandomSearch:
        return RandomSearch(num_candidates=4, propose=2, seed=3, **budget)

    whole = program()
    await make().compile(whole, trainset=TRAIN, valset=VAL, resources=config)
    total = server.stats.requests
    server.reset_stats()

    checkpoint = tmp_path / "search.json"
    qa = program()
    first = await make(max_calls=41, checkpoint=checkpoint).compile(
        qa, trainset=TRAIN, valset=VAL, resources=config
    )
    assert first.stopped_by_budget and first.improved  # it applied the best it finished
    server.reset_stats()
    resumed = await make(checkpoint=checkpoint).compile(
        qa, trainset=TRAIN, valset=VAL, resources=config
    )
    assert resumed.start.parameters == program().state_dict()
    assert server.stats.requests == total - 41
    assert qa.state_dict() == whole.state_dict()


async def test_a_finished_search_reruns_from_its_checkpoint_without_a_call(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Any
) -> None:
    checkpoint = tmp_path / "search.json"
    first = program()
    report = await RandomSearch(num_candidates=4, propose=2, checkpoint=checkpoint).compile(
        first, trainset=TRAIN, valset=VAL, resources=config
    )
    server.reset_stats()
    again = program()
    rerun = await RandomSearch(num_candidates=4, propose=2, checkpoint=checkpoint).compile(
        again, trainset=TRAIN, valset=VAL, resources=config
    )
    assert server.stats.requests == 0 and rerun.resumed_calls == report.calls
    assert again.state_dict() == first.state_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"trainset": examples([2, 4, 6, 8, 3, 5, 7, 9])}, "another trainset"),
        ({"valset": examples(range(40, 50))}, "another valset"),
        ({"instructions": "Say odd."}, "another program"),
        ({"search": BootstrapFewShot(max_demos=3)}, "other settings"),
        ({"search": RandomSearch()}, "holds a BootstrapFewShot checkpoint, not a RandomSearch one"),
    ],
    ids=["trainset", "valset", "program", "settings", "search"],
)
async def test_a_checkpoint_of_other_work_is_refused_before_any_call(
    server: ScriptedServer,
    config: ResourceConfig,
    tmp_path: Any,
    change: dict[str, Any],
    message: str,
) -> None:
    checkpoint = tmp_path / "search.json"
    await BootstrapFewShot(max_demos=2, checkpoint=checkpoint).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    server.reset_stats()
    search = change.get("search", BootstrapFewShot(max_demos=2))
    search.checkpoint = checkpoint
    other = program()
    if "instructions" in change:
        other.instructions.value = change["instructions"]
    with pytest.raises(ValueError, match=message) as refused:
        await search.compile(
            other,
            trainset=change.get("trainset", TRAIN),
            valset=change.get("valset", VAL),
            resources=config,
        )
    assert "search.json" in str(refused.value) and "\n" not in str(refused.value)
    assert server.stats.requests == 0


async def test_a_truncated_checkpoint_is_an_error_naming_the_file_and_line(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Any
) -> None:
    checkpoint = tmp_path / "search.json"
    search = ReflectiveSearch(max_calls=40, minibatch=4, checkpoint=checkpoint)
    await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
    text = checkpoint.read_text()
    checkpoint.write_text(text[: len(text) // 2])
    server.reset_stats()
    with pytest.raises(CheckpointError, match=r"search\.json is not valid JSON \(.*line \d+"):
        await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
    assert server.stats.requests == 0


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda data: data["trials"][0].update(score="high"), r"trials\[0\]\.score"),
        (lambda data: data["trials"][0].pop("scores"), r"trials\[0\]\.scores"),
        (lambda data: data["state"]["rounds"].update(rng=[3, "x"]), r"state\.rounds\.rng"),
        (
            lambda data: data["state"]["rounds"]["pool"][0].update(parent="me"),
            r"state\.rounds\.pool\[0\]\.parent",
        ),
        (lambda data: data.update(trials={"a": 1}), r"trials"),
        (lambda data: data["trials"][0].update(undone=[3]), r"trials\[0\]\.undone"),
    ],
    ids=["score", "scores", "rng", "parent", "trials", "undone"],
)
async def test_an_edited_checkpoint_is_an_error_naming_the_field(
    server: ScriptedServer,
    config: ResourceConfig,
    tmp_path: Any,
    edit: Callable[[dict[str, Any]], Any],
    where: str,
) -> None:
    checkpoint = tmp_path / "search.json"
    search = ReflectiveSearch(max_calls=40, minibatch=4, checkpoint=checkpoint)
    await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
    data = json.loads(checkpoint.read_text())
    edit(data)
    checkpoint.write_text(json.dumps(data, indent=1))
    server.reset_stats()
    with pytest.raises(CheckpointError, match=rf"search\.json: {where} ") as refused:
        await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
    assert "\n" not in str(refused.value)
    assert server.stats.requests == 0


async def test_an_edited_bootstrap_pass_is_an_error_naming_the_field(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Any
) -> None:
    checkpoint = tmp_path / "search.json"
    search = BootstrapFewShot(max_demos=2, checkpoint=checkpoint)
    await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
    data = json.loads(checkpoint.read_text())
    data["state"]["steps"]["bootstrap"]["value"]["undone"] = ["x"]
    checkpoint.write_text(json.dumps(data, indent=1))
    server.reset_stats()
    where = r"search\.json: state\.steps\.bootstrap\.value\.undone\[0\] is 'x', not a count"
    with pytest.raises(CheckpointError, match=where):
        await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
    assert server.stats.requests == 0


async def test_a_grid_search_checkpoint_keeps_its_place_in_the_one_format(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Any
) -> None:
    checkpoint = tmp_path / "search.json"
    grid = {"temperature": [0.0, 0.7]}
    await GridSearch(parameters=grid, checkpoint=checkpoint).compile(
        program(), valset=VAL, resources=config
    )
    data = json.loads(checkpoint.read_text())
    assert data["format"] == "plait.search/1" and data["search"] == "GridSearch"
    with pytest.raises(ValueError, match="holds a GridSearch checkpoint, not a LabeledFewShot"):
        await LabeledFewShot(k=2, checkpoint=checkpoint).compile(
            program(), trainset=TRAIN, valset=VAL, resources=config
        )


@pytest.mark.parametrize(
    ("make", "exact"),
    [
        (lambda **options: BootstrapFewShot(max_demos=2, **options), True),
        (lambda **options: ReflectiveSearch(minibatch=4, **options), False),
    ],
    ids=["BootstrapFewShot", "ReflectiveSearch"],
)
async def test_an_estimate_leaves_out_the_work_the_checkpoint_holds(
    server: ScriptedServer,
    config: ResourceConfig,
    tmp_path: Any,
    make: Callable[..., Any],
    exact: bool,
) -> None:
    checkpoint = tmp_path / "search.json"
    data = {"trainset": TRAIN, "valset": VAL, "resources": config}
    before = await make(max_calls=60, checkpoint=checkpoint).estimate(program(), **data, sample=0)
    first = await make(max_calls=24, checkpoint=checkpoint).compile(program(), **data)
    after = await make(max_calls=60, checkpoint=checkpoint).estimate(program(), **data, sample=0)
    rerun = await make(max_calls=60, checkpoint=checkpoint).compile(program(), **data)
    # trial 0 and the bootstrap pass (or the rounds' calls) are not counted again
    assert first.stopped_by_budget and rerun.resumed_calls >= len(VAL)
    assert after.calls.expected < before.calls.expected
    # BootstrapFewShot: exactly what the first run did (trial 0, the bootstrap pass and
    # the examples of the candidate it finished)
    assert first.calls == 24 and first.start.unevaluated == 0
    assert not exact or before.calls.expected - after.calls.expected == first.calls


# ------------------------------------------------------------------ pipeline


def _kind(body: dict[str, Any]) -> str:
    """Which part of a reflective search a request belongs to, from what it asks."""
    user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
    # the program's calls carry one number: a validation example's, or a minibatch's;
    # a rewrite or a feedback summary carries more
    return "validation" if user in {x for x, _ in VAL} else "proposal"


async def test_reflective_proposals_run_while_children_are_validated_within_the_budget(
    tmp_path: Any,
) -> None:
    async with ScriptedServer(responder=respond, latency=0.05) as server:
        config = ResourceConfig({"*": server.endpoint(max_retries=0, max_concurrent=64)})
        search = ReflectiveSearch(max_calls=90, minibatch=4, proposals=1, merge_every=0)
        await search.compile(program(), trainset=TRAIN, valset=VAL, resources=config)
        log = list(server.stats.log)
    assert server.stats.requests <= 90
    start = len(VAL)  # trial 0 is validated alone, before any proposal
    validations = [r for r in log[start:] if _kind(r.body) == "validation"]
    proposals = [r for r in log[start:] if _kind(r.body) == "proposal"]
    assert validations and proposals
    assert all(r.finished is not None for r in log)
    overlapping = [
        p
        for p in proposals
        if any(v.arrived < p.finished and p.arrived < v.finished for v in validations)
    ]
    assert overlapping, "no proposal call was sent while a child was being validated"
