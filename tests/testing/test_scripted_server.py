"""The scripted OpenAI-compatible server, driven with a plain aiohttp client.

These tests talk raw HTTP on purpose: the server is the yardstick other
tests measure plait's clients against, so it is checked without them.
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest

from plait.testing import Fault, RawReply, ScriptedServer, fetch_stats, start_server_process

CHAT = "/chat/completions"


def chat_body(text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


async def post(
    server: ScriptedServer, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.base_url + CHAT, json=body, headers=headers) as response,
    ):
        raw = await response.read()
        return response.status, json.loads(raw), response.headers


async def post_stream(server: ScriptedServer, body: dict[str, Any]) -> list[str]:
    """Returns the data payloads of the SSE stream, in order."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.base_url + CHAT, json={**body, "stream": True}) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        text = (await response.read()).decode()
    return [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]


# -- replies ---------------------------------------------------------------------


async def test_default_reply_echoes_last_user_message_with_word_count_usage():
    async with ScriptedServer() as server:
        body = chat_body("hello there")
        status, reply, _ = await post(server, body)
    assert status == 200
    assert reply["object"] == "chat.completion"
    assert reply["model"] == "m"
    choice = reply["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "echo: hello there"}
    assert choice["finish_reason"] == "stop"
    assert reply["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert server.stats.requests == 1
    record = server.stats.log[0]
    assert record.body == body
    assert record.status == 200
    assert record.stream is False
    assert record.finished is not None and record.finished >= record.arrived


async def test_responder_may_be_async_and_return_tool_calls():
    async def responder(body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"tool_calls": [{"name": "lookup", "arguments": {"q": "x"}}]}

    async with ScriptedServer(responder=responder) as server:
        _, reply, _ = await post(server, chat_body())
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None  # as OpenAI sends it
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["function"] == {"name": "lookup", "arguments": '{"q":"x"}'}
    assert call["id"]


async def test_responder_dict_sets_finish_reason_and_usage():
    def responder(body: dict[str, Any]) -> dict[str, Any]:
        return {"content": "no", "finish_reason": "content_filter", "usage": {"prompt_tokens": 9}}

    async with ScriptedServer(responder=responder) as server:
        _, reply, _ = await post(server, chat_body())
    assert reply["choices"][0]["finish_reason"] == "content_filter"
    assert reply["usage"] == {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}


async def test_responder_that_raises_gives_500_naming_the_exception():
    def responder(body: dict[str, Any]) -> str:
        raise KeyError("missing-thing")

    async with ScriptedServer(responder=responder) as server:
        status, reply, _ = await post(server, chat_body())
    assert status == 500
    assert "KeyError" in reply["error"]["message"]
    assert "missing-thing" in reply["error"]["message"]


async def test_raw_reply_goes_on_the_wire_byte_for_byte():
    answer = RawReply(b'{"choices": "\xff"}', status=202, headers={"X-Odd": "1"})
    async with (
        ScriptedServer(responder=lambda body: answer) as server,
        aiohttp.ClientSession() as session,
        session.post(server.base_url + CHAT + "?api-version=1", json=chat_body()) as response,
    ):
        assert (response.status, response.headers["X-Odd"]) == (202, "1")
        assert await response.read() == b'{"choices": "\xff"}'
    assert server.stats.log[0].target == "/v1/chat/completions?api-version=1"


async def test_raw_reply_streams_its_events_as_given_then_done():
    answer = RawReply(stream_events=[b"[1, 2]", b"not json"])
    async with ScriptedServer(responder=lambda body: answer) as server:
        assert await post_stream(server, chat_body()) == ["[1, 2]", "not json", "[DONE]"]


async def test_max_tokens_cuts_the_reply_with_finish_reason_length():
    async with ScriptedServer(responder=lambda body: "one two three four five") as server:
        _, reply, _ = await post(server, chat_body(max_tokens=2))
    assert reply["choices"][0]["message"]["content"] == "one two"
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 2


async def test_llama_cpp_dialect_ignores_max_completion_tokens():
    async with ScriptedServer(responder=lambda body: "a b c", dialect="llama_cpp") as server:
        _, reply, _ = await post(server, chat_body(max_completion_tokens=1))
    assert reply["choices"][0]["message"]["content"] == "a b c"


async def test_malformed_requests_get_openai_shaped_400s():
    async with ScriptedServer() as server:
        not_json = await post(server, "just a string")
        no_model = await post(server, {"messages": [{"role": "user", "content": "x"}]})
        no_messages = await post(server, {"model": "m", "messages": []})
    for status, reply, _ in (not_json, no_model, no_messages):
        assert status == 400
        assert reply["error"]["type"] == "invalid_request_error"
    assert "model" in no_model[1]["error"]["message"]
    assert server.stats.requests == 3


async def test_api_key_is_required_when_configured():
    async with ScriptedServer(api_key="sk-good") as server:
        bad, reply, _ = await post(server, chat_body(), {"Authorization": "Bearer sk-bad"})
        good, _, _ = await post(server, chat_body(), {"Authorization": "Bearer sk-good"})
    assert (bad, good) == (401, 200)
    assert reply["error"]["message"] == "Incorrect API key provided."


# -- structured output dialects ----------------------------------------------------

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


async def test_llama_cpp_dialect_refuses_json_schema_like_llama_cpp_server():
    json_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    json_object = {"type": "json_object", "schema": SCHEMA}
    async with ScriptedServer(dialect="llama_cpp") as server:
        refused, reply, _ = await post(server, chat_body(response_format=json_schema))
        accepted, _, _ = await post(server, chat_body(response_format=json_object))
    assert refused == 500  # llama_cpp.server 0.3.36 wraps its validation error in a 500
    assert "response_format" in reply["error"]["message"]
    assert accepted == 200


async def test_openai_dialect_accepts_both_forms_and_refuses_unknown_types():
    async with ScriptedServer() as server:
        schema_form = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
        ok1, _, _ = await post(server, chat_body(response_format=schema_form))
        ok2, _, _ = await post(server, chat_body(response_format={"type": "json_object"}))
        bad, reply, _ = await post(server, chat_body(response_format={"type": "yaml"}))
    assert (ok1, ok2, bad) == (200, 200, 400)
    assert "response_format" in reply["error"]["message"]


# -- streaming -----------------------------------------------------------------------


async def test_stream_splits_content_and_sends_usage_only_when_asked():
    async with ScriptedServer(stream_pieces=3) as server:
        plain = await post_stream(server, chat_body("stream this text"))
        with_usage = await post_stream(
            server, chat_body("stream this text", stream_options={"include_usage": True})
        )
    assert plain[-1] == "[DONE]"
    events = [json.loads(p) for p in plain[:-1]]
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    pieces = [e["choices"][0]["delta"].get("content") or "" for e in events]
    assert "".join(pieces) == "echo: stream this text"
    assert sum(1 for p in pieces if p) == 3
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any("usage" in e for e in events)

    usage_event = json.loads(with_usage[-2])
    assert usage_event["choices"] == []
    assert usage_event["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert server.stats.log[0].stream is True


async def test_stream_sends_tool_calls_in_fragments_by_index():
    calls = [
        {"name": "first", "arguments": {"city": "Paris", "days": 3}},
        {"name": "second", "arguments": "{}"},
    ]
    async with ScriptedServer(responder=lambda body: {"tool_calls": calls}) as server:
        payloads = await post_stream(server, chat_body())
    events = [json.loads(p) for p in payloads[:-1]]
    fragments = [
        fragment
        for event in events
        for fragment in event["choices"][0]["delta"].get("tool_calls", [])
    ]
    first = [f for f in fragments if f["index"] == 0]
    assert first[0]["id"] and first[0]["function"]["name"] == "first"
    assert len(first) > 2  # a header, then the arguments in pieces
    joined = "".join(f["function"]["arguments"] for f in first)
    assert json.loads(joined) == {"city": "Paris", "days": 3}
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


# -- stats ---------------------------------------------------------------------------


async def test_peak_concurrency_counts_overlapping_requests():
    all_arrived = asyncio.Event()

    async def responder(body: dict[str, Any]) -> str:
        if server.stats.in_flight == 4:
            all_arrived.set()
        await asyncio.wait_for(all_arrived.wait(), timeout=30)
        return "ok"

    async with ScriptedServer(responder=responder) as server:
        results = await asyncio.gather(*(post(server, chat_body()) for _ in range(4)))
        assert [status for status, _, _ in results] == [200] * 4
        assert server.stats.peak_concurrency == 4
        assert server.stats.in_flight == 0
        server.reset_stats()
        assert (server.stats.requests, server.stats.peak_concurrency) == (0, 0)
        assert server.stats.log == []


async def test_latency_applies_per_request_and_header_overrides_it():
    async with ScriptedServer(latency=0.0) as server:
        await post(server, chat_body(), {"x-scripted-latency": "0.2"})
        await post(server, chat_body())
    slow, fast = server.stats.log
    assert slow.finished - slow.arrived >= 0.2  # a lower bound the server itself observed
    assert fast.status == 200


async def test_http_endpoints_for_models_stats_and_faults():
    async with ScriptedServer(model="tiny") as server, aiohttp.ClientSession() as session:
        root = server.base_url.removesuffix("/v1")
        async with session.get(server.base_url + "/models") as response:
            models = await response.json()
        await post(server, chat_body())
        async with session.get(root + "/stats?log=1") as response:
            stats = await response.json()
        async with session.post(root + "/faults", json={"status": 503, "times": 1}) as response:
            listed = await response.json()
        status_503, _, _ = await post(server, chat_body())
        async with session.post(root + "/faults", json={"kind": "nonsense"}) as response:
            bad_fault = response.status
        async with session.delete(root + "/faults") as response:
            after_clear = await response.json()
        async with session.post(root + "/stats/reset") as response:
            reset = await response.json()
    assert models["data"][0]["id"] == "tiny"
    assert stats["requests"] == 1 and stats["log"][0]["body"]["model"] == "m"
    assert listed == [{**Fault(status=503, times=1).as_dict(), "fired": 0}]
    assert status_503 == 503
    assert bad_fault == 400
    assert after_clear == []
    assert reset == {"requests": 0, "in_flight": 0, "peak_concurrency": 0}


# -- faults --------------------------------------------------------------------------


async def test_times_fault_fails_the_next_requests_then_stops():
    fault = Fault(status=429, headers={"Retry-After": "1"}, times=2)
    async with ScriptedServer(faults=[fault]) as server:
        results = [await post(server, chat_body()) for _ in range(3)]
    assert [status for status, _, _ in results] == [429, 429, 200]
    _, body, headers = results[0]
    assert headers["Retry-After"] == "1"
    assert body["error"]["type"] == "rate_limit_error"
    assert body["error"]["message"] == "scripted fault: HTTP 429"
    assert [r.fault for r in server.stats.log] == ["status 429", "status 429", None]
    assert fault.fired == 2 and fault.is_exhausted


async def test_rate_fault_is_deterministic_for_a_seed():
    async def statuses() -> list[int]:
        async with ScriptedServer(faults=[Fault(status=500, rate=0.3, seed=7)]) as server:
            return [(await post(server, chat_body()))[0] for _ in range(30)]

    first, second = await statuses(), await statuses()
    assert first == second
    assert 0 < first.count(500) < 30
    assert set(first) == {200, 500}


async def test_faults_are_asked_in_order_and_can_be_injected_at_run_time():
    async with ScriptedServer() as server:
        ok, _, _ = await post(server, chat_body())
        server.inject(Fault(status=503, times=1), Fault(status=502, times=1))
        first, _, _ = await post(server, chat_body())
        second, _, _ = await post(server, chat_body())
        server.inject(Fault(status=500))
        server.clear_faults()
        third, _, _ = await post(server, chat_body())
    assert (ok, first, second, third) == (200, 503, 502, 200)


async def test_slow_fault_delays_only_its_requests():
    async with ScriptedServer(faults=[Fault(kind="slow", delay=30.0, times=1)]) as server:
        with pytest.raises(asyncio.TimeoutError):
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    server.base_url + CHAT,
                    json=chat_body(),
                    timeout=aiohttp.ClientTimeout(total=0.3),
                ),
            ):
                pass
        status, _, _ = await post(server, chat_body())
    assert status == 200
    assert server.stats.log[0].fault == "slow 30s"
    assert server.stats.log[1].fault is None


async def test_drop_fault_closes_the_connection_without_an_answer():
    async with ScriptedServer(faults=[Fault(kind="drop", times=1)]) as server:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await post(server, chat_body())
        status, _, _ = await post(server, chat_body())
    assert status == 200
    assert server.stats.log[0].status is None
    assert server.stats.log[0].fault == "drop"


async def test_drop_fault_can_cut_a_stream_after_some_events():
    async with ScriptedServer(faults=[Fault(kind="drop", after_chunks=2)]) as server:
        with pytest.raises(aiohttp.ClientPayloadError):
            await post_stream(server, chat_body())
    assert server.stats.log[0].fault == "drop after 2 chunks"
    assert server.stats.log[0].status is None


async def test_a_fault_for_streams_fires_only_on_streams_and_draws_only_for_them():
    """``stream=True``: a plain request passes untouched and does not use up the fault's
    draws, so the streams it cuts are the same whatever plain requests come between."""
    cut = Fault(kind="drop", after_chunks=2, rate=0.5, seed=3, stream=True)
    async with ScriptedServer(faults=[cut]) as server:
        for _ in range(4):
            status, _, _ = await post(server, chat_body())
            assert status == 200
        outcomes = []
        for _ in range(8):
            try:
                await post_stream(server, chat_body())
                outcomes.append("whole")
            except aiohttp.ClientPayloadError:
                outcomes.append("cut")
    draws = random.Random(3)
    assert outcomes == ["cut" if draws.random() < 0.5 else "whole" for _ in range(8)]
    assert "cut" in outcomes and "whole" in outcomes


def test_fault_rejects_bad_settings_with_every_problem_named():
    with pytest.raises(ValueError, match=r"kind='boom'.*rate=2") as caught:
        Fault(kind="boom", rate=2)  # type: ignore[arg-type]
    assert "invalid Fault" in str(caught.value)
    with pytest.raises(ValueError, match="status=200"):
        Fault(status=200)
    with pytest.raises(ValueError, match=r"unknown Fault field.*statuss"):
        Fault.from_dict({"statuss": 500})


def test_fault_round_trips_through_json_data():
    fault = Fault(status=429, headers={"Retry-After": "2"}, times=3, rate=0.5, seed=4)
    assert Fault.from_dict(json.loads(json.dumps(fault.as_dict()))) == fault


async def test_stopping_cancels_requests_still_waiting():
    async with ScriptedServer(latency=60.0) as server:
        pending = asyncio.ensure_future(post(server, chat_body()))
        while server.stats.in_flight == 0:
            await asyncio.sleep(0.01)
    with pytest.raises(aiohttp.ClientError):
        await pending
    assert server.stats.in_flight == 0
    assert server.stats.log[0].status is None


def test_base_url_before_start_says_how_to_start():
    with pytest.raises(RuntimeError, match="async with ScriptedServer"):
        _ = ScriptedServer().base_url


# -- separate process ----------------------------------------------------------------


def _post_sync(base_url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(
        base_url + CHAT,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        error.close()
        return error.code


def test_server_runs_in_its_own_process():
    faults = [Fault(status=503, times=1)]
    with start_server_process(latency=0.0, faults=faults, keep_log=True) as (process, base_url):
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        statuses = [_post_sync(base_url, chat_body()) for _ in range(2)]
        stats = fetch_stats(base_url, include_log=True)
    assert statuses == [503, 200]
    assert stats["requests"] == 2
    assert [record["status"] for record in stats["log"]] == [503, 200]
    assert process.poll() is not None  # stopped when the block ended
