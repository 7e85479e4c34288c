"""Web pages cannot use a server through the browser of the person who visits them.

A page elsewhere can post text, a form or a body without a type to any origin without a
CORS preflight, so only a JSON body starts work (415 otherwise, before any model call). A
page whose own name was pointed at 127.0.0.1 (DNS rebinding) calls the server as its own
origin, so a server without API keys answers only loopback names (421) and pages on them
(403 for another ``Origin``). Every client here is a real one on a real uvicorn.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from plait import LLMInference, ReAct, tool
from plait.errors import ConfigError
from plait.serve import app
from plait.testing import ScriptedServer
from serve.support import serving, upstream

RUN_BODY = json.dumps({"prompt": "hi"})
JSON = {"content-type": "application/json"}
CHAT_BODY = json.dumps({"model": "llm", "messages": [{"role": "user", "content": "hi"}]})


def call_then_answer(body: dict[str, Any]) -> Any:
    """The model: asks for ``delete_file`` first, then replies with the tool's result."""
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        call = {"id": "call_1", "name": "delete_file", "arguments": {"path": "/tmp/x"}}
        return {"content": "On it.", "tool_calls": [call]}
    return json.dumps({"reply": " / ".join(results)})


def agent(log: Path) -> ReAct:
    @tool(require_confirmation=True)
    def delete_file(path: str) -> str:
        """Deletes a file."""
        with log.open("a") as file:
            file.write(f"{path}\n")
        return f"deleted {path}"

    return ReAct("request -> reply", tools=[delete_file], max_iters=3)


@contextlib.asynccontextmanager
async def session(
    programs: dict[str, Any], **options: Any
) -> AsyncIterator[tuple[str, httpx.AsyncClient, ScriptedServer]]:
    """Serves ``programs`` on the scripted model; yields the URL, a client and the upstream."""
    async with ScriptedServer(responder=call_then_answer) as server:
        served = app(programs, upstream(server), **options)
        async with serving(served) as url, httpx.AsyncClient(timeout=60) as client:
            yield url, client, server


async def test_only_a_json_body_starts_a_run_or_a_chat(tmp_path: Path) -> None:
    async with session({"llm": LLMInference("llm", "Be brief.")}) as (url, client, server):
        run = f"{url}/programs/llm/run"
        refused = [
            await client.post(run, content=RUN_BODY, headers={"content-type": "text/plain"}),
            await client.post(
                run + "?stream=true",
                content=RUN_BODY,
                headers={"content-type": "text/plain;charset=UTF-8"},
            ),
            await client.post(run, data={"prompt": "hi"}),  # a form
            await client.post(run, files={"prompt": ("prompt.txt", b"hi")}),  # multipart
            await client.post(run, content=RUN_BODY.encode()),  # no type: parsed as JSON before
            await client.post(f"{url}/v1/chat/completions", content=CHAT_BODY.encode()),
            await client.post(
                f"{url}/v1/chat/completions",
                content=CHAT_BODY,
                headers={"content-type": "text/plain"},
            ),
        ]
        calls_refused = server.stats.requests
        accepted = [
            await client.post(
                run, content=RUN_BODY, headers={"content-type": "application/json; charset=utf-8"}
            ),
            await client.post(
                run, content=RUN_BODY, headers={"content-type": "Application/Vnd.Example+JSON"}
            ),
            await client.post(f"{url}/v1/chat/completions", content=CHAT_BODY, headers=JSON),
        ]
    assert [answer.status_code for answer in refused] == [415] * len(refused)
    errors = [answer.json()["error"] for answer in refused]
    assert {error["type"] for error in errors} == {"unsupported_media_type"}
    assert errors[0]["message"] == (
        "the body must be JSON: send the header Content-Type: application/json (got 'text/plain')"
    )
    assert errors[4]["message"].endswith("(none was sent)")
    assert calls_refused == 0  # no model call for any of them
    assert [answer.status_code for answer in accepted] == [200, 200, 200], accepted[-1].text
    assert server.stats.requests == 3


async def test_a_resume_needs_a_json_body_and_a_refused_one_keeps_the_run(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    yes = json.dumps({"answers": {"call_1": "yes"}})
    async with session({"agent": agent(log)}) as (url, client, _):
        paused = await client.post(f"{url}/programs/agent/run", json={"request": "clean up"})
        resume = f"{url}/programs/agent/runs/{paused.json()['run_id']}/resume"
        untyped = await client.post(resume, content=yes.encode())
        as_text = await client.post(resume, content=yes, headers={"content-type": "text/plain"})
        ran_before = log.exists()
        resumed = await client.post(resume, content=yes, headers=JSON)
    assert paused.status_code == 202, paused.text
    assert (untyped.status_code, as_text.status_code) == (415, 415)
    assert not ran_before  # the approval was not given by either
    assert resumed.status_code == 200, resumed.text
    assert log.read_text().splitlines() == ["/tmp/x"]


async def test_without_keys_only_loopback_names_and_pages_are_answered(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    async with session({"agent": agent(log), "llm": LLMInference("llm")}) as (
        url,
        client,
        server,
    ):
        port = url.rsplit(":", 1)[1]
        paused = await client.post(f"{url}/programs/agent/run", json={"request": "clean up"})
        run_id = paused.json()["run_id"]
        rebound = {"host": f"rebound.example:{port}"}
        refused_hosts = [
            await client.post(f"{url}/programs/llm/run", json={"prompt": "x"}, headers=rebound),
            await client.get(f"{url}/programs/agent/runs/{run_id}", headers=rebound),
            await client.post(
                f"{url}/programs/agent/runs/{run_id}/resume",
                json={"answers": {"call_1": "yes"}},
                headers=rebound,
            ),
            await client.get(f"{url}/programs", headers={"host": "localhost.rebound.example"}),
            await client.get(f"{url}/", headers={"host": "127.0.0.1.nip.io"}),
        ]
        page = {"origin": f"http://rebound.example:{port}"}
        refused_origins = [
            await client.post(f"{url}/programs/llm/run", json={"prompt": "x"}, headers=page),
            await client.get(f"{url}/programs", headers={"origin": "null"}),
            await client.get(f"{url}/programs", headers={"origin": "http://localhost.example"}),
        ]
        calls_refused = server.stats.requests
        answered = [
            await client.get(f"{url}/programs", headers={"host": host})
            for host in ("localhost", f"localhost:{port}", "127.0.0.1:1", f"[::1]:{port}")
        ] + [
            await client.post(
                f"{url}/programs/llm/run",
                json={"prompt": "x"},
                headers={"origin": origin},
            )
            for origin in (url, f"http://localhost:{port}", "http://[::1]:5173")
        ]
        still_paused = await client.get(f"{url}/programs/agent/runs/{run_id}")
    assert [answer.status_code for answer in refused_hosts] == [421] * 5
    error = refused_hosts[0].json()["error"]
    assert error["type"] == "unknown_host"
    assert error["message"].startswith(f"Host 'rebound.example:{port}' is not a name of this")
    assert "--allowed-host" in error["message"]
    assert [answer.status_code for answer in refused_origins] == [403] * 3
    assert refused_origins[0].json()["error"]["type"] == "cross_origin"
    assert calls_refused == 1  # the pause's own call only
    assert [answer.status_code for answer in answered] == [200] * 7
    assert still_paused.status_code == 200 and not log.exists()


async def test_with_keys_or_named_hosts_the_names_are_the_operators_choice() -> None:
    key = {"authorization": "Bearer key-0123456789"}
    program = {"llm": LLMInference("llm")}
    async with session(program, api_keys=("key-0123456789",)) as (url, client, _):
        keyed = await client.get(f"{url}/programs", headers={"host": "api.example", **key})
        keyless = await client.get(f"{url}/programs", headers={"host": "api.example"})
    async with session(
        program, allowed_hosts=("API.example", "::1"), cors_origins=("https://app.example",)
    ) as (url, client, _):
        named = await client.get(f"{url}/programs", headers={"host": "api.example:8443"})
        unnamed = await client.get(f"{url}/programs", headers={"host": "other.example"})
        its_page = await client.get(f"{url}/programs", headers={"origin": "https://api.example"})
        cors_page = await client.get(f"{url}/programs", headers={"origin": "https://app.example"})
    async with session(program, allowed_hosts=("*",)) as (url, client, _):
        anything = await client.get(f"{url}/programs", headers={"host": "any.example"})
    assert keyed.status_code == 200 and keyless.status_code == 401
    assert (named.status_code, unnamed.status_code) == (200, 421)
    assert (its_page.status_code, cors_page.status_code) == (200, 200)
    assert cors_page.headers["access-control-allow-origin"] == "https://app.example"
    assert anything.status_code == 200


def test_an_allowed_host_is_a_bare_name() -> None:
    for entry in ("http://api.example", "api.example:8000", "", "a b"):
        with pytest.raises(ConfigError, match="is not a host name; give the name alone"):
            app({"llm": LLMInference("llm")}, {"*": "openai:m"}, allowed_hosts=(entry,))
