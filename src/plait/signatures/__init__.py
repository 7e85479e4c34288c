"""Signatures and adapters: what an LLM step takes and returns, and how that becomes messages.

A `Signature` declares typed input and output fields and the instructions;
an `Adapter` turns a signature plus input values (and demos, and history)
into chat messages, asks for the outputs' JSON schema, and parses the reply
back into typed values. `plait.modules.Predict` puts the two together.
"""

from plait.signatures.adapters import (
    Adapter,
    ChatAdapter,
    JSONAdapter,
    PlainAdapter,
    format_value,
    validate_outputs,
)
from plait.signatures.parser import SignatureSyntaxError, parse_signature
from plait.signatures.signature import (
    FieldSpec,
    InputField,
    OutputField,
    Signature,
    SignatureMeta,
    as_signature,
    make_signature,
    type_label,
)

__all__ = [
    "Adapter",
    "ChatAdapter",
    "FieldSpec",
    "InputField",
    "JSONAdapter",
    "OutputField",
    "PlainAdapter",
    "Signature",
    "SignatureMeta",
    "SignatureSyntaxError",
    "as_signature",
    "format_value",
    "make_signature",
    "parse_signature",
    "type_label",
    "validate_outputs",
]
