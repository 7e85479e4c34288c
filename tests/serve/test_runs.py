"""The typed run endpoint over real HTTP: schemas, validation, usage, streaming, pauses."""

from __future__ import annotations

import base64
from typing import Any

import httpx
from pydantic import BaseModel

from media.samples import png
from plait import (
    Image,
    InputField,
    LLMInference,
    Module,
    OutputField,
    Predict,
    ReAct,
    Signature,
    tool,
)
from plait.serve import app
from plait.testing import ScriptedServer
from serve.support import Gate, serving, sse_events, until, upstream


class ReadInvoice(Signature):
    """Read the invoice."""

    scan: Image = InputField()
    total: float = OutputField()


class Summary(BaseModel):
    title: str
    words: int


class Summarize(Module):
    """Summarises a text in a few words."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = LLMInference("llm", "Summarise.", response_format=Summary)

    def forward(self, text: str, style: str = "plain") -> Summary:
        return self.llm(f"{style}: {text}")


def summary_reply(body: dict[str, Any]) -> str:
    return '{"title": "short", "words": 2}'


async def test_a_run_answers_its_output_and_the_usage_of_that_request_alone() -> None:
    async with ScriptedServer() as server:
        programs = {"qa": Predict("question -> answer")}
        async with serving(app(programs, upstream(server))) as url, httpx.AsyncClient() as client:
            first = await client.post(f"{url}/programs/qa/run", json={"question": "hi"})
            second = await client.post(
                f"{url}/programs/qa/run",
                json={"question": "again"},
                headers={"X-Request-ID": "client-7"},
            )
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["status"] == "completed" and body["output"] == {"answer": "echo: question: hi"}
    assert body["usage"]["calls"] == 1 and body["usage"]["input_tokens"] > 0
    assert second.json()["usage"]["calls"] == 1  # its own call, not the server's total
    assert first.json()["run_id"] != second.json()["run_id"]
    assert second.headers["x-request-id"] == "client-7"
    assert len(first.headers["x-request-id"]) == 32


async def test_openapi_describes_inputs_from_forward_and_the_declared_output() -> None:
    async with ScriptedServer(responder=summary_reply) as server:
        served = app({"sum": Summarize(), "qa": Predict("question -> answer")}, upstream(server))
        async with serving(served) as url, httpx.AsyncClient() as client:
            schema = (await client.get(f"{url}/openapi.json")).json()
            ok = await client.post(f"{url}/programs/sum/run", json={"text": "a b c"})
    schemas = schema["components"]["schemas"]
    assert schemas["SumInput"]["required"] == ["text"]
    assert schemas["SumInput"]["properties"]["style"]["default"] == "plain"
    result = schemas["SumResult"]["properties"]
    assert result["output"]["$ref"].endswith("/Summary")
    assert set(schemas["Summary"]["properties"]) == {"title", "words"}
    assert schemas["QaInput"]["required"] == ["question"]
    qa_output = schemas["QaResult"]["properties"]["output"]["$ref"].rpartition("/")[2]
    assert schemas[qa_output]["required"] == ["answer"]
    responses = schema["paths"]["/programs/sum/run"]["post"]["responses"]
    assert responses["202"]["content"]["application/json"]["schema"]["$ref"].endswith("SumPaused")
    assert ok.json()["output"] == {"title": "short", "words": 2}


class Triage(Signature):
    """Sort a support ticket."""

    ticket: str = InputField("The customer's message, as written.")
    urgent: bool = OutputField("Whether someone must answer within the hour.")


async def test_openapi_keeps_the_descriptions_of_a_signatures_fields() -> None:
    async with ScriptedServer() as server:
        served = app({"triage": Predict(Triage)}, upstream(server))
        async with serving(served) as url, httpx.AsyncClient() as client:
            schema = (await client.get(f"{url}/openapi.json")).json()
    schemas = schema["components"]["schemas"]
    ticket = schemas["TriageInput"]["properties"]["ticket"]
    assert ticket["description"] == "The customer's message, as written."
    output = schemas["TriageResult"]["properties"]["output"]["$ref"].rpartition("/")[2]
    urgent = schemas[output]["properties"]["urgent"]
    assert urgent["description"] == "Whether someone must answer within the hour."


JSON = {"content-type": "application/json"}


async def test_bad_input_is_a_422_naming_the_field() -> None:
    async with ScriptedServer() as server:
        programs = {"qa": Predict("question -> answer"), "sum": Summarize()}
        async with serving(app(programs, upstream(server))) as url, httpx.AsyncClient() as client:
            missing = await client.post(f"{url}/programs/qa/run", json={"query": "hi"})
            wrong_type = await client.post(f"{url}/programs/sum/run", json={"text": ["x"]})
            not_json = await client.post(f"{url}/programs/qa/run", content=b"{nope", headers=JSON)
    assert missing.status_code == 422
    assert missing.json()["error"]["message"] == "question: Field required"
    assert "query" in str(missing.json()["error"]["fields"])
    assert wrong_type.status_code == 422
    assert wrong_type.json()["error"]["message"].startswith("text:")
    assert not_json.status_code == 422
    assert server.stats.requests == 0


async def test_the_run_route_answers_like_a_typed_route_for_other_methods_and_queries() -> None:
    async with ScriptedServer() as server:
        served = app({"qa": Predict("question -> answer")}, upstream(server))
        async with serving(served) as url, httpx.AsyncClient() as client:
            got = await client.get(f"{url}/programs/qa/run")
            bad_stream = await client.post(
                f"{url}/programs/qa/run?stream=maybe", json={"question": "hi"}
            )
            off = await client.post(f"{url}/programs/qa/run?stream=no", json={"question": "hi"})
            on = await client.post(f"{url}/programs/qa/run?stream=1", json={"question": "hi"})
            empty = await client.post(f"{url}/programs/qa/run", headers=JSON)
            other = await client.post(f"{url}/programs/nope/run", json={"question": "hi"})
            nowhere = await client.get(f"{url}/nowhere")
    assert got.status_code == 405 and got.headers["allow"] == "POST"
    assert got.json()["error"]["type"] == "method_not_allowed"
    assert bad_stream.status_code == 422
    assert bad_stream.json()["error"]["message"].startswith("stream: ")
    assert off.headers["content-type"] == "application/json"
    assert off.json()["output"] == {"answer": "echo: question: hi"}
    assert on.headers["content-type"].startswith("text/event-stream")
    assert sse_events(on.text)[-1][0] == "output"
    assert empty.status_code == 422 and empty.json()["error"]["message"].startswith("body: ")
    assert other.status_code == 404 and other.json()["error"]["type"] == "not_found"
    assert other.json()["error"]["message"] == (
        "no program named 'nope' is served here; the programs: 'qa'"
    )
    assert nowhere.status_code == 404
    assert nowhere.json()["error"]["message"] == "no route GET /nowhere; /docs lists the routes"
    assert server.stats.requests == 2


async def test_a_stream_sends_named_events_and_ends_with_the_output() -> None:
    async with ScriptedServer(stream_pieces=3) as server:
        programs = {"llm": LLMInference("llm", "be brief")}
        async with serving(app(programs, upstream(server))) as url, httpx.AsyncClient() as client:
            by_query = await client.post(
                f"{url}/programs/llm/run?stream=true", json={"prompt": "hi"}
            )
            by_accept = await client.post(
                f"{url}/programs/llm/run",
                json={"prompt": "hi"},
                headers={"Accept": "text/event-stream"},
            )
    assert by_query.headers["content-type"].startswith("text/event-stream")
    events = sse_events(by_query.text)
    names = [name for name, _ in events]
    assert names[-1] == "output" and set(names[:-1]) == {"text"}
    text = [data for name, data in events if name == "text"]
    assert "".join(chunk["delta"] for chunk in text) == "echo: hi"
    assert text[-1]["complete"] and text[0]["field"] == "text"
    assert events[-1][1]["output"] == "echo: hi" and events[-1][1]["usage"]["calls"] == 1
    assert [name for name, _ in sse_events(by_accept.text)] == names


def agent_reply(body: dict[str, Any]) -> Any:
    if body.get("tools"):
        return {"tool_calls": [{"name": "delete_file", "arguments": {"path": "/tmp/x"}}]}
    return '{"reply": "done"}'


def build_agent() -> ReAct:
    @tool(require_confirmation=True)
    def delete_file(path: str) -> str:
        """Deletes a file."""
        return f"deleted {path}"

    return ReAct("request -> reply", tools=[delete_file], max_iters=2)


async def test_a_run_that_pauses_answers_202_with_its_pending_call_and_keeps_it() -> None:
    async with ScriptedServer(responder=agent_reply) as server:
        served = app({"agent": build_agent()}, upstream(server))
        async with serving(served) as url, httpx.AsyncClient() as client:
            paused = await client.post(f"{url}/programs/agent/run", json={"request": "clean"})
            run_id = paused.json()["run_id"]
            kept = await client.get(f"{url}/programs/agent/runs/{run_id}")
            unknown = await client.get(f"{url}/programs/agent/runs/nope")
            streamed = await client.post(
                f"{url}/programs/agent/run?stream=true", json={"request": "clean"}
            )
            stream_run = sse_events(streamed.text)[-1][1]["run_id"]
            assert await served.state.runs.pending.get(stream_run) is not None
    assert paused.status_code == 202, paused.text
    body = paused.json()
    assert body["status"] == "paused" and body["program"] == "agent"
    (call,) = body["pending"]
    assert call["tool_name"] == "delete_file" and call["arguments"] == {"path": "/tmp/x"}
    assert call["approval_id"] and call["question"]
    assert kept.json()["pending"] == body["pending"]
    assert unknown.status_code == 404
    events = sse_events(streamed.text)
    assert [name for name, _ in events][-1] == "paused"
    assert events[-1][1]["pending"][0]["tool_name"] == "delete_file"


async def test_a_client_that_leaves_a_stream_cancels_its_run_and_upstream_request() -> None:
    gate = Gate()
    async with ScriptedServer(responder=gate) as server:
        programs = {"llm": LLMInference("llm")}
        async with serving(app(programs, upstream(server))) as url:
            async with (
                httpx.AsyncClient() as client,
                client.stream(
                    "POST", f"{url}/programs/llm/run?stream=true", json={"prompt": "hi"}
                ) as response,
            ):
                assert response.status_code == 200
                await until(lambda: server.stats.in_flight == 1, "the upstream request")
            # the client has hung up while the model was still writing
            await until(lambda: server.stats.in_flight == 0, "the upstream request to be cancelled")
            gate.opened.set()
            assert server.stats.requests == 1
            assert server.stats.log[0].status is None  # never answered: cancelled
            # counted (and logged) as the client leaving, 499, not as the 200 its head said
            left = 'plait_http_requests_total{method="POST",route="/programs/llm/run",status='
            async with httpx.AsyncClient() as client:
                for _ in range(500):
                    metrics = (await client.get(f"{url}/metrics")).text.splitlines()
                    if any(line.startswith(left) for line in metrics):
                        break
            assert [line for line in metrics if line.startswith(left)] == [f'{left}"499"}} 1.0']


async def test_a_client_that_leaves_a_plain_run_cancels_it() -> None:
    gate = Gate()
    async with ScriptedServer(responder=gate) as server:
        served = app({"llm": LLMInference("llm")}, upstream(server))
        async with serving(served) as url:
            async with httpx.AsyncClient() as client:
                request = asyncio_task(client.post(f"{url}/programs/llm/run", json={"prompt": "x"}))
                await until(lambda: server.stats.in_flight == 1, "the upstream request")
                request.cancel()
            await until(lambda: server.stats.in_flight == 0, "the upstream request to be cancelled")
            await until(lambda: served.state.runs.admission.in_flight == 0, "the run to end")
            assert server.stats.log[0].status is None


def asyncio_task(work: Any) -> Any:
    import asyncio

    return asyncio.ensure_future(work)


async def test_an_image_input_is_sent_as_a_data_uri_or_url_never_as_a_path() -> None:
    """A program with an `Image` input is served with that input as a string: a ``data:``
    URI or an ``http(s)`` URL, built into an Image as plait builds one (its format read from
    its bytes); a path is refused (a client must not name the server's files), and so are
    bytes that are not an image, each a 422 naming the field."""
    uri = "data:image/png;base64," + base64.b64encode(png()).decode()
    async with ScriptedServer(responder=lambda body: '{"total": 12.5}') as server:
        served = app({"invoice": Predict(ReadInvoice)}, upstream(server))
        async with serving(served) as url, httpx.AsyncClient() as client:
            listed = (await client.get(f"{url}/programs")).json()
            read = await client.post(f"{url}/programs/invoice/run", json={"scan": uri})
            linked = await client.post(
                f"{url}/programs/invoice/run", json={"scan": "https://example.com/scan.png"}
            )
            path = await client.post(f"{url}/programs/invoice/run", json={"scan": "/etc/hosts"})
            text = await client.post(
                f"{url}/programs/invoice/run", json={"scan": "data:image/png;base64,aGVsbG8="}
            )
    scan = listed[0]["input_schema"]["properties"]["scan"]
    assert (scan["type"], scan["format"]) == ("string", "uri")
    assert read.status_code == 200 and read.json()["output"] == {"total": 12.5}
    parts = server.stats.log[0].body["messages"][-1]["content"]
    assert {"type": "image_url", "image_url": {"url": uri}} in parts
    assert linked.status_code == 200
    assert server.stats.log[1].body["messages"][-1]["content"][1]["image_url"] == {
        "url": "https://example.com/scan.png"
    }
    assert path.status_code == 422
    assert path.json()["error"]["message"] == (
        "scan: Value error, give the image as a data: URI (data:<type>;base64,...) or an "
        "http(s) URL; a path is not read from a request"
    )
    assert text.status_code == 422
    assert text.json()["error"]["message"].startswith(
        "scan: Value error, Image from a data URI: the bytes are not a PNG, JPEG, GIF or WebP"
    )
    assert server.stats.requests == 2
