"""Every learning step told to callbacks and seen as OpenTelemetry spans.

Each search (and one Trainer run) runs against the scripted server with an
`OpenTelemetryCallback` writing to OpenTelemetry's in-memory exporter; the
tests read the tree of spans back: the optimisation run at the root, its
rounds, candidate evaluations, proposals (with the LLM calls that proposed),
backward passes, and the decisions and updates as span events with their
evidence. The scripted model answers by rules, so every tree is the same on
every run.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import plait
from plait import LLMInference, Parameter, Predict, ResourceConfig, ResourceManager
from plait.callbacks import BaseCallback
from plait.optimization import (
    BootstrapFewShot,
    RandomSearch,
    ReflectiveSearch,
    SFAOptimizer,
    Trainer,
)
from plait.signatures import PlainAdapter
from plait.testing import ScriptedServer

from . import test_reflective, test_trainer
from .test_search import BETTER, PARITY, TRAIN, VAL, balanced_demos, model, system

pytest.importorskip("opentelemetry.sdk")

CHAT = "chat scripted-model"


class Spans:
    """The finished spans of one run, as a tree."""

    def __init__(self, spans: Any) -> None:
        self.all = list(spans)
        self.by_id = {span.context.span_id: span for span in self.all}

    def roots(self) -> list[Any]:
        return [s for s in self.all if s.parent is None or s.parent.span_id not in self.by_id]

    def children(self, span: Any) -> list[Any]:
        return [
            s for s in self.all if s.parent is not None and s.parent.span_id == span.context.span_id
        ]

    def names(self, span: Any) -> Counter[str]:
        return Counter(child.name for child in self.children(span))

    def named(self, name: str) -> list[Any]:
        return [s for s in self.all if s.name == name]

    def under(self, span: Any) -> Iterator[Any]:
        """Every span below ``span``."""
        for child in self.children(span):
            yield child
            yield from self.under(child)


def events(span: Any, name: str) -> list[dict[str, Any]]:
    return [dict(event.attributes) for event in span.events if event.name == name]


@pytest.fixture
def exporter() -> Any:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    return InMemorySpanExporter()


def telemetry(exporter: Any, *, capture_content: bool = False) -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from plait.report.telemetry import OpenTelemetryCallback

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OpenTelemetryCallback(provider, capture_content=capture_content)


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(responder=model(lambda body: system(body) == BETTER)) as running:
        yield running


def config_of(server: ScriptedServer) -> ResourceConfig:
    return ResourceConfig({"*": server.endpoint(max_retries=0, max_concurrent=8)})


def parity_program() -> Predict:
    return Predict(PARITY, adapter=PlainAdapter())


# ------------------------------------------------------------- RandomSearch
async def test_a_random_search_is_one_span_with_its_candidates_proposals_and_decisions(
    server: ScriptedServer, exporter: Any
) -> None:
    search = RandomSearch(num_candidates=4, max_demos=2, propose=1, seed=0)
    with plait.settings.context(callbacks=[telemetry(exporter)]):
        report = await search.compile(parity_program(), TRAIN, VAL, resources=config_of(server))
    spans = Spans(exporter.get_finished_spans())

    (root,) = spans.roots()  # one trace: every model call of the search nests in it
    assert root.name == "optimize RandomSearch"
    assert root.attributes["plait.learning.optimizer"] == "RandomSearch"
    assert root.attributes["plait.learning.best_score"] == 1.0
    assert root.attributes["plait.learning.improved"] is True
    assert root.attributes["plait.learning.calls"] == report.calls
    assert spans.names(root) == Counter(
        {f"candidate {n}": 1 for n in range(5)} | {"proposal demos": 1, "proposal instructions": 1}
    )
    # Each candidate evaluation: its score, size and cost, the evaluation and its calls inside.
    for trial in report.trials:
        (candidate,) = spans.named(f"candidate {trial.number}")
        assert candidate.attributes["plait.learning.score"] == trial.score
        assert candidate.attributes["plait.learning.n"] == len(VAL)
        assert candidate.attributes["plait.learning.calls"] == trial.calls == len(VAL)
        (evaluation,) = spans.children(candidate)
        assert evaluation.name == "evaluate Predict"
        assert sum(s.name == CHAT for s in spans.under(evaluation)) == len(VAL)
    # The proposal holds the call that proposed; its text stays out without capture.
    (proposal,) = spans.named("proposal instructions")
    assert proposal.attributes["plait.learning.parameter"] == "instructions"
    assert proposal.attributes["plait.learning.accepted"] is True
    assert "plait.learning.proposed" not in proposal.attributes
    assert spans.names(proposal) == Counter({CHAT: 1})
    # The bootstrap runs on the training set are the demos' proposal.
    (bootstrap,) = spans.named("proposal demos")
    assert sum(s.name == CHAT for s in spans.under(bootstrap)) == len(TRAIN)
    # One decision per candidate, with its evidence against trial 0.
    decisions = {d["plait.learning.candidate"]: d for d in events(root, "plait.learning.decision")}
    assert sorted(decisions) == [1, 2, 3, 4]
    chosen = decisions[report.best.number]
    assert chosen["plait.learning.accepted"] is True
    assert (chosen["plait.learning.wins"], chosen["plait.learning.losses"]) == (5, 0)
    assert chosen["plait.learning.p_value"] == 1 / 32
    assert (chosen["plait.learning.old_score"], chosen["plait.learning.new_score"]) == (0.5, 1.0)
    assert "sign test" in chosen["plait.learning.rule"]
    assert sum(d["plait.learning.accepted"] for d in decisions.values()) == 1
    # The update of the program: which parameter, sizes and hashes, not the text.
    (update,) = events(root, "plait.learning.update")
    assert update["plait.learning.parameter"] == "instructions"
    assert update["plait.learning.new_chars"] == len(BETTER)
    assert len(update["plait.learning.new_sha256"]) == 12
    assert "plait.learning.new" not in update and "plait.learning.old" not in update


async def test_captured_content_puts_the_proposed_and_updated_text_on_the_spans(
    server: ScriptedServer, exporter: Any
) -> None:
    search = RandomSearch(num_candidates=4, max_demos=2, propose=1, seed=0)
    with plait.settings.context(callbacks=[telemetry(exporter, capture_content=True)]):
        await search.compile(parity_program(), TRAIN, VAL, resources=config_of(server))
    spans = Spans(exporter.get_finished_spans())
    (root,) = spans.roots()
    (update,) = events(root, "plait.learning.update")
    assert update["plait.learning.new"] == BETTER
    (proposal,) = spans.named("proposal instructions")
    assert proposal.attributes["plait.learning.proposed"] == BETTER


# ---------------------------------------------------------- BootstrapFewShot
async def test_bootstrap_few_shot_shows_its_bootstrap_candidate_and_decision(
    server: ScriptedServer, exporter: Any
) -> None:
    server.responder = model(balanced_demos)
    qa = parity_program()
    with plait.settings.context(callbacks=[telemetry(exporter)]):
        report = await BootstrapFewShot(max_demos=2).compile(
            qa, TRAIN, VAL, resources=config_of(server)
        )
    spans = Spans(exporter.get_finished_spans())

    (root,) = spans.roots()
    assert root.name == "optimize BootstrapFewShot"
    assert spans.names(root) == Counter(["candidate 0", "proposal demos", "candidate 1"])
    (bootstrap,) = spans.named("proposal demos")
    assert bootstrap.attributes["plait.learning.method"] == "bootstrap"
    assert bootstrap.attributes["plait.learning.good_runs"] == 6  # the model says "even": 6 of 8
    (decision,) = events(root, "plait.learning.decision")
    assert decision["plait.learning.accepted"] is True and report.improved
    assert decision["plait.learning.new_score"] == report.best.score == 1.0
    (update,) = events(root, "plait.learning.update")
    assert update["plait.learning.parameter"] == "demos"
    assert update["plait.learning.old_chars"] == 2  # "[]": no demos before


# ---------------------------------------------------------- ReflectiveSearch
async def test_reflective_search_rounds_hold_proposals_backward_and_the_minibatch_decision(
    exporter: Any,
) -> None:
    search = ReflectiveSearch(max_calls=40, minibatch=4, proposals=1, merge_every=0, seed=0)
    async with ScriptedServer(responder=test_reflective.respond) as server:
        with plait.settings.context(callbacks=[telemetry(exporter)]):
            report = await search.compile(
                test_reflective.program(), TRAIN, VAL, resources=config_of(server)
            )
    spans = Spans(exporter.get_finished_spans())

    (root,) = spans.roots()
    assert root.name == "optimize ReflectiveSearch"
    rounds = spans.named("round 1")
    assert len(rounds) == 1 and rounds[0].parent.span_id == root.context.span_id
    assert root.attributes["plait.learning.best_score"] == 1.0 == report.best.score
    # Round 1 reflects on the instructions: training run, backward, rewrite, minibatch check.
    (reflection,) = spans.children(rounds[0])
    assert reflection.name == "proposal instructions"
    assert reflection.attributes["plait.learning.method"] == "reflection"
    inside = spans.names(reflection)
    assert inside["backward"] == 1 and inside["proposal instructions"] == 1
    # its validation is the next step's, run beside round 2's proposals
    assert inside["candidate"] == 0
    (second,) = spans.named("round 2")
    assert [c.name for c in spans.children(second)].count("candidate") == 1
    (backward,) = [s for s in spans.children(reflection) if s.name == "backward"]
    # Feedback reached both parameters, named as the program has them.
    reached = json.loads(backward.attributes["plait.learning.parameters"])
    assert reached == {"instructions": 4, "demos": 4}
    (rewrite,) = [s for s in spans.children(reflection) if s.name == "proposal instructions"]
    assert spans.names(rewrite) == Counter({CHAT: 1})
    (checked,) = events(rewrite, "plait.learning.decision")
    assert checked["plait.learning.accepted"] is True
    (minibatch,) = events(reflection, "plait.learning.decision")
    assert minibatch["plait.learning.accepted"] is True
    # The same check the search's log tells in words: "minibatch 3 -> 4" of 4 examples.
    assert "instructions: minibatch 3 -> 4, accepted" in search.log
    assert (minibatch["plait.learning.old_score"], minibatch["plait.learning.new_score"]) == (
        0.75,
        1.0,
    )
    assert "minibatch" in minibatch["plait.learning.rule"]
    (changed,) = events(reflection, "plait.learning.update")
    assert changed["plait.learning.parameter"] == "instructions"


# -------------------------------------------------------------------- Trainer
async def test_one_trainer_epoch_is_a_span_with_its_step_backward_proposal_and_keep_best(
    exporter: Any,
) -> None:
    task = LLMInference("task", system_prompt=Parameter("PLAIN", description="task instructions"))
    async with ScriptedServer(responder=test_trainer.model("GOOD")) as server:
        config = ResourceConfig({"*": server.endpoint(max_retries=0)})
        async with ResourceManager(config) as manager:
            trainer = Trainer(
                task,
                test_trainer.exact,
                SFAOptimizer(task.named_parameters(), conservatism=0),
                resources=manager,
                train_set=test_trainer.examples("t", 2),
                val_set=test_trainer.examples("v", 4),
                metric=test_trainer.exact,
                batch_size=2,
                progress=False,
            )
            with plait.settings.context(callbacks=[telemetry(exporter)]):
                report = await trainer.fit()
    spans = Spans(exporter.get_finished_spans())

    (root,) = spans.roots()
    assert root.name == "optimize Trainer"
    assert spans.names(root) == Counter(["candidate 0", "round 1", "candidate 1"])
    assert root.attributes["plait.learning.best_score"] == report.best_score == 1.0
    (step,) = spans.named("round 1")
    assert step.attributes["plait.learning.epoch"] == 1
    assert step.attributes["plait.learning.applied"] == 1
    names = spans.names(step)
    assert names["backward"] == 1 and names["proposal system_prompt"] == 1
    (proposal,) = spans.named("proposal system_prompt")
    assert spans.names(proposal)[CHAT] == 2  # SFA: the feedback summary, then the new value
    (checked,) = events(proposal, "plait.learning.decision")
    assert checked["plait.learning.accepted"] is True
    (update,) = events(step, "plait.learning.update")
    assert update["plait.learning.parameter"] == "system_prompt"
    assert update["plait.learning.new_chars"] == len("PLAIN GOOD")
    (keep,) = events(root, "plait.learning.decision")
    assert keep["plait.learning.accepted"] is True
    assert (keep["plait.learning.old_score"], keep["plait.learning.new_score"]) == (0.5, 1.0)
    assert "keep-best" in keep["plait.learning.rule"]


# ---------------------------------------------------------------- callbacks
class Steps(BaseCallback):
    """Writes down the learning hooks it hears, in order."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, Any]] = []

    def on_optimize_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.heard.append(("optimize", inputs["optimizer"]))

    def on_candidate_end(self, call_id: str, outputs: Any, exception: Any = None) -> None:
        self.heard.append(("candidate", outputs["score"]))

    def on_decision(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.heard.append(("decision", inputs["accepted"]))

    def on_update(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.heard.append(("update", inputs["new"]))

    def on_optimize_end(self, call_id: str, outputs: Any, exception: Any = None) -> None:
        self.heard.append(("end", outputs["best_score"]))


async def test_a_module_callback_hears_the_search_of_its_program(server: ScriptedServer) -> None:
    server.responder = model(balanced_demos)
    qa = parity_program()
    qa.callbacks = [heard := Steps()]
    await BootstrapFewShot(max_demos=2).compile(qa, TRAIN, VAL, resources=config_of(server))
    kinds = [kind for kind, _ in heard.heard]
    assert kinds == ["optimize", "candidate", "candidate", "decision", "update", "end"]
    assert heard.heard[0] == ("optimize", "BootstrapFewShot")
    assert heard.heard[-1] == ("end", 1.0)
    assert len(heard.heard[4][1]) == 2  # the full demos reach a callback of the user's own


async def test_a_reverted_step_tells_its_validation_decision_and_the_value_put_back() -> None:
    from plait.report.learning import LearningLog

    from . import test_optimizers

    async with ScriptedServer(responder=test_optimizers.scripted()) as server:
        config = ResourceConfig({"*": server.endpoint(max_retries=0)})
        async with ResourceManager(config) as manager:
            param = test_optimizers.prompt()

            async def validate() -> float:
                return 0.2 if "Be specific." in param.value else 0.5

            optimizer = SFAOptimizer([("prompt", param)], conservatism=0, validate=validate)
            with LearningLog(capture_content=True) as log:
                await optimizer.bind(manager).step()

    told = [(step["kind"], step["inputs"].get("accepted")) for step in log.steps]
    assert told == [
        ("proposal", None),
        ("decision", True),  # the proposed value passed the update check ...
        ("update", None),
        ("decision", False),  # ... and the validation score fell: the step is reverted
        ("update", None),
    ]
    validation = log.steps[3]["inputs"]
    assert (validation["old_score"], validation["new_score"]) == (0.5, 0.2)
    assert "validation" in validation["rule"]
    back = log.steps[4]["inputs"]
    assert (back["old"], back["new"]) == ("Summarise the text. Be specific.", "Summarise the text.")


async def test_a_programs_own_telemetry_traces_its_search_as_one_tree(
    server: ScriptedServer, exporter: Any
) -> None:
    server.responder = model(balanced_demos)
    qa = parity_program()
    qa.callbacks = [telemetry(exporter)]
    await BootstrapFewShot(max_demos=2).compile(qa, TRAIN, VAL, resources=config_of(server))
    spans = Spans(exporter.get_finished_spans())

    # The candidates are copies of the program: they share its callback, not a copy of it.
    (root,) = spans.roots()
    assert root.name == "optimize BootstrapFewShot"
    assert sum(span.name == CHAT for span in spans.all) == len(TRAIN) + 2 * len(VAL)
