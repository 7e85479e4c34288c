"""Tests of plait.containers: list and dict behaviour, naming, re-numbering, state."""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from typing import Any

import pytest

from plait.containers import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from plait.module import LLMInference, Module
from plait.parameter import Parameter
from plait.tracing import Tracer


class Upper(Module):
    def forward(self, text: str) -> str:
        return text.upper()


class Exclaim(Module):
    def forward(self, text: str) -> str:
        return text + "!"


class Tag(Module):
    """Appends its tag, so the order a Sequential runs modules in is visible."""

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag

    def forward(self, text: str) -> str:
        return f"{text}{self.tag}"

    def extra_repr(self) -> str:
        return repr(self.tag)


class Block(Module):
    """A composite with one LLM call and a learnable prompt."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.llm = LLMInference("fast", system_prompt=prompt(text))

    def forward(self, x: str) -> str:
        return self.llm(x)


class Holder(Module):
    def __init__(self, **attrs: Any) -> None:
        super().__init__()
        for name, value in attrs.items():
            setattr(self, name, value)


def prompt(value: str) -> Parameter:
    return Parameter(value, description="An instruction under test.")


def tags(container: Any) -> list[str]:
    return [module.tag for module in container]


def names(module: Module) -> list[str]:
    return [name for name, _ in module.named_modules()]


def param_names(module: Module) -> list[str]:
    return [name for name, _ in module.named_parameters()]


def child_names(module: Module) -> list[str]:
    return [name for name, _ in module.named_children()]


# =================================================================== Sequential


def test_sequential_runs_eagerly_in_order() -> None:
    assert Sequential(Upper(), Exclaim())("hi") == "HI!"
    assert Sequential(Tag("a"), Tag("b"), Tag("c"))("") == "abc"


def test_empty_sequential_returns_its_input() -> None:
    assert Sequential()("unchanged") == "unchanged"


def test_sequential_children_are_named_by_position() -> None:
    seq = Sequential(Tag("a"), Tag("b"))
    assert child_names(seq) == ["0", "1"]
    assert getattr(seq, "1").tag == "b"


def test_sequential_from_ordered_dict_keeps_names_and_order() -> None:
    up, bang = Upper(), Exclaim()
    seq = Sequential(OrderedDict([("up", up), ("bang", bang)]))
    assert list(seq.named_children()) == [("up", up), ("bang", bang)]
    assert seq[0] is up
    assert seq.bang is bang
    assert seq("x") == "X!"


def test_sequential_from_mapping_rejects_bad_names_and_entries() -> None:
    with pytest.raises(ValueError, match=r"contains '\.'"):
        Sequential({"a.b": Upper()})
    with pytest.raises(TypeError, match=r"Sequential\['up'\]: expected a Module, got str"):
        Sequential({"up": "upper"})


def test_sequential_rejects_non_modules_with_position() -> None:
    with pytest.raises(TypeError, match=r"Sequential\(\) argument 1: expected a Module, got str"):
        Sequential(Upper(), "oops")
    with pytest.raises(TypeError, match=r"the class Upper itself; did you mean Upper\(...\)"):
        Sequential(Upper)


def test_sequential_indexing_positive_and_negative() -> None:
    a, b, c = Tag("a"), Tag("b"), Tag("c")
    seq = Sequential(a, b, c)
    assert seq[0] is a
    assert seq[2] is c
    assert seq[-1] is c
    assert seq[-3] is a


@pytest.mark.parametrize("index", [3, -4, 100])
def test_sequential_index_out_of_range(index: int) -> None:
    seq = Sequential(Tag("a"), Tag("b"), Tag("c"))
    with pytest.raises(
        IndexError, match=f"index {index} is out of range for Sequential of length 3"
    ):
        seq[index]


def test_sequential_index_must_be_an_integer() -> None:
    with pytest.raises(TypeError, match="Sequential indices must be integers or slices, not str"):
        Sequential(Tag("a"))["0"]


def test_sequential_slice_is_a_new_renumbered_sequential() -> None:
    a, b, c, d = Tag("a"), Tag("b"), Tag("c"), Tag("d")
    seq = Sequential(a, b, c, d)
    tail = seq[1:]
    assert type(tail) is Sequential
    assert tail is not seq
    assert list(tail) == [b, c, d]
    assert child_names(tail) == ["0", "1", "2"]
    assert tail("") == "bcd"
    assert list(seq[::2]) == [a, c]
    assert list(seq[::-1]) == [d, c, b, a]
    assert len(seq[5:]) == 0
    # The original is unchanged.
    assert list(seq) == [a, b, c, d]
    assert child_names(seq) == ["0", "1", "2", "3"]


def test_named_sequential_slice_keeps_names() -> None:
    seq = Sequential(OrderedDict(up=Upper(), bang=Exclaim(), twice=Exclaim()))
    assert child_names(seq[1:]) == ["bang", "twice"]


def test_sequential_len_iter_reversed_contains() -> None:
    a, b = Tag("a"), Tag("b")
    seq = Sequential(a, b)
    assert len(seq) == 2
    assert list(seq) == [a, b]
    assert list(reversed(seq)) == [b, a]
    assert a in seq
    assert Tag("a") not in seq


def test_sequential_append_returns_self_and_numbers() -> None:
    seq = Sequential(Tag("a"))
    assert seq.append(Tag("b")) is seq
    assert child_names(seq) == ["0", "1"]
    assert seq("") == "ab"
    with pytest.raises(TypeError, match=r"Sequential.append\(\): expected a Module, got int 3"):
        seq.append(3)  # type: ignore[arg-type]


def test_sequential_extend() -> None:
    seq = Sequential(Tag("a"))
    assert seq.extend([Tag("b"), Tag("c")]) is seq
    assert tags(seq) == ["a", "b", "c"]
    assert child_names(seq) == ["0", "1", "2"]


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (0, ["new", "a", "b", "c"]),
        (1, ["a", "new", "b", "c"]),
        (3, ["a", "b", "c", "new"]),
        (99, ["a", "b", "c", "new"]),
        (-1, ["a", "b", "new", "c"]),
        (-3, ["new", "a", "b", "c"]),
        (-99, ["new", "a", "b", "c"]),
    ],
)
def test_sequential_insert_follows_list_semantics(index: int, expected: list[str]) -> None:
    seq = Sequential(Tag("a"), Tag("b"), Tag("c"))
    seq.insert(index, Tag("new"))
    assert tags(seq) == expected
    assert child_names(seq) == ["0", "1", "2", "3"]
    assert [getattr(seq, str(i)).tag for i in range(4)] == expected
    assert seq("") == "".join(expected)


def test_sequential_pop_default_last_and_index() -> None:
    a, b, c, d = Tag("a"), Tag("b"), Tag("c"), Tag("d")
    seq = Sequential(a, b, c, d)
    assert seq.pop() is d
    assert seq.pop(-1) is c
    assert seq.pop(0) is a
    assert list(seq) == [b]
    assert child_names(seq) == ["0"]
    assert seq.pop() is b
    with pytest.raises(IndexError, match="pop from empty Sequential"):
        seq.pop()


def test_sequential_pop_out_of_range() -> None:
    with pytest.raises(IndexError, match="index 2 is out of range for Sequential of length 2"):
        Sequential(Tag("a"), Tag("b")).pop(2)


def test_sequential_del_renumbers() -> None:
    a, b, c = Tag("a"), Tag("b"), Tag("c")
    seq = Sequential(a, b, c)
    del seq[0]
    assert list(seq.named_children()) == [("0", b), ("1", c)]
    assert seq("") == "bc"
    assert not hasattr(seq, "2")


def test_sequential_del_slice_renumbers() -> None:
    seq = Sequential(*(Tag(t) for t in "abcde"))
    del seq[1:4]
    assert tags(seq) == ["a", "e"]
    assert child_names(seq) == ["0", "1"]
    del seq[::2]
    assert tags(seq) == ["e"]
    assert child_names(seq) == ["0"]


def test_named_sequential_del_keeps_custom_names_and_renumbers_positional_ones() -> None:
    seq = Sequential(OrderedDict(first=Tag("a"), second=Tag("b")))
    seq.append(Tag("c"))
    seq.insert(0, Tag("z"))
    assert child_names(seq) == ["0", "first", "second", "3"]
    del seq[1]
    assert child_names(seq) == ["0", "second", "2"]
    assert seq("") == "zbc"


def test_sequential_setitem_replaces_in_place() -> None:
    a, b, c = Tag("a"), Tag("b"), Tag("c")
    seq = Sequential(a, b, c)
    replacement = Tag("B")
    seq[-2] = replacement
    assert list(seq.named_children()) == [("0", a), ("1", replacement), ("2", c)]
    with pytest.raises(IndexError, match="index 3 is out of range"):
        seq[3] = Tag("x")
    with pytest.raises(TypeError, match="expected a Module, got str"):
        seq[0] = "x"  # type: ignore[assignment]


def test_sequential_plus_and_inplace_plus() -> None:
    a, b, c = Tag("a"), Tag("b"), Tag("c")
    left, right = Sequential(a, b), Sequential(c)
    both = left + right
    assert type(both) is Sequential
    assert list(both) == [a, b, c]
    assert child_names(both) == ["0", "1", "2"]
    assert list(left) == [a, b]
    left += [c]
    assert list(left) == [a, b, c]


def test_sequential_of_llm_calls_traces_to_a_chain() -> None:
    class Pipeline(Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = Sequential(LLMInference("fast"), LLMInference("smart"))

        def forward(self, text: str) -> str:
            return self.blocks(text)

    graph = Tracer().trace(Pipeline(), "doc")
    assert list(graph.nodes) == ["input:text", "blocks.0", "blocks.1"]
    assert graph.nodes["blocks.0"].dependencies == ("input:text",)
    assert graph.nodes["blocks.1"].dependencies == ("blocks.0",)
    assert graph.output_ids == ["blocks.1"]


def test_traced_paths_follow_renumbering_through_nested_containers() -> None:
    class Pipeline(Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = Sequential(Block("one"), Block("two"), Block("three"))

        def forward(self, text: str) -> str:
            return self.blocks(text)

    model = Pipeline()
    graph = Tracer().trace(model, "doc")
    assert [n.module_path for n in graph if n.kind == "call"] == [
        "blocks.0.llm",
        "blocks.1.llm",
        "blocks.2.llm",
    ]
    assert graph.nodes["blocks.1.llm"].module is model.blocks[1].llm
    del model.blocks[0]
    graph = Tracer().trace(model, "doc")
    assert [n.module_path for n in graph if n.kind == "call"] == ["blocks.0.llm", "blocks.1.llm"]
    assert graph.nodes["blocks.0.llm"].module is model.blocks[0].llm
    assert model.state_dict() == {
        "blocks.0.llm.system_prompt": "two",
        "blocks.1.llm.system_prompt": "three",
    }


# =================================================================== ModuleList


def test_module_list_registers_children_by_position() -> None:
    model = Holder(layers=ModuleList([Block("a"), Block("b")]))
    assert names(model) == ["", "layers", "layers.0", "layers.0.llm", "layers.1", "layers.1.llm"]
    assert param_names(model) == ["layers.0.llm.system_prompt", "layers.1.llm.system_prompt"]


def test_module_list_from_generator_and_empty() -> None:
    assert len(ModuleList(Tag(t) for t in "abc")) == 3
    assert len(ModuleList()) == 0
    assert list(ModuleList()) == []


def test_module_list_indexing_and_errors() -> None:
    a, b, c = Tag("a"), Tag("b"), Tag("c")
    layers = ModuleList([a, b, c])
    assert layers[0] is a
    assert layers[-1] is c
    assert layers[-3] is a
    with pytest.raises(IndexError, match="index 3 is out of range for ModuleList of length 3"):
        layers[3]
    with pytest.raises(IndexError, match="index -4 is out of range for ModuleList of length 3"):
        layers[-4]
    with pytest.raises(IndexError, match="index 0 is out of range for ModuleList of length 0"):
        ModuleList()[0]


def test_module_list_slice_is_a_module_list() -> None:
    a, b, c = Tag("a"), Tag("b"), Tag("c")
    layers = ModuleList([a, b, c])
    part = layers[1:]
    assert type(part) is ModuleList
    assert list(part) == [b, c]
    assert child_names(part) == ["0", "1"]
    assert list(layers[-2:]) == [b, c]
    assert list(layers[:-1]) == [a, b]
    assert child_names(layers) == ["0", "1", "2"]


def test_module_list_setitem_replaces_in_place() -> None:
    old, new = Block("old"), Block("new")
    model = Holder(layers=ModuleList([Block("a"), old, Block("c")]))
    model.layers[1] = new
    assert dict(model.named_modules())["layers.1"] is new
    assert old not in list(model.modules())
    assert model.state_dict()["layers.1.llm.system_prompt"] == "new"
    assert param_names(model) == [
        "layers.0.llm.system_prompt",
        "layers.1.llm.system_prompt",
        "layers.2.llm.system_prompt",
    ]


def test_module_list_setitem_errors() -> None:
    layers = ModuleList([Tag("a")])
    with pytest.raises(TypeError, match=r"ModuleList\[0\]: expected a Module, got int"):
        layers[0] = 5  # type: ignore[assignment]
    with pytest.raises(IndexError, match="index 1 is out of range for ModuleList of length 1"):
        layers[1] = Tag("b")
    with pytest.raises(TypeError, match="does not support slice assignment"):
        layers[0:1] = [Tag("b")]  # type: ignore[assignment]
    with pytest.raises(TypeError, match="indices must be integers or slices, not float"):
        layers[0.0] = Tag("b")  # type: ignore[index]


def test_module_list_del_renumbers_modules_parameters_and_state() -> None:
    model = Holder(layers=ModuleList([Block("a"), Block("b"), Block("c")]))
    del model.layers[0]
    assert names(model) == ["", "layers", "layers.0", "layers.0.llm", "layers.1", "layers.1.llm"]
    assert param_names(model) == ["layers.0.llm.system_prompt", "layers.1.llm.system_prompt"]
    assert model.state_dict() == {
        "layers.0.llm.system_prompt": "b",
        "layers.1.llm.system_prompt": "c",
    }
    model.load_state_dict({"layers.1.llm.system_prompt": "C"})
    assert model.layers[1].llm.system_prompt.value == "C"
    with pytest.raises(KeyError, match=r"layers\.2\.llm\.system_prompt"):
        model.load_state_dict({"layers.2.llm.system_prompt": "stale"})


def test_module_list_del_negative_and_slice() -> None:
    layers = ModuleList(Tag(t) for t in "abcd")
    del layers[-1]
    assert tags(layers) == ["a", "b", "c"]
    del layers[:2]
    assert tags(layers) == ["c"]
    assert child_names(layers) == ["0"]
    with pytest.raises(IndexError, match="index 1 is out of range for ModuleList of length 1"):
        del layers[1]


def test_module_list_append_extend_insert_pop() -> None:
    a, b, c, d, e = (Tag(t) for t in "abcde")
    layers = ModuleList([b])
    assert layers.append(d) is layers
    assert layers.extend(ModuleList([e])) is layers
    layers.insert(0, a)
    layers.insert(-2, c)
    assert list(layers) == [a, b, c, d, e]
    assert child_names(layers) == ["0", "1", "2", "3", "4"]
    assert layers.pop() is e
    assert layers.pop(1) is b
    assert layers.pop(-1) is d
    assert list(layers.named_children()) == [("0", a), ("1", c)]


def test_module_list_extend_is_atomic_and_checks_iterability() -> None:
    layers = ModuleList([Tag("a")])
    with pytest.raises(TypeError, match=r"ModuleList.extend\(\): expected a Module, got str"):
        layers.extend([Tag("b"), "c"])  # type: ignore[list-item]
    assert tags(layers) == ["a"]
    with pytest.raises(TypeError, match=r"takes an iterable .* use append\(\) to add one"):
        layers.extend(Tag("b"))  # type: ignore[arg-type]


def test_module_list_extend_with_itself_doubles() -> None:
    a, b = Tag("a"), Tag("b")
    layers = ModuleList([a, b])
    layers.extend(layers)
    assert list(layers) == [a, b, a, b]
    assert len(list(layers.children())) == 2  # the same modules, each reported once


def test_module_list_plus() -> None:
    a, b = Tag("a"), Tag("b")
    left, right = ModuleList([a]), ModuleList([b])
    both = left + right
    assert type(both) is ModuleList
    assert list(both) == [a, b]
    assert list(left) == [a]
    assert list(right) == [b]
    left += right
    assert list(left) == [a, b]
    with pytest.raises(TypeError):
        left + 1  # type: ignore[operator]


def test_module_list_membership_and_index_are_by_identity() -> None:
    a = Tag("same")
    twin = Tag("same")
    layers = ModuleList([a])
    assert a in layers
    assert twin not in layers
    assert "same" not in layers
    assert layers.index(a) == 0
    with pytest.raises(ValueError, match="is not in this ModuleList"):
        layers.index(twin)


def test_module_list_iteration_is_a_snapshot() -> None:
    layers = ModuleList([Tag("a"), Tag("b")])
    for layer in layers:
        layers.append(Tag(layer.tag * 2))
    assert tags(layers) == ["a", "b", "aa", "bb"]


def test_module_list_is_not_callable() -> None:
    model = Holder(layers=ModuleList([Upper()]))
    with pytest.raises(NotImplementedError, match="ModuleList 'layers' is a container"):
        model.layers("x")
    with pytest.raises(NotImplementedError, match=r"for layer in self.layers: x = layer\(x\)"):
        ModuleList()("x")


def test_module_list_subclass_with_forward_is_callable() -> None:
    class Chain(ModuleList):
        def forward(self, text: str) -> str:
            for module in self:
                text = module(text)
            return text

    assert Chain([Upper(), Exclaim()])("hi") == "HI!"


def test_module_list_holding_one_module_twice() -> None:
    shared = Block("shared")
    model = Holder(layers=ModuleList([shared, shared]))
    assert len(model.layers) == 2
    assert names(model) == ["", "layers", "layers.0", "layers.0.llm"]
    assert model.state_dict() == {"layers.0.llm.system_prompt": "shared"}


def test_modes_and_freezing_reach_into_containers() -> None:
    model = Holder(layers=ModuleList([Block("a")]), experts=ModuleDict({"x": Block("b")}))
    model.train()
    assert model.layers[0].llm.training
    assert model.experts["x"].llm.training
    model.requires_grad_(False)
    assert all(not p.requires_grad for p in model.parameters())
    assert len(list(model.parameters())) == 2


def test_module_list_rejects_non_module_entries() -> None:
    with pytest.raises(TypeError, match=r"ModuleList.extend\(\): expected a Module, got the class"):
        ModuleList([LLMInference])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"ModuleList\.insert"):
        ModuleList().insert(0, prompt("p"))  # type: ignore[arg-type]


def test_module_list_repr() -> None:
    assert repr(ModuleList([Tag("a"), LLMInference("fast")])) == (
        "ModuleList(\n  (0): Tag('a')\n  (1): LLMInference(alias='fast')\n)"
    )


def test_attribute_assignment_on_a_list_joins_the_entries() -> None:
    layers = ModuleList([Tag("a")])
    extra = Tag("b")
    layers.extra = extra
    assert list(layers.named_children()) == [("0", layers[0]), ("extra", extra)]
    assert "extra" not in vars(layers)
    del layers.extra
    assert child_names(layers) == ["0"]
    with pytest.raises(TypeError, match="cannot assign int to entry '0' of ModuleList"):
        setattr(layers, "0", 1)


# =================================================================== ModuleDict


def test_module_dict_basic_mapping_behaviour() -> None:
    legal, tone = Tag("legal"), Tag("tone")
    experts = ModuleDict({"legal": legal, "tone": tone})
    assert experts["legal"] is legal
    assert experts.tone is tone
    assert len(experts) == 2
    assert list(experts) == ["legal", "tone"]
    assert list(experts.keys()) == ["legal", "tone"]
    assert list(experts.values()) == [legal, tone]
    assert list(experts.items()) == [("legal", legal), ("tone", tone)]
    assert "legal" in experts
    assert "medical" not in experts
    assert experts.get("medical") is None
    assert experts.get("legal") is legal


def test_module_dict_registers_children_by_key() -> None:
    model = Holder(experts=ModuleDict({"legal": Block("l"), "tone": Block("t")}))
    assert names(model) == ["", "experts", "experts.legal", "experts.legal.llm",
                            "experts.tone", "experts.tone.llm"]  # fmt: skip
    assert model.state_dict() == {
        "experts.legal.llm.system_prompt": "l",
        "experts.tone.llm.system_prompt": "t",
    }


def test_module_dict_preserves_insertion_order_and_replacement_position() -> None:
    a, b, c, b2 = Tag("a"), Tag("b"), Tag("c"), Tag("b2")
    d = ModuleDict()
    d["z"] = a
    d["a"] = b
    d["m"] = c
    d["a"] = b2
    assert list(d.items()) == [("z", a), ("a", b2), ("m", c)]


def test_module_dict_setitem_delitem_and_missing_key() -> None:
    d = ModuleDict({"a": Tag("a")})
    d["b"] = Tag("b")
    del d["a"]
    assert list(d) == ["b"]
    assert child_names(d) == ["b"]
    with pytest.raises(KeyError, match="no entry 'zz' in ModuleDict; keys: 'b'"):
        d["zz"]
    with pytest.raises(KeyError, match="no entry 'a' in ModuleDict"):
        del d["a"]


def test_module_dict_update_from_mapping_pairs_and_container() -> None:
    a, b, c = Tag("a"), Tag("b"), Tag("c")
    d = ModuleDict()
    d.update({"a": a})
    d.update([("b", b)])
    d.update(ModuleDict({"c": c}))
    assert list(d.items()) == [("a", a), ("b", b), ("c", c)]
    assert list(ModuleDict([("x", a), ("y", b)])) == ["x", "y"]


def test_module_dict_update_is_atomic_and_checks_pairs() -> None:
    d = ModuleDict({"a": Tag("a")})
    with pytest.raises(ValueError, match=r"contains '\.'"):
        d.update({"b": Tag("b"), "c.d": Tag("c")})
    with pytest.raises(TypeError, match="expected a Module, got str"):
        d.update({"b": Tag("b"), "c": "not a module"})
    assert list(d) == ["a"]
    with pytest.raises(TypeError, match=r"element #0 is Tag .* not a \(key, Module\) pair"):
        d.update([Tag("x")])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="takes a mapping or"):
        d.update(3)  # type: ignore[arg-type]


def test_module_dict_pop_and_clear() -> None:
    a, b = Tag("a"), Tag("b")
    d = ModuleDict({"a": a, "b": b})
    assert d.pop("a") is a
    assert list(d) == ["b"]
    assert d.pop("missing", None) is None
    with pytest.raises(KeyError, match="no entry 'missing' in ModuleDict"):
        d.pop("missing")
    d.clear()
    assert len(d) == 0
    assert list(d.named_children()) == []


@pytest.mark.parametrize("key", ["a.b", ".", "trailing."])
def test_module_dict_rejects_keys_with_dots(key: str) -> None:
    d = ModuleDict()
    with pytest.raises(ValueError, match=r"contains '\.', which separates the segments"):
        d[key] = Tag("x")
    # PyTorch raises KeyError for the same mistake; both clauses catch it.
    with pytest.raises(KeyError):
        d[key] = Tag("x")
    assert len(d) == 0


def test_module_dict_rejects_empty_and_non_string_keys() -> None:
    d = ModuleDict()
    with pytest.raises(ValueError, match="non-empty"):
        d[""] = Tag("x")
    with pytest.raises(TypeError, match="ModuleDict keys must be str, got int 1"):
        d[1] = Tag("x")  # type: ignore[index]
    with pytest.raises(TypeError, match="ModuleDict keys must be str"):
        ModuleDict({("a", "b"): Tag("x")})  # type: ignore[dict-item]


def test_module_dict_rejects_non_module_values() -> None:
    with pytest.raises(TypeError, match=r"ModuleDict\['a'\]: expected a Module, got str 'x'"):
        ModuleDict({"a": "x"})  # type: ignore[dict-item]


def test_module_dict_keys_named_like_methods_do_not_shadow_them() -> None:
    train, keys = Tag("train"), Tag("keys")
    d = ModuleDict({"train": train, "keys": keys, "forward": Tag("forward")})
    assert d["train"] is train
    assert d.train() is d
    assert list(d.keys()) == ["train", "keys", "forward"]
    assert child_names(d) == ["train", "keys", "forward"]


def test_module_dict_attribute_assignment_is_item_assignment() -> None:
    d = ModuleDict()
    m = Tag("m")
    d.fast = m
    assert d["fast"] is m
    assert "fast" not in vars(d)
    replacement = Tag("r")
    d["fast"] = replacement
    assert d.fast is replacement
    del d.fast
    assert "fast" not in d
    with pytest.raises(AttributeError, match="'ModuleDict' object has no attribute 'fast'"):
        d.fast  # noqa: B018


def test_module_dict_is_not_callable() -> None:
    with pytest.raises(NotImplementedError, match="ModuleDict is a container"):
        ModuleDict()("x")


def test_module_dict_values_membership_is_by_identity() -> None:
    a = Tag("a")
    d = ModuleDict({"a": a})
    assert a in d.values()
    assert Tag("a") not in d.values()


# ================================================================ ParameterList


def test_parameter_list_names_by_index() -> None:
    p0, p1 = prompt("first"), prompt("second")
    model = Holder(prompts=ParameterList([p0, p1]))
    assert list(model.named_parameters()) == [("prompts.0", p0), ("prompts.1", p1)]
    assert model.state_dict() == {"prompts.0": "first", "prompts.1": "second"}
    assert (p0.name, p1.name) == ("0", "1")


def test_parameter_list_state_dict_json_round_trip() -> None:
    source = Holder(prompts=ParameterList([prompt("a"), prompt("b")]))
    source.prompts[1].apply_update("b, improved")
    saved = json.loads(json.dumps(source.state_dict()))
    target = Holder(prompts=ParameterList([prompt("x"), prompt("y")]))
    target.load_state_dict(saved)
    assert [p.value for p in target.prompts] == ["a", "b, improved"]
    assert target.state_dict() == source.state_dict()


def test_parameter_list_holds_structured_values_through_json() -> None:
    demos = [{"q": "2+2", "a": "4"}]
    source = Holder(demos=ParameterList([Parameter(demos, description="Few-shot demos.")]))
    target = Holder(demos=ParameterList([Parameter([], description="Few-shot demos.")]))
    target.load_state_dict(json.loads(json.dumps(source.state_dict())))
    assert target.demos[0].value == demos


def test_parameter_list_del_renumbers_state_dict() -> None:
    a, b, c = prompt("a"), prompt("b"), prompt("c")
    model = Holder(prompts=ParameterList([a, b, c]))
    del model.prompts[0]
    assert model.state_dict() == {"prompts.0": "b", "prompts.1": "c"}
    assert (b.name, c.name) == ("0", "1")
    with pytest.raises(KeyError, match=r"prompts\.2"):
        model.load_state_dict({"prompts.2": "stale"})
    model.prompts.insert(0, a)
    assert model.state_dict() == {"prompts.0": "a", "prompts.1": "b", "prompts.2": "c"}
    assert model.prompts.pop(1) is b
    assert list(model.state_dict()) == ["prompts.0", "prompts.1"]


def test_parameter_list_keeps_equal_valued_parameters_apart() -> None:
    first, second = prompt("same"), prompt("same")
    plist = ParameterList([first, second])
    assert len(plist) == 2
    assert first in plist
    assert second in plist
    assert prompt("same") not in plist
    assert "same" not in plist
    assert plist.index(second) == 1
    model = Holder(prompts=plist)
    assert model.state_dict() == {"prompts.0": "same", "prompts.1": "same"}


def test_parameter_list_rejects_non_parameters() -> None:
    plist = ParameterList()
    with pytest.raises(TypeError, match=r"ParameterList.append\(\): expected a Parameter, got str"):
        plist.append("Be concise.")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"wrap it: Parameter\('Be concise.', description='...'\)"):
        plist.append("Be concise.")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"ParameterList\[0\]: expected a Parameter, got int"):
        ParameterList([prompt("p")])[0] = 3  # type: ignore[assignment]
    with pytest.raises(TypeError, match="got Tag"):
        ParameterList([Tag("x")])  # type: ignore[list-item]
    assert len(plist) == 0


def test_parameter_list_indexing_slicing_and_errors() -> None:
    a, b, c = prompt("a"), prompt("b"), prompt("c")
    plist = ParameterList([a, b, c])
    assert plist[-1] is c
    part = plist[:2]
    assert type(part) is ParameterList
    assert list(part) == [a, b]
    with pytest.raises(IndexError, match="index 3 is out of range for ParameterList of length 3"):
        plist[3]
    with pytest.raises(IndexError, match="pop from empty ParameterList"):
        ParameterList().pop()


def test_parameter_list_setitem_keeps_the_name() -> None:
    model = Holder(prompts=ParameterList([prompt("a"), prompt("b")]))
    new = prompt("B")
    model.prompts[1] = new
    assert list(model.named_parameters()) == [("prompts.0", model.prompts[0]), ("prompts.1", new)]


def test_parameter_list_freezing_and_repr() -> None:
    model = Holder(prompts=ParameterList([prompt("a"), Parameter("b", requires_grad=False)]))
    model.requires_grad_(False)
    assert [p.requires_grad for p in model.prompts] == [False, False]
    assert repr(model.prompts) == (
        "ParameterList(\n"
        "  (0): Parameter('a', requires_grad=False)\n"
        "  (1): Parameter('b', requires_grad=False)\n"
        ")"
    )
    assert repr(ParameterList()) == "ParameterList()"


def test_parameter_list_is_not_callable() -> None:
    with pytest.raises(NotImplementedError, match="ParameterList is a container"):
        ParameterList()()


def test_parameter_list_entries_trace_as_indexed_refs() -> None:
    class FewShot(Module):
        def __init__(self) -> None:
            super().__init__()
            self.demos = ParameterList([prompt("Q: 1+1 A: 2"), prompt("Q: 2+2 A: 4")])
            self.llm = LLMInference("fast")

        def forward(self, question: str) -> str:
            return self.llm(f"{self.demos[1]}\nQ: {question} A:")

    graph = Tracer().trace(FewShot(), "3+3")
    assert graph.nodes["llm"].parameters == ("param:demos.1",)


# ================================================================ ParameterDict


def test_parameter_dict_names_by_key() -> None:
    greeting, closing = prompt("Hello!"), Parameter("Bye.", requires_grad=False)
    model = Holder(prompts=ParameterDict({"greeting": greeting, "closing": closing}))
    assert list(model.named_parameters()) == [
        ("prompts.greeting", greeting),
        ("prompts.closing", closing),
    ]
    assert model.state_dict() == {"prompts.greeting": "Hello!", "prompts.closing": "Bye."}
    assert greeting.name == "greeting"


def test_parameter_dict_state_dict_json_round_trip() -> None:
    source = Holder(prompts=ParameterDict({"a": prompt("alpha"), "b": prompt("beta")}))
    source.prompts["b"].apply_update("beta, improved")
    saved = json.loads(json.dumps(source.state_dict()))
    target = Holder(prompts=ParameterDict({"a": prompt("x"), "b": prompt("y")}))
    target.load_state_dict(saved)
    assert target.prompts["a"].value == "alpha"
    assert target.prompts["b"].value == "beta, improved"


def test_parameter_dict_unknown_key_on_load_changes_nothing() -> None:
    model = Holder(prompts=ParameterDict({"a": prompt("alpha")}))
    with pytest.raises(KeyError, match=r"prompts\.zz"):
        model.load_state_dict({"prompts.a": "changed", "prompts.zz": "unknown"})
    assert model.prompts["a"].value == "alpha"


def test_parameter_dict_mapping_behaviour() -> None:
    a, b, c = prompt("a"), prompt("b"), prompt("c")
    pdict = ParameterDict([("a", a), ("b", b)])
    pdict["c"] = c
    assert list(pdict) == ["a", "b", "c"]
    assert list(pdict.values()) == [a, b, c]
    assert "a" in pdict
    assert pdict.pop("b") is b
    del pdict["a"]
    assert list(pdict.items()) == [("c", c)]
    pdict.update({"d": prompt("d")})
    assert list(pdict) == ["c", "d"]
    pdict.clear()
    assert list(pdict.named_parameters()) == []


def test_parameter_dict_keeps_equal_valued_parameters_apart() -> None:
    first, second = prompt("same"), prompt("same")
    pdict = ParameterDict({"x": first, "y": second})
    assert len(pdict) == 2
    assert first in pdict.values()
    assert second in pdict.values()
    assert prompt("same") not in pdict.values()
    assert pdict.state_dict() == {"x": "same", "y": "same"}


def test_parameter_dict_same_parameter_under_two_keys_is_reported_once() -> None:
    shared = prompt("shared")
    pdict = ParameterDict({"x": shared, "y": shared})
    assert len(pdict) == 2
    assert pdict.state_dict() == {"x": "shared"}


def test_parameter_dict_rejects_bad_keys_and_values() -> None:
    pdict = ParameterDict()
    with pytest.raises(ValueError, match=r"ParameterDict key 'a\.b' contains '\.'"):
        pdict["a.b"] = prompt("p")
    with pytest.raises(ValueError, match="non-empty"):
        pdict[""] = prompt("p")
    with pytest.raises(
        TypeError, match=r"ParameterDict\['a'\]: expected a Parameter, got str 'text'"
    ):
        pdict["a"] = "text"  # type: ignore[assignment]
    with pytest.raises(TypeError, match="expected a Parameter, got Tag"):
        pdict["a"] = Tag("x")  # type: ignore[assignment]
    assert len(pdict) == 0


def test_parameter_dict_missing_key_lists_known_keys() -> None:
    pdict = ParameterDict({"greeting": prompt("hi")})
    with pytest.raises(KeyError, match="no entry 'greting' in ParameterDict; keys: 'greeting'"):
        pdict["greting"]


def test_parameter_dict_repr() -> None:
    pdict = ParameterDict({"greeting": Parameter("Hi", requires_grad=False)})
    assert repr(pdict) == "ParameterDict(\n  (greeting): Parameter('Hi', requires_grad=False)\n)"


# ============================================================ nested containers


def test_nested_containers_give_dotted_paths() -> None:
    model = Holder(
        blocks=Sequential(Block("zero"), Block("one")),
        stages=ModuleList([ModuleDict({"judge": Block("j")})]),
        prompts=ParameterDict({"greeting": prompt("hi")}),
    )
    assert "blocks.1.llm" in names(model)
    assert "stages.0.judge.llm" in names(model)
    assert param_names(model) == [
        "blocks.0.llm.system_prompt",
        "blocks.1.llm.system_prompt",
        "stages.0.judge.llm.system_prompt",
        "prompts.greeting",
    ]
    assert dict(model.named_modules())["blocks.1.llm"] is model.blocks[1].llm
    saved = json.loads(json.dumps(model.state_dict()))
    saved["stages.0.judge.llm.system_prompt"] = "strict judge"
    model.load_state_dict(saved)
    assert model.stages[0]["judge"].llm.system_prompt.value == "strict judge"


def test_moving_a_module_between_containers_leaves_no_stale_name() -> None:
    block = Block("moved")
    model = Holder(a=ModuleList([Block("x"), block]), b=ModuleList())
    model.b.append(model.a.pop(1))
    assert names(model) == ["", "a", "a.0", "a.0.llm", "b", "b.0", "b.0.llm"]
    assert model.state_dict() == {"a.0.llm.system_prompt": "x", "b.0.llm.system_prompt": "moved"}


def test_deepcopy_copies_entries_and_keeps_names() -> None:
    model = Holder(
        layers=ModuleList([Block("a"), Block("b")]),
        prompts=ParameterDict({"greeting": prompt("hi")}),
    )
    clone = copy.deepcopy(model)
    assert clone.state_dict() == model.state_dict()
    assert names(clone) == names(model)
    assert clone.layers[0] is not model.layers[0]
    clone.prompts["greeting"].apply_update("hello")
    assert model.prompts["greeting"].value == "hi"
    clone.layers.append(Block("c"))
    assert len(model.layers) == 2


def test_constructors_accept_pytorch_keyword_names() -> None:
    assert len(ModuleList(modules=[Tag("a")])) == 1
    assert list(ModuleDict(modules={"a": Tag("a")})) == ["a"]
    assert len(ParameterList(values=[prompt("p")])) == 1
    assert list(ParameterDict(parameters={"k": prompt("p")})) == ["k"]
