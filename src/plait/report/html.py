"""One self-contained HTML page of a `RunReport`, with plots drawn by plotly.

Every plot is a plotly figure; plotly.js is inlined once, so the page opens
anywhere with no network. Every value that came from the run (module paths,
aliases, node names, item numbers, error messages) is escaped, in the page and
in the plots' labels: a report shows what a run wrote as text and never runs it.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from typing import Any

from plait import _files
from plait.report.fallbacks import budget_lines, fallback_lines
from plait.report.run_report import PRICE_HINT, RunReport

__all__ = ["render_html", "write_html"]

_COLORS = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6"]


def _go() -> Any:
    try:
        import plotly.graph_objects as go  # optional extra (plait[report])
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "the HTML report needs plotly: pip install 'plait[report]'", name="plotly"
        ) from exc
    return go


def _label(text: Any) -> str:
    """Returns text for a plotly label: plotly draws some HTML in labels (links, bold),
    so the run's text is escaped to be shown as written (plotly decodes ``&amp;``,
    ``&lt;`` and ``&gt;``, not ``&quot;``, so quotes stay as they are)."""
    return html.escape(str(text), quote=False)


def _figure_html(figure: Any, div_id: str) -> str:
    """Returns a figure as its title (a heading of the page) above its plot.

    Plotly draws a title inside the plot's top margin, where its toolbar appears too: a
    title longer than the space left of the toolbar was hidden under it. The heading
    stands above the plot instead, so nothing covers it.
    """
    title = figure.layout.title.text or ""
    figure.update_layout(
        title=None,
        template="plotly_white",
        margin={"l": 60, "r": 20, "t": 40, "b": 50},
        height=340,
    )
    plot = figure.to_html(
        full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False}
    )
    # the title was escaped for plotly (`_label`): undone, then escaped for HTML
    heading = html.escape(html.unescape(title))
    return f"<h3 class='plot-title'>{heading}</h3>{plot}" if heading else plot


_WAITING = "waiting for a slot"
_REQUEST = "request"
_WHOLE = "whole call"


def latency_figure(report: RunReport) -> Any:
    """Box plots of each module's calls (seconds): the wait for a slot and the request apart.

    A call queued behind others on a busy endpoint is slow for want of a
    slot, not because the endpoint is: the "waiting" box is the time its
    model calls waited for limits (a slot, a rate, a pause), the "request"
    box the rest (the requests and the module's own work). Reports written
    before waits were kept show the whole call.
    """
    go = _go()
    parts: dict[str, tuple[list[str], list[float]]] = {}

    def add(part: str, path: str, seconds: list[float]) -> None:
        names, values = parts.setdefault(part, ([], []))
        names += [_label(path)] * len(seconds)
        values += seconds

    for path, summary in report.modules.items():
        totals, waits = summary["samples"], summary.get("wait_samples")
        if waits is None or len(waits) != len(totals):
            add(_WHOLE, path, totals)
            continue
        add(_REQUEST, path, [total - wait for total, wait in zip(totals, waits, strict=True)])
        add(_WAITING, path, waits)
    figure = go.Figure()
    colors = {_REQUEST: _COLORS[0], _WAITING: _COLORS[1], _WHOLE: _COLORS[4]}
    for part, (names, values) in parts.items():
        figure.add_trace(
            go.Box(
                x=names,
                y=values,
                name=part,
                boxpoints="outliers",
                marker_color=colors[part],
                hovertemplate="%{x}: %{y:.3f} s %{fullData.name}<extra></extra>",
            )
        )
    figure.update_layout(
        title="Module calls: the request, and the wait for a slot",
        yaxis_title="seconds",
        boxmode="group",
        legend={"orientation": "h", "y": -0.2},
    )
    return figure


def traffic_figure(report: RunReport) -> Any:
    """Mean requests in flight (lines) and 429s (bars) over time, per endpoint."""
    go = _go()
    figure = go.Figure()
    for i, (endpoint, series) in enumerate(report.timeline.items()):
        color = _COLORS[i % len(_COLORS)]
        ends = _bucket_ends(series)
        figure.add_trace(
            go.Scatter(
                x=ends,
                y=_held(series["in_flight"]),
                mode="lines",
                name=f"{_label(endpoint)}: in flight",
                line={"color": color, "shape": "hv"},
            )
        )
        figure.add_trace(
            go.Scatter(
                x=ends,
                y=_held(series["waiting"]),
                mode="lines",
                name=f"{_label(endpoint)}: waiting",
                line={"color": color, "dash": "dot", "shape": "hv"},
            )
        )
        figure.add_trace(
            go.Bar(
                x=series["t"],
                y=series["rate_limited"],
                name=f"{_label(endpoint)}: 429s",
                marker_color="#E45756",
                opacity=0.7,
                yaxis="y2",
            )
        )
    figure.update_layout(
        title="Requests in flight and 429s per endpoint",
        xaxis_title="seconds since start",
        yaxis={"title": "requests (mean per bucket)", "rangemode": "tozero"},
        yaxis2={"title": "429s", "overlaying": "y", "side": "right", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.25},
        barmode="overlay",
    )
    return figure


def _bucket_ends(series: dict[str, Any]) -> list[float]:
    """Returns a timeline's bucket starts and the last bucket's end.

    Each value holds for its whole bucket, so its line is drawn to the bucket's end: an
    endpoint busy in one bucket alone (a fallback's backup that served a short burst) then
    draws a line, which a single point would not.
    """
    starts = list(series["t"])
    if not starts:
        return starts
    step = series.get("step") or (starts[-1] - starts[-2] if len(starts) > 1 else 0.1)
    return [*starts, starts[-1] + step]


def _held(values: list[float]) -> list[float]:
    """Returns a timeline's values with the last one held to the last bucket's end."""
    return [*values, values[-1]] if values else values


def cost_figure(report: RunReport) -> Any:
    """Cost (dollars) per alias that has a price, with tokens and calls on hover."""
    go = _go()
    aliases = [alias for alias in report.aliases if alias not in report.unpriced]
    totals = [report.aliases[a] for a in aliases]
    figure = go.Figure(
        go.Bar(
            x=[_label(alias) for alias in aliases],
            y=[t.get("cost", 0.0) for t in totals],
            marker_color=_COLORS[0],
            customdata=[
                [
                    int(t.get("calls", 0)),
                    int(t.get("input_tokens", 0)),
                    int(t.get("output_tokens", 0)),
                ]
                for t in totals
            ],
            hovertemplate="%{x}: $%{y:.4f}<br>%{customdata[0]} calls, "
            "%{customdata[1]} in / %{customdata[2]} out tokens<extra></extra>",
        )
    )
    unpriced = f" (no price set for {', '.join(report.unpriced)})" if report.unpriced else ""
    figure.update_layout(
        title=_label(f"Cost by alias{unpriced}"), yaxis_title="dollars", xaxis_title="alias"
    )
    return figure


def _cost_notice() -> str:
    """Stands where the cost chart would be when no alias has a price: a chart of zeros
    would say the run cost nothing."""
    return (
        "<div class='plot notice' id='cost-notice'><h3>Cost</h3><p>No prices set, so the "
        f"cost of this run is unknown: {html.escape(PRICE_HINT)}.</p></div>"
    )


def _levels(nodes: list[dict[str, Any]]) -> dict[str, int]:
    level: dict[str, int] = {}
    for node in nodes:  # recorded in a topological order
        deps = [level[d] for d in node["dependencies"] if d in level]
        level[node["id"]] = 1 + max(deps) if deps else 0
    return level


def graph_figure(report: RunReport) -> Any:
    """The program graph, drawn in layers: inputs on top, each node below what it reads."""
    go = _go()
    nodes = report.graph["nodes"] if report.graph else []
    level = _levels(nodes)
    rows: dict[int, list[str]] = {}
    for node in nodes:
        rows.setdefault(level[node["id"]], []).append(node["id"])
    position = {}
    for depth, ids in rows.items():
        for i, node_id in enumerate(ids):
            position[node_id] = (i - (len(ids) - 1) / 2, -depth)
    edge_x: list[float | None] = []
    edge_y: list[float | None] = []
    for node in nodes:
        for dep in node["dependencies"]:
            if dep in position:
                (x0, y0), (x1, y1) = position[dep], position[node["id"]]
                edge_x += [x0, x1, None]
                edge_y += [y0, y1, None]
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(x=edge_x, y=edge_y, mode="lines", line={"color": "#999"}, hoverinfo="skip")
    )
    kinds = {"input": _COLORS[2], "op": _COLORS[4]}
    figure.add_trace(
        go.Scatter(
            x=[position[n["id"]][0] for n in nodes],
            y=[position[n["id"]][1] for n in nodes],
            mode="markers+text",
            text=[_label(n["id"]) for n in nodes],
            textposition="middle right",
            marker={
                "size": 18,
                "symbol": ["diamond" if n["llm"] else "circle" for n in nodes],
                "color": [
                    _COLORS[1] if n["llm"] else kinds.get(n["kind"], _COLORS[0]) for n in nodes
                ],
            },
            hovertext=[_label(f"{n['name']} ({n['kind']})") for n in nodes],
            hoverinfo="text",
        )
    )
    figure.update_layout(
        title="Program graph (diamonds: LLM calls)",
        showlegend=False,
        xaxis={"visible": False},
        yaxis={"visible": False},
    )
    return figure


def training_figures(report: RunReport) -> list[Any]:
    """Validation score per epoch, and accepted / discarded / rejected updates per step."""
    go = _go()
    training = report.training or {}
    scores = [training.get("initial_score"), *training.get("scores", [])]
    score = go.Figure(
        go.Scatter(x=list(range(len(scores))), y=scores, mode="lines+markers", name="validation")
    )
    score.update_layout(
        title="Validation score per epoch (0: before training)",
        xaxis_title="epoch",
        yaxis_title="score",
        xaxis={"dtick": 1},
    )
    history = training.get("history", [])
    steps = list(range(1, len(history) + 1))
    updates = go.Figure(
        [
            go.Bar(x=steps, y=[h["accepted"] for h in history], name="accepted",
                   marker_color=_COLORS[2]),
            # Applied, then undone by keep-best (reports written before this count had none).
            go.Bar(x=steps, y=[h.get("discarded", 0) for h in history], name="discarded",
                   marker_color=_COLORS[1]),
            go.Bar(x=steps, y=[h["rejected"] for h in history], name="rejected",
                   marker_color=_COLORS[3]),
        ]
    )  # fmt: skip
    updates.update_layout(
        title="Parameter updates per optimizer step",
        barmode="stack",
        xaxis_title="step",
        yaxis_title="updates",
    )
    return [score, updates]


def _table(rows: Iterable[tuple[str, Any]]) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    return f"<table class='facts'>{cells}</table>"


_MAX_LEARNING_ROWS = 2000
"""Rows of the learning table; a longer run says how many more its run.json keeps."""


def _learning(report: RunReport) -> str:
    """Returns the learning steps as one table, each step under the step it happened in."""
    if not report.learning:
        return ""
    ordered = _tree_order(report.learning)
    rows = "".join(_learning_row(step, depth) for step, depth in ordered[:_MAX_LEARNING_ROWS])
    more = len(ordered) - _MAX_LEARNING_ROWS
    tail = f"<p>… and {more} more steps kept in the report.</p>" if more > 0 else ""
    return (
        "<h2>Learning steps</h2><p class='sub'>Every step of the optimisation: candidates "
        "with their validation scores, proposals, decisions with their evidence, parameter "
        f"updates (sizes and hashes).</p><table class='learning'>{rows}</table>{tail}"
    )


def _tree_order(steps: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """Returns the steps depth first (children in the order they started), with their depth.

    Each step is drawn once: an edited file whose ids repeat or loop cannot make it
    loop; a step whose parent is unknown, or that no chain of parents reaches from
    the top, is drawn at the top.
    """
    known = {step["id"] for step in steps}
    children: dict[Any, list[int]] = {}
    for position, step in enumerate(steps):
        parent = step["parent"] if step["parent"] in known else None
        children.setdefault(parent, []).append(position)
    ordered: list[tuple[dict[str, Any], int]] = []
    drawn: set[int] = set()
    pending = [(position, 0) for position in reversed(children.get(None, []))]
    while pending:
        position, depth = pending.pop()
        if position in drawn:
            continue
        drawn.add(position)
        ordered.append((steps[position], depth))
        below = children.get(steps[position]["id"], [])
        pending += [(child, depth + 1) for child in reversed(below)]
    ordered += [(step, 0) for position, step in enumerate(steps) if position not in drawn]
    return ordered


_TITLE_KEYS = {
    "optimize": "optimizer",
    "round": "round",
    "candidate": "candidate",
    "proposal": "parameter",
    "update": "parameter",
}
"""The fact each kind of step is named by (a decision is named by its outcome)."""


def _learning_row(step: dict[str, Any], depth: int) -> str:
    kind = step["kind"]
    facts = {**step["inputs"], **(step.get("outputs") or {})}
    outcome = ""
    if kind == "decision":
        outcome = "accepted" if facts.pop("accepted", False) else "rejected"
        title = f"decision: {outcome}"
    else:
        named = facts.pop(_TITLE_KEYS.get(kind, ""), None)
        title = kind if named is None else f"{kind} {named}"
    text = "; ".join(
        f"{key} {_fact(value)}" for key, value in facts.items() if value not in (None, "")
    )
    if kind == "optimize" and "best_score" in facts:
        text = (
            f"validation {_fact(facts.get('start_score'))} → {_fact(facts['best_score'])}; {text}"
        )
    if step.get("error"):
        text = f"failed: {step['error']}; {text}"
    return (
        f"<tr class='step {kind} {outcome}' data-depth='{depth}'>"
        f"<td class='what' style='padding-left:{0.3 + 1.5 * depth:.1f}em'>{html.escape(title)}</td>"
        f"<td class='facts'>{html.escape(text)}</td></tr>"
    )


def _fact(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 200 else f"{text[:200]}…"
    return str(value)


def _fallback_facts(report: RunReport) -> list[tuple[str, str]]:
    """Returns a row per endpoint of each fallback chain at work (what it served and
    failed, when its circuit opened) and per budget (spent, held, left)."""
    rows = []
    for alias, members in report.fallbacks.items():
        for line in fallback_lines({alias: members})[1:]:
            rows.append((f"fallback {alias!r}", line.strip()))
    for line in budget_lines(report.budgets):
        name, _, books = line.partition(": ")
        rows.append((name, books))
    return rows


def _failures(report: RunReport) -> str:
    if not report.failures:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(str(f['index']))}</td>"
        f"<td>{html.escape(str(f.get('node') or ''))}</td><td>{html.escape(f['error_type'])}</td>"
        f"<td>{html.escape(f['message'][:300])}</td></tr>"
        for f in report.failures[:50]
    )
    more = len(report.failures) - 50
    tail = f"<p>… and {more} more kept in the report.</p>" if more > 0 else ""
    return (
        "<h2>Failed items</h2><table class='failures'><tr><th>item</th><th>node</th>"
        f"<th>error</th><th>message</th></tr>{rows}</table>{tail}"
    )


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2em; } .sub { color: #666; margin-top: 0; }
h3.plot-title { font-size: 100%; font-weight: 600; margin: 0.6em 0 0 60px; }
table.facts th { text-align: left; padding-right: 2em; font-weight: 600; }
table.failures { border-collapse: collapse; font-size: 90%; }
table.failures td, table.failures th { border: 1px solid #ddd; padding: 4px 8px; }
.plots { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
.plots .wide { grid-column: 1 / span 2; }
pre.mermaid { background: #f6f6f6; padding: 1em; font-size: 85%; }
.notice { border: 1px solid #ddd; padding: 0 1em; color: #444; }
table.learning { border-collapse: collapse; font-size: 90%; width: 100%; }
table.learning td { border-bottom: 1px solid #eee; padding: 3px 8px; vertical-align: top; }
table.learning td.what { white-space: nowrap; font-weight: 600; }
table.learning tr.accepted td.what { color: #1a7f37; }
table.learning tr.rejected td.what { color: #b35900; }
"""


def _plots(report: RunReport) -> str:
    """Returns the plots the report has data for, in order, each in its own ``div``."""
    figures: list[tuple[str, Any, bool]] = []
    if report.modules:
        figures.append(("latency", latency_figure(report), False))
    priced = any(alias not in report.unpriced for alias in report.aliases)
    if priced:
        figures.append(("cost", cost_figure(report), False))
    if report.timeline:
        figures.append(("traffic", traffic_figure(report), True))
    if report.training:
        score, updates = training_figures(report)
        figures += [("validation", score, False), ("updates", updates, False)]
    if report.graph:
        figures.append(("graph", graph_figure(report), True))
    blocks = [
        f"<div class='plot{' wide' if wide else ''}'>{_figure_html(figure, f'plot-{name}')}</div>"
        for name, figure, wide in figures
    ]
    if report.aliases and not priced:
        blocks.insert(1 if report.modules else 0, _cost_notice())  # where the chart would be
    return "".join(blocks)


def render_html(report: RunReport) -> str:
    """Returns the page as one string (plotly.js inlined)."""
    from plotly.offline import get_plotlyjs  # optional extra (plait[report])

    usage = report.usage
    requests = (
        f"{int(usage['requests'])} ({int(usage['retries'])} retries, "
        f"{int(usage['rate_limited'])} rate-limited, {int(usage['failures'])} failed)"
    )
    facts = [
        ("program", report.program or "(unnamed)"),
        ("kind", report.kind),
        ("wall time", f"{report.wall_time:.2f} s"),
        ("items", report.items_text()),
        ("LLM calls", f"{int(usage['calls'])} ({int(usage.get('cache_hits', 0))} from cache)"),
        ("requests", requests),
        ("tokens", f"{int(usage['input_tokens'])} in, {int(usage['output_tokens'])} out"),
        ("cost", report.cost_text()),
        *_fallback_facts(report),
        *((name, value) for name, value in report.metrics.items()),
    ]  # fmt: skip
    mermaid = ""
    if report.graph and report.graph.get("mermaid"):
        mermaid = (
            "<details><summary>Mermaid source of the graph</summary><pre class='mermaid'>"
            f"{html.escape(report.graph['mermaid'])}</pre></details>"
        )
    sampled = (
        "<p class='sub'>Latency plots and the trace use a uniform sample of the run's spans; "
        "totals and the timeline are exact.</p>"
        if report.sampled
        else ""
    )
    title = html.escape(f"plait run report: {report.program or report.kind}")
    data = html.escape(json.dumps({"format": "plait.run/1", "program": report.program}))
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>{_STYLE}</style>"
        f"<script>{get_plotlyjs()}</script></head><body data-run='{data}'>"
        f"<h1>{title}</h1>{_table(facts)}{sampled}<div class='plots'>{_plots(report)}</div>"
        f"{mermaid}{_learning(report)}{_failures(report)}</body></html>"
    )


def write_html(report: RunReport, path: str) -> None:
    """Writes `render_html` to ``path``, replacing it whole.

    Raises:
        FileError: ``path`` is a symbolic link (never written through) or not a
            regular file, or cannot be written.
    """
    _files.write_atomically(path, render_html(report))
