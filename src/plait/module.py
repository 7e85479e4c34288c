# size: the one base class users subclass, shaped like torch.nn.Module (issue 35).
"""Module: the unit of composition, shaped like ``torch.nn.Module``.

Assigning a `Module` or `Parameter` to an attribute registers it, so a program
is a tree whose leaves make LLM calls (`LLMInference`) and whose parameters
can be listed, saved and optimised.

Calling a module does one of four things, decided by context:

1. while a trace is recorded, the call is recorded (leaf) or followed (composite);
2. inside an executing graph (an ``async def forward``), it returns a coroutine
   that runs the module on the same resources;
3. when it has resources (`bind` on it, below it or above it, ``ExecutionSettings``,
   ``plait.settings.configure``), it traces and executes the program: inside a
   running event loop it returns an awaitable (``await module(x)``); called
   from synchronous code with no loop running, it runs to completion and
   returns the result, as ``module.run_sync(x)`` would (so a script can write
   ``result = predictor(question=...)``), instead of a coroutine that
   would never run;
4. otherwise ``forward`` runs directly, which is how modules without LLM
   calls are used and tested; an ``async def forward`` called so from a
   script (no loop running) is refused at once, since nothing would run
   its coroutine.

``module.forward(...)`` called by hand from a script runs an ``async def
forward`` module like ``run_sync`` (`plait._sync_entry`).
"""

from __future__ import annotations

import functools
import types
import typing
import weakref
from collections.abc import AsyncGenerator, Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Self

from plait import _context, _lazy
from plait._sync_entry import SyncEntry
from plait.errors import PlaitError
from plait.parameter import Parameter, module_parent

if TYPE_CHECKING:
    from plait.feedback import BackwardContext, BackwardResult
    from plait.module_state import ModuleState

__all__ = [
    "LLMInference",
    "Module",
    "ModuleState",
    "adopt",
    "bound_resources",
    "call_forward",
    "has_own_backward",
    "is_async_module",
    "takes_keyword",
]


# size: the public base class whose whole surface users learn in one place, as torch.nn.Module.
class Module:
    """Base class of every plait program; subclass it and implement ``forward``.

    Unlike ``torch.nn.Module``, a module starts in *eval* mode: training mode
    makes bound calls return Values carrying tape ids for backward, which an
    ordinary caller does not want.

    Example::

        class Shout(Module):
            def forward(self, text: str) -> str:
                return text.upper()

        Shout()("hi")  # 'HI' — no LLM inside, so it runs directly
    """

    _plait_leaf: bool = False
    """Set true on a subclass to make tracing record it as one node instead of following it."""

    trace_limit: int = 1000
    """Most trace records kept per module (the oldest are dropped); see `traces`."""

    callbacks: tuple[Any, ...] | list[Any] = ()
    """`plait.callbacks.BaseCallback` objects told about this module's calls and everything
    inside them, besides those of the settings. Set it on an instance: ``m.callbacks = [cb]``."""

    # Private state of each instance, declared here so that readers and type checkers
    # find all of it in one place. It is set with ``object.__setattr__``, past the
    # registering ``__setattr__``: the first six in ``__new__``, ``_parent`` when a
    # module is registered as a child, ``_traces`` and ``_state`` on first use. Only
    # annotations: a class-level default would be shared by every instance.
    _children: dict[str, Module]
    """Child modules by attribute name, in assignment order."""
    _parameters: dict[str, Parameter]
    """Parameters by attribute name, in assignment order."""
    _name: str | None
    """The attribute name this module is registered under in its parent; None at the root."""
    _parent: weakref.ref[Module]
    """A weak link to the parent module (absent at the root; not pickled or deep-copied)."""
    _training: bool
    """Training mode, set by `train` / `eval` (see `training`)."""
    _bound_resources: Any
    """The resources given to `bind`, or None."""
    _bound_config: dict[str, Any]
    """The execution options given to `bind` (``max_concurrent`` …)."""
    _traces: Any
    """The bounded deque of this module's trace records, made on first use."""
    _state: ModuleState
    """What optimizers recorded on this module, made on first use (see `state`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # An ``async def forward`` called by hand from a script runs the module
        # (udspy's synchronous ``forward``) instead of returning a coroutine
        # nothing would run; see `plait._sync_entry`.
        super().__init_subclass__(**kwargs)
        forward = cls.__dict__.get("forward")
        if forward is not None and is_async_def(forward):
            cls.forward = SyncEntry(forward)  # type: ignore[method-assign,assignment]

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # The registries exist before any ``__init__`` runs, so a subclass that
        # never calls ``super().__init__()`` (an easy omission) or assigns
        # children before calling it still registers them. Copies and pickles
        # come through here too; their saved state then replaces these defaults.
        module = super().__new__(cls)
        object.__setattr__(module, "_children", {})
        object.__setattr__(module, "_parameters", {})
        object.__setattr__(module, "_name", None)
        object.__setattr__(module, "_training", False)
        object.__setattr__(module, "_bound_resources", None)
        object.__setattr__(module, "_bound_config", {})
        return module

    def __init__(self) -> None:
        """Does nothing: the module's state is set up when it is created (``__new__``).

        Calling ``super().__init__()`` from a subclass is harmless and may come
        at any point of its ``__init__``; leaving it out works too.
        """

    # ----------------------------------------------------------- registration
    def __setattr__(self, name: str, value: Any) -> None:
        # Replacing an entry keeps its place (dict assignment), so named_modules()
        # order does not change when a child is swapped, as in torch.
        if isinstance(value, Module):
            self._parameters.pop(name, None)
            self._children[name] = value
            adopt(self, name, value)
        elif isinstance(value, Parameter):
            self._children.pop(name, None)
            self._parameters[name] = value
            adopt(self, name, value)
        else:
            self._children.pop(name, None)
            self._parameters.pop(name, None)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._children.pop(name, None)
        self._parameters.pop(name, None)
        object.__delattr__(self, name)

    # A pickle (Ray, multiprocessing) or deep copy leaves out the weak link to the
    # parent, which cannot be pickled and would point at the original; each
    # module re-links the children and parameters it restored. A shallow copy
    # shares its children, which stay linked to the original.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_parent", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        for name, child in self._children.items():
            if child._name == name and module_parent(child) is None:
                object.__setattr__(child, "_parent", weakref.ref(self))
        for name, param in self._parameters.items():
            if param._name == name and param._owner is None:
                param._owner = weakref.ref(self)

    def register_module(self, name: str, module: Module | None) -> None:
        """Registers ``module`` as a child under ``name`` (like ``add_module``)."""
        setattr(self, name, module)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Registers ``param`` under ``name``."""
        setattr(self, name, param)

    # --------------------------------------------------------------- forward
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Defines the computation. Override this.

        While tracing, arguments are symbolic Values and calls to child
        modules return symbolic Values; at run time (or when called directly)
        they are real data.
        """
        name = type(self).__name__
        if hasattr(self, "aexecute"):  # a module written for another framework's loop
            raise NotImplementedError(
                f"{name} defines aexecute() (udspy's name) but plait calls forward(): rename "
                "it `async def forward(self, *, stream=False, **inputs)`; astream() passes "
                "stream=True"
            )
        raise NotImplementedError(f"{name} must implement forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        session = _context.current_trace()
        if session is not None:
            return session.record_call(self, args, kwargs)
        executor = _context.current_run()
        if executor is not None:
            return executor.call_module(self, args, kwargs)
        if _context.setting("resources") is not None or bound_resources(self) is not None:
            from plait.execution.run import call_bound  # late-bound upward call (ARCHITECTURE.md)

            return call_bound(self, args, kwargs)
        return self._call_directly(args, kwargs)

    async def aforward(self, *args: Any, stream: bool = False, **kwargs: Any) -> Any:
        """Runs the module and returns its output: ``await module.aforward(question=...)``.

        Another spelling of ``await module(...)`` (``acall`` too); it also
        works for a module without LLM calls, whose direct call is not
        awaitable. Override ``forward``, not this.

        ``stream`` switches this call's events (text chunks, tool events, your
        own) on: they reach an enclosing ``astream`` consumer only with
        ``stream=True``; by default they are kept out, so a call that asked for
        no stream emits nothing (``await module(...)``, plait's own form,
        always lets them through). A ``forward`` that declares a ``stream``
        parameter also receives the flag, to pass on to its children.
        """
        import inspect  # import time: as in `is_async_def` (asyncio, running this, loaded it)

        if takes_keyword(type(self).forward, "stream"):
            kwargs["stream"] = stream
        # Without a consumer there is nothing to keep out; a call to be kept
        # out runs with no stream in its context (nor in tasks it starts).
        muted = None if stream else _context.STREAM.set(None)
        try:
            result = self(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        finally:
            if muted is not None:
                _context.STREAM.reset(muted)
        return result

    acall = aforward

    def _call_directly(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Runs ``forward`` with no resources. Override to refuse (as LLMInference does).

        An ``async def forward`` called from a script with no resources is
        refused at the call: its coroutine would never run (no loop runs it),
        and ``astream`` and callbacks need resources too.
        """
        if is_async_module(self) and not _loop_running():
            name = type(self).__name__
            raise PlaitError(
                f"{name}.forward is async and {name} has no resources, so this call would "
                "return a coroutine that nothing runs: give it resources (module.bind(config) "
                "or plait.settings.configure(lm=...)), or run it with "
                "asyncio.run(module.aforward(...))"
            )
        return call_forward(self, args, kwargs)

    # --------------------------------------------------------------- backward
    def backward(self, feedback: str, ctx: BackwardContext) -> BackwardResult | Any:
        """Says how feedback on this module's output reaches its inputs and parameters.

        Called during ``await loss.backward()`` with the real inputs and
        output of the forward pass in ``ctx`` and the feedback on that output
        (text; ``feedback.payload`` gives the same text, as on a
        `Value`). The default passes the feedback to every input and tells each
        learnable parameter of this module (and its children) what went in,
        what came out and what was said about it.

        Override to route more precisely. A leaf's override replaces the
        default for its node. A *composite*'s override (its ``forward`` calls
        child modules) replaces backward through everything inside it: the
        children's own ``backward`` methods are not called, and the override
        decides what its inputs hear (``input_feedback`` by ``forward``
        parameter name) and what any parameter below it hears
        (``parameter_feedback`` by dotted name, e.g. ``"llm.system_prompt"``).
        It may be ``async``, and its feedback values may be awaitables: calling
        a child module inside it (``self.critic(text)``) makes that call
        through the training resources and its reply becomes the feedback.
        """
        # import time: plait.feedback's dataclasses load `dataclasses` (and `inspect`)
        from plait.feedback import BackwardResult

        result = BackwardResult(input_feedback=dict.fromkeys(ctx.inputs, feedback))
        report = _call_report(ctx)
        for name, param in self.named_parameters():
            if param.requires_grad:
                result.parameter_feedback[name] = report
        return result

    def declared_output_types(self) -> tuple[Any, ...]:
        """Returns the types this module says its outputs are made of.

        Checkpoints restore an output only as one of the types the program
        itself declares (never a class named in the file). The default is
        `declared_return_type`, when there is one. Override this to add the
        types a module builds its output from (a signature's output fields).
        """
        returned = self.declared_return_type()
        return () if returned is None else (returned,)

    def declared_return_type(self) -> Any:
        """Returns the type this module declares for its whole output, or None for none.

        A checkpointed output of the program must be of this type, when it is
        written and when it is restored (a line edited to hold a plain string
        where a model is declared is refused). The default is the return
        annotation of ``forward``, when it can be resolved.
        """
        try:
            hints = typing.get_type_hints(type(self).forward)
        except Exception:  # an annotation naming a local or missing class: nothing declared
            return None
        return hints.get("return")

    # ---------------------------------------------------------------- binding
    def bind(self, resources: Any, max_concurrent: int | None = None, **kwargs: Any) -> Self:
        """Binds resources so ``await module(x)`` and ``run_sync`` execute for real.

        A module that is not bound but wraps bound modules (all bound to the
        same resources) uses theirs: ``TrainingStep(program.bind(config), loss)``.

        Args:
            resources: a ``ResourceConfig``, ``ResourceManager`` or mapping.
            max_concurrent: most LLM calls in flight at once (None: from
                ``ExecutionSettings``, else 100).
            **kwargs: other execution options (``checkpoint_dir``, ``timeout`` …).

        Returns:
            self, for chaining: ``pipeline = Pipeline().bind(resources)``.
        """
        object.__setattr__(self, "_bound_resources", resources)
        object.__setattr__(self, "_bound_config", {"max_concurrent": max_concurrent, **kwargs})
        return self

    async def astream(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        """Runs the module on one input, yielding events as they happen, then the output.

        ``async for event in program.astream(x)``: `plait.streaming` events
        (text per output field as the model writes it, tool calls and results,
        your own `emit_event`s) from every module of the program (except calls
        made with ``aforward(..., stream=False)``), interleaved as concurrent
        branches produce them, each naming its module (``event.module``) and
        the path of its call (``event.module_path``); the last item is the
        program's output (a `Prediction`, itself a `StreamEvent`, for
        Predict-like modules). Needs resources, like ``await module(x)``.
        Stopping the iteration cancels the program and its requests.
        """
        # late-bound upward call (ARCHITECTURE.md)
        from plait.execution.astream import stream_events

        async for event in stream_events(self, args, kwargs):
            yield event

    def run_sync(self, *args: Any, **kwargs: Any) -> Any:
        """Executes like ``await module(...)`` but blocks; works inside a running loop too.

        Inside Jupyter (a loop is already running) the call runs on a
        background loop thread instead of failing.
        """
        from plait.execution.run import run_sync  # late-bound upward call (ARCHITECTURE.md)

        return run_sync(self, args, kwargs)

    # ----------------------------------------------------------- introspection
    def children(self) -> Iterator[Module]:
        """Returns an iterator over immediate child modules."""
        for _, module in self.named_children():
            yield module

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """Returns an iterator over immediate children as ``(name, module)``, each once."""
        seen: set[int] = set()
        for name, module in self._children.items():
            if id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def modules(self) -> Iterator[Module]:
        """Returns an iterator over all modules in the tree, self first, each once."""
        for _, module in self.named_modules():
            yield module

    def named_modules(
        self, prefix: str = "", memo: set[int] | None = None
    ) -> Iterator[tuple[str, Module]]:
        """Returns an iterator over ``(dotted.path, module)``, depth first, each module once.

        A module reachable by two paths is reported under the first one.
        """
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        """Returns an iterator over parameters of the tree, each once."""
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_parameters(
        self, prefix: str = "", recurse: bool = True
    ) -> Iterator[tuple[str, Parameter]]:
        """Returns an iterator over ``(dotted.name, parameter)``, each parameter once."""
        seen: set[int] = set()
        modules = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for path, module in modules:
            for name, param in module._parameters.items():
                if id(param) not in seen:
                    seen.add(id(param))
                    yield (f"{path}.{name}" if path else name), param

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Returns every parameter's value by dotted name (JSON-compatible)."""
        return {name: param.value for name, param in self.named_parameters()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Loads parameter values by dotted name.

        Missing keys keep their current value. Unknown keys raise one
        ``KeyError`` listing all of them. A value of another type than the
        parameter's current value (a dict or a number where a prompt is text)
        raises one ``TypeError`` listing every such parameter: such a value,
        from a hand-edited or foreign file, would otherwise be formatted into
        prompts as its Python repr. Either way nothing is changed. Values are
        compared as JSON sees them: any number fits a number, a list a tuple,
        and a parameter whose value is None takes anything.
        """
        params = dict(self.named_parameters())
        unknown = [name for name in state_dict if name not in params]
        if unknown:
            known = ", ".join(params) or "none"
            lines = "\n".join(f"  {name}" for name in unknown)
            raise KeyError(f"unknown parameter(s) in state_dict:\n{lines}\nknown: {known}")
        from plait.feedback import clip  # import time: only for a state_dict that does not fit

        wrong = [
            f"  {name}: expected {type(params[name].value).__name__}, got "
            f"{type(value).__name__} {clip(repr(value), 60)}"
            for name, value in state_dict.items()
            if not _fits(params[name].value, value)
        ]
        if wrong:
            lines = "\n".join(wrong)
            raise TypeError(
                f"parameter value(s) of the wrong type in state_dict; nothing was loaded:\n"
                f"{lines}\na value must have the type of the parameter's current value (text for "
                "a prompt); correct the saved values, or set this one in code"
            )
        for name, value in state_dict.items():
            params[name].value = value

    def save(self, path: Any, optimizer: Any = None) -> Any:
        """Writes parameters (values, descriptions) and optimizer state to ``path`` as JSON.

        See `plait.optimization.serialization.save_module`; never pickle.
        """
        return _serialization().save_module(self, path, optimizer)

    def load(self, path: Any) -> Any:
        """Loads parameter values saved by `save`; returns the saved optimizer state or None.

        Unknown parameter names raise one ``KeyError`` listing them, and values
        of another type than the current ones (a dict for a prompt) one
        ``TypeError`` naming the file; either way nothing changes.
        """
        return _serialization().load_module(self, path)

    # --------------------------------------------------------------- training
    @property
    def training(self) -> bool:
        """Whether the module is in training mode."""
        return self._training

    def train(self, mode: bool = True) -> Self:
        """Sets training mode on this module and all descendants; returns self."""
        for module in self.modules():
            object.__setattr__(module, "_training", mode)
        return self

    def eval(self) -> Self:
        """Sets evaluation mode (``train(False)``); returns self."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Self:
        """Freezes (False) or unfreezes every parameter of the tree; returns self."""
        for param in self.parameters():
            param.requires_grad = requires_grad
        return self

    # ------------------------------------------------------------------ copies
    def copy(self, deep: bool = True) -> Self:
        """Returns an independent copy of this module, e.g. one candidate of an optimizer.

        ``deep=True`` copies the whole tree: children and parameters are new
        objects, so changing the copy's instructions or demos never touches
        the original. ``deep=False`` makes a new top-level module that shares
        its children and parameters with the original (assigning a new child
        or parameter to the copy does not affect the original).

        Either way, bound resources are shared, not copied (a ResourceManager
        holds connections and limits that must stay one per program), and so
        are the modules' ``callbacks`` (observers such as a tracer: a search's
        candidates report to the program's own), and the copy starts with no
        trace records and a fresh `state` (not compiled).
        """
        import copy  # import time: only copies need it

        if not deep:
            clone = copy.copy(self)
            object.__setattr__(clone, "_children", dict(self._children))
            object.__setattr__(clone, "_parameters", dict(self._parameters))
            object.__setattr__(clone, "_bound_config", dict(self._bound_config))
            clone.__dict__.pop("_traces", None)
            clone.__dict__.pop("_state", None)
            return clone
        memo: dict[int, Any] = {}
        for module in self.modules():
            resources = module._bound_resources
            if resources is not None:
                memo[id(resources)] = resources
            for callback in module.__dict__.get("callbacks", ()):
                memo[id(callback)] = callback
            records = module.__dict__.get("_traces")
            if records is not None:
                memo[id(records)] = type(records)(maxlen=records.maxlen)
            state = module.__dict__.get("_state")
            if state is not None:
                memo[id(state)] = type(state)()
        return copy.deepcopy(self, memo)

    # ----------------------------------------------------------- optimization
    @property
    def state(self) -> ModuleState:
        """Returns what optimizers recorded on this module: trials, best score and parameters.

        Filled by the program-level optimizers (`plait.optimization.GridSearch`,
        ``BootstrapFewShot``, ``RandomSearch``, ``ReflectiveSearch`` …) and by
        `optimize_grid`; a copy starts with a fresh state.
        """
        state = self.__dict__.get("_state")
        if state is None:
            # import time: a dataclass (`dataclasses` loads `inspect`), read once optimizers run
            from plait.module_state import ModuleState

            state = ModuleState()
            object.__setattr__(self, "_state", state)
        return state

    @state.setter
    def state(self, value: Any) -> None:
        # Some ported modules keep their own data in ``self.state``; here the name is
        # the optimizers' record, which searches write to, so it must stay a ModuleState.
        raise AttributeError(
            f"{type(self).__name__}.state is plait's record of what optimizers tried on this "
            "module (trials, best score and parameters) and cannot be assigned; keep the "
            "module's own data under another name, e.g. self.saved = ..."
        )

    def is_compiled(self) -> bool:
        """Whether an optimizer has changed this module (applied a candidate other than
        the module as it was); a search that kept the module leaves it false."""
        state = self.__dict__.get("_state")
        return state is not None and state.compiled

    def optimize_grid(
        self, devset: Any, metric: Any = None, parameters: Any = None, **options: Any
    ) -> Any:
        """Tries every combination of ``parameters`` on ``devset``, keeps the best; see
        `plait.optimization.optimize_grid` (returns its `SearchReport`; awaited inside
        a running event loop, run to completion from a script, like a module call)."""
        # late-bound upward call (ARCHITECTURE.md)
        from plait.optimization.search.grid import optimize_grid

        return optimize_grid(self, devset, metric, parameters, **options)

    # ----------------------------------------------------------------- traces
    def traces(self) -> list[Any]:
        """Returns the records of the LLM calls made by this module and its descendants.

        Oldest first. Program modules (``Predict``, ``ReAct`` …) record every
        call they make as a ``plait.modules.traces.TraceRecord``: inputs, the
        messages sent, the output, latency, tokens, cost, cache hit. Each
        module keeps its last ``trace_limit`` records.
        """
        records = [
            record
            for _, module in self.named_modules()
            for record in module.__dict__.get("_traces", ())
        ]
        records.sort(key=lambda record: record.timestamp)
        return records

    def get_traces(self) -> list[Any]:
        """Returns `traces` (the name ported code calls)."""
        return self.traces()

    def traces_frame(self) -> Any:
        """Returns `traces` as a pandas DataFrame, one row per LLM call.

        Raises:
            ImportError: pandas is not installed.
        """
        pandas = _pandas()
        if pandas is None:
            raise ImportError(
                "Module.traces_frame() needs pandas, which is not installed: "
                "`pip install pandas`, or use module.traces() (a list of records)"
            ) from None
        return pandas.DataFrame([record.as_dict() for record in self.traces()])

    def clear_traces(self) -> None:
        """Forgets the trace records of this module and all its descendants."""
        for module in self.modules():
            records = module.__dict__.get("_traces")
            if records is not None:
                records.clear()

    # ------------------------------------------------------------------ print
    def extra_repr(self) -> str:
        """Returns the settings shown in ``repr``. Override to show yours."""
        return ""

    def __repr__(self) -> str:
        lines = [
            f"({name}): {child!r}".replace("\n", "\n  ") for name, child in self.named_children()
        ]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"


def _json_kind(x: Any) -> Any:
    """Returns what JSON makes of ``x``'s type: numbers, arrays and objects each one kind."""
    if isinstance(x, int | float) and not isinstance(x, bool):
        return "number"
    if isinstance(x, list | tuple):
        return "array"
    if isinstance(x, Mapping):
        return "object"
    return type(x)


def _fits(current: Any, new: Any) -> bool:
    """Whether ``new`` may replace a parameter whose value is ``current`` (`load_state_dict`)."""
    if current is None:
        return True
    kind = _json_kind(current)
    return kind == _json_kind(new) if isinstance(kind, str) else isinstance(new, kind)


def _call_report(ctx: BackwardContext) -> str:
    """Returns the bounded account of one call that a parameter's feedback quotes."""
    from plait.feedback import clip  # import time: as in `Module.backward`

    inputs = "\n".join(f"{name}: {clip(value, 600)}" for name, value in ctx.inputs.items())
    return (
        f"Step {ctx.module_path or ctx.node_id} received:\n{inputs}\n"
        f"It produced:\n{clip(ctx.output, 600)}\n"
        f"Feedback on that output:\n{clip(ctx.feedback)}"
    )


def adopt(owner: Module, name: str, item: Module | Parameter) -> None:
    """Registers the name of ``item`` (a child or a parameter just stored in ``owner``).

    A child module is named ``name`` and notes ``owner`` as its parent. A
    parameter keeps the first name it was registered under, as long as that
    registration holds (a parameter shared by two modules is named after the
    first); a parameter no longer held there takes the new one. These links
    give `Parameter.path` and the resources of a bound ancestor
    (`bound_resources`).
    """
    if isinstance(item, Module):
        object.__setattr__(item, "_name", name)
        object.__setattr__(item, "_parent", weakref.ref(owner))
    elif item._name is None or item._owner is None or not _still_held(item):
        item._name = name
        item._owner = weakref.ref(owner)


def _still_held(param: Parameter) -> bool:
    owner = param._owner() if param._owner is not None else None
    return owner is not None and param.is_owned_by(owner)


def bound_resources(module: Module) -> Any:
    """Returns the resources ``module`` gets from binding, or None.

    In order: what it is bound to itself; the one set of resources that every
    bound module below it shares (a `TrainingStep` or a wrapper around a bound
    program finds the program's); what its nearest bound ancestor is bound to
    (``pipeline.bind(config)`` lets ``pipeline.summarizer`` be called alone:
    binding a program binds every module in it). This is the
    structural part of `plait.execution.settings.find_resources`, the one rule.
    """
    if module._bound_resources is not None:
        return module._bound_resources
    below = {
        id(resources): resources
        for sub in module.modules()
        if (resources := sub._bound_resources) is not None
    }
    if len(below) == 1:
        return next(iter(below.values()))
    seen = {id(module)}
    ancestor = module_parent(module)
    while ancestor is not None and id(ancestor) not in seen:
        if ancestor._bound_resources is not None:
            return ancestor._bound_resources
        seen.add(id(ancestor))
        ancestor = module_parent(ancestor)
    return None


@functools.lru_cache(maxsize=1024)
def takes_keyword(function: Any, name: str) -> bool:
    """Whether ``function`` names a parameter ``name`` that a keyword argument can fill.

    A ``**kwargs`` catch-all does not count: only a parameter written out
    (``stream`` in ``async def forward(self, *, stream=False, **inputs)``).
    Remembered per function (reading a signature costs tens of microseconds,
    and ``aforward`` asks on every call): pass the class's function,
    ``type(module).forward``, not a bound method, which is new each time.
    """
    import inspect  # import time: with ast, dis and tokenize, once a signature is read

    try:
        parameter = inspect.signature(function).parameters.get(name)
    except (TypeError, ValueError):  # a builtin or C function without a signature
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def _loop_running() -> bool:
    import asyncio  # import time: `import plait` stays free of the runtime

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def has_own_backward(module: Module) -> bool:
    """Whether ``module``'s class overrides `Module.backward`."""
    return type(module).backward is not Module.backward


def is_async_module(module: Module) -> bool:
    """Whether ``module.forward`` is ``async def`` (it then runs eagerly as one node)."""
    return is_async_def(type(module).forward)


_CO_COROUTINE = 0x80
"""The code flag of an ``async def`` function (``inspect.CO_COROUTINE``)."""


def is_async_def(function: Any) -> bool:
    """Whether ``function`` is an ``async def`` function, as ``inspect.iscoroutinefunction`` says.

    A plain function answers from its code flags, so defining, subclassing and
    calling modules does not load `inspect` (which brings ast, dis and tokenize:
    a fifth of ``import plait``); anything else (a partial, a bound method, a
    function marked with ``inspect.markcoroutinefunction``) asks `inspect` itself.
    """
    if type(function) is types.FunctionType and "_is_coroutine_marker" not in vars(function):
        return bool(function.__code__.co_flags & _CO_COROUTINE)
    import inspect  # import time: see above; only for what is not a plain function

    return inspect.iscoroutinefunction(function)


def call_forward(module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Calls ``module.forward(*args, **kwargs)`` for a leaf that runs (not while tracing).

    An ``async def forward`` that takes ``resume_state=`` belongs to a module
    that pauses for a person and resumes: it runs through
    `plait.resumable.run_resumable`, which hands it the call's checked resume
    state and seals the pauses that leave it, so every such module keeps the
    guarantees ReAct keeps. A ``resume_state=`` given to the call itself (a
    direct call; a run strips it and offers it) is offered the same way.
    """
    resuming = "resume_state" in kwargs
    if resuming or _takes_resume_state(type(module).forward):
        # late-bound upward call (ARCHITECTURE.md): the programs layer, loaded by such modules only
        from plait.resumable import resume_call, run_resumable

        return (resume_call if resuming else run_resumable)(module, args, kwargs)
    return module.forward(*args, **kwargs)


@functools.lru_cache(maxsize=256)
def _takes_resume_state(forward: Any) -> bool:
    if not is_async_def(forward):
        return False
    import inspect  # import time: as in `takes_keyword`

    try:
        return "resume_state" in inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a callable without a signature: takes nothing by name
        return False


class LLMInference(Module):
    """One LLM call: the atomic leaf every program is built from.

    Args:
        alias: the resource alias to call (an entry of ``ResourceConfig``).
        system_prompt: a string (fixed) or a `Parameter` (learnable).
        temperature: sampling temperature.
        max_tokens: cap on generated tokens (None: the provider's default).
        response_format: a pydantic model, dataclass, ``list[str]``,
            ``Literal[...]`` … — the reply is parsed into it (JSON-schema mode).

    Called with text, a `Message`, a conversation (a list of Messages or
    ``{"role": ..., "content": ...}`` dicts) or a `plait.History`, it makes
    one call and returns the reply text, or the typed object when
    ``response_format`` is set; its system prompt goes first unless the
    conversation starts with its own. A list of anything else is a batch (one
    call per item), and so is a list of conversations.
    """

    _plait_leaf = True

    def __init__(
        self,
        alias: str,
        system_prompt: str | Parameter = "",
        temperature: float = 1.0,
        max_tokens: int | None = None,
        response_format: Any = None,
    ) -> None:
        super().__init__()
        if not isinstance(alias, str) or not alias:
            raise ValueError(f"LLMInference needs a non-empty alias string, got {alias!r}")
        self.alias = alias
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.response_format = response_format
        if isinstance(system_prompt, Parameter):
            self.system_prompt: Parameter | None = system_prompt
        elif system_prompt:
            self.system_prompt = Parameter(system_prompt, requires_grad=False)
        else:
            self.system_prompt = None

    def forward(self, prompt: Any) -> Any:
        """Not called: the execution layer makes the request through the resources."""
        raise RuntimeError(
            "LLMInference.forward() is run by plait's executor; call the module "
            "(bound, or inside ExecutionSettings) instead"
        )

    def declared_return_type(self) -> Any:
        """Returns the response format, when there is one (the reply is text otherwise)."""
        return self.response_format

    def backward(self, feedback: str, ctx: BackwardContext) -> BackwardResult:
        """Sends the feedback to the prompt's producers and, if learnable, to the system prompt."""
        # import time: plait.feedback's dataclasses load `dataclasses` (and `inspect`)
        from plait.feedback import BackwardResult

        result = BackwardResult(input_feedback=dict.fromkeys(ctx.inputs, feedback))
        if self.system_prompt is not None and self.system_prompt.requires_grad:
            result.parameter_feedback["system_prompt"] = _call_report(ctx)
        return result

    def _call_directly(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        path = self._name or type(self).__name__
        raise RuntimeError(
            f"LLMInference {path!r} (alias {self.alias!r}) has no resources: bind them with "
            "module.bind(ResourceConfig(...)), use `async with ExecutionSettings(resources=...)`, "
            "or call plait.run(module, ..., resources=...)"
        )

    def extra_repr(self) -> str:
        parts = [f"alias={self.alias!r}"]
        if self.response_format is not None:
            name = getattr(self.response_format, "__name__", repr(self.response_format))
            parts.append(f"response_format={name}")
        return ", ".join(parts)


def _serialization() -> ModuleType:
    """`plait.optimization.serialization`, which `Module.save` and `Module.load` use."""
    from plait.optimization import serialization  # late-bound upward call (ARCHITECTURE.md)

    return serialization


def _pandas() -> ModuleType | None:
    """pandas, or None when it is not installed."""
    try:
        import pandas  # optional extra (plait[pandas]), heavy: loaded on first use
    except ImportError:
        return None
    return pandas


# ``ModuleState`` lives in `plait.module_state` (a dataclass, loaded on first use) and
# is still read as ``plait.module.ModuleState``.
__getattr__, __dir__ = _lazy.exports(
    "plait.module", {"ModuleState": "plait.module_state"}, globals(), __all__
)
