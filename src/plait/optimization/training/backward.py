"""Backward: route textual feedback from a loss to every learnable parameter.

Starting from the output nodes of each tape, nodes are visited in reverse
dependency order, one *wave* at a time: a node is visited once every node
that read its output has been. Within a wave, backward calls run
concurrently (they may make LLM calls, which go through the training
resources). Each node turns the feedback on its output into feedback for its
inputs (routed to the nodes that produced them, by argument name) and for
its parameters:

* functional-op nodes (``value["key"]``, ``F.*``) pass feedback through;
* leaf modules call their ``backward`` (`Module.backward`);
* a composite module that overrides ``backward`` is visited as one step (a
  `Scope` of the graph): its override hears the feedback on its output and
  decides what its inputs and every parameter below it hear; the nodes
  inside it are not visited;
* calls made inside an ``async def forward`` node are replayed to their own
  modules' ``backward``, so parameters used inside agents and loops learn too;
* a parameter formatted into an input (``f"{self.instructions} ..."``) hears
  about the call it took part in.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from plait import _context
from plait._together import together
from plait.execution.executor import Executor
from plait.execution.settings import find_resources
from plait.execution.tape import Tape, get_tape, release_tape
from plait.feedback import BackwardContext, BackwardResult, Feedback, FeedbackText, clip
from plait.optimization.events import learning_step
from plait.resources import ResourceManager
from plait.tracing.graph import Node, Scope, iter_refs, substitute
from plait.values import Value

__all__ = ["BackwardReport", "backward", "node_levels"]

_MAX_ITEMS_PER_NODE = 6
"""Feedback texts combined for one node; more (from many readers) are summarised by count."""


@dataclass
class BackwardReport:
    """What one backward pass reached."""

    parameters: dict[str, int] = field(default_factory=dict)
    """Dotted parameter name → feedback items it received."""
    nodes: list[str] = field(default_factory=list)
    """Node ids visited, in visiting order."""
    levels: dict[str, int] = field(default_factory=dict)
    """Dotted parameter name → level of the earliest node that read it (see `node_levels`)."""


def _as_text(grad: Any) -> str:
    if isinstance(grad, Value):
        grad = grad.payload
    if isinstance(grad, Feedback):
        return str(grad)
    return clip(grad)


async def backward(
    outputs: Value | Sequence[Value] | Feedback,
    grad: Any = None,
    *,
    resources: Any = None,
    retain_tape: bool = False,
) -> BackwardReport:
    """Sends feedback backward through the tapes of ``outputs``.

    Args:
        outputs: a training-mode output (or several) with ``meta["_tape_ids"]``;
            an eval-mode `Feedback` (``Feedback.backward``) is taken only to be
            refused with the hint below.
        grad: the feedback to send; default: each output's own payload (a
            loss Value's `Feedback`).
        resources: resources for backward methods that call LLMs (default:
            those of the active ``ExecutionSettings``, else those the forward
            pass ran on).
        retain_tape: keep the tapes for another backward pass.

    Callbacks hear the pass as one ``backward`` step (`plait.callbacks`): the
    calls that backward methods make nest inside it.

    Raises:
        ValueError: an output has no tape (it was not produced in training mode).
    """
    # Only a list or tuple means "several outputs": anything else (an eval-mode
    # Feedback, a plain string) is one output, refused below with the hint.
    given = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    values: list[Value] = []
    jobs: list[tuple[Tape, str]] = []
    for position, value in enumerate(given):
        if not isinstance(value, Value) or not value.meta.get("_tape_ids"):
            raise ValueError(
                f"output {position} ({type(value).__name__}) has no tape ids: it was not "
                "produced in training mode; "
                "call module.train() (or TrainingStep(...).train()) before the forward pass"
            )
        values.append(value)
        text = _as_text(grad if grad is not None else value)
        jobs.extend((get_tape(tape_id), text) for tape_id in value.meta["_tape_ids"])
    report = BackwardReport()
    executor = await _executor_for(resources, jobs)
    token = _context.RUN.set(executor) if executor is not None else None
    told = {"outputs": len(values), "tapes": len(jobs)}
    try:
        with learning_step("backward", None, told) as step:
            await together(*(_backward_tape(tape, text, report) for tape, text in jobs))
            step.outputs = {
                "parameters": _program_names(report.parameters),
                "nodes": len(report.nodes),
            }
    finally:
        if token is not None:
            _context.RUN.reset(token)
    if not retain_tape:
        for tape, _ in jobs:
            release_tape(tape.id)
        for value in values:
            value.meta.pop("_tape_ids", None)
    return report


def _program_names(reached: dict[str, int]) -> dict[str, int]:
    """Returns parameter names as the user's program has them, for callbacks.

    A program trained through a `TrainingStep` (the Trainer, ReflectiveSearch)
    runs held at `PROGRAM_PATH`; its users know its parameters without that prefix.
    """
    # import time: step loads the losses, only once used
    from plait.optimization.training.step import PROGRAM_PATH

    prefix = f"{PROGRAM_PATH}."
    return {name.removeprefix(prefix): count for name, count in reached.items()}


async def _executor_for(resources: Any, jobs: list[tuple[Tape, str]]) -> Any:
    resources = find_resources(resources)
    if resources is None:
        # The forward pass's own manager: a bound program needs no settings block.
        managers = {id(t.manager): t.manager for t, _ in jobs if t.manager is not None}
        return Executor(next(iter(managers.values()))) if len(managers) == 1 else None

    return Executor(ResourceManager.shared(resources))


def node_levels(graph: Any) -> dict[str, int]:
    """Returns each node's level: 0 for inputs, else one more than its deepest dependency.

    Nodes on one level never depend on each other, so optimizers update the
    parameters read on one level together, lower (upstream) levels first.
    """
    levels: dict[str, int] = {}
    for node_id in graph.topological_order():
        deps = [levels[d] for d in graph.nodes[node_id].dependencies if d in levels]
        levels[node_id] = 1 + max(deps) if deps else 0
    return levels


Site = Node | Scope
"""What backward visits: a node, or the scope of a composite with its own ``backward``."""


def _units(tape: Tape) -> tuple[list[Site], dict[str, Site]]:
    """Returns the sites in recording order, and the site that answers for each node id.

    A scope's nodes are contiguous in recording order, so putting the scope
    where its nodes were keeps the order topological.
    """
    graph = tape.graph
    owner: dict[str, Site] = {}
    for scope in graph.scopes:
        for node_id in scope.node_ids:
            owner[node_id] = scope
    sites: list[Site] = []
    seen: set[str] = set()
    for node_id in graph.topological_order():
        site = owner.setdefault(node_id, graph.nodes[node_id])
        if site.id not in seen:
            seen.add(site.id)
            sites.append(site)
    return sites, owner


def _waves(tape: Tape, sites: list[Site], owner: dict[str, Site]) -> list[list[Site]]:
    """Returns the sites grouped so that every site comes after all sites reading it."""
    dependents = tape.graph.dependents
    level: dict[str, int] = {}
    for site in reversed(sites):
        inside = site.node_ids if isinstance(site, Scope) else (site.id,)
        readers = {owner[r].id for node_id in inside for r in dependents[node_id]} - {site.id}
        level[site.id] = 1 + max((level[r] for r in readers), default=-1)
    waves: dict[int, list[Site]] = defaultdict(list)
    for site in sites:
        waves[level[site.id]].append(site)
    return [waves[depth] for depth in sorted(waves)]


async def _backward_tape(tape: Tape, feedback: str, report: BackwardReport) -> None:
    pending: dict[str, list[str]] = defaultdict(list)
    levels = node_levels(tape.graph)
    sites, owner = _units(tape)
    for scope in tape.graph.scopes:
        levels[scope.id] = min((levels[n] for n in scope.node_ids), default=0)
    route = {node_id: site.id for node_id, site in owner.items()}
    for output_id in tape.graph.output_ids:
        if output_id in tape.graph.nodes:
            pending[route[output_id]].append(feedback)
        elif output_id in tape.parameters:
            last = 1 + max(levels.values(), default=0)
            _to_parameter(tape.parameters[output_id], output_id[6:], feedback, report, last)
    for wave in _waves(tape, sites, owner):
        ready = [site for site in wave if pending.get(site.id) and site.kind != "input"]
        await together(*(_visit(tape, site, pending, report, levels, route) for site in ready))


def _combined(items: list[str]) -> str:
    shown = items[:_MAX_ITEMS_PER_NODE]
    text = "\n\n".join(clip(item, 800) for item in shown)
    if len(items) > len(shown):
        text += f"\n\n(and {len(items) - len(shown)} more similar items)"
    return text


async def _visit(
    tape: Tape,
    site: Site,
    pending: dict[str, list[str]],
    report: BackwardReport,
    levels: dict[str, int],
    route: dict[str, str],
) -> None:
    report.nodes.append(site.id)
    feedback = FeedbackText(_combined(pending[site.id]))
    level = levels[site.id]
    if site.kind == "op":
        for ref in _refs((site.args, site.kwargs)):
            _send(tape, ref, feedback, pending, report, via=site.id, level=level, route=route)
        return
    ctx = _context_of(tape, site, feedback)
    result = site.module.backward(feedback, ctx)
    if inspect.isawaitable(result):
        result = await result
    result = await _resolved(site.module, site.id, result)
    _apply(tape, site, ctx, result, pending, report, level, route)
    await together(
        *(_replay_inner_call(tape, site, call, feedback, report, level) for call in ctx.inner_calls)
    )


async def _resolved(module: Any, where: str, result: Any) -> BackwardResult:
    """Returns ``result`` with awaitable feedback values awaited (concurrently) and as text.

    Raises:
        TypeError: the override returned something that is not a `BackwardResult`.
    """
    if not isinstance(result, BackwardResult):
        raise TypeError(
            f"{type(module).__name__}.backward ({where}) returned "
            f"{type(result).__name__}; it must return a BackwardResult(input_feedback=..., "
            "parameter_feedback=...)"
        )
    tables = (result.input_feedback, result.parameter_feedback)
    waiting = [
        (table, key) for table in tables for key, v in table.items() if inspect.isawaitable(v)
    ]
    if waiting:
        values = await together(*(table[key] for table, key in waiting))
        for (table, key), value in zip(waiting, values, strict=True):
            table[key] = value
    for table in tables:
        for key, value in table.items():
            if not isinstance(value, str):
                table[key] = _as_text(value)
    return result


def _context_of(tape: Tape, site: Site, feedback: str) -> BackwardContext:
    def lookup(ref: str) -> Any:
        value = tape.results.get(ref)
        return value.payload if value is not None else tape.parameters[ref].value

    args = substitute(site.args, lookup)
    kwargs = substitute(site.kwargs, lookup)
    if isinstance(site, Scope):
        output, inner = substitute(site.output, lookup), []
    else:
        output = tape.results[site.id].payload
        inner = tape.results[site.id].meta.get("_inner_calls", [])
    return BackwardContext(
        node_id=site.id,
        module_path=site.module_path,
        args=args,
        kwargs=kwargs,
        input_names=_input_names(site.module, len(args)),
        output=output,
        feedback=feedback,
        inner_calls=inner,
    )


def _input_names(module: Any, count: int) -> tuple[str, ...]:
    names: list[str] = []
    for param in inspect.signature(module.forward).parameters.values():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            names.extend(f"{param.name}[{i}]" for i in range(count - len(names)))
            break
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            names.append(param.name)
    return tuple(names[:count])


def _apply(
    tape: Tape,
    node: Site,
    ctx: BackwardContext,
    result: BackwardResult,
    pending: dict[str, list[str]],
    report: BackwardReport,
    level: int,
    route: dict[str, str],
) -> None:
    for name, text in result.input_feedback.items():
        for ref in _refs(_recorded_input(node, ctx, name)):
            _send(tape, ref, text, pending, report, via=node.id, level=level, route=route)
    own = dict(node.module.named_parameters())
    for name, text in result.parameter_feedback.items():
        param = own.get(name)
        if param is None:
            raise KeyError(
                f"{type(node.module).__name__}.backward gave feedback for unknown parameter "
                f"{name!r}; its parameters: {', '.join(own) or 'none'}"
            )
        full = f"{node.module_path}.{name}" if node.module_path else name
        _to_parameter(param, full, text, report, level)


def _recorded_input(node: Site, ctx: BackwardContext, name: str) -> Any:
    """Returns what input ``name`` was recorded as; ``name[i]`` is item i of a list input.

    Raises:
        KeyError: ``name`` is not a parameter of the module's ``forward`` (a
            typo would otherwise drop the feedback silently).
    """
    if name in node.kwargs:
        return node.kwargs[name]
    if name in ctx.input_names:
        return node.args[ctx.input_names.index(name)]
    base, bracket, index = name.partition("[")
    if bracket and index[:-1].isdigit() and index.endswith("]"):
        whole = _recorded_input(node, ctx, base)
        if not isinstance(whole, list | tuple):
            return whole  # one node produced the whole list: it hears about each item
        position = int(index[:-1])
        return whole[position] if position < len(whole) else ()
    accepted = inspect.signature(node.module.forward).parameters.values()
    if any(p.name == name or p.kind is p.VAR_KEYWORD for p in accepted):
        return ()  # an optional input this call did not pass
    raise KeyError(
        f"{type(node.module).__name__}.backward ({node.id}) gave feedback for unknown input "
        f"{name!r}; its inputs: {', '.join(ctx.input_names + tuple(ctx.kwargs)) or 'none'}"
    )


def _refs(recorded: Any) -> list[str]:
    return list(dict.fromkeys(iter_refs(recorded)))


def _send(
    tape: Tape,
    ref: str,
    text: str,
    pending: dict[str, list[str]],
    report: BackwardReport,
    via: str,
    level: int,
    route: dict[str, str],
) -> None:
    if ref.startswith("param:"):
        param = tape.parameters.get(ref)
        if param is not None:
            note = f"This text was part of the input of step {via}.\n{text}"
            _to_parameter(param, ref[6:], note, report, level)
        return
    pending[route.get(ref, ref)].append(text)


def _to_parameter(param: Any, name: str, text: str, report: BackwardReport, level: int) -> None:
    if param.requires_grad:
        param.accumulate_feedback(text)
        report.parameters[name] = report.parameters.get(name, 0) + 1
        report.levels[name] = min(report.levels.get(name, level), level)
        known = param.graph_level
        param.graph_level = level if known is None else min(known, level)


async def _replay_inner_call(
    tape: Tape,
    node: Site,
    call: dict[str, Any],
    feedback: str,
    report: BackwardReport,
    level: int,
) -> None:
    """Gives a call made inside an async node its own backward, with its real input and output.

    Raw calls (``generate``) have no module of their own; the async node's
    own backward sees them in ``ctx.inner_calls``.
    """
    module = call["module"]
    if module is None:
        return
    args = call.get("args", ())
    ctx = BackwardContext(
        node_id=f"{node.id}/{call['path']}",
        module_path=call["path"],
        args=tuple(args),
        kwargs=dict(call.get("kwargs", {})),
        input_names=_input_names(module, len(args)),
        output=call["output"],
        feedback=feedback,
    )
    result = module.backward(feedback, ctx)
    if inspect.isawaitable(result):
        result = await result
    result = await _resolved(module, ctx.node_id, result)
    own = dict(module.named_parameters())
    for name, text in result.parameter_feedback.items():
        if name in own:
            _to_parameter(own[name], f"{call['path']}.{name}", text, report, level)
