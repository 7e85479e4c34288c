"""A saved run report is the same JSON as ``json.dump`` of ``asdict`` made it, for less CPU
(issue 39); the spans' flat shape is pinned in tests/test_usage_record.py."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from plait.report.profiling import NodeTiming
from plait.report.run_report import FORMAT, RunReport


def test_a_saved_report_reads_back_as_asdict_and_json_dump_wrote_it(tmp_path: Path):
    nodes = [NodeTiming(f"n{i}", "summary", i, 0.5, 0.75).span() for i in range(2500)]
    report = RunReport(
        program="p.py:P",
        spans={"nodes": nodes, "requests": []},  # written a thousand at a time
        metrics={"score": 0.5, "when": Path("x")},  # not JSON: written as its text
        failures=[{"item": 1, "error": "ValueError: bad é"}],
    )
    path = tmp_path / "run.json"

    report.save(path)

    expected = json.dumps({"format": FORMAT, **asdict(report)}, ensure_ascii=False, default=str)
    assert path.read_text(encoding="utf-8") == expected + "\n"
    assert report.to_dict() == json.loads(expected) | {"metrics": report.metrics}
