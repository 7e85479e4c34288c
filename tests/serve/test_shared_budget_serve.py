"""One endpoint budget spent by two ``plait serve`` servers (one of two workers) sharing a
state store on a real PostgreSQL server: together they never pass it."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx

from plait.testing import ScriptedServer
from serve.test_cli_serve import _listening_url, environment, plait_command
from serve.test_workers import PROGRAM, _until_ready, files, ten_tokens


async def test_two_servers_and_their_workers_spend_one_budget(
    state_url: str, tmp_path: Path
) -> None:
    async with ScriptedServer(latency=0.05, keep_log=False, responder=ten_tokens) as server:
        # every call costs $1.00 and holds at most $1.00 while in flight: room for 20 calls
        budget = "budget = 20.0\nprice = {input = 0.0, output = 100000.0}\n"
        program, resources = files(tmp_path, server.base_url, max_concurrent=16, budget=budget)
        program.write_text(PROGRAM.replace('"Be brief.")', '"Be brief.", max_tokens=10)'))
        serve = ["serve", f"pid={program}:make", "-r", str(resources), "--port", "0"]
        commands = [
            plait_command(*serve, "--state", state_url, "--workers", "2"),
            plait_command(*serve, "--state", state_url),
        ]
        processes = [
            await asyncio.create_subprocess_exec(
                *command, env=environment(), stderr=asyncio.subprocess.PIPE
            )
            for command in commands
        ]
        urls = [await _listening_url(process) for process in processes]
        logs = [asyncio.ensure_future(p.stderr.read()) for p in processes]  # type: ignore[union-attr]
        statuses: list[int] = []
        try:
            async with httpx.AsyncClient(timeout=120) as client:
                for url in urls:
                    await _until_ready(client, url)
            for _ in range(4):  # rounds of 16 at each server, until the budget refuses
                async with httpx.AsyncClient(
                    limits=httpx.Limits(max_connections=32), timeout=120
                ) as client:
                    answers = await asyncio.gather(
                        *(
                            client.post(f"{url}/programs/pid/run", json={"prompt": f"q{i}"})
                            for url in urls
                            for i in range(16)
                        )
                    )
                statuses += [a.status_code for a in answers]
                if any(s != 200 for s in statuses):
                    break
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            codes = [await asyncio.wait_for(p.wait(), 60) for p in processes]
            await asyncio.gather(*logs)
    # each server's own $20 would let 40 through; one budget for all: 19 or 20 calls
    assert 19 <= server.stats.requests <= 20, statuses
    assert statuses.count(200) == server.stats.requests
    assert codes == [0, 0]
