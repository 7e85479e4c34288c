"""Containers: lists and dicts of modules and parameters, shaped like ``torch.nn``'s.

Entries live in the owning module's registries (``_children`` for modules,
``_parameters`` for parameters) under their index or key, so the dotted names
of ``named_modules()``, ``named_parameters()`` and ``state_dict()`` read
``blocks.1.llm`` or ``prompts.greeting``, and every traversal, ``train()``,
``requires_grad_()`` and the tracer see through containers with no special case.

Lists keep their entries named ``"0"``, ``"1"``, ... by position: ``insert``,
``pop`` and ``del`` re-number the entries behind the change, exactly as the
positions a user would index with. A `Sequential` built from a mapping keeps
its own (non-numeric) names; only numeric names follow positions.

Membership is by identity, as for `Parameter` itself: two parameters with the
same text are two entries, and ``p in plist`` is true only for ``p`` itself.
"""

from __future__ import annotations

import itertools
import operator
import reprlib
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any, ClassVar, Generic, Self, TypeVar, cast, overload

from plait.module import Module, adopt
from plait.parameter import Parameter

__all__ = ["ModuleDict", "ModuleList", "ParameterDict", "ParameterList", "Sequential"]

T = TypeVar("T", bound=Module | Parameter)
M = TypeVar("M", bound=Module)

_MISSING: Any = object()


class _KeyError(KeyError):
    """A KeyError whose message prints as written (KeyError would repr() it)."""

    def __str__(self) -> str:
        return str(self.args[0])


class _InvalidKeyError(_KeyError, ValueError):
    """A key that cannot be a path segment: a KeyError (as in PyTorch) and a ValueError."""


def _check_key(key: Any, owner: str) -> str:
    """Returns ``key`` if it can be one segment of a dotted path, else raises."""
    if not isinstance(key, str):
        raise TypeError(f"{owner} keys must be str, got {type(key).__name__} {key!r}")
    if not key:
        raise _InvalidKeyError(f"{owner} keys must be non-empty strings, got ''")
    if "." in key:
        raise _InvalidKeyError(
            f"{owner} key {key!r} contains '.', which separates the segments of "
            f"named_modules() and state_dict() names; use e.g. {key.replace('.', '_')!r}"
        )
    return key


def _is_position(name: str) -> bool:
    """Whether ``name`` is a positional name (``"0"``, ``"12"``) that follows re-numbering."""
    return name.isascii() and name.isdigit()


def _describe(item: Any) -> str:
    """Names a wrongly typed entry for an error message: its type and a short repr."""
    if isinstance(item, type):
        return f"the class {item.__name__} itself; did you mean {item.__name__}(...)?"
    return f"{type(item).__name__} {reprlib.repr(item)}"


class _Container(Module, Generic[T]):
    """What list and dict containers share: typed entries kept in one registry of Module."""

    _registry: ClassVar[str] = "_children"
    """Name of the Module registry holding the entries: ``_children`` or ``_parameters``."""
    _item_type: ClassVar[type] = Module
    """Class every entry must be an instance of."""
    _call_hint: ClassVar[str] = "call its entries instead"
    """What to do instead of calling the container, shown when it is called."""

    def _store(self) -> dict[str, T]:
        return self.__dict__[self._registry]

    def _checked(self, item: Any, where: str) -> T:
        """Returns ``item`` if it has the entry type, else raises a TypeError naming ``where``."""
        if isinstance(item, self._item_type):
            return cast(T, item)  # an instance of the entry type, just checked
        hint = ""
        if self._item_type is Parameter and isinstance(item, str):
            hint = f"; wrap it: Parameter({reprlib.repr(item)}, description='...')"
        raise TypeError(
            f"{type(self).__name__}{where}: expected a {self._item_type.__name__}, "
            f"got {_describe(item)}{hint}"
        )

    def _adopt(self, key: str, item: T, old_key: str | None = None) -> None:
        """Names ``item`` after its key, as Module.__setattr__ does for attributes."""
        if isinstance(item, Parameter) and item._name == old_key and item.is_owned_by(self):
            item._name = None  # re-numbered in this container: take the new key
        adopt(self, key, item)

    def _set_entry(self, key: str, item: T) -> None:
        raise NotImplementedError

    def _remove_entry(self, key: str) -> None:
        raise NotImplementedError

    # Attribute access mirrors item access (``md.fast`` is ``md["fast"]``), and
    # entries are kept only in the registry: a copy in ``__dict__`` would go
    # stale on the next re-numbering or replacement.
    def __getattr__(self, name: str) -> Any:
        store = self.__dict__.get(self._registry)
        if store is not None and name in store:
            return store[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        store = self.__dict__.get(self._registry)
        if store is not None and isinstance(value, self._item_type):
            # An instance of the entry type, just checked: an entry.
            self._set_entry(_check_key(name, type(self).__name__), cast(T, value))
        elif store is not None and name in store:
            raise TypeError(
                f"cannot assign {type(value).__name__} to entry {name!r} of "
                f"{type(self).__name__}; entries must be {self._item_type.__name__} "
                f"(use del to remove an entry)"
            )
        else:
            super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        store = self.__dict__.get(self._registry)
        if store is not None and name in store and name not in self.__dict__:
            self._remove_entry(name)
        else:
            super().__delattr__(name)

    # A container only holds things; like torch's ModuleList it cannot be
    # called, unless a subclass defines forward (Sequential does).
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Raises: a container has no computation of its own. Override to give it one."""
        where = f" {self._name!r}" if self._name else ""
        raise NotImplementedError(
            f"{type(self).__name__}{where} is a container and has no forward(); {self._call_hint}"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if type(self).forward is _Container.forward:
            self.forward()
        return super().__call__(*args, **kwargs)


class _ListContainer(_Container[T]):
    """List behaviour over a registry whose entries are named by position."""

    def _new_like(self, entries: list[tuple[str, T]]) -> Self:
        """Returns a new container of this type holding ``entries`` (used by slicing and +)."""
        return type(self)([item for _, item in entries])  # type: ignore[call-arg]

    def _entries(self) -> list[tuple[str, T]]:
        return list(self._store().items())

    def _rebuild(self, entries: Iterable[tuple[str | None, T]]) -> None:
        """Replaces the entries, naming each numeric or new (None) entry by its position."""
        entries = list(entries)
        store = self._store()
        store.clear()
        for position, (old_key, item) in enumerate(entries):
            key = old_key if old_key is not None and not _is_position(old_key) else str(position)
            store[key] = item
            self._adopt(key, item, old_key)

    def _position(self, index: Any) -> int:
        """Returns ``index`` as a position in range, or raises IndexError/TypeError."""
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(
                f"{type(self).__name__} indices must be integers or slices, "
                f"not {type(index).__name__}"
            ) from None
        n = len(self)
        position = i + n if i < 0 else i
        if not 0 <= position < n:
            raise IndexError(f"index {i} is out of range for {type(self).__name__} of length {n}")
        return position

    def _set_entry(self, key: str, item: T) -> None:
        entries: list[tuple[str | None, T]] = list(self._entries())
        for i, (old_key, _) in enumerate(entries):
            if old_key == key:
                entries[i] = (key, item)
                break
        else:
            entries.append((key, item))
        self._rebuild(entries)

    def _remove_entry(self, key: str) -> None:
        self._rebuild((k, item) for k, item in self._entries() if k != key)

    def __len__(self) -> int:
        return len(self._store())

    def __iter__(self) -> Iterator[T]:
        # A snapshot, so a loop may append or delete entries as with a list.
        return iter(list(self._store().values()))

    def __reversed__(self) -> Iterator[T]:
        return reversed(list(self._store().values()))

    def __contains__(self, item: object) -> bool:
        return any(entry is item for entry in self._store().values())

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Self: ...
    def __getitem__(self, index: int | slice) -> T | Self:
        if isinstance(index, slice):
            return self._new_like(self._entries()[index])
        position = self._position(index)
        return next(itertools.islice(self._store().values(), position, None))

    def __setitem__(self, index: int, item: T) -> None:
        if isinstance(index, slice):
            raise TypeError(
                f"{type(self).__name__} does not support slice assignment; "
                "delete the slice and insert() the new entries"
            )
        item = self._checked(item, f"[{index!r}]")
        key = list(self._store())[self._position(index)]
        self._store()[key] = item  # an existing key keeps its place in the dict
        self._adopt(key, item)

    def __delitem__(self, index: int | slice) -> None:
        entries = self._entries()
        if isinstance(index, slice):
            del entries[index]
        else:
            del entries[self._position(index)]
        self._rebuild(entries)

    def __add__(self, other: Iterable[T]) -> Self:
        if not isinstance(other, Iterable):
            return NotImplemented
        combined = self._new_like([])
        combined.extend(list(self))
        combined.extend(other)
        return combined

    def __iadd__(self, other: Iterable[T]) -> Self:
        return self.extend(other)

    def append(self, item: T) -> Self:
        """Adds ``item`` at the end, named by its position; returns self."""
        item = self._checked(item, ".append()")
        key = str(len(self))
        self._store()[key] = item
        self._adopt(key, item)
        return self

    def extend(self, items: Iterable[T]) -> Self:
        """Appends every entry of ``items`` (all are checked before any is added); returns self."""
        if not isinstance(items, Iterable):
            raise TypeError(
                f"{type(self).__name__}.extend() takes an iterable of "
                f"{self._item_type.__name__}s, got {_describe(items)}; "
                "use append() to add one"
            )
        checked = [self._checked(item, ".extend()") for item in items]
        for item in checked:
            self.append(item)
        return self

    def insert(self, index: int, item: T) -> None:
        """Inserts ``item`` before ``index`` (list semantics, negative allowed); re-numbers."""
        item = self._checked(item, ".insert()")
        entries: list[tuple[str | None, T]] = list(self._entries())
        entries.insert(operator.index(index), (None, item))
        self._rebuild(entries)

    def pop(self, index: int = -1) -> T:
        """Removes and returns the entry at ``index`` (default: the last); re-numbers."""
        if not self._store():
            raise IndexError(f"pop from empty {type(self).__name__}")
        entries = self._entries()
        _, item = entries.pop(self._position(index))
        self._rebuild(entries)
        return item

    def index(self, item: T) -> int:
        """Returns the position of ``item`` itself (by identity); ValueError if absent."""
        for position, entry in enumerate(self._store().values()):
            if entry is item:
                return position
        raise ValueError(f"{_describe(item)} is not in this {type(self).__name__}")


class _DictContainer(_Container[T]):
    """Dict behaviour over a registry keyed by user-chosen strings, in insertion order."""

    def __init__(self, items: Mapping[str, T] | Iterable[tuple[str, T]] | None = None) -> None:
        super().__init__()
        if items is not None:
            self.update(items)

    def _set_entry(self, key: str, item: T) -> None:
        self[key] = item

    def _remove_entry(self, key: str) -> None:
        del self[key]

    def _missing(self, key: Any) -> KeyError:
        known = ", ".join(repr(k) for k in self._store()) or "none"
        return _KeyError(f"no entry {key!r} in {type(self).__name__}; keys: {known}")

    def __getitem__(self, key: str) -> T:
        try:
            return self._store()[key]
        except KeyError:
            raise self._missing(key) from None

    def __setitem__(self, key: str, item: T) -> None:
        name = type(self).__name__
        _check_key(key, name)
        item = self._checked(item, f"[{key!r}]")
        self._store()[key] = item  # a replaced key keeps its place
        self._adopt(key, item)

    def __delitem__(self, key: str) -> None:
        if key not in self._store():
            raise self._missing(key)
        del self._store()[key]

    def __len__(self) -> int:
        return len(self._store())

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._store()))

    def __contains__(self, key: object) -> bool:
        return key in self._store()

    def keys(self) -> KeysView[str]:
        """Returns a view of the keys, in insertion order."""
        return self._store().keys()

    def values(self) -> ValuesView[T]:
        """Returns a view of the entries; ``x in d.values()`` compares by identity."""
        return self._store().values()

    def items(self) -> ItemsView[str, T]:
        """Returns a view of ``(key, entry)`` pairs, in insertion order."""
        return self._store().items()

    def get(self, key: str, default: T | None = None) -> T | None:
        """Returns the entry under ``key``, or ``default``."""
        return self._store().get(key, default)

    def pop(self, key: str, default: Any = _MISSING) -> T:
        """Removes and returns the entry under ``key``; KeyError (or ``default``) if absent."""
        if key not in self._store():
            if default is _MISSING:
                raise self._missing(key)
            return default
        return self._store().pop(key)

    def clear(self) -> None:
        """Removes every entry."""
        self._store().clear()

    def update(self, items: Mapping[str, T] | Iterable[tuple[str, T]]) -> None:
        """Adds or replaces entries from a mapping, a container or ``(key, entry)`` pairs.

        Everything is checked before anything changes, so a bad entry leaves
        the container as it was.
        """
        name = type(self).__name__
        if isinstance(items, Mapping | _DictContainer):
            pairs = list(items.items())
        elif isinstance(items, Iterable) and not isinstance(items, str):
            pairs = []
            for n, pair in enumerate(items):
                if not isinstance(pair, tuple | list) or len(pair) != 2:
                    raise TypeError(
                        f"{name}.update() element #{n} is {_describe(pair)}, "
                        f"not a (key, {self._item_type.__name__}) pair"
                    )
                pairs.append((pair[0], pair[1]))
        else:
            raise TypeError(
                f"{name}.update() takes a mapping or (key, entry) pairs, got {_describe(items)}"
            )
        checked = [
            (_check_key(key, name), self._checked(item, f"[{key!r}]")) for key, item in pairs
        ]
        for key, item in checked:
            self._store()[key] = item
            self._adopt(key, item)


class Sequential(_ListContainer[Module]):
    """Chains modules: the output of each is the input of the next.

    Built from modules (named ``"0"``, ``"1"``, ...) or from one mapping of
    names to modules. It works eagerly and while tracing (each child call
    then returns a traced value, which is passed on), so a Sequential of
    LLM calls traces to one node per call.

    Example::

        class Upper(Module):
            def forward(self, text: str) -> str:
                return text.upper()

        class Exclaim(Module):
            def forward(self, text: str) -> str:
                return text + "!"

        pipe = Sequential(Upper(), Exclaim())
        pipe("hi")                        # 'HI!'
        pipe[-1]                          # the Exclaim
        named = Sequential(OrderedDict(up=Upper(), bang=Exclaim()))
        named[1:].bang                    # slices keep names; numeric names are positions
    """

    def __init__(self, *modules: Module | Mapping[str, Module]) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            named = modules[0]
            self._rebuild(
                (_check_key(key, "Sequential"), self._checked(module, f"[{key!r}]"))
                for key, module in named.items()
            )
            return
        for position, module in enumerate(modules):
            self.append(self._checked(module, f"() argument {position}"))

    def _new_like(self, entries: list[tuple[str, Module]]) -> Self:
        return type(self)(dict(entries))

    def forward(self, x: Any) -> Any:
        """Passes ``x`` through every module in order and returns the last output."""
        for module in self:
            x = module(x)
        return x


class ModuleList(_ListContainer[M]):
    """A list of modules, registered as children named by position.

    Use it to hold a variable number of sub-modules; ``named_modules()``
    reports them as ``layers.0``, ``layers.1``. It has no ``forward``: loop
    over it in the owning module's ``forward`` (or use `Sequential`).

    Example::

        class Panel(Module):
            def __init__(self, n: int) -> None:
                super().__init__()
                self.judges = ModuleList(LLMInference("judge") for _ in range(n))

            def forward(self, text: str) -> list[str]:
                return [judge(text) for judge in self.judges]

        panel = Panel(3)
        del panel.judges[0]                          # re-numbered: judges.0, judges.1
        [name for name, _ in panel.named_modules()]  # ['', 'judges', 'judges.0', 'judges.1']
    """

    _call_hint = (
        "call its modules instead, e.g. `for layer in self.layers: x = layer(x)`, "
        "or use Sequential to chain them"
    )

    def __init__(self, modules: Iterable[M] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)


class ModuleDict(_DictContainer[M]):
    """A dict of modules, registered as children under their keys, in insertion order.

    Keys are path segments (``experts.legal.llm``), so they must be non-empty
    strings without ``"."``. Like `ModuleList` it has no ``forward``.

    Example::

        experts = ModuleDict({"legal": LLMInference("smart"), "tone": LLMInference("fast")})
        experts["tone"].alias               # 'fast'
        list(experts)                       # ['legal', 'tone']
        experts["bad.key"] = LLMInference("x")  # raises: '.' separates path segments
    """

    _call_hint = "call one of its modules instead, e.g. `self.experts[name](text)`"

    def __init__(self, modules: Mapping[str, M] | Iterable[tuple[str, M]] | None = None) -> None:
        super().__init__(modules)


class ParameterList(_ListContainer[Parameter]):
    """A list of parameters named by position: ``prompts.0``, ``prompts.1``.

    They appear in ``named_parameters()``, ``state_dict()`` and
    ``load_state_dict()`` under those names. Entries must be `Parameter`
    objects; membership is by identity.

    Example::

        demos = ParameterList([Parameter("Q: 2+2 A: 4", description="A worked example.")])
        demos.append(Parameter("Q: 3+3 A: 6", description="A worked example."))
        dict(demos.named_parameters())      # {'0': Parameter(...), '1': Parameter(...)}
    """

    _registry = "_parameters"
    _item_type = Parameter
    _call_hint = "use its parameters inside a module's forward, e.g. f'{self.prompts[0]}'"

    def __init__(self, values: Iterable[Parameter] | None = None) -> None:
        super().__init__()
        if values is not None:
            self.extend(values)

    def __repr__(self) -> str:
        return _repr_parameters(self, self._entries())


class ParameterDict(_DictContainer[Parameter]):
    """A dict of parameters under string keys: ``prompts.greeting`` in ``state_dict()``.

    Keys follow the same rules as `ModuleDict`'s. ``key in d`` tests keys;
    ``p in d.values()`` tests parameters by identity.

    Example::

        prompts = ParameterDict({
            "greeting": Parameter("Hello!", description="How to open a reply."),
            "closing": Parameter("Bye.", requires_grad=False),
        })
        prompts["greeting"].value           # 'Hello!'
    """

    _registry = "_parameters"
    _item_type = Parameter
    _call_hint = "use its parameters inside a module's forward, e.g. f'{self.prompts[\"x\"]}'"

    def __init__(
        self, parameters: Mapping[str, Parameter] | Iterable[tuple[str, Parameter]] | None = None
    ) -> None:
        super().__init__(parameters)

    def __repr__(self) -> str:
        return _repr_parameters(self, list(self.items()))


def _repr_parameters(container: Module, entries: list[tuple[str, Parameter]]) -> str:
    """Returns the repr of a parameter container: one ``(key): Parameter(...)`` per line."""
    head = type(container).__name__ + "("
    if not entries:
        return head + ")"
    return head + "".join(f"\n  ({key}): {param!r}" for key, param in entries) + "\n)"
