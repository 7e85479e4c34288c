"""`check_update`: what makes an optimizer's proposal usable (pure functions, no server)."""

from __future__ import annotations

from plait.optimization.updates import (
    ParameterUpdate,
    change_ratio,
    check_update,
    parse_leniently,
    placeholders,
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
    # conservatism 1 allows 10% of the words to change; 0.5 allows 55%.
    ten = " ".join(f"w{i}" for i in range(10))
    assert check_update(ten, ten.replace("w9", "x9"), 1.0)[1] is None  # 10% changed
    two = ten.replace("w9", "x9").replace("w8", "x8")
    assert "allows at most 10%" in check_update(ten, two, 1.0)[1]
    assert check_update(ten, two, 0.5)[1] is None


def test_placeholders_and_lenient_parsing() -> None:
    assert placeholders("Use {text} and {n:>3} but not {{this}}") == {"{text}", "{n:>3}"}
    raw = '{"rationale": "r", "new_value": "a\nb"}'  # a raw newline: invalid strict JSON
    assert parse_leniently(raw, ParameterUpdate) == ParameterUpdate(rationale="r", new_value="a\nb")
    assert parse_leniently("not json", ParameterUpdate) is None
