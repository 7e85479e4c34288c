"""``plait serve`` as a person runs it: one-line usage errors, and a SIGTERM that drains."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from plait.testing import ScriptedServer
from serve.support import Gate, until

SRC = Path(__file__).resolve().parents[2] / "src"

PROGRAM = """
from plait import LLMInference

def make():
    return LLMInference("llm", "Be brief.")
"""


def plait_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "plait", *args]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    return env


def files(tmp_path: Path, base_url: str) -> tuple[Path, Path]:
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    resources = tmp_path / "res.toml"
    resources.write_text(
        f'[llm]\nprovider = "openai"\nmodel = "m"\nbase_url = "{base_url}"\napi_key = "k"\n'
    )
    return program, resources


def test_mistakes_are_one_line_with_exit_2(tmp_path: Path) -> None:
    program, resources = files(tmp_path, "http://127.0.0.1:9/v1")
    other = tmp_path / "other.toml"
    other.write_text('other = "openai:m"\n')
    planted = tmp_path / "pending.sqlite"
    planted.symlink_to(tmp_path / "elsewhere.sqlite")
    cases = [
        ([f"{program}:make", "-r", str(resources), "--host", "0.0.0.0"], "without API keys"),
        ([f"{program}:nothing", "-r", str(resources)], "has no 'nothing'"),
        ([f"{program}:make", "--api-key-env", "PLAIT_TEST_UNSET_KEY"], "PLAIT_TEST_UNSET_KEY"),
        ([f"{program}:make", "-r", str(tmp_path / "missing.toml")], "missing.toml: no such file"),
        (
            [f"{program}:make", "-r", str(other), "--workers", "2"],
            "make calls the alias 'llm', which",
        ),
        (
            [f"{program}:make", "--api-key-file", "no-keys.txt"],
            "--api-key-file no-keys.txt: cannot read it (No such file or directory); name a",
        ),
        (
            [f"{program}:make", "-r", str(resources), "--approval-key-env", "PLAIT_TEST_UNSET"],
            "--approval-key-env PLAIT_TEST_UNSET",
        ),
        (
            [f"{program}:make", "-r", str(resources), "--pending-db", str(planted)],
            "is a symbolic link",
        ),
    ]
    for args, expected in cases:
        done = subprocess.run(
            plait_command("serve", *args), capture_output=True, text=True, env=environment(),
            timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("plait: error: "), done.stderr
        assert expected in lines[0]
    assert not (tmp_path / "elsewhere.sqlite").exists()


def test_a_port_in_use_is_one_line_with_exit_2(tmp_path: Path) -> None:
    """A port another server holds is said on one line (not uvicorn's log line, exit 3),
    for `plait serve` and for `plait mcp --transport http`."""
    program, resources = files(tmp_path, "http://127.0.0.1:9/v1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for command in (
            ["serve", f"{program}:make", "-r", str(resources), "--port", port],
            ["serve", f"{program}:make", "-r", str(resources), "--port", port, "--workers", "2"],
            ["mcp", f"{program}:make", "-r", str(resources), "--transport", "http", "--port", port],
        ):
            done = subprocess.run(
                plait_command(*command), capture_output=True, text=True, env=environment(),
                timeout=120, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            assert done.returncode == 2, (command, done.stderr)
            lines = [line for line in done.stderr.splitlines() if line.startswith("plait: error")]
            assert lines == [
                f"plait: error: port {port} on 127.0.0.1 is in use (another server listens "
                "there); stop it, or pass --port with a free port"
            ], done.stderr
            assert "Traceback" not in done.stderr and "ERROR" not in done.stderr


async def test_sigterm_drains_the_runs_in_flight_and_readiness_goes_false(tmp_path: Path) -> None:
    gate = Gate("drained answer")
    async with ScriptedServer(responder=gate) as server:
        program, resources = files(tmp_path, server.base_url)
        process = await asyncio.create_subprocess_exec(
            *plait_command("serve", f"ask={program}:make", "-r", str(resources), "--port", "0"),
            env=environment(),
            stderr=asyncio.subprocess.PIPE,
        )
        url = await _listening_url(process)
        async with httpx.AsyncClient(timeout=60) as client:
            assert (await client.get(f"{url}/readyz")).status_code == 200
            run = asyncio.ensure_future(
                client.post(f"{url}/programs/ask/run", json={"prompt": "x"})
            )
            await until(lambda: server.stats.in_flight == 1, "the run's upstream request")
            process.send_signal(signal.SIGTERM)
            await _until_status(client, f"{url}/readyz", 503)
            refused = await client.post(f"{url}/programs/ask/run", json={"prompt": "y"})
            gate.opened.set()
            finished = await run
        code = await asyncio.wait_for(process.wait(), 60)
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "draining"
    assert finished.status_code == 200 and finished.json()["output"] == "drained answer"
    assert code == 0


async def _listening_url(process: asyncio.subprocess.Process) -> str:
    """Reads uvicorn's start-up lines until it says where it listens."""
    assert process.stderr is not None
    seen = []
    while line := (await asyncio.wait_for(process.stderr.readline(), 60)).decode():
        seen.append(line)
        if "Uvicorn running on " in line:
            return line.split("Uvicorn running on ")[1].split()[0]
    raise AssertionError(f"plait serve did not start: {''.join(seen)}")


async def _until_status(client: httpx.AsyncClient, url: str, status: int) -> None:
    for _ in range(3000):
        if (await client.get(url)).status_code == status:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{url} never answered {status}")


def test_import_plait_and_plait_serve_load_no_web_stack() -> None:
    code = (
        "import sys, plait, plait.serve; "
        "print(sorted(m for m in ('fastapi', 'starlette', 'uvicorn', 'prometheus_client') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment(), timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr


AGENT = """
from plait import ReAct, tool

@tool(require_confirmation=True)
def delete_file(path: str) -> str:
    \"\"\"Deletes a file.\"\"\"
    with open({log!r}, "a") as file:
        file.write(path + "\\n")
    return "deleted " + path

def make():
    return ReAct("request -> reply", tools=[delete_file], max_iters=3)
"""


def call_then_answer(body: dict) -> object:
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        call = {"id": "call_1", "name": "delete_file", "arguments": {"path": "/tmp/x"}}
        return {"tool_calls": [call]}
    return json.dumps({"reply": " / ".join(results)})


async def test_a_paused_run_survives_a_restart_and_is_resumed_once(tmp_path: Path) -> None:
    log = tmp_path / "ran.txt"
    program = tmp_path / "agent.py"
    program.write_text(AGENT.format(log=str(log)))
    env = {**environment(), "SERVE_TEST_APPROVAL_KEY": "k" * 40}
    db = tmp_path / "state" / "pending.sqlite"
    async with ScriptedServer(responder=call_then_answer) as server:
        _, resources = files(tmp_path, server.base_url)
        command = plait_command(
            "serve", f"agent={program}:make", "-r", str(resources), "--port", "0",
            "--pending-db", str(db), "--approval-key-env", "SERVE_TEST_APPROVAL_KEY",
        )  # fmt: skip

        async def start() -> tuple[asyncio.subprocess.Process, str]:
            process = await asyncio.create_subprocess_exec(
                *command, env=env, stderr=asyncio.subprocess.PIPE
            )
            return process, await _listening_url(process)

        async def stop(process: asyncio.subprocess.Process) -> int:
            process.send_signal(signal.SIGTERM)
            return await asyncio.wait_for(process.wait(), 60)

        answers = {"answers": {"call_1": "yes"}}
        async with httpx.AsyncClient(timeout=60) as client:
            process, url = await start()
            paused = await client.post(f"{url}/programs/agent/run", json={"request": "clean"})
            run_id = paused.json()["run_id"]
            assert await stop(process) == 0
            kept = sqlite3.connect(db).execute("SELECT * FROM pending_runs").fetchall()

            process, url = await start()  # a new process, the same file and key
            resume = f"{url}/programs/agent/runs/{run_id}/resume"
            resumed = await client.post(resume, json=answers)
            again = await client.post(resume, json=answers)
            assert await stop(process) == 0

            with sqlite3.connect(db) as restore:  # a backup of the paused run, put back
                restore.execute("INSERT INTO pending_runs VALUES (?, ?, ?, ?, ?, ?)", kept[0])
            process, url = await start()
            replayed = await client.post(f"{url}/programs/agent/runs/{run_id}/resume", json=answers)
            assert await stop(process) == 0
    assert paused.status_code == 202, paused.text
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["output"] == {"reply": "deleted /tmp/x"}
    assert again.status_code == 409
    assert replayed.status_code == 409 and "already used" in replayed.json()["error"]["message"]
    assert log.read_text().splitlines() == ["/tmp/x"]


async def test_the_access_log_is_one_json_object_a_line_with_the_request_id(tmp_path: Path) -> None:
    async with ScriptedServer() as server:
        program, resources = files(tmp_path, server.base_url)
        logs = {}
        for flag, request_id in (("--access-log", "trace-42"), ("--no-access-log", "trace-43")):
            command = plait_command(
                "serve", f"ask={program}:make", "-r", str(resources), "--port", "0", flag
            )
            process = await asyncio.create_subprocess_exec(
                *command, env=environment(), stderr=asyncio.subprocess.PIPE
            )
            url = await _listening_url(process)
            async with httpx.AsyncClient(timeout=60) as client:
                answer = await client.post(
                    f"{url}/programs/ask/run",
                    json={"prompt": "x"},
                    headers={"X-Request-ID": request_id},
                )
            assert answer.status_code == 200
            process.send_signal(signal.SIGTERM)
            assert process.stderr is not None
            logs[flag] = (await process.stderr.read()).decode()
            assert await asyncio.wait_for(process.wait(), 60) == 0
    lines = [line for line in logs["--access-log"].splitlines() if "trace-42" in line]
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["request_id"] == "trace-42" and entry["status"] == 200
    assert entry["method"] == "POST" and entry["path"] == "/programs/ask/run"
    assert set(entry) == {"request_id", "method", "path", "status", "duration_ms", "client"}
    assert "trace-43" not in logs["--no-access-log"]


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one", "workers"])
async def test_plait_serve_answers_431_to_a_head_over_64_kib(
    tmp_path: Path, workers: list[str]
) -> None:
    from serve.test_http_protocol import TAKEN_AT_MOST, head_flood

    program, resources = files(tmp_path, "http://127.0.0.1:9/v1")
    process = await asyncio.create_subprocess_exec(
        *plait_command("serve", f"{program}:make", "-r", str(resources), "--port", "0", *workers),
        env=environment(),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        url = await _listening_url(process)
        async with httpx.AsyncClient(timeout=60) as client:
            for _ in range(3000):  # the workers listen once they have started
                with contextlib.suppress(httpx.ConnectError):
                    if (await client.get(f"{url}/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.02)
            large = await client.get(f"{url}/healthz", headers={"x-big": "a" * 70_000})
        answer, sent = await asyncio.to_thread(head_flood, url)
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 60)
    assert large.status_code == 431 and large.json()["error"]["type"] == "head_too_large"
    assert answer.startswith(b"HTTP/1.1 431 ") or answer == b""
    assert sent < TAKEN_AT_MOST
