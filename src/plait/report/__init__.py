"""Seeing a run: a `RunReport` of one run, its Perfetto trace, and an HTML page with plots.

A `RunReport` is plain data (usage, cost, timings, retries, errors, the
program graph, training scores) built from a `plait.profiling.Profiler`
and saved as JSON (``run.json``)::

    outputs, report = await plait.run(program, rows, resources=config, report=True)
    print(report.summary())
    report.save("run.json")
    report.save_trace("trace.json")         # ui.perfetto.dev / chrome://tracing

``plait report run.json -o report.html`` (or `write_html`) draws it as one
self-contained page; that needs the ``report`` extra (plotly), loaded only then.
"""

from plait.report.run_report import RunReport, RunReportError, graph_data

__all__ = ["RunReport", "RunReportError", "graph_data", "write_html"]


def write_html(report: RunReport, path: str) -> None:
    """Writes ``report`` as one self-contained HTML page of plots (needs plotly)."""
    from plait.report.html import write_html as write

    write(report, path)
