"""Signature: the immutable contract of an LLM step: inputs in, typed outputs out.

A signature is a *class*, built either by a class statement or from a string::

    class QA(Signature):
        \"\"\"Answer questions with a short factual answer.\"\"\"

        question: str = InputField(description="The user's question")
        answer: str = OutputField(description="A few words")

    Rate = Signature.from_string("text -> sentiment: Literal['pos', 'neg'], score: float")

Both give the same kind of object. Signatures are classes (not instances)
because the class statement is the natural way to declare typed fields, and a
class can never be half-built: the metaclass validates every field when the
class is created, then the class is frozen. Nothing ever instantiates a
signature; every "change" (`with_instructions`, `append` …) returns a new
class and leaves the original untouched, so an optimizer trying variants can
never corrupt the contract another module relies on.

Two signatures are equal when their instructions and fields are equal (the
class name does not matter), and equal signatures hash alike.
"""

from __future__ import annotations

import inspect
import keyword
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

from plait.signatures._models import output_model_for
from plait.signatures.parser import parse_signature

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "FieldSpec",
    "InputField",
    "OutputField",
    "Signature",
    "SignatureMeta",
    "as_signature",
    "make_signature",
    "type_label",
]

FieldKind = Literal["input", "output"]

_FIELDS_KEY = "__signature_fields__"
_INSTRUCTIONS_KEY = "__signature_instructions__"


# ---------------------------------------------------------------- fields
@dataclass(frozen=True, slots=True, init=False)
class _FieldMarker:
    description: str = ""
    """What the field holds; shown to the model next to the field's name."""

    kind: ClassVar[FieldKind]

    def __init__(self, description: str = "", **unknown: Any) -> None:
        # One name for one thing: DSPy's ``desc=`` (or another of its keywords) gets a
        # line saying what to write here, not Python's bare "unexpected keyword".
        if unknown:
            name = type(self).__name__
            given = unknown.get("desc", description)
            raise TypeError(
                f"{name}() takes only description=; got {', '.join(f'{k}=' for k in unknown)}"
                f" (DSPy's desc= is description= here): write {name}(description={given!r})"
            )
        object.__setattr__(self, "description", description)


# ``answer: int = OutputField()`` annotates the field's type, not the marker's
# (the class keeps no attribute of that name), so to a type checker a marker
# stands for a value of any type, as pydantic's ``Field()`` does. The markers
# are not dataclasses themselves: a checker would then read their own
# ``__init__`` instead of this ``__new__``.
class InputField(_FieldMarker):
    """Marks a signature attribute as an input: ``question: str = InputField("The question")``."""

    __slots__ = ()
    kind: ClassVar[FieldKind] = "input"

    if TYPE_CHECKING:

        def __new__(cls, description: str = "") -> Any: ...


class OutputField(_FieldMarker):
    """Marks a signature attribute as an output: ``answer: int = OutputField("The count")``."""

    __slots__ = ()
    kind: ClassVar[FieldKind] = "output"

    if TYPE_CHECKING:

        def __new__(cls, description: str = "") -> Any: ...


@dataclass(frozen=True, slots=True, eq=True)
class FieldSpec:
    """One field of a signature, as adapters and modules see it."""

    name: str
    """The field's name: a keyword of ``forward`` (inputs) or a key of the result (outputs)."""
    annotation: Any
    """The field's type: ``str``, ``int``, ``Literal[...]``, an enum, ``list[...]``, a model …"""
    description: str
    """What the field holds ("" when none was given)."""
    kind: FieldKind
    """``"input"`` or ``"output"``."""

    # The annotation is left out of the hash: some annotations (Annotated with
    # pydantic metadata) hash by identity, and equal specs must hash alike.
    def __hash__(self) -> int:
        return hash((self.name, self.description, self.kind))


# ------------------------------------------------------------ metaclass
class SignatureMeta(type):
    """Builds, validates and freezes signature classes; gives them their read-only properties."""

    _inputs: tuple[FieldSpec, ...]
    _outputs: tuple[FieldSpec, ...]
    _explicit_instructions: str | None

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> SignatureMeta:
        given = namespace.pop(_FIELDS_KEY, None)
        explicit = namespace.pop(_INSTRUCTIONS_KEY, None)
        markers = {k: v for k, v in namespace.items() if isinstance(v, _FieldMarker)}
        for key in markers:
            del namespace[key]
        cls = super().__new__(mcls, name, bases, namespace, **kwargs)
        if given is not None:
            fields = list(given)
        else:
            fields = _inherited_fields(bases)
            for spec in _declared_fields(cls, name, namespace, markers):
                _put(fields, spec)
            doc = namespace.get("__doc__")
            is_base = not any(isinstance(b, SignatureMeta) for b in bases)
            if is_base:
                explicit = None  # Signature's own docstring documents plait, not a task
            elif doc and doc.strip():
                explicit = _clean_doc(doc)
            elif explicit is None:
                explicit = next(
                    (b._explicit_instructions for b in bases if isinstance(b, SignatureMeta)), None
                )
        _check_names(name, fields)
        type.__setattr__(cls, "_inputs", tuple(f for f in fields if f.kind == "input"))
        type.__setattr__(cls, "_outputs", tuple(f for f in fields if f.kind == "output"))
        type.__setattr__(cls, "_explicit_instructions", explicit)
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"signature {cls.__name__} is a contract, not something to instantiate; "
            f"pass the class to a module: Predict({cls.__name__})"
        )

    # ---------------------------------------------------------- immutability
    def __setattr__(cls, name: str, value: Any) -> None:
        raise AttributeError(
            f"signature {cls.__name__} is immutable; derive a new one instead, e.g. "
            f"{cls.__name__}.with_instructions(...) or {cls.__name__}.with_field(...)"
        )

    def __delattr__(cls, name: str) -> None:
        raise AttributeError(
            f"signature {cls.__name__} is immutable; use {cls.__name__}.without(name) "
            "for a copy without a field"
        )

    # ------------------------------------------------------------ properties
    @property
    def instructions(cls) -> str:
        """The task given to the model: the docstring, or a default naming the fields."""
        if cls._explicit_instructions is not None:
            return cls._explicit_instructions
        return _default_instructions(cls._inputs, cls._outputs)

    @property
    def input_fields(cls) -> Mapping[str, FieldSpec]:
        """Input fields by name, in declaration order (read-only)."""
        return MappingProxyType({f.name: f for f in cls._inputs})

    @property
    def output_fields(cls) -> Mapping[str, FieldSpec]:
        """Output fields by name, in declaration order (read-only)."""
        return MappingProxyType({f.name: f for f in cls._outputs})

    @property
    def fields(cls) -> Mapping[str, FieldSpec]:
        """All fields by name: inputs first, then outputs (read-only)."""
        return MappingProxyType({f.name: f for f in (*cls._inputs, *cls._outputs)})

    # ----------------------------------------------------- equality and text
    def _key(cls) -> tuple[Any, ...]:
        return (cls.instructions, cls._inputs, cls._outputs)

    def __eq__(cls, other: object) -> bool:
        if cls is other:
            return True
        if not isinstance(other, SignatureMeta):
            return NotImplemented
        return cls._key() == other._key()

    def __hash__(cls) -> int:
        return hash(cls._key())

    def __repr__(cls) -> str:
        def side(specs: tuple[FieldSpec, ...]) -> str:
            return ", ".join(f"{f.name}: {type_label(f.annotation)}" for f in specs)

        return f"{cls.__name__}({side(cls._inputs)} -> {side(cls._outputs)})"


def _clean_doc(doc: str) -> str:
    return inspect.cleandoc(doc)


def _default_instructions(inputs: tuple[FieldSpec, ...], outputs: tuple[FieldSpec, ...]) -> str:
    if not inputs and not outputs:
        return ""
    names_in = ", ".join(f"`{f.name}`" for f in inputs) or "nothing"
    names_out = ", ".join(f"`{f.name}`" for f in outputs) or "nothing"
    return f"Given the fields {names_in}, produce the fields {names_out}."


def _inherited_fields(bases: tuple[type, ...]) -> list[FieldSpec]:
    fields: list[FieldSpec] = []
    for base in bases:
        if isinstance(base, SignatureMeta):
            for spec in (*base._inputs, *base._outputs):
                _put(fields, spec)
    return fields


def _put(fields: list[FieldSpec], spec: FieldSpec) -> None:
    """Replaces the field of the same name in place, or appends it."""
    for i, old in enumerate(fields):
        if old.name == spec.name:
            fields[i] = spec
            return
    fields.append(spec)


def _declared_fields(
    cls: type, name: str, namespace: dict[str, Any], markers: dict[str, _FieldMarker]
) -> list[FieldSpec]:
    annotations = namespace.get("__annotations__", {})
    unmarked = [
        key
        for key in annotations
        if key not in markers and not key.startswith("_") and not _is_classvar(annotations[key])
    ]
    if unmarked:
        fix = ", ".join(f"{key}: ... = InputField(...) / OutputField(...)" for key in unmarked)
        raise TypeError(
            f"signature {name}: attribute(s) {', '.join(unmarked)} have a type but are not "
            f"marked as fields; write {fix}"
        )
    specs = []
    for key, marker in markers.items():
        annotation = _resolve(cls, name, key, annotations.get(key, str))
        specs.append(FieldSpec(key, annotation, marker.description, marker.kind))
    return specs


def _is_classvar(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return annotation.startswith(("ClassVar", "typing.ClassVar"))
    return typing.get_origin(annotation) is ClassVar


def _resolve(cls: type, name: str, key: str, annotation: Any) -> Any:
    """Evaluates a string annotation (``from __future__ import annotations``) in its module."""
    if not isinstance(annotation, str):
        return annotation
    module = sys.modules.get(cls.__module__)
    scope = dict(vars(module)) if module is not None else {}
    try:
        return eval(annotation, scope, dict(vars(cls)))
    except Exception as exc:
        raise TypeError(
            f"signature {name}: cannot resolve the type {annotation!r} of field {key!r} "
            f"({type(exc).__name__}: {exc}); define the type at module level, or drop "
            "`from __future__ import annotations` in that file"
        ) from None


def _check_names(name: str, fields: list[FieldSpec]) -> None:
    seen: set[str] = set()
    for spec in fields:
        if not spec.name.isidentifier() or keyword.iskeyword(spec.name):
            raise ValueError(f"signature {name}: {spec.name!r} is not a valid field name")
        if spec.name.startswith("_"):
            raise ValueError(
                f"signature {name}: field names may not start with '_' (got {spec.name!r})"
            )
        if spec.name in seen:
            raise ValueError(f"signature {name}: field {spec.name!r} is defined twice")
        seen.add(spec.name)


# --------------------------------------------------------------- the class
class Signature(metaclass=SignatureMeta):
    """Base class of signatures: subclass it, or build one with `Signature.from_string`.

    The class docstring is the instructions; annotated attributes marked with
    `InputField` / `OutputField` are the fields, in declaration order. Types
    are anything pydantic can describe as JSON: ``str``, ``int``, ``float``,
    ``bool``, ``Literal[...]``, enums, ``list[...]``, ``dict[...]``, nested
    pydantic models.

    Example::

        class Classify(Signature):
            \"\"\"Classify the sentiment of a review.\"\"\"

            review: str = InputField(description="A product review")
            sentiment: Literal["positive", "negative"] = OutputField()
            confidence: float = OutputField(description="Between 0 and 1")

        Classify.signature_text()            # 'review -> sentiment, confidence'
        Classify.with_instructions("Be strict.").instructions   # 'Be strict.'
        Classify.instructions                # unchanged
    """

    @classmethod
    def from_string(
        cls,
        text: str,
        instructions: str | None = None,
        *,
        types: Mapping[str, type] | None = None,
    ) -> type[Signature]:
        """Returns the signature described by ``"in1, in2 -> out1: type, out2"``.

        Fields without a type are ``str``. Types: ``str``, ``int``, ``float``,
        ``bool``, ``list[T]``, ``dict[K, V]``, ``Literal['a', 'b']``,
        ``Optional[T]`` and ``T | None``, and your own classes (a pydantic
        model, an enum) by the names ``types`` gives them::

            Signature.from_string("text -> order: Order", types={"Order": Order})

        Raises:
            SignatureSyntaxError: the text is malformed; carries ``.position``.
            TypeError, ValueError: ``types`` names something that is not a class,
                or uses a name that is not an identifier or is a type word.
        """
        inputs, outputs = parse_signature(text, types)
        fields = [FieldSpec(n, a, "", "input") for n, a in inputs]
        fields += [FieldSpec(n, a, "", "output") for n, a in outputs]
        return make_signature(fields, instructions=instructions, name="StringSignature")

    @classmethod
    def get_input_fields(cls) -> dict[str, FieldSpec]:
        """Returns the input fields by name (`input_fields` as a dict, for ported code)."""
        return dict(cls.input_fields)

    @classmethod
    def get_output_fields(cls) -> dict[str, FieldSpec]:
        """Returns the output fields by name (`output_fields` as a dict, for ported code)."""
        return dict(cls.output_fields)

    @classmethod
    def get_instructions(cls) -> str:
        """Returns the instructions (`instructions`, for ported code)."""
        return cls.instructions

    @classmethod
    def signature_text(cls) -> str:
        """Returns the field names as ``"context, question -> answer, confidence"``."""
        return f"{', '.join(cls.input_fields)} -> {', '.join(cls.output_fields)}"

    @classmethod
    def with_instructions(cls, instructions: str) -> type[Signature]:
        """Returns a copy with other instructions (the same fields)."""
        if not isinstance(instructions, str):
            raise TypeError(f"instructions must be a str, got {type(instructions).__name__}")
        return make_signature(_specs(cls), instructions=instructions, name=cls.__name__)

    @classmethod
    def with_field(
        cls, name: str, field: InputField | OutputField, annotation: Any = str
    ) -> type[Signature]:
        """Returns a copy where field ``name`` is replaced in place, or added last of its kind."""
        spec = _spec_of(cls, name, field, annotation)
        fields = _specs(cls)
        if any(f.name == name and f.kind != spec.kind for f in fields):
            fields = [f for f in fields if f.name != name]  # an input became an output, or back
        _put(fields, spec)
        return cls._derived(fields)

    @classmethod
    def prepend(
        cls, name: str, field: InputField | OutputField, annotation: Any = str
    ) -> type[Signature]:
        """Returns a copy with a new field placed first among the fields of its kind."""
        spec = _spec_of(cls, name, field, annotation)
        cls._refuse_existing(name)
        same = [f for f in _specs(cls) if f.kind == spec.kind]
        other = [f for f in _specs(cls) if f.kind != spec.kind]
        return cls._derived([spec, *same, *other])

    @classmethod
    def append(
        cls, name: str, field: InputField | OutputField, annotation: Any = str
    ) -> type[Signature]:
        """Returns a copy with a new field placed last among the fields of its kind."""
        spec = _spec_of(cls, name, field, annotation)
        cls._refuse_existing(name)
        return cls._derived([*_specs(cls), spec])

    @classmethod
    def without(cls, name: str) -> type[Signature]:
        """Returns a copy without field ``name``.

        Raises:
            KeyError: there is no such field (the message lists the fields).
        """
        if name not in cls.fields:
            raise KeyError(
                f"signature {cls.__name__} has no field {name!r}; fields: {', '.join(cls.fields)}"
            )
        return cls._derived([f for f in _specs(cls) if f.name != name])

    @classmethod
    def output_model(cls) -> type[BaseModel]:
        """Returns a pydantic model of the output fields (cached; equal outputs share it).

        The model ignores extra keys and accepts numbers for ``str`` fields,
        because model replies are often almost right.
        """
        return output_model_for(cls.__name__, cls._outputs)

    @classmethod
    def demo_model(cls) -> type[BaseModel]:
        """Returns a pydantic model of one few-shot demo: every input and output field (cached).

        What an optimizer asks for when it proposes demos, so the reply is a
        list of examples of the right shape (a grammar on the local backend).
        """
        return output_model_for(cls.__name__, (*cls._inputs, *cls._outputs), suffix="Demo")

    # ---------------------------------------------------------------- helpers
    @classmethod
    def _derived(cls, fields: list[FieldSpec]) -> type[Signature]:
        return make_signature(fields, instructions=cls._explicit_instructions, name=cls.__name__)

    @classmethod
    def _refuse_existing(cls, name: str) -> None:
        if name in cls.fields:
            raise ValueError(
                f"signature {cls.__name__} already has a field {name!r}; use "
                f"with_field({name!r}, ...) to replace it"
            )


def _specs(sig: type[Signature]) -> list[FieldSpec]:
    return [*sig._inputs, *sig._outputs]


def _spec_of(sig: type[Signature], name: str, field: Any, annotation: Any) -> FieldSpec:
    if not isinstance(field, _FieldMarker):
        raise TypeError(
            f"{sig.__name__}: the field for {name!r} must be InputField(...) or "
            f"OutputField(...), got {type(field).__name__}"
        )
    if not isinstance(name, str):
        raise TypeError(f"{sig.__name__}: a field name must be a str, got {type(name).__name__}")
    return FieldSpec(name, annotation, field.description, field.kind)


def make_signature(
    fields: Iterable[FieldSpec] = (),
    instructions: str | None = None,
    name: str = "Signature",
    *,
    input_fields: Mapping[str, Any] | None = None,
    output_fields: Mapping[str, Any] | None = None,
) -> type[Signature]:
    """Returns a new signature class with these fields (inputs and outputs may be mixed).

    ``instructions`` None means the default text naming the fields. Fields
    come as `FieldSpec`s, or as ``input_fields=`` /
    ``output_fields=`` mappings of name to a type, a ``(type, "description")``
    pair, or a ``(type, InputField(...))`` pair::

        QA = make_signature(
            input_fields={"question": str},
            output_fields={"answer": (int, "The count")},
            instructions="Answer with a number",
        )

    Raises:
        ValueError: a name is not an identifier, starts with ``_``, or repeats.
        TypeError: a field is given in none of these forms.
    """
    specs = tuple(fields)
    for spec in specs:
        if not isinstance(spec, FieldSpec):
            raise TypeError(f"make_signature needs FieldSpec items, got {type(spec).__name__}")
    specs += _specs_of_mapping(input_fields, "input") + _specs_of_mapping(output_fields, "output")
    namespace = {
        _FIELDS_KEY: specs,
        _INSTRUCTIONS_KEY: instructions,
        "__module__": __name__,
        "__qualname__": name,
    }
    # The metaclass called with Signature as the only base makes a Signature subclass.
    return cast(type[Signature], SignatureMeta(name, (Signature,), namespace))


def _specs_of_mapping(given: Mapping[str, Any] | None, kind: FieldKind) -> tuple[FieldSpec, ...]:
    """Returns the fields of an ``input_fields=`` / ``output_fields=`` mapping."""
    if given is None:
        return ()
    if not isinstance(given, Mapping):
        raise TypeError(
            f"{kind}_fields must be a dict of field name to type, got {type(given).__name__}"
        )
    specs = []
    for key, entry in given.items():
        annotation, description = entry, ""
        if isinstance(entry, tuple) and len(entry) == 2:
            annotation, extra = entry
            if isinstance(extra, _FieldMarker):
                if extra.kind != kind:
                    raise TypeError(
                        f"{kind}_fields[{key!r}] is marked {type(extra).__name__}; "
                        f"use {'InputField' if kind == 'input' else 'OutputField'} there"
                    )
                description = extra.description
            elif isinstance(extra, str):
                description = extra
            else:
                raise TypeError(
                    f"{kind}_fields[{key!r}] must be a type, (type, 'description') or "
                    f"(type, {'InputField' if kind == 'input' else 'OutputField'}(...)); "
                    f"got a pair ending in {type(extra).__name__}"
                )
        specs.append(FieldSpec(key, annotation, description, kind))
    return tuple(specs)


def as_signature(signature: Any, instructions: str | None = None) -> type[Signature]:
    """Returns ``signature`` itself if it is a signature class, or parses it if it is a string.

    Raises:
        TypeError: it is neither.
        SignatureSyntaxError: the string is malformed.
    """
    if isinstance(signature, type) and issubclass(signature, Signature):
        if instructions is not None:
            return signature.with_instructions(instructions)
        return signature
    if isinstance(signature, str):
        return Signature.from_string(signature, instructions=instructions)
    raise TypeError(
        "expected a Signature subclass or a string like 'question -> answer', "
        f"got {type(signature).__name__}"
    )


# ------------------------------------------------------------- type labels
def type_label(annotation: Any) -> str:
    """Returns a short readable name of a type: ``str``, ``list[str]``, ``Literal['a', 'b']``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is typing.Annotated:
        return type_label(args[0])
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(type_label(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", None) or repr(origin).replace("typing.", "")
        return f"{name}[{', '.join(type_label(a) for a in args)}]" if args else name
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    return repr(annotation).replace("typing.", "")
