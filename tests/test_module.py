"""Tests of plait.module: registration, traversal, state, modes, binding and direct calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from plait.module import LLMInference, Module
from plait.parameter import Parameter
from seed_programs import (
    AssistantGeneration,
    DeepPipeline,
    MultiPerspectiveAnalysis,
    SummarizeAndAnalyze,
    Synthesizer,
)

# ----------------------------------------------------------- seed 000 programs


# --------------------------------------------------------------- small modules


class Upper(Module):
    def forward(self, text: str) -> str:
        return text.upper()


class Exclaim(Module):
    def forward(self, text: str) -> str:
        return text + "!"


class TextPipeline(Module):
    """A composite with no LLM inside: runs eagerly when called."""

    def __init__(self) -> None:
        super().__init__()
        self.upper = Upper()
        self.exclaim = Exclaim()

    def forward(self, text: str) -> str:
        return self.exclaim(self.upper(text))


def prompt(value: str) -> Parameter:
    return Parameter(value, description="An instruction under test.")


class Holder(Module):
    """A module whose children and parameters are set by the test."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__()
        for name, value in attrs.items():
            setattr(self, name, value)


# ------------------------------------------------------------ registration


def test_assignment_registers_modules_and_parameters() -> None:
    child, param = Upper(), prompt("p")
    m = Holder(child=child, instructions=param, plain="not registered")
    assert list(m.named_children()) == [("child", child)]
    assert list(m.named_parameters()) == [("instructions", param)]
    assert m.plain == "not registered"


def test_reassigning_a_module_to_a_plain_value_unregisters_it() -> None:
    m = Holder(child=Upper())
    m.child = "now a string"
    assert list(m.named_children()) == []
    assert [name for name, _ in m.named_modules()] == [""]
    assert m.child == "now a string"


def test_reassigning_a_parameter_to_none_unregisters_it() -> None:
    m = Holder(instructions=prompt("p"))
    m.instructions = None
    assert list(m.named_parameters()) == []
    assert m.state_dict() == {}


def test_reassigning_between_kinds_moves_the_registration() -> None:
    m = Holder(slot=Upper())
    param = prompt("p")
    m.slot = param
    assert list(m.named_children()) == []
    assert list(m.named_parameters()) == [("slot", param)]
    child = Exclaim()
    m.slot = child
    assert list(m.named_parameters()) == []
    assert list(m.named_children()) == [("slot", child)]


def test_replacing_a_child_keeps_its_place_in_the_order() -> None:
    m = Holder(first=Upper(), second=Upper(), third=Upper())
    replacement = Exclaim()
    m.second = replacement
    assert [name for name, _ in m.named_children()] == ["first", "second", "third"]
    assert m.second is replacement


def test_delattr_unregisters_and_removes_the_attribute() -> None:
    m = Holder(child=Upper(), instructions=prompt("p"))
    del m.child
    del m.instructions
    assert list(m.named_children()) == []
    assert list(m.named_parameters()) == []
    assert not hasattr(m, "child")
    with pytest.raises(AttributeError):
        del m.child


def test_register_module_and_register_parameter() -> None:
    m = Holder()
    child, param = Upper(), prompt("p")
    m.register_module("child", child)
    m.register_parameter("instructions", param)
    assert m.child is child
    assert m.instructions is param
    assert dict(m.named_children()) == {"child": child}
    assert dict(m.named_parameters()) == {"instructions": param}


def test_children_assigned_before_super_init_or_without_it_are_registered() -> None:
    class Late(Module):
        def __init__(self) -> None:
            self.llm = LLMInference("fast")
            super().__init__()  # after the assignment: keeps what was registered

    class Without(Module):
        def __init__(self) -> None:
            self.llm = LLMInference("fast")

    for module in (Late(), Without()):
        assert dict(module.named_children()) == {"llm": module.llm}
        assert module.llm._name == "llm" and module.training is False


# --------------------------------------------------------------- traversal


def test_children_and_named_children_are_immediate_only() -> None:
    p = DeepPipeline()
    assert [name for name, _ in p.named_children()] == ["stage1", "stage2", "stage3"]
    assert list(p.children()) == [p.stage1, p.stage2, p.stage3]


DEEP_MODULE_PATHS = [
    "",
    "stage1",
    "stage1.summarizer",
    "stage1.analyzer",
    "stage2",
    "stage2.technical",
    "stage2.business",
    "stage2.user",
    "stage3",
    "stage3.analyzer",
    "stage3.analyzer.technical",
    "stage3.analyzer.business",
    "stage3.analyzer.user",
    "stage3.synthesizer",
]


def test_named_modules_of_deep_pipeline_are_dotted_depth_first() -> None:
    p = DeepPipeline()
    named = list(p.named_modules())
    assert [name for name, _ in named] == DEEP_MODULE_PATHS
    assert named[0][1] is p
    assert dict(named)["stage3.analyzer.user"] is p.stage3.analyzer.user
    assert list(p.modules()) == [m for _, m in named]


def test_named_modules_with_prefix() -> None:
    names = [name for name, _ in SummarizeAndAnalyze().named_modules(prefix="root")]
    assert names == ["root", "root.summarizer", "root.analyzer"]


def test_named_parameters_of_deep_pipeline() -> None:
    p = DeepPipeline()
    assert [name for name, _ in p.named_parameters()] == [
        "stage1.summarizer.system_prompt",
        "stage1.analyzer.system_prompt",
        "stage2.technical.system_prompt",
        "stage2.business.system_prompt",
        "stage2.user.system_prompt",
        "stage3.analyzer.technical.system_prompt",
        "stage3.analyzer.business.system_prompt",
        "stage3.analyzer.user.system_prompt",
        "stage3.synthesizer.system_prompt",
    ]
    assert list(p.parameters()) == [param for _, param in p.named_parameters()]
    assert all(not param.requires_grad for param in p.parameters())


def test_seed_summarize_and_analyze_structure() -> None:
    m = SummarizeAndAnalyze()
    assert [n for n, _ in m.named_modules()] == ["", "summarizer", "analyzer"]
    assert m.state_dict() == {
        "summarizer.system_prompt": "You are a concise summarizer.",
        "analyzer.system_prompt": "You are a thorough analyst.",
    }


def test_seed_multi_perspective_structure() -> None:
    m = MultiPerspectiveAnalysis()
    assert [n for n, _ in m.named_modules()] == ["", "technical", "business", "user"]
    assert [n for n, _ in m.named_parameters()] == [
        "technical.system_prompt",
        "business.system_prompt",
        "user.system_prompt",
    ]
    assert {child.alias for child in m.children()} == {"llm"}


def test_seed_synthesizer_structure() -> None:
    m = Synthesizer()
    assert [n for n, _ in m.named_modules()] == [
        "",
        "analyzer",
        "analyzer.technical",
        "analyzer.business",
        "analyzer.user",
        "synthesizer",
    ]
    assert [n for n, _ in m.named_parameters()] == [
        "analyzer.technical.system_prompt",
        "analyzer.business.system_prompt",
        "analyzer.user.system_prompt",
        "synthesizer.system_prompt",
    ]


def test_seed_assistant_generation_structure() -> None:
    m = AssistantGeneration("Be helpful.", temperature=0.2)
    assert [n for n, _ in m.named_modules()] == ["", "llm", "optimizer_llm"]
    named = dict(m.named_parameters())
    # The llm has no system prompt, so it contributes no parameter.
    assert list(named) == ["assistant_instructions", "optimizer_llm.system_prompt"]
    assert named["assistant_instructions"].requires_grad is True
    assert named["optimizer_llm.system_prompt"].requires_grad is False
    assert m.llm.temperature == 0.2
    assert m.llm.system_prompt is None


def test_shared_module_is_reported_once_under_its_first_path() -> None:
    shared = LLMInference("fast", system_prompt=prompt("shared prompt"))
    m = Holder(a=Holder(llm=shared), b=Holder(llm=shared))
    names = [name for name, _ in m.named_modules()]
    assert names == ["", "a", "a.llm", "b"]
    assert [name for name, _ in m.named_parameters()] == ["a.llm.system_prompt"]
    assert len(list(m.modules())) == 4


def test_same_child_under_two_names_is_one_child() -> None:
    child = Upper()
    m = Holder(first=child, second=child)
    assert list(m.named_children()) == [("first", child)]
    assert list(m.children()) == [child]


def test_shared_parameter_is_reported_once() -> None:
    param = prompt("shared")
    m = Holder(x=Holder(p=param), y=Holder(p=param), own=param)
    assert list(m.named_parameters()) == [("own", param)]
    assert m.state_dict() == {"own": "shared"}


def test_named_parameters_without_recursion() -> None:
    m = AssistantGeneration("Be helpful.")
    assert [n for n, _ in m.named_parameters(recurse=False)] == ["assistant_instructions"]
    assert list(m.parameters(recurse=False)) == [m.assistant_instructions]


def test_a_module_cycle_does_not_loop_forever() -> None:
    a = Holder()
    b = Holder(parent=a)
    a.child = b
    assert [name for name, _ in a.named_modules()] == ["", "child"]


# ------------------------------------------------------------------- state


def test_state_dict_uses_dotted_names_and_current_values() -> None:
    m = AssistantGeneration("Be helpful.")
    m.assistant_instructions.apply_update("Be very helpful.")
    assert m.state_dict() == {
        "assistant_instructions": "Be very helpful.",
        "optimizer_llm.system_prompt": "You help improve prompts based on feedback.",
    }


def test_state_dict_round_trips_through_json() -> None:
    source = DeepPipeline()
    source.stage3.synthesizer.system_prompt.value = "Write a one-page report."
    saved = json.loads(json.dumps(source.state_dict()))
    target = DeepPipeline()
    target.load_state_dict(saved)
    assert target.state_dict() == source.state_dict()
    assert target.stage3.synthesizer.system_prompt.value == "Write a one-page report."


def test_load_state_dict_allows_missing_keys() -> None:
    m = SummarizeAndAnalyze()
    m.load_state_dict({"analyzer.system_prompt": "new analyst prompt"})
    assert m.state_dict() == {
        "summarizer.system_prompt": "You are a concise summarizer.",
        "analyzer.system_prompt": "new analyst prompt",
    }


def test_load_state_dict_unknown_keys_list_all_and_change_nothing() -> None:
    m = SummarizeAndAnalyze()
    before = m.state_dict()
    bad = {
        "summarizer.system_prompt": "would be changed",
        "summariser.system_prompt": "typo",
        "analyzer.instructions": "no such parameter",
    }
    with pytest.raises(KeyError) as excinfo:
        m.load_state_dict(bad)
    message = str(excinfo.value)
    assert "summariser.system_prompt" in message
    assert "analyzer.instructions" in message
    assert "known:" in message
    assert m.state_dict() == before


def test_load_state_dict_refuses_values_of_another_type_and_changes_nothing() -> None:
    m = SummarizeAndAnalyze()
    before = m.state_dict()
    bad = {
        "summarizer.system_prompt": {"role": "system"},
        "analyzer.system_prompt": 42,
    }
    with pytest.raises(TypeError) as excinfo:
        m.load_state_dict(bad)
    lines = str(excinfo.value).splitlines()
    assert lines[1:3] == [
        "  summarizer.system_prompt: expected str, got dict {'role': 'system'}",
        "  analyzer.system_prompt: expected str, got int 42",
    ]
    assert m.state_dict() == before


def test_load_state_dict_on_a_module_without_parameters() -> None:
    m = TextPipeline()
    m.load_state_dict({})
    with pytest.raises(KeyError, match="known: none"):
        m.load_state_dict({"x": "y"})


# --------------------------------------------------------------- modes


def test_modules_start_in_eval_mode() -> None:
    p = DeepPipeline()
    assert all(not m.training for m in p.modules())


def test_train_and_eval_propagate_and_return_self() -> None:
    p = DeepPipeline()
    assert p.train() is p
    assert all(m.training for m in p.modules())
    assert p.eval() is p
    assert all(not m.training for m in p.modules())
    p.train()
    assert p.train(False) is p
    assert not p.stage3.analyzer.user.training


def test_train_on_a_subtree_leaves_the_rest() -> None:
    p = DeepPipeline()
    p.stage2.train()
    assert p.stage2.technical.training
    assert not p.training
    assert not p.stage1.summarizer.training


def test_requires_grad_freezes_and_unfreezes_every_parameter() -> None:
    m = AssistantGeneration("Be helpful.")
    assert m.requires_grad_(False) is m
    assert all(not p.requires_grad for p in m.parameters())
    m.assistant_instructions.accumulate_feedback("ignored while frozen")
    assert m.assistant_instructions.get_accumulated_feedback() == []
    assert m.requires_grad_() is m
    assert all(p.requires_grad for p in m.parameters())


# ------------------------------------------------------------- binding, calls


def test_bind_returns_self_and_stores_resources_and_config() -> None:
    m = SummarizeAndAnalyze()
    resources = {"fast_llm": {"provider": "local"}}
    assert m.bind(resources, max_concurrent=7, checkpoint_dir="ckpt") is m
    assert m._bound_resources is resources
    assert m._bound_config == {"max_concurrent": 7, "checkpoint_dir": "ckpt"}


def test_bind_leaves_max_concurrent_to_settings_and_defaults() -> None:
    from plait.execution import ExecutionSettings
    from plait.execution.settings import effective_options

    m = Upper().bind({"x": {}})
    assert m._bound_config == {"max_concurrent": None}
    assert effective_options(m._bound_config, {})["max_concurrent"] == 100
    with ExecutionSettings(max_concurrent=3):
        assert effective_options(m._bound_config, {})["max_concurrent"] == 3


def test_module_without_llm_runs_eagerly() -> None:
    assert Upper()("hello") == "HELLO"
    assert TextPipeline()("hi") == "HI!"
    assert TextPipeline()(text="kw") == "KW!"


def test_module_without_forward_says_so() -> None:
    with pytest.raises(NotImplementedError, match="Holder must implement forward"):
        Holder()("x")


def test_llm_inference_without_resources_names_alias_and_fix() -> None:
    llm = LLMInference("fast_llm")
    with pytest.raises(RuntimeError, match="alias 'fast_llm'") as excinfo:
        llm("hello")
    message = str(excinfo.value)
    assert "no resources" in message
    assert ".bind(" in message
    assert "ExecutionSettings" in message


def test_composite_called_without_resources_names_the_child() -> None:
    with pytest.raises(RuntimeError, match=r"'summarizer' \(alias 'fast_llm'\)"):
        SummarizeAndAnalyze()("some text")


def test_llm_inference_forward_is_not_for_direct_use() -> None:
    with pytest.raises(RuntimeError, match="executor"):
        LLMInference("fast").forward("x")


def test_llm_inference_settings() -> None:
    learnable = prompt("Be brief.")
    llm = LLMInference("fast", system_prompt=learnable, temperature=0.3, max_tokens=64)
    assert (llm.alias, llm.temperature, llm.max_tokens) == ("fast", 0.3, 64)
    assert llm.system_prompt is learnable
    assert list(llm.named_parameters()) == [("system_prompt", learnable)]
    fixed = LLMInference("fast", system_prompt="Fixed.")
    assert fixed.system_prompt is not None
    assert fixed.system_prompt.requires_grad is False
    assert LLMInference("fast").system_prompt is None


@pytest.mark.parametrize("alias", ["", None, 3])
def test_llm_inference_needs_an_alias(alias: Any) -> None:
    with pytest.raises(ValueError, match="non-empty alias"):
        LLMInference(alias)


def test_repr_shows_the_tree() -> None:
    assert repr(SummarizeAndAnalyze()) == (
        "SummarizeAndAnalyze(\n"
        "  (summarizer): LLMInference(alias='fast_llm')\n"
        "  (analyzer): LLMInference(alias='smart_llm')\n"
        ")"
    )
    assert repr(Upper()) == "Upper()"


# ------------------------------------------------------------------ copies
class Tuned(Module):
    """A module with its own parameter and a child holding another (for copy tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt = Parameter("Be brief.", description="tone of the reply")
        self.inner = LLMInference(alias="llm", system_prompt="Summarise.")
        self.inner.extra = Parameter(["demo"], description="few-shot examples")


def test_deep_copy_is_independent_but_shares_bound_resources() -> None:
    resources = object()  # stands for a manager: must be shared, never copied
    original = Tuned().bind(resources, max_concurrent=4)
    clone = original.copy()

    assert clone is not original and clone.inner is not original.inner
    assert [n for n, _ in clone.named_parameters()] == [n for n, _ in original.named_parameters()]
    assert clone.state_dict() == original.state_dict()
    assert clone._bound_resources is resources and clone.inner._bound_resources is None
    clone.prompt.value = "Be thorough."
    clone.inner.extra.value.append("another")
    clone.inner.system_prompt.value = "Translate."
    assert original.state_dict() == {
        "prompt": "Be brief.",
        "inner.system_prompt": "Summarise.",
        "inner.extra": ["demo"],
    }


def test_shallow_copy_shares_children_and_parameters() -> None:
    original = Tuned()
    clone = original.copy(deep=False)

    assert clone is not original
    assert clone.inner is original.inner and clone.prompt is original.prompt
    clone.inner = LLMInference(alias="other")  # re-registering on the copy …
    assert original.inner.alias == "llm"  # … leaves the original's tree alone
    assert [n for n, _ in original.named_children()] == ["inner"]


async def _async_def(x: Any) -> Any:
    return x


def _plain_def(x: Any) -> Any:
    return x


async def _async_generator() -> Any:
    yield 1


def _generator() -> Any:
    yield 1


class _AsyncCallable:
    async def __call__(self) -> None:
        return None

    async def method(self) -> None:
        return None


def _sync_wrapper_of(function: Any) -> Any:
    import functools

    @functools.wraps(function)
    def wrapper(*args: Any) -> Any:
        return function(*args)

    return wrapper


def _marked() -> Any:
    import inspect

    def function() -> Any:
        return None

    mark = getattr(inspect, "markcoroutinefunction", None)  # Python 3.12+
    return mark(function) if mark else function


@pytest.mark.parametrize(
    "function",
    [
        _async_def,
        _plain_def,
        _async_generator,
        _generator,
        lambda: None,
        _AsyncCallable(),
        _AsyncCallable().method,
        _AsyncCallable.method,
        staticmethod(_async_def),
        _sync_wrapper_of(_async_def),
        _marked(),
        __import__("functools").partial(_async_def, 1),
        print,
        None,
    ],
    ids=lambda function: getattr(function, "__qualname__", type(function).__name__),
)
def test_is_async_def_answers_as_inspect_does(function: Any) -> None:
    import inspect

    from plait.module import is_async_def

    assert is_async_def(function) is inspect.iscoroutinefunction(function)
