"""A run fails with the error of its own class, at every entry point, located in the program.

The endpoint's budget here has room for one call: the first stage (``draft``) is
answered, the second (``review``) is refused with `BudgetExceededError`.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from mcp import Client

from media.samples import png
from plait import Image, LLMInference, Module, Predict, ResourceConfig, run
from plait.errors import BudgetExceededError, MediaError, described
from plait.mcp import server as mcp_server
from plait.optimization.evaluation import evaluate
from plait.serve import app
from plait.testing import ScriptedServer, server_in_thread
from serve.support import serving

PRICE = {"input": 1000.0, "output": 0.0}  # $1 per 1,000 input tokens


def thousand_tokens(body: dict[str, Any]) -> dict[str, Any]:
    return {"content": "ok", "usage": {"prompt_tokens": 1000, "completion_tokens": 0}}


def one_call_budget(server: ScriptedServer) -> dict[str, Any]:
    """Resources whose every alias is ``server``, with a budget one $1 call spends."""
    return {"*": server.endpoint(max_retries=0, price=PRICE, budget=0.5)}


class Pipeline(Module):
    def __init__(self) -> None:
        super().__init__()
        self.draft = LLMInference("llm", system_prompt="draft")
        self.review = LLMInference("llm", system_prompt="review")

    def forward(self, text: str) -> str:
        return self.review(self.draft(text))


class Checked(Module):
    """A plain-Python stage of the user's that refuses some inputs."""

    def forward(self, text: str) -> str:
        if text == "bad":
            raise ValueError("bad input")
        return text


class WithCheck(Module):
    def __init__(self) -> None:
        super().__init__()
        self.check = Checked()
        self.llm = LLMInference("llm")

    def forward(self, text: str) -> str:
        return self.llm(self.check(text))


def assert_located_at_review(error: BaseException, index: int | None = None) -> None:
    assert getattr(error, "module_path", None) == "review"
    assert getattr(error, "input_index", None) == index
    where = "review failed" + ("" if index is None else f" on input {index}")
    assert error.__notes__ == [where]
    assert described(error).startswith("BudgetExceededError: alias 'llm': the budget of $0.5000")
    assert described(error).endswith(f"({where})")


async def test_run_and_an_async_module_call_raise_the_budget_error_itself() -> None:
    async with ScriptedServer(responder=thousand_tokens) as server:
        with pytest.raises(BudgetExceededError) as info:
            await run(Pipeline(), "text", resources=one_call_budget(server))
        assert_located_at_review(info.value)
        assert server.stats.requests == 1

    async with ScriptedServer(responder=thousand_tokens) as server:
        program = Pipeline().bind(one_call_budget(server))
        with pytest.raises(BudgetExceededError) as info:
            await program("text")
        assert_located_at_review(info.value)


async def test_a_batch_raises_the_failed_items_error_naming_its_index() -> None:
    async with ScriptedServer(responder=thousand_tokens) as server:
        with pytest.raises(BudgetExceededError) as info:
            await run(Pipeline(), ["a", "b"], resources=one_call_budget(server), max_concurrent=1)
    error = info.value  # which item's which stage met the spent budget first may vary
    assert error.input_index in (0, 1) and error.module_path in ("draft", "review")
    assert error.__notes__ == [f"{error.module_path} failed on input {error.input_index}"]

    async with ScriptedServer(responder=thousand_tokens) as server:
        outputs = await run(
            Pipeline(), ["a", "b"], resources=one_call_budget(server), on_error="collect"
        )
    assert all(isinstance(output, BudgetExceededError) for output in outputs)


def test_run_sync_and_a_sync_module_call_raise_the_budget_error_itself() -> None:
    with server_in_thread(responder=thousand_tokens) as server:
        program = Pipeline().bind(one_call_budget(server))
        with pytest.raises(BudgetExceededError) as info:
            program.run_sync("text")
        assert_located_at_review(info.value)
        with pytest.raises(BudgetExceededError):  # the budget stays spent: the draft refused
            program("text")


async def test_evaluate_rows_name_the_errors_class_and_where() -> None:
    async with ScriptedServer(responder=thousand_tokens) as server:
        result = await evaluate(
            Pipeline(), [("a", "ok")], resources=one_call_budget(server), max_concurrent=1
        )
    (row,) = result.rows
    assert row.error is not None
    assert row.error.startswith("BudgetExceededError: alias 'llm': the budget of $0.5000")
    assert row.error.endswith("(review failed on input 0)")


async def test_the_users_own_error_keeps_its_class_and_names_the_stage() -> None:
    async with ScriptedServer() as server:
        with pytest.raises(ValueError, match="bad input") as info:
            await run(WithCheck(), "bad", resources={"*": server.endpoint()})
        assert server.stats.requests == 0
    assert info.value.module_path == "check"  # type: ignore[attr-defined]
    assert info.value.__notes__ == ["check failed"]


async def test_an_image_to_a_text_only_model_is_a_media_error() -> None:
    config = {"reader": {"provider": "local"}}
    with pytest.raises(MediaError, match="is a text-only model and cannot take <image") as info:
        await run(LLMInference("reader"), ["What is it?", Image(png())], resources=config)
    assert info.value.__notes__ and "failed" in info.value.__notes__[0]


async def test_plait_serve_answers_503_budget_exhausted_and_logs_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    async with ScriptedServer(responder=thousand_tokens) as server:
        served = app({"qa": Predict("question -> answer")}, one_call_budget(server))
        async with serving(served) as url, httpx.AsyncClient() as client:
            first = await client.post(f"{url}/programs/qa/run", json={"question": "a"})
            spent = await client.post(f"{url}/programs/qa/run", json={"question": "b"})
            streamed = await client.post(
                f"{url}/programs/qa/run?stream=true", json={"question": "c"}
            )
        assert server.stats.requests == 1
    assert first.status_code == 200, first.text
    assert spent.status_code == 503, spent.text
    error = spent.json()["error"]
    assert error["type"] == "budget_exhausted" and error["error_id"] in error["message"]
    assert '"type":"budget_exhausted"' in streamed.text.replace(" ", "")
    assert not [record for record in caplog.records if record.exc_info]
    assert "Traceback" not in caplog.text
    told = [r.getMessage() for r in caplog.records if error["error_id"] in r.getMessage()]
    assert len(told) == 1 and "BudgetExceededError: alias 'llm': the budget of $0.5000" in told[0]


async def test_plait_mcp_tells_the_budget_error_by_its_class() -> None:
    async with ScriptedServer(responder=thousand_tokens) as llm:
        served = mcp_server({"qa": Pipeline()}, ResourceConfig(one_call_budget(llm)))
        async with Client(served.sdk_server) as client:
            result = await client.call_tool("qa", {"text": "a"})
    assert result.is_error
    text = result.content[0].text
    assert text.startswith("qa failed: BudgetExceededError: alias 'llm': the budget of $0.5"), text
    assert text.endswith("(review failed)")
