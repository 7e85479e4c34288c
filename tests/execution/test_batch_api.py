"""Provider Batch APIs: rounds per LLM level, results mapped back, resumed from stored batch ids.

The scripted server speaks the OpenAI Batch API (``/v1/files``, ``/v1/batches``)
over loopback, answering each line with its responder.
"""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest

from plait import LLMInference, Module, run
from plait.errors import ConfigError
from plait.execution.batch_api import BatchJob
from plait.execution.checkpoint import CheckpointError
from plait.testing import ScriptedServer


class TwoLevels(Module):
    def __init__(self) -> None:
        super().__init__()
        self.left = LLMInference("llm", "Left.")
        self.right = LLMInference("llm", "Right.")
        self.judge = LLMInference("llm", "Judge.")

    def forward(self, text: str) -> str:
        return self.judge(f"{self.left(text)} + {self.right(text)}")


def fail_marked(body: dict) -> str:
    text = body["messages"][-1]["content"]
    if "FAIL" in text:
        raise ValueError("scripted failure")
    return f"echo: {text}"


def lines_of(server: ScriptedServer, batch_id: str) -> list[dict]:
    store = server.batch_api
    raw = store.files[store.batches[batch_id]["input_file_id"]]
    return [orjson.loads(line) for line in raw.splitlines()]


async def test_a_two_level_program_takes_one_batch_per_level_and_answers_every_item():
    async with ScriptedServer() as server:
        config = {"llm": server.endpoint()}
        job = BatchJob(TwoLevels(), config, poll_interval=0.01)
        outputs = await job.run(["a", "b", "c"])

    assert outputs == [f"echo: echo: {x} + echo: {x}" for x in "abc"]
    assert job.rounds == 2 and len(server.batch_api.batches) == 2
    first, second = job.batch_ids
    assert len(lines_of(server, first)) == 6 and len(lines_of(server, second)) == 3
    line = lines_of(server, second)[0]
    assert line["method"] == "POST" and line["url"] == "/v1/chat/completions"
    assert line["body"]["messages"][0] == {"role": "system", "content": "Judge."}
    assert server.stats.requests == 0  # nothing went through live chat completions


async def test_batch_calls_cost_the_batch_price():
    async with ScriptedServer() as server:
        price = {"input": 2.0, "output": 4.0}
        live_config = {"llm": server.endpoint(price=price)}
        batch_config = {"llm": server.endpoint(price=price, model="scripted-batch")}
        _, live = await run(TwoLevels(), ["x y"], resources=live_config, report=True)
        _, batched = await run(
            TwoLevels(), ["x y"], resources=batch_config, report=True, batch_api=True
        )

    assert batched.usage["calls"] == live.usage["calls"] == 3
    assert batched.usage["input_tokens"] == live.usage["input_tokens"]
    assert batched.usage["cost"] == pytest.approx(live.usage["cost"] / 2)


async def test_a_batch_through_the_batch_api_with_a_report_is_traced_once():
    class CountsItsTraces(TwoLevels):
        traces = 0

        def forward(self, text: str) -> str:
            self.traces += 1  # a plain setting: each lookup after a trace misses the cache
            return super().forward(text)

    program = CountsItsTraces()
    async with ScriptedServer() as server:
        config = {"llm": server.endpoint()}
        outputs, report = await run(
            program, ["a", "b", "c"], resources=config, report=True, batch_api=True
        )

    assert len(outputs) == 3 and report.graph is not None
    assert program.traces == 1


async def test_a_failed_line_fails_its_item_only():
    async with ScriptedServer(responder=fail_marked) as server:
        config = {"llm": server.endpoint(max_retries=0)}
        outputs = await BatchJob(TwoLevels(), config, poll_interval=0.01).run(
            ["ok", "FAIL", "fine"], on_error="collect"
        )

    assert outputs[0] == "echo: echo: ok + echo: ok"
    assert isinstance(outputs[1], Exception) and "scripted failure" in str(outputs[1])
    assert outputs[2] == "echo: echo: fine + echo: fine"


async def test_an_interrupted_job_resumes_from_the_stored_batch_without_paying_again(tmp_path):
    async with ScriptedServer() as server:
        server.batch_api.batch_delay = 30  # the provider takes its time
        config = {"llm": server.endpoint()}
        first = BatchJob(TwoLevels(), config, checkpoint_dir=tmp_path, poll_interval=0.01)
        task = asyncio.create_task(first.run(["a", "b"]))
        stored_ids = tmp_path / "batch_api.json"
        # The server knows the batch a moment before the client has its id and stores it.
        while not stored_ids.exists():
            await asyncio.sleep(0.01)
        task.cancel()  # the client dies while its batch is running
        with pytest.raises(asyncio.CancelledError):
            await task
        [batch_id] = server.batch_api.batches
        assert batch_id in stored_ids.read_text()

        server.batch_api.batch_delay = 0
        server.batch_api._ready_at[batch_id] = 0  # the provider has finished meanwhile
        second = BatchJob(TwoLevels(), config, checkpoint_dir=tmp_path, poll_interval=0.01)
        outputs = await second.run(["a", "b"])

    assert outputs == [f"echo: echo: {x} + echo: {x}" for x in "ab"]
    assert second.batch_ids[0] == batch_id  # read back, not submitted again
    assert len(server.batch_api.batches) == 2  # only the second level was new
    stored = json.loads((tmp_path / "batch_api.json").read_text())["batches"]
    assert set(stored.values()) == set(second.batch_ids)


async def test_links_planted_where_batch_ids_are_kept_are_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    at_temporary = tmp_path / "temporary"
    at_temporary.mkdir()
    (at_temporary / "batch_api.tmp").symlink_to(victim)  # the temporary name plait once used
    at_target = tmp_path / "target"
    at_target.mkdir()
    (at_target / "batch_api.json").symlink_to(victim)
    async with ScriptedServer() as server:
        config = {"llm": server.endpoint()}
        job = BatchJob(TwoLevels(), config, checkpoint_dir=at_temporary, poll_interval=0.01)
        assert await job.run(["a"]) == ["echo: echo: a + echo: a"]
        refused = BatchJob(TwoLevels(), config, checkpoint_dir=at_target, poll_interval=0.01)
        with pytest.raises(CheckpointError, match=r"batch_api\.json is a symbolic link"):
            await refused.run(["a"])
    stored = json.loads((at_temporary / "batch_api.json").read_text())["batches"]
    assert set(stored.values()) == set(job.batch_ids)
    assert victim.read_text() == "precious\n"


async def test_run_with_batch_api_needs_a_batch_and_an_openai_endpoint():
    with pytest.raises(ValueError, match="batch_api=True runs a batch"):
        await run(TwoLevels(), "one", resources={"llm": {"provider": "local"}}, batch_api=True)
    with pytest.raises(ConfigError, match="needs an 'openai' endpoint"):
        await run(TwoLevels(), ["one"], resources={"llm": {"provider": "local"}}, batch_api=True)


async def test_run_with_batch_api_refuses_an_endpoint_without_its_key_before_any_call(
    monkeypatch,
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"alias 'llm': endpoint 'llm' .* OPENAI_API_KEY"):
        await run(TwoLevels(), ["one"], resources={"llm": "openai:gpt-4o-mini"}, batch_api=True)


async def test_anthropic_message_batches_through_the_official_sdk_level_by_level():
    pytest.importorskip("anthropic")
    async with ScriptedServer() as server:
        config = {
            "llm": {
                "provider": "anthropic",
                "model": "claude-test",
                "base_url": f"http://127.0.0.1:{server.port}",
                "api_key": "k",
                "price": {"input": 3.0, "output": 15.0},
            }
        }
        job = BatchJob(TwoLevels(), config, poll_interval=0.01)
        outputs = await job.run(["a", "b c"])

    assert outputs == [f"echo: echo: {x} + echo: {x}" for x in ("a", "b c")]
    batches = server.batch_api.message_batches
    assert job.rounds == 2 and len(batches) == 2 and job.batch_ids == list(batches)
    first = server.batch_api._requests[job.batch_ids[0]]
    assert len(first) == 4 and first[0]["params"]["system"] in ("Left.", "Right.")
    assert first[0]["params"]["model"] == "claude-test"
