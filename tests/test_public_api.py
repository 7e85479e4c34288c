"""The public surface of `plait` (SPEC §3): complete, sorted, importable, and cheap to import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import plait

SPEC_NAMES = {
    "Module", "Parameter", "LLMInference",
    "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict",
    "Value", "ValueKind", "ValueRef", "valueify", "unwrap", "collect_refs",
    "ResourceConfig", "ResourceManager", "ExecutionSettings", "run", "BatchResult",
    "TracingError",
}  # fmt: skip


def test_all_is_sorted_and_holds_every_spec_name() -> None:
    assert plait.__all__ == sorted(plait.__all__)
    assert set(plait.__all__) >= SPEC_NAMES


def test_every_exported_name_resolves() -> None:
    for name in plait.__all__:
        assert getattr(plait, name) is not None, name


def test_graph_names_import_from_tracing() -> None:
    from plait.tracing import InferenceGraph, Tracer

    assert callable(Tracer().trace) and InferenceGraph.topological_order


def test_resource_manager_names_import_from_their_module_and_the_package() -> None:
    """`ResourceManager` is split over several modules; its public names stay where they were."""
    from plait import resources
    from plait.resources import manager

    assert {"EndpointStats", "ResourceManager", "ResponseCache"} <= set(manager.__all__)
    for name in manager.__all__:
        assert getattr(manager, name) is not None, name
    assert manager.ResourceManager is resources.ResourceManager is plait.ResourceManager
    assert manager.EndpointStats is resources.EndpointStats


def test_functional_imports_as_f() -> None:
    import plait.functional as F

    assert F.select({"a": 1}, "a").payload == 1


def test_import_loads_no_network_stack_or_sdk() -> None:
    code = (
        "import sys, plait; "
        "heavy = [m for m in ('aiohttp', 'openai', 'anthropic', 'llama_cpp', 'rich', 'pydantic') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unknown_attribute_says_so() -> None:
    try:
        plait.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_stream_restart_is_exported_beside_the_other_stream_events() -> None:
    from plait.streaming import StreamRestart

    assert plait.StreamRestart is StreamRestart
    assert "StreamRestart" in plait.__all__


@pytest.mark.parametrize(
    ("package", "table", "modules"),
    [
        ("plait", "_LAZY", {"settings"}),
        ("plait.optimization", "_HOMES", set()),
        ("plait.report", "_HOMES", set()),
    ],
)
def test_all_the_lazy_table_and_the_type_checking_imports_agree(
    package: str, table: str, modules: set[str]
) -> None:
    import ast
    import importlib
    from pathlib import Path

    loaded = importlib.import_module(package)
    tree = ast.parse(Path(loaded.__file__).read_text())
    [checking] = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
    ]
    typed = {
        alias.asname or alias.name
        for node in ast.walk(checking)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    eager = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module != "__future__"
        for alias in node.names
    } - {"TYPE_CHECKING", "Any", "_lazy"}
    defined = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    }
    assert typed == set(getattr(loaded, table)) | modules
    assert set(loaded.__all__) == typed | eager | defined
    assert loaded.__all__ == sorted(loaded.__all__)


def test_optimization_names_load_on_first_use_and_backward_stays_the_function() -> None:
    code = (
        "import sys, plait.optimization; "
        "cheap = 'plait.optimization.losses' not in sys.modules; "
        "import plait.optimization.backward; "
        "from plait.optimization import Trainer, backward; "
        "print(cheap, type(backward).__name__, Trainer.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "function", "Trainer"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("plait.evaluation", "plait.optimization.evaluation"),
        ("plait.metrics", "plait.optimization.metrics"),
        ("plait.profiling", "plait.report.profiling"),
        ("plait.telemetry", "plait.report.telemetry"),
    ],
)
def test_a_moved_public_module_keeps_its_old_path(old: str, new: str) -> None:
    import importlib

    before, after = importlib.import_module(old), importlib.import_module(new)
    assert before.__all__ == after.__all__
    for name in after.__all__:
        assert getattr(before, name) is getattr(after, name), name


# The modules of the learning layer before it became folders (issue 35), and the names each
# exported then: importing them from the old path keeps working.
LEARNING_OLD_PATHS = {
    "plait.optimization.backward": ["BackwardReport", "backward", "node_levels"],
    "plait.optimization.costs": [
        "CostEstimate", "Phase", "Proposal", "Range", "Variant", "check_sample", "estimate",
        "from_schedule", "measure", "measure_variant", "quiet",
    ],
    "plait.optimization.fewshot": [
        "BootstrapFewShot", "LabeledFewShot", "RandomSearch", "balanced_sample", "demo_modules",
    ],
    "plait.optimization.losses": [
        "CompositeLoss", "HumanFeedbackLoss", "LLMJudge", "LLMPreferenceLoss", "LLMRankingLoss",
        "LLMRubricLoss", "Loss", "RankingFeedback", "VerifierLoss",
    ],
    "plait.optimization.optimizers": [
        "Optimizer", "SFAOptimizer", "StepReport", "TextGradOptimizer", "UpdateRecord",
        "change_ratio", "check_update",
    ],
    "plait.optimization.reflective": ["ReflectiveSearch"],
    "plait.optimization.search": [
        "Candidate", "GridSearch", "ProgramSearch", "SearchReport", "Trial", "balanced_score",
        "optimize_grid", "sign_test",
    ],
    "plait.optimization.search_checkpoint": [
        "Reader", "SearchCheckpoint", "digest", "program_digest", "trial_key",
    ],
    "plait.optimization.step": ["PROGRAM_PATH", "TrainingStep", "on_examples"],
    "plait.optimization.trainer": ["NOTHING_VALIDATED", "TrainReport", "Trainer"],
    "plait.optimization.updates": [
        "FeedbackSummary", "ParameterUpdate", "StepReport", "UpdateRecord", "allowed_change",
        "allowed_words", "as_text", "change_ratio", "changed_words", "check_update",
        "clip_middle", "copied_name", "copied_run", "kind_of", "parse_leniently",
        "placeholders", "update_model_for",
    ],
}  # fmt: skip


@pytest.mark.parametrize("old", sorted(LEARNING_OLD_PATHS))
def test_the_learning_layers_old_module_paths_keep_their_names(old: str) -> None:
    import importlib

    import plait.optimization

    module = importlib.import_module(old)
    for name in LEARNING_OLD_PATHS[old]:
        value = getattr(module, name)  # AttributeError names the one a move lost
        if name in plait.optimization.__all__:
            assert value is getattr(plait.optimization, name), (old, name)
