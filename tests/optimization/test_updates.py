"""`check_update`: what makes an optimizer's proposal usable (pure functions, no server)."""

from __future__ import annotations

from pydantic import BaseModel

from plait.optimization.updates import (
    ParameterUpdate,
    allowed_words,
    change_ratio,
    changed_words,
    check_update,
    copied_name,
    copied_run,
    parse_leniently,
    placeholders,
    update_model_for,
)


def test_check_update_rules() -> None:
    assert check_update("Be brief.", "Be brief and kind.", 0.0) == ("Be brief and kind.", None)
    assert "empty" in check_update("Be brief.", "", 0.0)[1]
    assert "{text}" in check_update("Sum {text}", "Sum it", 0.0)[1]
    assert "{extra}" in check_update("Sum {text}", "Sum {text} {extra}", 0.0)[1]
    assert check_update("Say {{hi}}", "Say {{hi}} kindly", 0.0)[1] is None  # braces, not fields
    demos = [{"q": "a", "a": "b"}]
    assert check_update(demos, '[{"q": "c", "a": "d"}]', 0.0) == ([{"q": "c", "a": "d"}], None)
    assert "JSON list" in check_update(demos, '{"q": "c"}', 0.0)[1]
    assert change_ratio("a b c d", "a b c d") == 0.0 and change_ratio("a b", "c d") == 1.0
    # conservatism 1 allows 10% of the words to change; 0.5 allows 55% or 20 words.
    ten = " ".join(f"w{i}" for i in range(10))
    assert check_update(ten, ten.replace("w9", "x9"), 1.0)[1] is None  # 10% changed
    two = ten.replace("w9", "x9").replace("w8", "x8")
    assert (
        "changes 2 of 10 words; conservatism 1 allows at most 1" in check_update(ten, two, 1.0)[1]
    )
    assert check_update(ten, two, 0.5)[1] is None


def test_the_default_conservatism_lets_a_short_prompt_be_rewritten_but_not_a_long_one() -> None:
    short = "Evaluate the boolean expression. Answer True or False."
    rewrite = (
        "Work out the boolean expression step by step, inner brackets first, "
        "then reply with the single word True or False."
    )
    # The old rule (a share of words alone) refused this: 62 % changed, 55 % allowed.
    assert change_ratio(short, rewrite) > 0.6 and changed_words(short, rewrite) == 15
    assert check_update(short, rewrite, 0.5) == (rewrite, None)
    # A long prompt may not be replaced in one step: 55 % of its words at most.
    long = " ".join(f"rule{i} applies here." for i in range(20))  # 60 words
    other = " ".join(f"other{i} instead now." for i in range(20))
    assert "conservatism 0.5 allows at most 33" in check_update(long, other, 0.5)[1]
    assert allowed_words(0.5, short, short) == 20 and allowed_words(0.0, long, other) == 60


def test_a_prompt_that_pastes_feedback_is_refused() -> None:
    old = "Evaluate the boolean expression. Answer True or False."
    feedback = [
        "Step llm received: not ( True ) and ( True ) is\nIt produced: True\n"
        "Feedback on that output: The output failed the check. Expected: 'False'. Got: 'True'."
    ]
    pasted = old + " The output failed the check. Expected: 'False'. Got: 'True'."
    value, reason = check_update(old, pasted, 0.0, sources=feedback)
    assert value is None and 'copies "the output failed the check expected false got' in reason
    own = old + " Check each operator before answering."
    assert check_update(old, own, 0.0, sources=feedback) == (own, None)
    # Keeping a sentence the old value had is not copying it.
    assert copied_run(old + " x", [old], old) is None


def test_a_prompt_that_takes_a_name_from_the_feedback_is_refused() -> None:
    # Seen on SmolLM2-135M (object_counting, TextGrad): seven copied words, one short of a run.
    old = "Count the objects the question asks about. Answer with only the number."
    feedback = [
        "The output failed object_counting_correct. Expected: '2'. Got: Prediction(answer='3')."
    ]
    pasted = "The feedback failed object_counting_correct. Expected: 2. Got: Prediction(answer='2')"
    value, reason = check_update(old, pasted, 0.0, sources=feedback)
    assert value is None and 'copies "Prediction("' in reason
    assert copied_name("Use object_counting_correct.", feedback) == "object_counting_correct"
    # Names the old value had, and plain words, are not copies.
    assert copied_name("Call fix_it() first.", ["fix_it( failed"], "Call fix_it() now.") is None
    own = "Count only the things the question names, then answer with the number."
    assert check_update(old, own, 0.0, sources=feedback) == (own, None)


def test_typed_values_are_checked_as_data() -> None:
    demos = [{"q": "a", "a": "b"}]

    class Demo(BaseModel):
        q: str
        a: str

    assert check_update(demos, [Demo(q="c", a="d")], 0.0) == ([{"q": "c", "a": "d"}], None)
    assert "empty" in check_update(demos, [], 0.0)[1]
    model = update_model_for(list[Demo])
    assert model.__name__ == "ParameterUpdate" and update_model_for(None) is ParameterUpdate
    parsed = model.model_validate({"rationale": "r", "new_value": [{"q": "x", "a": "y"}]})
    assert parsed.new_value == [Demo(q="x", a="y")]


def test_placeholders_and_lenient_parsing() -> None:
    assert placeholders("Use {text} and {n:>3} but not {{this}}") == {"{text}", "{n:>3}"}
    raw = '{"rationale": "r", "new_value": "a\nb"}'  # a raw newline: invalid strict JSON
    assert parse_leniently(raw, ParameterUpdate) == ParameterUpdate(rationale="r", new_value="a\nb")
    assert parse_leniently("not json", ParameterUpdate) is None
