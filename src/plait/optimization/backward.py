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
* calls made inside an ``async def forward`` node are replayed to their own
  modules' ``backward``, so parameters used inside agents and loops learn too;
* a parameter formatted into an input (``f"{self.instructions} ..."``) hears
  about the call it took part in.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from plait import _context
from plait.execution.settings import find_resources
from plait.execution.tape import Tape, get_tape, release_tape
from plait.feedback import BackwardContext, BackwardResult, Feedback, clip
from plait.tracing.graph import Node, iter_refs, substitute
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
    outputs: Value | Sequence[Value],
    grad: Any = None,
    *,
    resources: Any = None,
    retain_tape: bool = False,
) -> BackwardReport:
    """Sends feedback backward through the tapes of ``outputs``.

    Args:
        outputs: a training-mode output (or several) with ``meta["_tape_ids"]``.
        grad: the feedback to send; default: each output's own payload (a
            loss Value's `Feedback`).
        resources: resources for backward methods that call LLMs (default:
            those of the active ``ExecutionSettings``).
        retain_tape: keep the tapes for another backward pass.

    Raises:
        ValueError: an output has no tape (it was not produced in training mode).
    """
    # Only a list or tuple means "several outputs": anything else (an eval-mode
    # Feedback, a plain string) is one output, refused below with the hint.
    values = list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    jobs: list[tuple[Tape, str]] = []
    for position, value in enumerate(values):
        tape_ids = value.meta.get("_tape_ids") if isinstance(value, Value) else None
        if not tape_ids:
            raise ValueError(
                f"output {position} ({type(value).__name__}) has no tape ids: it was not "
                "produced in training mode; "
                "call module.train() (or TrainingStep(...).train()) before the forward pass"
            )
        text = _as_text(grad if grad is not None else value)
        jobs.extend((get_tape(tape_id), text) for tape_id in tape_ids)
    report = BackwardReport()
    runner = await _runner_for(resources)
    token = _context.RUN.set(runner) if runner is not None else None
    try:
        await asyncio.gather(*(_backward_tape(tape, text, report) for tape, text in jobs))
    finally:
        if token is not None:
            _context.RUN.reset(token)
    if not retain_tape:
        for tape, _ in jobs:
            release_tape(tape.id)
        for value in values:
            value.meta.pop("_tape_ids", None)
    return report


async def _runner_for(resources: Any) -> Any:
    resources = find_resources(resources)
    if resources is None:
        return None
    from plait.execution.runner import Runner
    from plait.resources import ResourceManager

    return Runner(ResourceManager.shared(resources))


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


def _waves(tape: Tape) -> list[list[Node]]:
    """Returns the nodes grouped so that every node comes after all nodes reading it."""
    graph = tape.graph
    level: dict[str, int] = {}
    for node_id in reversed(graph.topological_order()):
        readers = graph.dependents[node_id]
        level[node_id] = 1 + max((level[r] for r in readers), default=-1)
    waves: dict[int, list[Node]] = defaultdict(list)
    for node_id, depth in level.items():
        waves[depth].append(graph.nodes[node_id])
    return [waves[depth] for depth in sorted(waves)]


async def _backward_tape(tape: Tape, feedback: str, report: BackwardReport) -> None:
    pending: dict[str, list[str]] = defaultdict(list)
    levels = node_levels(tape.graph)
    for output_id in tape.graph.output_ids:
        if output_id in tape.graph.nodes:
            pending[output_id].append(feedback)
        elif output_id in tape.parameters:
            last = 1 + max(levels.values(), default=0)
            _to_parameter(tape.parameters[output_id], output_id[6:], feedback, report, last)
    for wave in _waves(tape):
        ready = [node for node in wave if pending.get(node.id) and node.kind != "input"]
        await asyncio.gather(*(_visit(tape, node, pending, report, levels) for node in ready))


def _combined(items: list[str]) -> str:
    shown = items[:_MAX_ITEMS_PER_NODE]
    text = "\n\n".join(clip(item, 800) for item in shown)
    if len(items) > len(shown):
        text += f"\n\n(and {len(items) - len(shown)} more similar items)"
    return text


async def _visit(
    tape: Tape,
    node: Node,
    pending: dict[str, list[str]],
    report: BackwardReport,
    levels: dict[str, int],
) -> None:
    report.nodes.append(node.id)
    feedback = _combined(pending[node.id])
    level = levels[node.id]
    if node.kind == "op":
        for ref in _refs((node.args, node.kwargs)):
            _send(tape, ref, feedback, pending, report, via=node.id, level=level)
        return
    ctx = _context_of(tape, node, feedback)
    result = node.module.backward(feedback, ctx)
    if inspect.isawaitable(result):
        result = await result
    _apply(tape, node, ctx, result, pending, report, level)
    await asyncio.gather(
        *(_replay_inner_call(tape, node, call, feedback, report, level) for call in ctx.inner_calls)
    )


def _context_of(tape: Tape, node: Node, feedback: str) -> BackwardContext:
    def lookup(ref: str) -> Any:
        value = tape.results.get(ref)
        return value.payload if value is not None else tape.parameters[ref].value

    args = substitute(node.args, lookup)
    kwargs = substitute(node.kwargs, lookup)
    return BackwardContext(
        node_id=node.id,
        module_path=node.module_path,
        args=args,
        kwargs=kwargs,
        input_names=_input_names(node.module, len(args)),
        output=tape.results[node.id].payload,
        feedback=feedback,
        inner_calls=tape.results[node.id].meta.get("_inner_calls", []),
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
    node: Node,
    ctx: BackwardContext,
    result: BackwardResult,
    pending: dict[str, list[str]],
    report: BackwardReport,
    level: int,
) -> None:
    for name, text in result.input_feedback.items():
        for ref in _refs(_recorded_input(node, ctx, name)):
            _send(tape, ref, text, pending, report, via=node.id, level=level)
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


def _recorded_input(node: Node, ctx: BackwardContext, name: str) -> Any:
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
) -> None:
    if ref.startswith("param:"):
        param = tape.parameters.get(ref)
        if param is not None:
            note = f"This text was part of the input of step {via}.\n{text}"
            _to_parameter(param, ref[6:], note, report, level)
        return
    pending[ref].append(text)


def _to_parameter(param: Any, name: str, text: str, report: BackwardReport, level: int) -> None:
    if param.requires_grad:
        param.accumulate_feedback(text)
        report.parameters[name] = report.parameters.get(name, 0) + 1
        report.levels[name] = min(report.levels.get(name, level), level)
        known = param.graph_level
        param.graph_level = level if known is None else min(known, level)


async def _replay_inner_call(
    tape: Tape,
    node: Node,
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
    own = dict(module.named_parameters())
    for name, text in result.parameter_feedback.items():
        if name in own:
            _to_parameter(own[name], f"{call['path']}.{name}", text, report, level)
