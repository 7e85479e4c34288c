"""Perfetto / Chrome traces of real runs: one process per endpoint and module, lanes that nest."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict

from plait import LLMInference, Module, run
from plait.report.profiling import profile
from plait.testing import ScriptedServer
from plait.testing._faults import Fault


class Fan(Module):
    def __init__(self) -> None:
        super().__init__()
        self.left = LLMInference("fast")
        self.right = LLMInference("slow")

    def forward(self, text: str) -> dict:
        return {"left": self.left(text), "right": self.right(text)}


def assert_lanes_do_not_overlap(events: list[dict]) -> None:
    lanes = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            lanes[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in lanes.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end - 1.0  # 1 µs of rounding


async def test_profile_save_writes_a_trace_with_a_track_per_endpoint_and_module(tmp_path):
    faults = [Fault(status=500, times=1)]
    async with (
        ScriptedServer(latency=0.01) as fast,
        ScriptedServer(latency=0.01, faults=faults) as slow,
    ):
        config = {
            "fast": fast.endpoint(max_concurrent=2),
            "slow": slow.endpoint(max_concurrent=1, max_retries=2, retry_base_delay=0.01),
        }
        with profile() as prof:
            await run(Fan(), ["a", "b", "c"], resources=config)
    path = tmp_path / "trace.json"
    prof.save(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]

    processes = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {"endpoint fast", "endpoint slow", "module left", "module right"}
    spans = [e for e in events if e["ph"] == "X"]
    names = {e["name"] for e in spans}
    assert {"request", "wait", "500", "backoff", "retry 1", "left", "right"} <= names
    assert_lanes_do_not_overlap(events)
    # the failed attempt and its retry are on the same lane, in order
    failed = next(e for e in spans if e["name"] == "500")
    retry = next(e for e in spans if e["name"] == "retry 1")
    assert (failed["pid"], failed["tid"]) == (retry["pid"], retry["tid"])
    assert retry["ts"] >= failed["ts"] + failed["dur"]
    # one concurrency slot on "slow": its requests never overlap in time (others wait meanwhile)
    slow_pid = next(
        e["pid"] for e in events if e["name"] == "process_name" and "slow" in e["args"]["name"]
    )
    sent = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in spans
        if e["pid"] == slow_pid and e["cat"] in ("request", "retry") and e["name"] != "backoff"
    )
    assert len(sent) == 4
    assert all(later[0] >= earlier[1] - 1.0 for earlier, later in itertools.pairwise(sent))
    assert any(e["name"] == "wait" for e in spans if e["pid"] == slow_pid)
