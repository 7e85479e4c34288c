"""The observability layer: profiling a run, reporting it, and exporting its spans.

`profiling.py` records what ran (`profile()`, `Profiler`), `run_report.py` turns
those records into a `RunReport` of one run, `perfetto.py` its Perfetto trace,
`html.py` an HTML page with plots, `telemetry.py` sends every call (and every
learning step) as an OpenTelemetry span as it happens, and `learning.py` keeps a
run's learning steps for its report.

A `RunReport` is plain data (usage, cost, timings, retries, errors, the
program graph, training scores) built from a `Profiler` and saved as JSON
(``run.json``)::

    outputs, report = await plait.run(program, rows, resources=config, report=True)
    print(report.summary())
    report.save("run.json")
    report.save_trace("trace.json")         # ui.perfetto.dev / chrome://tracing

``plait report run.json -o report.html`` (or `write_html`) draws it as one
self-contained page; that needs the ``report`` extra (plotly), loaded only then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait import _lazy

if TYPE_CHECKING:
    from plait.report.run_report import RunReport, RunReportError, graph_data

# Loaded on first use, so that profiling a run (`plait.report.profiling`, in
# this package) does not also load the report it may never build.
_HOMES = {
    "RunReport": "plait.report.run_report",
    "RunReportError": "plait.report.run_report",
    "graph_data": "plait.report.run_report",
}

__all__ = ["RunReport", "RunReportError", "graph_data", "write_html"]


def write_html(report: RunReport, path: str) -> None:
    """Writes ``report`` as one self-contained HTML page of plots (needs plotly)."""
    # optional extra (plait[report]): html loads plotly
    from plait.report.html import write_html as write

    write(report, path)


__getattr__, __dir__ = _lazy.exports("plait.report", _HOMES, globals(), __all__)
