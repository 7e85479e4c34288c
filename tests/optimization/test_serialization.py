"""Saving and loading parameters and optimizer state: JSON files, never pickle."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from plait import LLMInference, Module, Parameter
from plait.errors import FileError
from plait.optimization import SFAOptimizer, load_state


class Program(Module):
    def __init__(self) -> None:
        super().__init__()
        self.instructions = Parameter("Answer briefly.", description="How to answer.")
        self.demos = Parameter(
            [{"question": "2+2?", "answer": "4"}], description="Worked examples shown first."
        )
        self.llm = LLMInference("llm", system_prompt="You are careful.")  # fixed

    def forward(self, question: str) -> str:
        return self.llm(f"{self.instructions}\n{self.demos}\n{question}")


def test_save_and_load_round_trip_through_json(tmp_path: Path) -> None:
    trained = Program()
    trained.instructions.value = "Answer with one number, nothing else."
    trained.demos.value = [{"question": "3*3?", "answer": "9"}, {"question": "1+1?", "answer": "2"}]
    path = trained.save(tmp_path / "program.json")

    fresh = Program()
    assert fresh.load(path) is None  # no optimizer state was saved
    assert fresh.state_dict() == trained.state_dict()
    assert fresh.demos.value == [
        {"question": "3*3?", "answer": "9"},
        {"question": "1+1?", "answer": "2"},
    ]


def test_save_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    linked = tmp_path / "linked.json"
    linked.symlink_to(victim)
    with pytest.raises(FileError, match=r"linked\.json is a symbolic link"):
        Program().save(linked)
    (tmp_path / f".program.json.{os.getpid()}.tmp").symlink_to(victim)  # plait's old temporary
    path = Program().save(tmp_path / "program.json")
    assert json.loads(path.read_text())["format"] == 1 and not path.is_symlink()
    assert victim.read_text() == "precious\n"


def test_the_file_is_readable_json_with_descriptions(tmp_path: Path) -> None:
    path = tmp_path / "program.json"
    Program().save(path)
    text = path.read_text(encoding="utf-8")
    document = json.loads(text)
    assert document == {
        "format": 1,
        "parameters": {
            "instructions": {
                "value": "Answer briefly.",
                "description": "How to answer.",
                "requires_grad": True,
            },
            "demos": {
                "value": [{"question": "2+2?", "answer": "4"}],
                "description": "Worked examples shown first.",
                "requires_grad": True,
            },
            "llm.system_prompt": {
                "value": "You are careful.",
                "description": None,
                "requires_grad": False,
            },
        },
        "optimizer": None,
    }
    assert load_state(path) == document
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(path.read_bytes())


def test_optimizer_state_is_saved_and_returned_by_load(tmp_path: Path) -> None:
    program = Program()
    optimizer = SFAOptimizer(program.named_parameters())
    path = program.save(tmp_path / "checkpoint.json", optimizer=optimizer)
    saved = json.loads(path.read_text())["optimizer"]
    assert saved == json.loads(json.dumps(optimizer.state_dict()))

    restored_program = Program()
    restored = SFAOptimizer(restored_program.named_parameters())
    state = restored_program.load(path)
    assert state == saved
    restored.load_state_dict(state)
    assert restored.state_dict() == optimizer.state_dict()


def test_unknown_names_raise_one_key_error_and_change_nothing(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    document: dict[str, Any] = {
        "format": 1,
        "parameters": {
            "instructions": {"value": "CHANGED"},
            "summarizer.system_prompt": {"value": "x"},
            "stage2.user.system_prompt": {"value": "y"},
        },
        "optimizer": None,
    }
    path.write_text(json.dumps(document))
    program = Program()
    with pytest.raises(KeyError) as raised:
        program.load(path)
    message = str(raised.value)
    assert "summarizer.system_prompt" in message and "stage2.user.system_prompt" in message
    assert "known: instructions, demos, llm.system_prompt" in message
    assert program.instructions.value == "Answer briefly."


def test_a_pickle_or_a_foreign_json_file_is_refused(tmp_path: Path) -> None:
    pickled = tmp_path / "params.pkl"
    pickled.write_bytes(pickle.dumps({"instructions": "x"}))
    with pytest.raises(ValueError, match=r"params\.pkl is not a plait parameter file"):
        Program().load(pickled)
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"format": 7, "parameters": {"instructions": "bare"}}))
    with pytest.raises(ValueError) as raised:
        load_state(foreign)
    assert "'format' is 7, expected 1" in str(raised.value)
    assert "parameter 'instructions' has no 'value'" in str(raised.value)


def test_a_deeply_nested_parameter_or_optimizer_state_is_a_value_error(tmp_path: Path) -> None:
    nested = tmp_path / "nested.json"
    nested.write_text('{"format": 1, "parameters": ' + "[" * 100_000)
    with pytest.raises(ValueError, match=r"nested\.json is not a plait parameter file.*too deep"):
        Program().load(nested)
    optimizer = SFAOptimizer(Program().named_parameters())
    with pytest.raises(ValueError, match="not an optimizer state"):
        optimizer.load_state_dict('{"format": ' + "[" * 100_000)


def test_a_value_that_is_not_json_is_refused_and_the_old_file_kept(tmp_path: Path) -> None:
    path = Program().save(tmp_path / "program.json")
    before = path.read_text()
    program = Program()
    program.demos.value = {1, 2, 3}  # a set: not JSON
    with pytest.raises(TypeError, match="parameter 'demos' cannot be saved as JSON"):
        program.save(path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["program.json"]


class UnsavableOptimizer:
    """A user's own optimizer whose state holds a non-JSON object."""

    def state_dict(self) -> dict[str, Any]:
        return {"seen": object()}


def test_optimizer_state_that_is_not_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"UnsavableOptimizer\.state_dict\(\) cannot be saved"):
        Program().save(tmp_path / "x.json", optimizer=UnsavableOptimizer())
    assert list(tmp_path.iterdir()) == []


def test_values_of_the_wrong_type_are_all_refused_with_the_file_name(tmp_path: Path) -> None:
    path = Program().save(tmp_path / "edited.json")
    document = json.loads(path.read_text())
    document["parameters"]["instructions"]["value"] = {"text": "Answer briefly."}
    document["parameters"]["demos"]["value"] = 3
    document["parameters"]["llm.system_prompt"]["value"] = ["You are careful."]
    path.write_text(json.dumps(document))
    program = Program()
    before = program.state_dict()

    with pytest.raises(TypeError) as raised:
        program.load(path)

    message = str(raised.value)
    assert message.startswith(f"cannot load {path}: parameter value(s) of the wrong type")
    assert "  instructions: expected str, got dict {'text': 'Answer briefly.'}" in message
    assert "  demos: expected list, got int 3" in message
    assert "  llm.system_prompt: expected str, got list ['You are careful.']" in message
    assert program.state_dict() == before


def test_values_of_the_json_kind_of_the_current_value_load() -> None:
    program = Program()
    program.demos.value = ()  # a tuple is saved as a JSON array and comes back a list
    program.load_state_dict({"demos": [{"question": "1+1?", "answer": "2"}], "instructions": "Hi"})
    assert program.state_dict()["demos"] == [{"question": "1+1?", "answer": "2"}]
