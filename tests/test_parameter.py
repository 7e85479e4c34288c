"""Tests of plait.parameter: validation, feedback, identity and formatting."""

from __future__ import annotations

import pytest

from plait.module import LLMInference, Module
from plait.parameter import Parameter
from plait.tracing import Tracer


def learnable(value: str = "Be concise.") -> Parameter:
    return Parameter(value, description="Tone of the summary.")


# ------------------------------------------------------------------ validation
def test_learnable_parameter_without_description_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="has no description"):
        Parameter("Be concise.")


@pytest.mark.parametrize("description", ["", "   ", None])
def test_blank_description_counts_as_missing(description: str | None) -> None:
    with pytest.raises(ValueError, match="requires_grad=False"):
        Parameter("Be concise.", description=description)


def test_frozen_parameter_needs_no_description() -> None:
    p = Parameter("fixed system prompt", requires_grad=False)
    assert p.value == "fixed system prompt"
    assert p.description is None
    assert p.requires_grad is False


def test_constructor_keeps_fields() -> None:
    p = Parameter(["demo 1", "demo 2"], description="Few-shot demos.")
    assert p.value == ["demo 1", "demo 2"]
    assert p.description == "Few-shot demos."
    assert p.requires_grad is True


# -------------------------------------------------------------------- feedback
def test_feedback_accumulates_in_order() -> None:
    p = learnable()
    p.accumulate_feedback("too long")
    p.accumulate_feedback("too formal")
    assert p.get_accumulated_feedback() == ["too long", "too formal"]


def test_get_accumulated_feedback_returns_a_copy() -> None:
    p = learnable()
    p.accumulate_feedback("too long")
    copy = p.get_accumulated_feedback()
    copy.append("injected")
    copy.clear()
    assert p.get_accumulated_feedback() == ["too long"]


def test_apply_update_sets_value_and_clears_feedback() -> None:
    p = learnable()
    p.accumulate_feedback("too long")
    p.apply_update("Answer in one sentence.")
    assert p.value == "Answer in one sentence."
    assert p.get_accumulated_feedback() == []


def test_zero_feedback_clears_but_keeps_value() -> None:
    p = learnable()
    p.accumulate_feedback("a")
    p.accumulate_feedback("b")
    p.zero_feedback()
    assert p.get_accumulated_feedback() == []
    assert p.value == "Be concise."


def test_frozen_parameter_ignores_feedback() -> None:
    p = Parameter("fixed", requires_grad=False)
    p.accumulate_feedback("ignored")
    assert p.get_accumulated_feedback() == []


def test_freezing_later_stops_collection_and_unfreezing_resumes() -> None:
    p = learnable()
    p.accumulate_feedback("kept")
    p.requires_grad = False
    p.accumulate_feedback("dropped")
    p.requires_grad = True
    p.accumulate_feedback("kept too")
    assert p.get_accumulated_feedback() == ["kept", "kept too"]


def test_feedback_buffers_are_per_parameter() -> None:
    a, b = learnable(), learnable()
    a.accumulate_feedback("only a")
    assert b.get_accumulated_feedback() == []


# -------------------------------------------------------------------- identity
def test_equal_values_are_not_equal_parameters() -> None:
    a, b = learnable("same"), learnable("same")
    assert a == a
    assert a != b
    assert (a == b) is False


def test_hash_is_by_identity_so_sets_keep_both() -> None:
    a, b = learnable("same"), learnable("same")
    assert len({a, b}) == 2
    assert {a: 1, b: 2}[b] == 2


def test_membership_in_a_list_is_by_identity() -> None:
    a, b = learnable("same"), learnable("same")
    assert a in [a]
    assert b not in [a]
    assert [a, b].index(b) == 1


def test_hash_is_stable_when_the_value_changes() -> None:
    p = learnable()
    seen = {p}
    p.apply_update("a different prompt")
    assert p in seen


def test_parameter_is_not_equal_to_its_value() -> None:
    p = learnable("text")
    assert p != "text"
    assert p not in ["text"]


# ------------------------------------------------------------------ formatting
def test_str_is_the_value() -> None:
    assert str(learnable("Be concise.")) == "Be concise."


def test_fstring_and_format_spec() -> None:
    p = learnable("abc")
    assert f"[{p}]" == "[abc]"
    assert f"[{p:>5}]" == "[  abc]"
    assert "{}!".format(p) == "abc!"  # noqa: UP032 - str.format is what is under test


def test_str_of_a_non_string_value() -> None:
    p = Parameter(["a", "b"], description="Demos.")
    assert str(p) == "['a', 'b']"


def test_repr_shows_value_and_frozen_flag() -> None:
    assert repr(learnable("hi")) == "Parameter('hi')"
    assert repr(Parameter("hi", requires_grad=False)) == "Parameter('hi', requires_grad=False)"


# ----------------------------------------------------------------------- names
def test_name_before_registration() -> None:
    assert learnable().name == "<unnamed>"


def test_name_is_the_first_attribute_it_was_registered_under() -> None:
    class Holder(Module):
        def __init__(self, p: Parameter) -> None:
            super().__init__()
            self.instructions = p

    p = learnable()
    Holder(p)
    assert p.name == "instructions"
    Holder(p).alias_of_it = p
    assert p.name == "instructions"


def test_parameter_formats_to_a_graph_ref_while_tracing() -> None:
    class Assistant(Module):
        def __init__(self) -> None:
            super().__init__()
            self.instructions = learnable("Be kind.")
            self.llm = LLMInference("assistant")

        def forward(self, request: str) -> str:
            return self.llm(f"{self.instructions}\n\nUser: {request}")

    module = Assistant()
    graph = Tracer().trace(module, "hello")
    assert graph.nodes["llm"].parameters == ("param:instructions",)
    assert graph.nodes["llm"].dependencies == ("input:request",)
    # Outside the trace the parameter is plain text again.
    assert str(module.instructions) == "Be kind."
