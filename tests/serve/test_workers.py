"""``plait serve --workers N``: N processes that together keep every endpoint's limits."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from plait.testing import ScriptedServer
from serve.test_cli_serve import _listening_url, environment, plait_command

PROGRAM = """
import os

from plait import LLMInference, Module


class Pid(Module):
    def __init__(self):
        super().__init__()
        self.llm = LLMInference("llm", "Be brief.")

    async def forward(self, prompt: str) -> str:
        reply = await self.llm(prompt)
        return f"{os.getpid()} {reply}"


def make():
    return Pid()
"""


def files(
    tmp_path: Path, base_url: str, max_concurrent: int, budget: str = ""
) -> tuple[Path, Path]:
    program = tmp_path / "pid.py"
    program.write_text(PROGRAM)
    resources = tmp_path / "res.toml"
    resources.write_text(
        f'[llm]\nprovider = "openai"\nmodel = "m"\nbase_url = "{base_url}"\napi_key = "k"\n'
        f"max_concurrent = {max_concurrent}\nmax_retries = 0\n{budget}"
    )
    return program, resources


async def test_two_workers_answer_and_together_keep_the_endpoint_limit(tmp_path: Path) -> None:
    async with ScriptedServer(latency=0.05, keep_log=False) as server:
        program, resources = files(tmp_path, server.base_url, max_concurrent=4)
        command = plait_command(
            "serve", f"pid={program}:make", "-r", str(resources), "--port", "0", "--workers", "2"
        )
        process = await asyncio.create_subprocess_exec(
            *command, env=environment(), stderr=asyncio.subprocess.PIPE
        )
        url = await _listening_url(process)
        pids: set[str] = set()
        statuses: list[int] = []
        try:
            for _ in range(20):  # rounds of fresh connections, until both workers answered
                limits = httpx.Limits(max_connections=64)
                async with httpx.AsyncClient(limits=limits, timeout=120) as client:
                    await _until_ready(client, url)
                    answers = await asyncio.gather(
                        *(
                            client.post(f"{url}/programs/pid/run", json={"prompt": f"q{i}"})
                            for i in range(64)
                        )
                    )
                statuses += [answer.status_code for answer in answers]
                pids |= {a.json()["output"].split()[0] for a in answers if a.status_code == 200}
                if len(pids) == 2:
                    break
        finally:
            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), 60)
    assert set(statuses) == {200}
    assert len(pids) == 2  # both worker processes answered runs
    assert server.stats.requests == len(statuses)
    assert server.stats.peak_concurrency <= 4  # 2 slots each, never 4 each
    assert code == 0


async def _until_ready(client: httpx.AsyncClient, url: str) -> None:
    for _ in range(3000):
        try:
            if (await client.get(f"{url}/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.01)
    raise AssertionError("plait serve --workers 2 never became ready")


def test_workers_refuse_an_endpoint_limit_they_cannot_split(tmp_path: Path) -> None:
    program, resources = files(tmp_path, "http://127.0.0.1:9/v1", max_concurrent=1)
    done = subprocess.run(
        plait_command("serve", f"{program}:make", "-r", str(resources), "--workers", "2"),
        capture_output=True, text=True, env=environment(), timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("plait: error: ")
    assert "llm (max_concurrent=1) cannot be split" in lines[0]
    assert "lower --workers, or raise their max_concurrent to 2 or more" in lines[0]


ENVIRONMENT_PROGRAM = """
import os
import subprocess
import sys

from plait import Module


class Environment(Module):
    def forward(self, prompt: str) -> str:
        shown = "import os; print(sorted(os.environ.items()))"
        child = subprocess.run([sys.executable, "-c", shown], capture_output=True, text=True)
        return repr(sorted(os.environ.items())) + child.stdout


def make():
    return Environment()
"""


async def test_workers_get_the_api_keys_without_the_environment(tmp_path: Path) -> None:
    """The keys of --api-key-file reach the workers, which check them, but neither a
    worker's environment nor that of a process it starts (a tool's) holds them."""
    key = "worker-key-4f9c2a7e1b"
    (tmp_path / "keys.txt").write_text(key + "\n")
    program, resources = files(tmp_path, "http://127.0.0.1:9/v1", max_concurrent=2)
    program.write_text(ENVIRONMENT_PROGRAM)  # it calls no model
    command = plait_command(
        "serve", f"env={program}:make", "-r", str(resources), "--port", "0", "--workers", "2",
        "--api-key-file", str(tmp_path / "keys.txt"),
    )  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        *command, env=environment(), stderr=asyncio.subprocess.PIPE
    )
    url = await _listening_url(process)
    try:
        async with httpx.AsyncClient(timeout=120) as client:
            await _until_ready(client, url)
            refused = await client.post(f"{url}/programs/env/run", json={"prompt": "x"})
            answer = await client.post(
                f"{url}/programs/env/run",
                json={"prompt": "x"},
                headers={"Authorization": f"Bearer {key}"},
            )
    finally:
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 60)
    assert refused.status_code == 401
    assert answer.status_code == 200, answer.text
    shown = answer.json()["output"]
    assert "PATH" in shown  # the environments were shown
    assert key not in shown
    assert code == 0


def ten_tokens(body: dict) -> dict:
    """A reply of 10 completion tokens and no prompt tokens: $1.00 at the price below."""
    return {"content": "ok", "usage": {"prompt_tokens": 0, "completion_tokens": 10}}


async def test_two_workers_together_spend_one_endpoint_budget(tmp_path: Path) -> None:
    """Rounds of 64 requests at once against a budget with room for 150 calls: the two
    workers send at most 150 together (each one's own $150 would let all 192 of three
    rounds through), and no fewer than the budget less one call's worst case."""
    async with ScriptedServer(latency=0.05, keep_log=False, responder=ten_tokens) as server:
        # $0.10 a completion token, none for the prompt: every call costs $1.00, and holds
        # at most $1.00 (the program's max_tokens=10) while in flight.
        budget = "budget = 150.0\nprice = {input = 0.0, output = 100000.0}\n"
        program, resources = files(tmp_path, server.base_url, max_concurrent=64, budget=budget)
        program.write_text(PROGRAM.replace('"Be brief.")', '"Be brief.", max_tokens=10)'))
        command = plait_command(
            "serve", f"pid={program}:make", "-r", str(resources), "--port", "0", "--workers", "2"
        )
        process = await asyncio.create_subprocess_exec(
            *command, env=environment(), stderr=asyncio.subprocess.PIPE
        )
        url = await _listening_url(process)
        assert process.stderr is not None
        log = asyncio.ensure_future(process.stderr.read())  # a full pipe would stall them
        served: list[httpx.Response] = []
        refused = 0
        try:
            for _ in range(5):  # rounds of fresh connections, until the budget refuses
                async with httpx.AsyncClient(
                    limits=httpx.Limits(max_connections=64), timeout=120
                ) as client:
                    await _until_ready(client, url)
                    answers = await asyncio.gather(
                        *(
                            client.post(f"{url}/programs/pid/run", json={"prompt": f"q{i}"})
                            for i in range(64)
                        )
                    )
                served += [a for a in answers if a.status_code == 200]
                refused += sum(a.status_code != 200 for a in answers)
                if refused:
                    break
        finally:
            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), 60)
            await log
    pids = {a.json()["output"].split()[0] for a in served}
    assert 149 <= server.stats.requests <= 150, refused  # one budget for both, and used
    assert len(served) == server.stats.requests
    assert len(pids) == 2  # both workers spent from it
    assert code == 0


REPORT = """
from plait import LLMInference, Module


class Report(Module):
    def __init__(self):
        super().__init__()
        self.technical = LLMInference("llm", "Judge the technical change.", max_tokens=16)
        self.business = LLMInference("llm", "Judge the cost and benefit.", max_tokens=16)
        self.summary = LLMInference("llm", "Summarise the notes in two sentences.", max_tokens=16)

    def forward(self, text):
        tech, biz = self.technical(text), self.business(text)  # run concurrently
        return self.summary(f"Technical: {tech}\\nBusiness: {biz}")
"""


@pytest.mark.slow
async def test_two_workers_each_load_their_own_local_model(tmp_path: Path) -> None:
    """docs/how-to/serving.md's first command, with ``--workers 2`` and the embedded model (one call
    at a time): each worker loads its own model, so nothing is split, and both answer."""
    pytest.importorskip("llama_cpp")
    (tmp_path / "prog.py").write_text(REPORT)
    (tmp_path / "res.toml").write_text('["*"]\nprovider = "local"\n')
    command = plait_command(
        "serve", "prog.py:Report", "--resources", "res.toml", "--port", "0", "--workers", "2"
    )
    process = await asyncio.create_subprocess_exec(
        *command, env=environment(), cwd=tmp_path, stderr=asyncio.subprocess.PIPE
    )
    url = await _listening_url(process)
    try:
        async with httpx.AsyncClient(timeout=300) as client:
            await _until_ready(client, url)
            answers = await asyncio.gather(
                *(
                    client.post(f"{url}/programs/Report/run", json={"text": f"queue {i}"})
                    for i in range(4)
                )
            )
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 60)
    assert [a.status_code for a in answers] == [200] * 4, answers[0].text
    assert all(isinstance(a.json()["output"], str) for a in answers)


def test_workers_split_a_server_endpoint_but_not_the_local_model() -> None:
    from plait.resources.config import ResourceConfig
    from plait.resources.limits import limiter_shares
    from plait.serve.runs import check_shares

    config = ResourceConfig(
        {"llm": {"provider": "local"}, "api": {"provider": "openai", "model": "m",
                                               "api_key": "k", "max_concurrent": 8}}
    )  # fmt: skip
    check_shares(config, 2)  # the local model's limit is not split, so not refused
    share = limiter_shares(2)
    local = config.resolve("llm")
    assert share(local).max_concurrent == local.max_concurrent  # each worker its own model
    assert share(config.resolve("api")).max_concurrent == 4
