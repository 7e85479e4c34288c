"""The HTML report: one self-contained page of plotly plots, checked in headless Chromium.

With ``PLAIT_UPDATE_SCREENSHOT=1`` the Chromium test also writes the docs' picture of the
page, ``docs/report.png``, from the report it checked.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
from tests.optimization.test_trainer import exact, examples, model

from plait import LLMInference, Module, Parameter, ResourceConfig, run
from plait.errors import FileError
from plait.optimization import SFAOptimizer, Trainer
from plait.report import RunReport, write_html
from plait.report.learning import LearningLog
from plait.report.profiling import profile
from plait.testing import ScriptedServer
from plait.testing._faults import Fault

pytest.importorskip("plotly")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "report.png"


class Pipeline(Module):
    def __init__(self) -> None:
        super().__init__()
        self.extract = LLMInference("fast", "Extract.")
        self.judge = LLMInference("smart", "Judge.")

    def forward(self, text: str) -> dict:
        facts = self.extract(text)
        return {"facts": facts, "verdict": self.judge(f"{text} / {facts}")}


def hostile(body: dict) -> str:
    text = body["messages"][-1]["content"]
    if "boom" in text:
        raise ValueError("</script><script>window.pwned=1</script>")
    return f"echo: {text}"


async def a_real_report() -> RunReport:
    """A run with 429s and a failed item, then a short training run, both profiled."""
    faults = [Fault(status=429, headers={"Retry-After": "0.01"}, rate=0.2, seed=3)]
    async with (
        ScriptedServer(latency=0.005, responder=hostile) as server,
        ScriptedServer(latency=0.005, faults=faults) as limited,
        ScriptedServer(responder=model("GOOD")) as tutor,
    ):
        config = ResourceConfig(
            {
                "fast": server.endpoint(
                    max_concurrent=4, max_retries=0, price={"input": 0.15, "output": 0.6}
                ),
                "smart": limited.endpoint(
                    max_concurrent=2,
                    max_retries=8,
                    retry_base_delay=0.01,
                    price={"input": 3.0, "output": 15.0},
                ),
                "*": tutor.endpoint(max_retries=0),
            }
        )
        rows = [f"row {i}" for i in range(30)] + ["boom"]
        with profile() as prof:
            await run(Pipeline(), rows, resources=config, on_error="collect")
            task = LLMInference(
                "task", system_prompt=Parameter("PLAIN", description="task instructions")
            )
            trainer = Trainer(
                task, exact, SFAOptimizer(task.named_parameters(), conservatism=0),
                resources=config, train_set=examples("t", 4), val_set=examples("v", 4),
                metric=exact, batch_size=2, progress=False,
            )  # fmt: skip
            with LearningLog() as learning:
                trained = await trainer.fit()
    from plait.execution.graph_cache import trace_cached

    graph = trace_cached(Pipeline(), ("x",), {})
    return prof.report(
        program="Pipeline",
        kind="train",
        graph=graph,
        training=asdict(trained),
        learning=learning.steps,
    )


async def test_the_page_is_self_contained_and_escapes_what_the_run_wrote(tmp_path):
    report = await a_real_report()
    path = tmp_path / "report.html"
    write_html(report, str(path))
    page = path.read_text()

    assert report.usage["rate_limited"] > 0 and report.training["scores"] == [1.0]
    [failure] = report.failures  # the "boom" row, whose reply was hostile text
    assert "pwned" in failure["message"] and failure["node"] == "extract"
    assert page.count("<script") == 1 + 6  # plotly.js, then one per figure, no other
    assert "window.pwned=1</script>" not in page
    assert "raised ValueError: &lt;/script&gt;&lt;script&gt;windo" in page
    assert not re.search(r"<script[^>]+src=", page)  # nothing loaded from elsewhere
    for div in ("plot-latency", "plot-cost", "plot-traffic", "plot-validation", "plot-updates",
                "plot-graph"):  # fmt: skip
        assert f'id="{div}"' in page


PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message)));
const __consoleError = console.error;
console.error = (...args) => { window.__errors.push(args.join(" ")); __consoleError(...args); };
window.addEventListener("load", () => setTimeout(() => {
  const plots = [...document.querySelectorAll(".js-plotly-plot")].map(div => ({
    id: div.id,
    svg: div.querySelectorAll(".main-svg").length,
    width: div.getBoundingClientRect().width,
    marks: div.querySelectorAll(".trace path, .trace .point, .bars path, .boxlayer path").length,
  }));
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({errors: window.__errors, plots, pwned: !!window.pwned});
  document.body.appendChild(probe);
}, 1000));
</script>"""


def open_in_chromium(page: Path, probe: str, tmp_path: Path) -> dict:
    """Loads ``page`` with ``probe`` (a script that writes JSON into ``<pre id="probe">``)
    first in its head, in headless Chromium; returns what the probe wrote."""
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("<head>", "<head>" + probe, 1))
    done = subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1280,2400", "--virtual-time-budget=15000", "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.DOTALL)
    assert found, f"the page did not finish loading; chromium said: {done.stderr[-2000:]}"
    assert "Uncaught" not in done.stderr
    return json.loads(html.unescape(found.group(1)))


def screenshot_in_chromium(page: Path, picture: Path, tmp_path: Path) -> None:
    """Writes a PNG of ``page`` as headless Chromium draws it (1200 px wide, the plots drawn)."""
    done = subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1200,1900", "--virtual-time-budget=15000",
            f"--screenshot={picture}", page.as_uri(),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert picture.exists(), f"no screenshot; chromium said: {done.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")
async def test_the_page_loads_in_headless_chromium_with_no_errors_and_every_plot_drawn(tmp_path):
    report = await a_real_report()
    path = tmp_path / "report.html"
    write_html(report, str(path))

    probe = open_in_chromium(path, PROBE, tmp_path)

    assert probe["errors"] == []
    assert not probe["pwned"]
    plots = {p["id"]: p for p in probe["plots"]}
    assert set(plots) == {
        "plot-latency", "plot-cost", "plot-traffic", "plot-validation", "plot-updates",
        "plot-graph",
    }  # fmt: skip
    for plot in plots.values():
        assert plot["svg"] >= 1 and plot["width"] > 100, plot
        assert plot["marks"] > 0, plot
    if os.environ.get("PLAIT_UPDATE_SCREENSHOT") == "1":
        screenshot_in_chromium(path, tmp_path / "report.png", tmp_path)
        shutil.copyfile(tmp_path / "report.png", SCREENSHOT)


PLOT_PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message)));
window.addEventListener("load", () => setTimeout(() => {
  const latency = document.getElementById("plot-latency");
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({
    errors: window.__errors,
    latency: latency.data.map(t => ({name: t.name, x: [...(t.x || [])], y: [...t.y]})),
    cost_plot: !!document.getElementById("plot-cost"),
    cost_notice: (document.getElementById("cost-notice") || {}).textContent || "",
    facts: [...document.querySelectorAll("table.facts tr")].map(r => r.textContent),
  });
  document.body.appendChild(probe);
}, 1000));
</script>"""


async def a_queued_unpriced_report() -> RunReport:
    """Four items sharing one slot of a 0.2 s endpoint that has no price."""
    async with ScriptedServer(latency=0.2) as server:
        config = {"fast": server.endpoint(max_concurrent=1), "smart": server.endpoint()}
        _, report = await run(Pipeline(), ["a", "b", "c", "d"], resources=config, report=True)
    return report


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")
async def test_the_page_shows_the_wait_for_a_slot_apart_and_says_when_no_prices_are_set(
    tmp_path,
):
    report = await a_queued_unpriced_report()
    path = tmp_path / "report.html"
    write_html(report, str(path))

    probe = open_in_chromium(path, PLOT_PROBE, tmp_path)

    assert probe["errors"] == []
    boxes = {trace["name"]: trace for trace in probe["latency"]}
    assert set(boxes) == {"request", "waiting for a slot"}

    def extract(trace: dict) -> list[float]:
        return [y for x, y in zip(trace["x"], trace["y"], strict=True) if x == "extract"]

    assert max(extract(boxes["waiting for a slot"])) >= 0.4  # the 4th waited for 3 requests
    assert min(extract(boxes["request"])) >= 0.18  # a request takes the endpoint's 0.2 s
    assert len(extract(boxes["request"])) == 4
    assert not probe["cost_plot"]  # no chart of zeros: the cost is unknown, and it says so
    assert "No prices set" in probe["cost_notice"] and '"price"' in probe["cost_notice"]
    assert any(row.startswith("costunknown: no prices set") for row in probe["facts"])


LAYOUT_PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message)));
window.addEventListener("load", () => setTimeout(() => {
  const box = node => { const r = node.getBoundingClientRect();
                        return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  const plots = [...document.querySelectorAll(".js-plotly-plot")].map(div => {
    const wrapper = div.parentElement.closest("div.plot") || div.parentElement;
    const titles = [...wrapper.querySelectorAll(".gtitle, h3.plot-title")];
    const toolbar = div.querySelector(".modebar");
    return {id: div.id, titles: titles.map(t => ({text: t.textContent, box: box(t)})),
            toolbar: toolbar ? box(toolbar) : null};
  });
  const traffic = document.getElementById("plot-traffic");
  const lines = [...traffic.querySelectorAll(".scatterlayer .trace")].map(trace => ({
    name: trace.__data__[0].trace.name,
    d: (trace.querySelector("path.js-line") || {getAttribute: () => ""}).getAttribute("d") || "",
  }));
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({errors: window.__errors, plots, lines});
  document.body.appendChild(probe);
}, 1000));
</script>"""


async def a_fallback_report() -> RunReport:
    """A chain whose primary fails every call and whose backup serves them, all at once."""
    async with (
        ScriptedServer(faults=[Fault(status=500, rate=1.0)]) as primary,
        ScriptedServer(latency=0.01) as backup,
    ):
        config = ResourceConfig(
            {
                "primary": primary.endpoint(max_retries=0),
                "backup": backup.endpoint(max_retries=0),
                "fast": {"fallback": ["primary", "backup"]},
                "smart": {"fallback": ["primary", "backup"]},
            }
        )
        _, report = await run(Pipeline(), ["a", "b", "c"], resources=config, report=True)
    return report


def overlap(a: dict, b: dict) -> bool:
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and (b["top"] < a["bottom"])
    )


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")
async def test_no_toolbar_covers_a_title_and_a_fallbacks_backup_draws_its_line(tmp_path):
    report = await a_fallback_report()
    assert [m["served"] for m in report.fallbacks["fast"]] == [0, 6]  # the backup served all
    path = tmp_path / "report.html"
    write_html(report, str(path))

    probe = open_in_chromium(path, LAYOUT_PROBE, tmp_path)

    assert probe["errors"] == []
    for plot in probe["plots"]:
        assert [t["text"] for t in plot["titles"]], plot  # every plot has its title
        assert plot["toolbar"] is not None, plot
        for title in plot["titles"]:
            assert not overlap(title["box"], plot["toolbar"]), plot
    drawn = {line["name"]: line["d"] for line in probe["lines"]}
    assert set(drawn) >= {"backup: in flight", "primary: in flight"}
    assert all(re.match(r"M[-\d.,]+[LHV]", d) for d in drawn.values()), drawn  # 2 points or more


def test_the_page_never_goes_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "report.html").symlink_to(victim)
    with pytest.raises(FileError, match=r"report\.html is a symbolic link"):
        write_html(RunReport(program="empty"), str(tmp_path / "report.html"))
    assert victim.read_text() == "precious\n"


def test_report_command_writes_the_page(tmp_path):
    from tests.cli.conftest import plait_cli

    saved = tmp_path / "run.json"
    RunReport(program="empty").save(saved)
    done = plait_cli("report", str(saved), "-o", str(tmp_path / "r.html"))
    assert done.code == 0, done.stderr
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")

    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    refused = plait_cli("report", str(bad), "-o", str(tmp_path / "x.html"))
    assert refused.code == 2 and "not a plait run report" in refused.stderr


# ------------------------------------------------------------------ a hostile run.json
SCRIPT = '<script>window.pwned = 1; document.title = "pwned"</script>'
IMAGE = '<img src=x onerror="window.pwned = 1">'
SVG = '<svg onload="window.pwned = 1">'
LINK = '<a href="javascript:window.pwned = 1">a <b>link</b></a>'  # markup plotly would draw


def hostile_report(index: object = 3) -> RunReport:
    """A report whose every text field holds markup, as a hand-edited run.json could."""
    node = {"kind": "input", "module_path": None, "llm": False, "dependencies": []}
    return RunReport(
        program=SCRIPT,
        kind=IMAGE,
        wall_time=1.5,
        items={"ok": 1, "failed": 1},
        aliases={IMAGE: {"calls": 2, "cost": 0.5, "input_tokens": 3, "output_tokens": 4}},
        modules={LINK: {"count": 2, "mean": 0.15, "samples": [0.1, 0.2]}},
        timeline={SVG: {"step": 1.0, "t": [0, 1], "in_flight": [1, 2], "waiting": [0, 1],
                        "requests": [1, 1], "rate_limited": [0, 1], "errors": [0, 0]}},
        failures=[{"index": index, "error_type": IMAGE, "message": SCRIPT, "node": SVG}],
        graph={
            "nodes": [{**node, "id": SCRIPT, "name": LINK},
                      {**node, "id": SVG, "name": SCRIPT, "kind": IMAGE, "llm": True,
                       "dependencies": [SCRIPT]}],
            "outputs": [SVG],
            "mermaid": SCRIPT,
        },
        training={"initial_score": 0.5, "scores": [1.0],
                  "history": [{"epoch": 1, "accepted": 1, "rejected": 0}]},
        metrics={SVG: SCRIPT},
    )  # fmt: skip


TEXT_PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message)));
window.addEventListener("load", () => setTimeout(() => {
  const text = selector => [...document.querySelectorAll(selector)].map(e => e.textContent);
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({
    pwned: !!window.pwned, title: document.title, errors: window.__errors,
    facts: text("table.facts td"), failures: text("table.failures td"),
    mermaid: text("pre.mermaid"), plots: text(".js-plotly-plot svg text"),
  });
  document.body.appendChild(probe);
}, 1000));
</script>"""


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")
def test_a_hostile_run_json_is_drawn_as_text_and_runs_nothing_in_the_browser(tmp_path):
    from tests.cli.conftest import plait_cli

    saved = tmp_path / "run.json"
    hostile_report().save(saved)
    page = tmp_path / "report.html"

    done = plait_cli("report", str(saved), "-o", str(page))
    assert done.code == 0, done.stderr
    probe = open_in_chromium(page, TEXT_PROBE, tmp_path)

    assert not probe["pwned"] and probe["errors"] == []
    assert probe["title"] == f"plait run report: {SCRIPT}"
    assert SCRIPT in probe["facts"] and IMAGE in probe["facts"]
    assert probe["failures"] == ["3", SVG, IMAGE, SCRIPT]
    assert probe["mermaid"] == [SCRIPT]
    drawn = "\n".join(probe["plots"])  # legends, ticks and labels of the plotly figures
    for markup in (SCRIPT, IMAGE, SVG, LINK):
        assert markup in drawn


def test_a_failure_index_that_is_not_a_number_is_refused_naming_the_field(tmp_path):
    from tests.cli.conftest import plait_cli

    saved = tmp_path / "run.json"
    hostile_report(index=SCRIPT).save(saved)
    page = tmp_path / "report.html"

    done = plait_cli("report", str(saved), "-o", str(page))

    assert done.code == 2 and "Traceback" not in done.stderr
    assert f"plait: error: {saved}: failures[0].index " in done.stderr
    assert not page.exists()


def test_every_value_of_a_report_built_in_code_is_escaped(tmp_path):
    page = tmp_path / "report.html"
    write_html(hostile_report(index=SCRIPT), str(page))

    text = page.read_text()
    for markup in (SCRIPT, IMAGE, SVG, LINK):
        assert markup not in text
    assert f"<tr><td>{html.escape(SCRIPT)}</td>" in text  # the index cell


LEARNING_PROBE = """<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message)));
window.addEventListener("load", () => setTimeout(() => {
  const rows = [...document.querySelectorAll("table.learning tr.step")].map(row => ({
    step: row.querySelector("td.what").textContent,
    depth: Number(row.dataset.depth),
    cls: row.className,
    facts: row.querySelector("td.facts").textContent,
  }));
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({errors: window.__errors, rows, pwned: !!window.pwned});
  document.body.appendChild(probe);
}, 500));
</script>"""


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")
async def test_the_learning_steps_show_as_a_nested_table_with_their_evidence(tmp_path):
    report = await a_real_report()
    hostile_reason = "</td></table><script>window.pwned=1</script>"
    root = report.learning[0]["id"]
    report.learning.append(
        {"id": 999, "parent": root, "kind": "decision",
         "inputs": {"accepted": False, "rule": "a rule", "reason": hostile_reason}}
    )  # fmt: skip
    path = tmp_path / "report.html"
    write_html(report, str(path))

    probe = open_in_chromium(path, LEARNING_PROBE, tmp_path)

    assert probe["errors"] == [] and not probe["pwned"]
    rows = probe["rows"]
    assert len(rows) == len(report.learning)
    assert rows[0]["step"] == "optimize Trainer" and rows[0]["depth"] == 0
    assert "validation 0.5 → 1" in rows[0]["facts"]
    top = [row["step"] for row in rows if row["depth"] == 1]
    assert top == ["candidate 0", "round 1", "round 2", "candidate 1", "decision: accepted",
                   "decision: rejected"]  # fmt: skip
    round_one = rows[[r["step"] for r in rows].index("round 1") + 1 :]
    assert [r["step"] for r in round_one[:3]] == ["backward", "proposal system_prompt",
                                                 "decision: accepted"]  # fmt: skip
    assert round_one[1]["depth"] == 2 and round_one[2]["depth"] == 3
    kept = next(row for row in rows if row["step"] == "decision: accepted" and row["depth"] == 1)
    assert "accepted" in kept["cls"] and "keep-best" in kept["facts"]
    assert "old_score 0.5" in kept["facts"] and "new_score 1" in kept["facts"]
    update = next(row for row in rows if row["step"] == "update system_prompt")
    assert "new_chars 10" in update["facts"] and "GOOD" not in update["facts"]
    assert rows[-1]["step"] == "decision: rejected" and hostile_reason in rows[-1]["facts"]


def test_learning_steps_whose_ids_repeat_or_loop_are_each_drawn_once(tmp_path):
    import threading

    from plait.report.html import render_html

    steps = [
        {"id": 1, "parent": None, "kind": "optimize", "inputs": {"optimizer": "Edited"}},
        {"id": 1, "parent": 1, "kind": "round", "inputs": {"round": 1}},  # its own parent
        {"id": 2, "parent": 3, "kind": "candidate", "inputs": {"candidate": 0}},
        {"id": 3, "parent": 2, "kind": "candidate", "inputs": {"candidate": 1}},  # a loop
    ]
    report = RunReport(program="edited", kind="train", learning=steps)
    pages: list[str] = []
    drawing = threading.Thread(target=lambda: pages.append(render_html(report)), daemon=True)
    drawing.start()
    drawing.join(timeout=60)  # a loop would never end; drawing takes well under a second

    assert pages, "drawing the page did not end"
    assert pages[0].count("<tr class='step") == len(steps)
