"""The options several commands share (``run``/``eval``'s files and limits, the budget,
``--estimate``), their value types, the ``--resources`` example their help ends with, and
the settings behind them.

The names are the ``plait.cli`` package's own, for its commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from plait.cli.datasets import FORMATS

_REPORT_SAMPLE = 20_000
"""Node and request spans a CLI run keeps for its trace (counters stay exact)."""


_RESOURCES_EXAMPLE = """\
# res.toml: a table per alias the program calls; ["*"] serves all the others
[llm]
provider = "openai"             # openai, anthropic or local
model = "gpt-4o-mini"
api_key_env = "OPENAI_API_KEY"  # or base_url = "http://localhost:8000/v1"
max_concurrent = 32             # also rpm, tpm, timeout, max_retries, cache
rpm = 500
["*"]
provider = "local"              # the embedded model: no key, no network
"""
"""What a ``--resources`` file looks like (the same example is in docs/how-to/run-files.md)."""


_RESOURCES_HELP = "\b\n--resources names a TOML, YAML or JSON file such as:\n\n\b\n" + "\n".join(
    f"  {line}" for line in _RESOURCES_EXAMPLE.splitlines()
)


class WholeNumber(click.IntRange):
    """A count (at least ``min``, at most ``max``); "'abc' is not a valid whole number",
    not click's "... integer range", which reads as if a range were wanted. Every
    whole-number option of the CLI has this type."""

    name = "whole number"


class Amount(click.FloatRange):
    """An amount such as dollars or seconds (at least ``min``); "'abc' is not a valid
    number", not click's "... float range". Every decimal option of the CLI has this type."""

    name = "number"


common_run_options = [
    click.option("-i", "--input", "input_path", type=click.Path(path_type=Path), required=True,
                 help="Rows to run: .jsonl, .csv or .parquet."),
    click.option("-o", "--output", "output_path", type=click.Path(path_type=Path), required=True,
                 help="Where outputs go, one row per input row, in input order."),
    click.option("-r", "--resources", type=click.Path(path_type=Path),
                 help="Endpoints file (.toml, .yaml, .json): alias -> provider settings "
                      "(example below)."),
    click.option("--checkpoint-dir", type=click.Path(path_type=Path),
                 help="Makes the run resumable: rerun with the same directory to continue."),
    click.option("--state", "state", metavar="URL",
                 help="State store (postgresql://user@host:port/db?schema=NAME, or an SQLite "
                      "path): endpoints with cache = true share their replies there."),
    click.option("--max-concurrent", type=WholeNumber(min=1),
                 help="Most LLM calls in flight at once (endpoint limits apply too)."),
    click.option("--chunk-size", type=WholeNumber(min=1), default=2000, show_default=True,
                 help="Rows read and run at a time; memory is bounded by it."),
    click.option("--column", "columns", multiple=True, metavar="ARG=COLUMN",
                 help="Fill the program's input ARG from COLUMN (default: the column named ARG)."),
    click.option("--input-format", type=click.Choice(FORMATS), help="Default: from the suffix."),
    click.option("--output-format", type=click.Choice(FORMATS), help="Default: from the suffix."),
    click.option("--load", type=click.Path(path_type=Path, exists=True, dir_okay=False),
                 help="Parameters saved by Module.save or `plait train --save`."),
    click.option("--report", "report_path", type=click.Path(path_type=Path),
                 help="Where the run report goes (default: beside the output, *.run.json)."),
    click.option("--trace", "trace_path", type=click.Path(path_type=Path),
                 help="Also write a Perfetto / Chrome trace of the run here."),
    click.option("--no-inputs", is_flag=True, help="Write only row number and outputs."),
    click.option("--timeout", type=Amount(min=0, min_open=True),
                 help="Seconds per LLM request attempt."),
    click.option("--progress/--no-progress", default=None,
                 help="Progress bar on stderr (default: when it is a terminal)."),
]  # fmt: skip


_ESTIMATE_STOPPED = "nothing ran but the sample's calls"


estimate_options = [
    click.option("--estimate", is_flag=True,
                 help="Print the calls, tokens and dollars it would spend (low / expected / "
                      "high), measured on --sample rows run for real (train also makes one "
                      "optimizer step on a copy); nothing else runs."),
    click.option("--sample", type=WholeNumber(min=0), default=2, show_default=True,
                 help="Rows --estimate runs for real to measure one run (0: none)."),
]  # fmt: skip


budget_options = [
    click.option("--max-calls", type=WholeNumber(min=0), help="Most model calls to send."),
    click.option("--max-tokens", type=WholeNumber(min=0), help="Most tokens to spend."),
    click.option("--max-cost", type=Amount(min=0),
                 help="Most dollars to spend (every endpoint needs a price)."),
]  # fmt: skip
"""The hard budget of ``plait train`` and ``plait eval`` (`plait.resources.usage.Budget`)."""


def _with(options: list[Any]) -> Any:
    def decorate(function: Any) -> Any:
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


def _budget(kwargs: dict[str, Any]) -> Any:
    """Returns the `Budget` of ``--max-calls``, ``--max-tokens`` and ``--max-cost`` (None
    when none is given, or the command has none)."""
    # import time: `plait --help` loads none of this, the command does
    from plait.resources.usage import Budget

    return Budget.of(kwargs.get("max_calls"), kwargs.get("max_tokens"), kwargs.get("max_cost"))
