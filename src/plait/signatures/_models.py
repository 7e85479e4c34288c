"""Pydantic models of signature outputs, built once per distinct set of output fields.

Kept apart from `signature.py` so that defining a signature does not import
pydantic; the model is needed only when a reply is parsed or a schema sent.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

    from plait.signatures.signature import (
        FieldSpec,  # annotations only: signature.py imports this module
    )

__all__ = ["attribute_names", "output_model_for", "outputs_of"]

_CACHE_SIZE = 512
_cache: OrderedDict[tuple[str, tuple[FieldSpec, ...]], type[BaseModel]] = OrderedDict()
"""Models by (model name, field specs)."""
_lock = threading.Lock()


def attribute_names(specs: tuple[FieldSpec, ...]) -> dict[str, str]:
    """Returns field name → attribute name on the output model.

    A field called ``json`` or ``schema`` would shadow a `BaseModel` method,
    so it lives under ``json_`` with the field name as its alias: the wire
    schema and the parsed dict still use the field's own name.
    """
    from pydantic import BaseModel  # import time: pydantic loads on first use, not on a plain call

    taken = {spec.name for spec in specs}
    names: dict[str, str] = {}
    for spec in specs:
        attr = spec.name
        if hasattr(BaseModel, attr):
            while attr in taken or hasattr(BaseModel, attr):
                attr += "_"
            taken.add(attr)
        names[spec.name] = attr
    return names


def output_model_for(
    name: str, specs: tuple[FieldSpec, ...], suffix: str = "Output"
) -> type[BaseModel]:
    """Returns the pydantic model ``<name><suffix>`` with one required field per spec (cached)."""
    key = (f"{name}{suffix}", specs)
    with _lock:
        model = _cache.get(key)
        if model is not None:
            _cache.move_to_end(key)
            return model
    model = _build(f"{name}{suffix}", specs)
    with _lock:
        _cache[key] = model
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return model


def _build(name: str, specs: tuple[FieldSpec, ...]) -> type[BaseModel]:
    # import time: pydantic loads on first use, not on a plain call
    from pydantic import ConfigDict, Field, create_model

    attrs = attribute_names(specs)
    definitions: dict[str, Any] = {}
    for spec in specs:
        options: dict[str, Any] = {}
        if spec.description:
            options["description"] = spec.description
        if attrs[spec.name] != spec.name:
            options["alias"] = spec.name
        definitions[attrs[spec.name]] = (spec.annotation, Field(**options))
    config = ConfigDict(
        extra="ignore",
        coerce_numbers_to_str=True,
        protected_namespaces=(),
        populate_by_name=True,
    )
    try:
        return create_model(name, __config__=config, **definitions)
    except Exception as exc:
        fields = ", ".join(f"{s.name}: {s.annotation!r}" for s in specs)
        raise TypeError(
            f"signature model {name}: its fields ({fields}) cannot be described as a JSON "
            f"schema: {type(exc).__name__}: {exc}"
        ) from exc


def outputs_of(specs: tuple[FieldSpec, ...], instance: Any) -> dict[str, Any]:
    """Returns the typed output values of a validated model instance, by field name."""
    attrs = attribute_names(specs)
    return {spec.name: getattr(instance, attrs[spec.name]) for spec in specs}
