"""Signatures: both forms, immutability, derivation, output models."""

import enum
from typing import Literal

import pytest
from pydantic import BaseModel

from plait import InputField, OutputField, Signature
from plait.signatures import FieldSpec, SignatureMeta, as_signature, make_signature


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    city: str
    zip_code: str


class Person(BaseModel):
    name: str
    address: Address


class QA(Signature):
    """Answer questions with a short factual answer."""

    context: str = InputField(description="Background facts")
    question: str = InputField(description="The user's question")
    answer: str = OutputField(description="A few words")
    confidence: float = OutputField()


class Extract(Signature):
    """Extract structured facts."""

    text: str = InputField()
    label: Literal["person", "place"] = OutputField()
    color: Color = OutputField()
    tags: list[str] = OutputField()
    person: Person = OutputField()


# ------------------------------------------------------------------ forms
def test_class_form_reads_docstring_fields_and_order():
    assert QA.instructions == "Answer questions with a short factual answer."
    assert list(QA.input_fields) == ["context", "question"]
    assert list(QA.output_fields) == ["answer", "confidence"]
    assert QA.input_fields["question"] == FieldSpec("question", str, "The user's question", "input")
    assert QA.output_fields["confidence"].annotation is float
    assert QA.signature_text() == "context, question -> answer, confidence"


def test_string_form_gives_the_same_kind_of_object():
    sig = Signature.from_string(
        "context, question -> answer: str, confidence: float", instructions="Be brief."
    )
    assert isinstance(sig, SignatureMeta) and issubclass(sig, Signature)
    assert sig.instructions == "Be brief."
    assert sig.input_fields["context"].annotation is str  # untyped means str
    assert sig.output_fields["confidence"].annotation is float
    assert sig.signature_text() == QA.signature_text()


def test_equal_contracts_are_equal_and_hash_alike():
    text = "a, b -> c: int"
    one, two = Signature.from_string(text), Signature.from_string(text)
    assert one == two and hash(one) == hash(two)
    assert one != Signature.from_string("a, b -> c: float")
    assert one != one.with_instructions("other")
    assert len({one, two, one.with_instructions("x")}) == 2


def test_a_signature_without_docstring_names_its_fields():
    sig = Signature.from_string("question -> answer")
    assert sig.instructions == "Given the fields `question`, produce the fields `answer`."

    class NoDoc(Signature):
        question: str = InputField()
        answer: str = OutputField()

    assert NoDoc.instructions == sig.instructions  # not Signature's own docstring
    assert Signature.instructions == ""


def test_subclass_inherits_fields_and_instructions():
    class WithSource(QA):
        source: str = OutputField(description="Where the answer comes from")

    assert list(WithSource.output_fields) == ["answer", "confidence", "source"]
    assert WithSource.instructions == QA.instructions
    assert list(QA.output_fields) == ["answer", "confidence"]


def test_as_signature_accepts_classes_and_strings_only():
    assert as_signature(QA) is QA
    assert as_signature("q -> a").signature_text() == "q -> a"
    assert as_signature(QA, instructions="x").instructions == "x"
    with pytest.raises(TypeError, match="Signature subclass or a string"):
        as_signature(42)


# ---------------------------------------------------------- immutability
def test_signatures_are_immutable():
    with pytest.raises(AttributeError, match="immutable"):
        QA.instructions = "changed"  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        QA.anything = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="immutable"):
        del QA.input_fields
    with pytest.raises(TypeError):
        QA.input_fields["x"] = None  # type: ignore[index]
    with pytest.raises(TypeError, match="not something to instantiate"):
        QA(question="hi")


def test_field_specs_are_frozen():
    spec = QA.input_fields["question"]
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("derive", "check"),
    [
        (lambda s: s.with_instructions("New."), lambda d: d.instructions == "New."),
        (
            lambda s: s.with_field("answer", OutputField("One word"), int),
            lambda d: d.output_fields["answer"] == FieldSpec("answer", int, "One word", "output")
            and list(d.output_fields) == ["answer", "confidence"],
        ),
        (
            lambda s: s.with_field("hint", InputField("A hint")),
            lambda d: list(d.input_fields) == ["context", "question", "hint"],
        ),
        (
            lambda s: s.prepend("reasoning", OutputField("Think")),
            lambda d: list(d.output_fields) == ["reasoning", "answer", "confidence"],
        ),
        (
            lambda s: s.prepend("topic", InputField()),
            lambda d: list(d.input_fields) == ["topic", "context", "question"],
        ),
        (
            lambda s: s.append("source", OutputField(), list[str]),
            lambda d: list(d.output_fields) == ["answer", "confidence", "source"]
            and d.output_fields["source"].annotation == list[str],
        ),
        (lambda s: s.without("context"), lambda d: list(d.input_fields) == ["question"]),
    ],
    ids=["with_instructions", "with_field-replace", "with_field-add", "prepend-output",
         "prepend-input", "append", "without"],
)  # fmt: skip
def test_each_derivation_returns_a_new_signature_and_leaves_the_original(derive, check):
    before = (QA.instructions, dict(QA.input_fields), dict(QA.output_fields))
    derived = derive(QA)
    assert derived is not QA and isinstance(derived, SignatureMeta)
    assert check(derived)
    assert (QA.instructions, dict(QA.input_fields), dict(QA.output_fields)) == before


def test_derivations_keep_the_name_and_the_instructions():
    derived = QA.append("source", OutputField())
    assert derived.__name__ == "QA"
    assert derived.instructions == QA.instructions


def test_with_field_can_turn_an_input_into_an_output():
    derived = QA.with_field("context", OutputField())
    assert list(derived.input_fields) == ["question"]
    assert list(derived.output_fields) == ["answer", "confidence", "context"]


def test_derivation_errors_are_clear():
    with pytest.raises(ValueError, match=r"already has a field 'answer'.*with_field"):
        QA.append("answer", OutputField())
    with pytest.raises(KeyError, match=r"no field 'nope'.*context, question, answer"):
        QA.without("nope")
    with pytest.raises(TypeError, match=r"InputField\(...\) or OutputField"):
        QA.with_field("x", "not a field")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a valid field name"):
        QA.append("two words", InputField())
    with pytest.raises(TypeError, match="must be a str"):
        QA.with_instructions(3)  # type: ignore[arg-type]


def test_class_form_errors_are_clear():
    with pytest.raises(TypeError, match=r"question.*not marked as fields"):

        class Unmarked(Signature):
            question: str
            answer: str = OutputField()

    with pytest.raises(ValueError, match="may not start with '_'"):
        make_signature([FieldSpec("_private", str, "", "input")])


# ----------------------------------------------------------- output model
def test_output_model_schema_covers_literal_enum_list_and_nested_models():
    model = Extract.output_model()
    schema = model.model_json_schema()
    props = schema["properties"]
    assert schema["required"] == ["label", "color", "tags", "person"]
    assert props["label"]["enum"] == ["person", "place"]
    assert props["tags"] == {"items": {"type": "string"}, "title": "Tags", "type": "array"}
    assert schema["$defs"]["Color"]["enum"] == ["red", "green"]
    assert set(schema["$defs"]["Person"]["properties"]) == {"name", "address"}
    assert set(schema["$defs"]["Address"]["properties"]) == {"city", "zip_code"}
    parsed = model.model_validate(
        {
            "label": "place",
            "color": "red",
            "tags": ["a"],
            "person": {"name": "Ada", "address": {"city": "London", "zip_code": "N1"}},
        }
    )
    assert parsed.color is Color.RED and parsed.person.address.city == "London"


def test_output_model_carries_descriptions_and_is_cached():
    model = QA.output_model()
    assert model.model_json_schema()["properties"]["answer"]["description"] == "A few words"
    assert QA.output_model() is model
    assert QA.with_instructions("other").output_model() is model  # same outputs, same model


def test_output_model_handles_field_names_that_shadow_basemodel():
    sig = Signature.from_string("q -> json: int, schema: str")
    model = sig.output_model()
    assert list(model.model_json_schema()["properties"]) == ["json", "schema"]
    assert model.model_validate({"json": 1, "schema": "s"}).json_ == 1


def test_repr_shows_fields_and_types():
    assert repr(Extract) == (
        "Extract(text: str -> label: Literal['person', 'place'], color: Color, "
        "tags: list[str], person: Person)"
    )


@pytest.mark.parametrize("marker", [InputField, OutputField])
def test_dspys_desc_is_a_one_line_error_naming_description(marker):
    with pytest.raises(TypeError) as caught:
        marker(desc="the question")
    message = str(caught.value)
    assert "\n" not in message
    assert f"{marker.__name__}(description='the question')" in message
    assert "desc=" in message
