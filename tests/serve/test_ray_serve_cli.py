"""``plait serve --ray-replicas`` as a person runs it: it starts a local Ray, serves through
Ray Serve's proxy, and a SIGTERM lets the run in flight finish before the command exits 0."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import pytest

from plait.testing import ScriptedServer
from serve.support import RAY_ON_A_BUSY_MACHINE, Gate, free_port, until
from serve.test_cli_serve import environment, files, plait_command

pytest.importorskip("ray.serve")


async def test_ray_replicas_serve_and_sigterm_lets_the_run_in_flight_finish(tmp_path: Path):
    gate = Gate("answered on ray")
    async with ScriptedServer(responder=gate) as server:
        program, resources = files(tmp_path, server.base_url)
        port = free_port()
        process = await asyncio.create_subprocess_exec(
            *plait_command(
                "serve", f"ask={program}:make", "-r", str(resources),
                "--port", str(port), "--ray-replicas", "2",
            ),
            env={**environment(), **RAY_ON_A_BUSY_MACHINE},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                await _until_ready(client, url, process)
                run = asyncio.ensure_future(
                    client.post(f"{url}/programs/ask/run", json={"prompt": "x"})
                )
                await until(lambda: server.stats.in_flight == 1, "the run's upstream request")
                process.send_signal(signal.SIGTERM)
                gate.opened.set()
                finished = await run
            code = await asyncio.wait_for(process.wait(), 120)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert finished.status_code == 200 and finished.json()["output"] == "answered on ray"
    assert code == 0


def test_ray_replicas_and_workers_together_are_one_line_with_exit_2(tmp_path: Path):
    import subprocess

    program, resources = files(tmp_path, "http://127.0.0.1:9/v1")
    args = [f"{program}:make", "-r", str(resources), "--ray-replicas", "2", "--workers", "2"]

    done = subprocess.run(
        plait_command("serve", *args), capture_output=True, text=True, env=environment(),
        timeout=120,
    )  # fmt: skip

    assert done.returncode == 2
    assert done.stderr.strip() == (
        "plait: error: --ray-replicas and --workers both run copies of the server; choose one"
    )


async def _until_ready(
    client: httpx.AsyncClient, url: str, process: asyncio.subprocess.Process
) -> None:
    """Waits (generously: Ray and its replicas start) until the app answers /readyz 200."""
    for _ in range(1200):
        if process.returncode is not None:
            raise AssertionError(f"plait serve exited with {process.returncode}")
        try:
            if (await client.get(f"{url}/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass  # the proxy is not listening yet
        await asyncio.sleep(0.1)
    raise AssertionError("the Ray Serve app never became ready")
