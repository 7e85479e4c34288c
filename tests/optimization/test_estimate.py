"""Cost estimates before a learning run: evaluate, every program search, the Trainer.

An estimate makes only its sample's calls (counted at the scripted server),
and on the scripted server its expected calls and tokens come within 25 % of
what the run then spends.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import pytest

import plait
from plait import LLMInference, Parameter, Predict, ResourceConfig, ResourceManager
from plait.optimization import (
    BootstrapFewShot,
    CostEstimate,
    GridSearch,
    LabeledFewShot,
    RandomSearch,
    ReflectiveSearch,
    SFAOptimizer,
    TextGradOptimizer,
    Trainer,
)
from plait.resources.usage import UsageMeter, metered
from plait.signatures import PlainAdapter
from plait.testing import ScriptedServer

from .test_budget import BETTER, examples, program, respond, task, trainer

PRICE = {"input": 0.15, "output": 0.60}
TRAIN = examples(range(2, 22))
VAL = examples(range(20, 50))


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(responder=respond) as running:
        yield running


@pytest.fixture
def config(server: ScriptedServer) -> ResourceConfig:
    return _priced(server)


def _priced(server: ScriptedServer) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(max_retries=0, max_concurrent=16, price=PRICE)})


def near(estimated: float, actual: float) -> bool:
    return abs(estimated - actual) <= 0.25 * actual


async def test_estimate_of_evaluate_makes_only_its_sample_calls_and_prints_a_table(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    estimate = await plait.estimate(program(), VAL, resources=config, sample=2)
    assert server.stats.requests == 2 and estimate.sample_calls == 2
    assert isinstance(estimate, CostEstimate)
    assert estimate.calls == (30, 30, 30) and estimate.cost is not None
    table = str(estimate)
    assert "low / expected / high" in table and "\ntotal " in table
    assert "measured on a sample: 2 call(s) made" in table


async def test_an_estimate_without_a_sample_makes_no_call(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    estimate = await plait.estimate(program(), VAL, resources=config, sample=0)
    assert server.stats.requests == 0 and estimate.sample_calls == 0
    assert estimate.calls.expected == 30 and estimate.calls.high == 60
    assert "nothing sampled" in str(estimate)


async def test_an_endpoint_without_a_price_makes_the_cost_unknown(server: ScriptedServer) -> None:
    unpriced = ResourceConfig({"*": server.endpoint(max_retries=0)})
    estimate = await plait.estimate(program(), VAL, resources=unpriced)
    assert estimate.cost is None
    assert "unknown (no price)" in str(estimate) and "set 'price'" in str(estimate)


@pytest.mark.parametrize(
    "search",
    [
        LabeledFewShot(k=4),
        BootstrapFewShot(),
        RandomSearch(num_candidates=6, propose=2),
        GridSearch(parameters={"instructions": [BETTER, "Say even or odd."]}),
        ReflectiveSearch(max_calls=120),
    ],
    ids=lambda search: type(search).__name__,
)
async def test_every_search_spends_close_to_its_estimate(
    server: ScriptedServer, config: ResourceConfig, search: Any
) -> None:
    estimate = await search.estimate(program(), trainset=TRAIN, valset=VAL, resources=config)
    server.reset_stats()
    async with ResourceManager(config) as manager:
        await search.compile(program(), trainset=TRAIN, valset=VAL, resources=manager)
        spent = manager.total_usage()
    assert estimate.calls.low <= server.stats.requests <= estimate.calls.high
    assert near(estimate.calls.expected, server.stats.requests)
    tokens = spent.input_tokens + spent.output_tokens
    assert estimate.tokens.low <= tokens <= estimate.tokens.high
    if not isinstance(search, ReflectiveSearch):  # its rounds depend on what it finds
        assert near(estimate.tokens.expected, tokens)
        assert near(estimate.cost.expected, spent.cost)


async def test_a_grid_estimate_leaves_out_the_trials_its_checkpoint_holds(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Any
) -> None:
    grid = {"instructions": [BETTER, "Say even or odd."]}
    checkpoint = tmp_path / "grid.json"
    before = await GridSearch(parameters=grid, checkpoint=checkpoint).estimate(
        program(), valset=VAL, resources=config
    )
    await GridSearch(parameters=grid, checkpoint=checkpoint).compile(
        program(), valset=VAL, resources=config
    )
    after = await GridSearch(parameters=grid, checkpoint=checkpoint).estimate(
        program(), valset=VAL, resources=config
    )
    assert before.calls.expected == 90 and after.calls.expected == 0


@pytest.mark.parametrize(
    ("make", "budget"),
    [
        (lambda **options: LabeledFewShot(k=4, **options), 45),
        (lambda **options: BootstrapFewShot(**options), 60),
        (lambda **options: RandomSearch(num_candidates=6, propose=2, **options), 150),
        (lambda **options: RandomSearch(num_candidates=6, propose=2, **options), 40),
    ],
    ids=["LabeledFewShot", "BootstrapFewShot", "RandomSearch", "RandomSearch-in-bootstrap"],
)
async def test_the_estimate_of_a_resumed_search_counts_only_what_its_checkpoint_lacks(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Any, make: Any, budget: int
) -> None:
    checkpoint = tmp_path / "search.json"
    stopped = await make(checkpoint=checkpoint, max_calls=budget).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    assert stopped.stopped_by_budget
    estimate = await make(checkpoint=checkpoint).estimate(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    server.reset_stats()
    await make(checkpoint=checkpoint).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    resumed = server.stats.requests
    assert estimate.calls.low <= resumed <= estimate.calls.high, (estimate.calls, resumed)
    assert near(estimate.calls.expected, resumed), (estimate.calls, resumed)


async def test_the_trainer_spends_close_to_its_estimate(
    server: ScriptedServer, config: ResourceConfig
) -> None:
    async with ResourceManager(config) as manager:
        training = trainer(manager, task())
        estimate = await training.estimate()
        server.reset_stats()
        await training.fit()
    assert estimate.calls.low <= server.stats.requests <= estimate.calls.high
    assert near(estimate.calls.expected, server.stats.requests)


QUESTIONS = [(f"Is the number {n} even or odd? Look at its last digit.", t) for n, t in TRAIN]
CHECKS = [(f"Is the number {n} even or odd? Look at its last digit.", t) for n, t in VAL]


def tutor(new_rewrites: bool) -> Callable[[dict[str, Any]], str]:
    """The scripted model of the Trainer tests: it answers the parity questions right once
    its system prompt holds BETTER, else "even"; its rewrite is BETTER each time, or a new
    value each time (``new_rewrites``: then no rewrite is refused as unchanged and asked
    again, the case an estimate's expected column counts)."""
    rewrites = itertools.count(1)

    def reply(body: dict[str, Any]) -> str:
        schema = json.dumps(body.get("response_format") or {})
        if "FeedbackSummary" in schema:
            return json.dumps({"summary": "Wrong on odd numbers.", "changes": ["Say odd."]})
        if "ParameterUpdate" in schema:
            value = f"{BETTER} Rule {next(rewrites)}." if new_rewrites else BETTER
            return json.dumps({"new_value": value, "rationale": "the feedback"})
        question = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        number = int(question.split("number ")[1].split()[0])
        knows = BETTER in body["messages"][0]["content"]
        return ("odd" if number % 2 else "even") if knows else "even"

    return reply


async def _train(optimizer: Any, new_rewrites: bool) -> tuple[CostEstimate, dict[str, Any]]:
    """Returns a Trainer's estimate and what its fit then spent (calls at the server)."""

    def exact(output: Any, target: Any) -> bool:
        return output == target

    module = LLMInference("task", system_prompt=Parameter("Say even.", description="task"))
    server = ScriptedServer(responder=tutor(new_rewrites))
    async with server, ResourceManager(_priced(server)) as manager:
        training = Trainer(
            module, exact, optimizer(module.named_parameters()), resources=manager,
            train_set=QUESTIONS, val_set=CHECKS, metric=exact, epochs=2, progress=False,
        )  # fmt: skip
        estimate = await training.estimate()
        server.reset_stats()
        await training.fit()
        spent = manager.total_usage()
        calls = server.stats.requests
    tokens = spent.input_tokens + spent.output_tokens
    return estimate, {"calls": calls, "tokens": tokens, "cost": spent.cost}


@pytest.mark.parametrize("optimizer", [SFAOptimizer, TextGradOptimizer])
async def test_the_trainer_spends_close_to_its_estimate_in_calls_tokens_and_dollars(
    optimizer: Any,
) -> None:
    """The optimizer's own calls are sized from the prompts it would send (the feedback of
    a minibatch, the parameter's value), not from a fixed 400 / 100 tokens: that guess
    made the cost of the Trainer in benchmarks/learning_cost_bench.py 26 % high."""
    estimate, spent = await _train(optimizer, new_rewrites=True)
    for key, actual in spent.items():
        guess = getattr(estimate, key)
        assert guess.low <= actual <= guess.high, (key, guess, actual)
        assert near(guess.expected, actual), (key, guess, actual)


@pytest.mark.parametrize("optimizer", [SFAOptimizer, TextGradOptimizer])
async def test_a_trainer_whose_rewrites_are_all_asked_again_stays_inside_its_range(
    optimizer: Any,
) -> None:
    estimate, spent = await _train(optimizer, new_rewrites=False)
    for key, actual in spent.items():
        guess = getattr(estimate, key)
        assert guess.low <= actual <= guess.high, (key, guess, actual)


async def test_a_budget_caps_the_estimate(server: ScriptedServer, config: ResourceConfig) -> None:
    estimate = await BootstrapFewShot(max_calls=50).estimate(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    assert estimate.calls.high == 50 and "capped by the budget" in str(estimate)
    assert "capped by the budget this run may spend: max_calls=50" in str(estimate)
    roomy = await BootstrapFewShot(max_calls=1000, max_cost=5.0).estimate(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    assert roomy.calls.high < 1000 and "capped" not in str(roomy)
    assert "within the budget this run may spend: max_calls=1000, max_cost=$5" in str(roomy)


async def test_a_resumed_reflective_estimate_is_capped_by_what_its_budget_has_left(
    server: ScriptedServer, config: ResourceConfig, tmp_path: Any
) -> None:
    # max_calls counts the whole search: the calls its checkpoint holds are spent already
    checkpoint = tmp_path / "reflective.json"
    search = partial(ReflectiveSearch, minibatch=4, proposals=2, checkpoint=checkpoint)
    first = await search(max_calls=60).compile(
        program(), trainset=TRAIN, valset=VAL, resources=config
    )
    assert first.stopped_by_budget
    estimate = await search(max_calls=120).estimate(
        program(), trainset=TRAIN, valset=VAL, resources=config, sample=0
    )
    held = json.loads(checkpoint.read_text())["state"]["rounds"]["spent"]
    left = 120 - held
    assert estimate.calls.high == left, (estimate.calls, left)
    assert f"capped by the budget this run may spend: max_calls={left}" in str(estimate)
    server.reset_stats()
    await search(max_calls=120).compile(program(), trainset=TRAIN, valset=VAL, resources=config)
    assert server.stats.requests <= left


def test_an_estimate_range_is_ordered_and_float_error_adds_no_call() -> None:
    from plait.optimization.costs import Phase, Range, from_schedule
    from plait.optimization.costs.parts import _Size

    # a schedule whose columns each fill a budget: the high one a hair under the expected,
    # which a sum's float error put above 55 (it must not round up to 56)
    phase = Phase("rounds until the budget", runs=Range(54.6, 55 + 1e-9, 55.0))
    size = _Size(
        calls=Range(1, 1, 1), prompt=Range(10, 10, 10), reply=Range(2, 2, 2), price=None,
        demo_tokens=0, measured=True,
    )  # fmt: skip
    estimate = from_schedule("a search", [phase], size, manager=None)
    assert estimate.calls == (55, 55, 55), estimate.calls
    assert estimate.rows[0]["calls"].high >= estimate.rows[0]["calls"].expected
    [total] = [line for line in str(estimate).splitlines() if line.startswith("total")]
    assert "55 / 55 / 55" in total, total


# ------------------------------------------------- proposals sampled for real
WORDY = " ".join(["since"] * 45)
"""A long rationale (the longest ParameterUpdate and InstructionProposal allow): the
scripted server counts tokens as words."""


class Wordy:
    """A scripted model whose calls outside the program are long and, for rewrites, refused
    once: each rewrite's first reply is not JSON, the re-ask gets a new value (each time
    another) with a long rationale. It answers the parity questions right once its system
    prompt (or instructions) holds BETTER. ``asked`` lists the kind of every call."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.rewrites = itertools.count(1)

    def __call__(self, body: dict[str, Any]) -> str:
        schema = json.dumps(body.get("response_format") or {})
        messages = body["messages"]
        if "InstructionProposal" in schema:
            self.asked.append("proposal")
            return json.dumps({"rationale": WORDY, "instruction": BETTER})
        if "FeedbackSummary" in schema:
            self.asked.append("summary")
            return json.dumps({"summary": WORDY, "changes": ["Say odd for odd numbers."]})
        if "ParameterUpdate" in schema:
            self.asked.append("rewrite")
            if len(messages) <= 2:
                return "I would change it " + " ".join(["because"] * 120)
            value = f"{BETTER} Rule {next(self.rewrites)}."
            return json.dumps({"new_value": value, "rationale": WORDY})
        self.asked.append("task")
        question = [m["content"] for m in messages if m["role"] == "user"][-1]
        number = int(question.split("number ")[1].split()[0]) if "number " in question else 0
        if number == 0:
            number = int(question)
        knows = BETTER in messages[0]["content"]
        return ("odd" if number % 2 else "even") if knows else "even"


def _spent(meter: UsageMeter, server: ScriptedServer) -> dict[str, Any]:
    """What the run metered spent (not the estimate's sample), its calls as the server saw."""
    assert meter.calls == server.stats.requests
    return {
        "calls": server.stats.requests,
        "tokens": meter.input_tokens + meter.output_tokens,
        "cost": meter.cost,
    }


def _close(estimate: CostEstimate, spent: dict[str, Any]) -> None:
    for key, actual in spent.items():
        guess = getattr(estimate, key)
        assert guess.low <= actual <= guess.high, (key, guess, actual)
        assert near(guess.expected, actual), (key, guess, actual)


async def test_the_trainer_estimate_makes_an_optimizer_step_for_real_and_leaves_all_as_it_was() -> (
    None
):
    """The step is sampled on copies: it asks the model (a summary, a rewrite refused once and
    asked again), but the program's value, the optimizer's history and its step count
    stay; its long replies and its re-ask size the estimate, which comes within 25 %."""

    def exact(output: Any, target: Any) -> bool:
        return output == target

    module = LLMInference("task", system_prompt=Parameter("Say even.", description="task"))
    optimizer = SFAOptimizer(module.named_parameters())
    wordy = Wordy()
    server = ScriptedServer(responder=wordy)
    async with server, ResourceManager(_priced(server)) as manager:
        training = Trainer(
            module, exact, optimizer, resources=manager, train_set=QUESTIONS,
            val_set=CHECKS, metric=exact, epochs=2, progress=False,
        )  # fmt: skip
        estimate = await training.estimate()
        sampled = list(wordy.asked)
        assert module.system_prompt.value == "Say even."
        assert optimizer.step_count == 0 and not any(optimizer.history.values())
        server.reset_stats()
        with metered() as meter:
            await training.fit()
        spent = _spent(meter, server)
    # 2 sampled examples, 2 training runs, then a step (summary, rewrite asked twice) and a
    # second one on the value it gave
    assert sampled.count("summary") == 2 and sampled.count("rewrite") == 4
    assert estimate.sample_calls == len(sampled)
    _close(estimate, spent)


async def test_without_the_sampled_step_the_trainer_estimate_misses_a_wordy_optimizer() -> None:
    """What the sampled step is for: the same Trainer estimated from the rendered prompts
    alone (``sample=0``) is short of what a wordy, re-asked optimizer spends."""

    def exact(output: Any, target: Any) -> bool:
        return output == target

    module = LLMInference("task", system_prompt=Parameter("Say even.", description="task"))
    server = ScriptedServer(responder=Wordy())
    async with server, ResourceManager(_priced(server)) as manager:
        training = Trainer(
            module, exact, SFAOptimizer(module.named_parameters()), resources=manager,
            train_set=QUESTIONS, val_set=CHECKS, metric=exact, epochs=2, progress=False,
        )  # fmt: skip
        estimate = await training.estimate(sample=0)
        server.reset_stats()
        with metered() as meter:
            await training.fit()
        spent = _spent(meter, server)
    assert estimate.sample_calls == 0
    assert not near(estimate.tokens.expected, spent["tokens"])


async def test_a_reflective_estimate_samples_a_rewrite_and_comes_close() -> None:
    wordy = Wordy()
    server = ScriptedServer(responder=wordy)
    search = ReflectiveSearch(max_calls=120, conservatism=0)  # any rewrite may be kept
    async with server, ResourceManager(_priced(server)) as manager:
        estimate = await search.estimate(program(), trainset=TRAIN, valset=VAL, resources=manager)
        sampled = list(wordy.asked)
        server.reset_stats()
        with metered() as meter:
            await search.compile(program(), trainset=TRAIN, valset=VAL, resources=manager)
        spent = _spent(meter, server)
    # a rewrite refused once and asked again, then one more on the value it gave
    assert sampled.count("rewrite") == 4 and estimate.sample_calls == len(sampled)
    _close(estimate, spent)


async def test_a_random_search_estimate_samples_a_proposal_and_sizes_its_candidates() -> None:
    """The sampled proposals' long replies size the proposals; the instruction they gave
    lengthens the prompts of the candidates that carry it."""
    wordy = Wordy()
    server = ScriptedServer(responder=wordy)
    search = RandomSearch(num_candidates=6, propose=2)
    async with server, ResourceManager(_priced(server)) as manager:
        estimate = await search.estimate(program(), trainset=TRAIN, valset=VAL, resources=manager)
        sampled = list(wordy.asked)
        server.reset_stats()
        with metered() as meter:
            await search.compile(program(), trainset=TRAIN, valset=VAL, resources=manager)
        spent = _spent(meter, server)
    # the run's own two proposals, then the sample under the instruction they gave
    assert sampled.count("proposal") == 2 and estimate.sample_calls == len(sampled)
    (row,) = [row for row in estimate.rows if "proposals" in row["phase"]]
    assert row["tokens"].expected > 2 * 45  # two proposals, each a 45-word reply and more
    _close(estimate, spent)


TALKATIVE = "Explain your reasoning in full before you answer: " + BETTER
DOTTED = "Mark each step: " + " ".join("abcdefghijklmnopqrstuvwxyz" * 9) + ". " + BETTER
"""An instruction of many one-letter words: twice the tokens its characters would be."""


class Proposer:
    """A scripted model with two instruction proposals: the first seed it is asked with gets
    BETTER, every other one ``other``, under which (when it is TALKATIVE) its task replies
    are a 120-word explanation before the answer (one word otherwise). ``asked`` as
    `Wordy`'s."""

    def __init__(self, other: str) -> None:
        self.other = other
        self.asked: list[str] = []
        self.first_seed: int | None = None

    def __call__(self, body: dict[str, Any]) -> str:
        schema = json.dumps(body.get("response_format") or {})
        if "InstructionProposal" in schema:
            self.asked.append("proposal")
            if self.first_seed is None:
                self.first_seed = body["seed"]
            text = BETTER if body["seed"] == self.first_seed else self.other
            return json.dumps({"rationale": "clearer", "instruction": text})
        self.asked.append("task")
        system = body["messages"][0]["content"]
        number = int(body["messages"][-1]["content"])
        answer = "odd" if number % 2 else "even"
        if TALKATIVE in system:
            return " ".join(["because"] * 120) + " " + answer
        return answer if BETTER in system else "even"


@pytest.mark.parametrize("other", [TALKATIVE, DOTTED], ids=["long-replies", "many-tokens"])
async def test_a_random_search_estimate_measures_the_runs_under_its_proposed_instructions(
    other: str,
) -> None:
    """One of the run's two proposed instructions makes the task's replies 120 times longer,
    or is twice the tokens its characters would say; its length alone shows neither. The
    estimate asks for the run's own proposals (its seeds) and runs its sample under each
    instruction they gave: within 25 %."""
    proposer = Proposer(other)
    server = ScriptedServer(responder=proposer)
    search = RandomSearch(num_candidates=4, max_demos=2, propose=2)  # no random candidate
    plain = Predict("number -> answer", adapter=PlainAdapter())
    async with server, ResourceManager(_priced(server)) as manager:
        estimate = await search.estimate(
            plain.copy(), trainset=TRAIN, valset=VAL, resources=manager
        )
        sampled = list(proposer.asked)
        server.reset_stats()
        with metered() as meter:
            await search.compile(plain.copy(), trainset=TRAIN, valset=VAL, resources=manager)
        spent = _spent(meter, server)
    _close(estimate, spent)
    (proposed,) = search.proposals.values()
    assert sorted(proposed) == sorted([BETTER, other])
    # two proposals; the program sampled (2 examples), under each proposal (2 + 2), with demos
    assert sampled.count("proposal") == 2 and estimate.sample_calls == len(sampled) == 9


@pytest.mark.parametrize("work", ["Trainer", "ReflectiveSearch"])
async def test_an_estimate_logs_no_warning_of_its_sampled_steps(
    server: ScriptedServer, config: ResourceConfig, work: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The sampled second rewrite proposes the value the first gave, which is refused: the
    estimate (on copies) says so only at debug level; the Trainer's run warns of it when it
    happens."""
    async with ResourceManager(config) as manager:
        if work == "Trainer":
            training = trainer(manager, task())
            estimated, run = training.estimate, training.fit
        else:
            search = ReflectiveSearch(max_calls=40, conservatism=0)
            estimated = partial(search.estimate, program(), TRAIN, VAL, resources=manager)
            run = None
        with caplog.at_level(logging.DEBUG, logger="plait"):
            await estimated()
        said = [r.levelno for r in caplog.records if "rejected the update" in r.getMessage()]
        assert said and set(said) == {logging.DEBUG}
        if run is not None:
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                await run()
            said = [r.levelno for r in caplog.records if "rejected the update" in r.getMessage()]
            assert said and set(said) == {logging.WARNING}


@pytest.mark.slow
async def test_on_the_embedded_model_reflection_and_training_spend_inside_their_estimates() -> None:
    """SmolLM2 writes long rewrites and is often asked again; the sampled proposals see
    it. Kept small (about 70 calls of a second or more each)."""

    def exact(output: Any, target: Any) -> bool:
        return str(output).strip() == target

    config = ResourceConfig({"*": {"provider": "local", "n_ctx": 4096}})
    train, val = QUESTIONS[:4], CHECKS[:4]
    search = ReflectiveSearch(max_calls=24, minibatch=2)
    module = LLMInference("task", system_prompt=Parameter("Say even or odd.", description="task"))
    async with ResourceManager(config) as manager:
        training = Trainer(
            module, exact, SFAOptimizer(module.named_parameters()), resources=manager,
            train_set=train, val_set=val, metric=exact, epochs=1, batch_size=4, progress=False,
        )  # fmt: skip
        works = [
            (
                lambda: search.estimate(program(), trainset=train, valset=val, resources=manager),
                lambda: search.compile(program(), trainset=train, valset=val, resources=manager),
            ),
            (training.estimate, training.fit),
        ]
        for estimated, run in works:
            estimate = await estimated()
            with metered() as meter:
                await run()
            spent = {"calls": meter.calls, "tokens": meter.input_tokens + meter.output_tokens}
            for key, actual in spent.items():
                guess = getattr(estimate, key)
                assert guess.low <= actual <= guess.high, (estimate.what, key, guess, actual)


@pytest.mark.parametrize("sample", [-1, "2", 1.5, True])
async def test_a_sample_that_is_not_a_count_is_refused_before_any_call(
    server: ScriptedServer, config: ResourceConfig, sample: Any
) -> None:
    refused = f"sample must be a whole number >= 0 .* got {sample!r}"
    with pytest.raises(ValueError, match=refused):
        await plait.estimate(program(), VAL, resources=config, sample=sample)
    with pytest.raises(ValueError, match=refused):
        await RandomSearch(propose=0).estimate(
            program(), trainset=TRAIN, valset=VAL, resources=config, sample=sample
        )
    async with ResourceManager(config) as manager:
        with pytest.raises(ValueError, match=refused):
            await trainer(manager, task()).estimate(sample)
    assert server.stats.requests == 0


async def test_the_no_price_note_names_the_unpriced_endpoint_of_a_chain(
    server: ScriptedServer,
) -> None:
    chain = ResourceConfig({
        "primary": server.endpoint(max_retries=0),
        "backup": server.endpoint(max_retries=0, price=PRICE),
        "*": {"fallback": ["primary", "backup"]},
    })  # fmt: skip
    estimate = await plait.estimate(program(), VAL, resources=chain)
    [note] = [line for line in estimate.notes if "no price" in line]
    assert "'primary'" in note and "'backup'" not in note, note
