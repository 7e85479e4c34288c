"""Fault soak of `plait serve`: many clients, a faulty upstream, and every answer checked.

The upstream is plait's scripted OpenAI-compatible server in a process of its own, failing
on purpose: 3 % of requests answered 429, 3 % answered 500, 2 % of connections dropped
unanswered, 2 % of streams cut inside the text, 0.3 % hanging (each fault drawn by its own
seeded generator, in that order, so the later ones see a little less than their rate).
The served app is ``plait serve`` itself (real uvicorn, one worker), its endpoint retrying
(``max_retries=6``) and giving up on an attempt after ``--attempt-timeout`` seconds (how a
hang ends). The clients, in this process, are 64 loops of httpx requests that take turns
over four kinds: ``/v1/chat/completions`` plain and streamed (the official wire format,
read by hand), and ``/programs/chat/run`` plain and streamed (SSE, its text rebuilt from the
deltas as a client does).

Each request asks for a reply that no other request gets (the echo of its own numbered
prompt), so every answer is checked against the one expected: ``wrong`` (another text, or
streamed text that does not add up to it), ``duplicated`` (the text twice: a retry's text
after the failed attempt's), ``lost`` (no answer, a transport error, a 5xx, a stream that
ended without its last event), ``refused`` (a clean error answer: the retries ran out, or a
stream ended with an error event). The server's resident memory (RSS) is read once it has
warmed up, at the middle and at the end. The exit status is 1 when anything was wrong,
duplicated or lost.

Run it alone (it keeps two cores busy)::

    flock /tmp/heavy.lock python benchmarks/serve_soak.py [--requests 10000] [--clients 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from serve_bench import _listening, rss_mb

from plait.testing import Fault, fetch_stats, start_server_process

HERE = Path(__file__).resolve().parent
KINDS = ("v1", "v1-stream", "run", "run-stream")
PADDING = "and the reply is long enough to come in several pieces " * 2


def faults() -> list[Fault]:
    """The upstream's failures (see the module docstring)."""
    return [
        Fault(status=429, rate=0.03, seed=1),
        Fault(status=500, rate=0.03, seed=2),
        Fault(kind="drop", rate=0.02, seed=3),
        Fault(kind="drop", after_chunks=3, rate=0.02, seed=4, stream=True),
        Fault(kind="slow", delay=3600.0, rate=0.003, seed=5),
    ]


def make_program() -> Any:
    """The served program: one model call answering a conversation."""
    from plait import History, LLMInference, Module

    class Chat(Module):
        def __init__(self) -> None:
            super().__init__()
            self.llm = LLMInference("llm", "Answer briefly.")

        def forward(self, history: History) -> str:
            return self.llm(history)

    return Chat()


def resources(upstream: str, attempt_timeout: float) -> dict[str, Any]:
    return {
        "llm": {
            "provider": "openai",
            "model": "scripted",
            "base_url": upstream,
            "api_key": "soak-key",
            "max_concurrent": 64,
            "max_retries": 6,
            "retry_base_delay": 0.05,
            "retry_max_delay": 0.5,
            "timeout": attempt_timeout,
        }
    }


# -- one request of each kind: each returns the answer's text, or raises Outcome ------


class Outcome(Exception):
    """How a request ended when it did not end with a reply text."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


def _failed(status: int, text: str) -> Outcome:
    return Outcome(
        "lost" if status >= 500 and status != 503 else "refused", f"{status} {text[:200]}"
    )


async def ask_v1(client: Any, prompt: str) -> str:
    body = {"model": "chat", "messages": [{"role": "user", "content": prompt}]}
    answer = await client.post("/v1/chat/completions", json=body)
    if answer.status_code != 200:
        raise _failed(answer.status_code, answer.text)
    return str(answer.json()["choices"][0]["message"]["content"])


async def ask_v1_stream(client: Any, prompt: str) -> str:
    body = {"model": "chat", "messages": [{"role": "user", "content": prompt}], "stream": True}
    text: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as answer:
        if answer.status_code != 200:
            raise _failed(answer.status_code, (await answer.aread()).decode())
        async for line in answer.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return "".join(text)
            data = json.loads(line[6:])
            if "error" in data:
                raise Outcome("refused", str(data["error"].get("message")))
            for choice in data.get("choices", ()):
                text.append(choice["delta"].get("content") or "")
    raise Outcome("lost", "the stream ended without [DONE]")


async def ask_run(client: Any, prompt: str) -> str:
    body = {"history": [{"role": "user", "content": prompt}]}
    answer = await client.post("/programs/chat/run", json=body)
    if answer.status_code != 200:
        raise _failed(answer.status_code, answer.text)
    return str(answer.json()["output"])


async def ask_run_stream(client: Any, prompt: str) -> str:
    body = {"history": [{"role": "user", "content": prompt}]}
    texts: dict[tuple[str, str], str] = {}
    name = ""
    async with client.stream("POST", "/programs/chat/run?stream=true", json=body) as answer:
        if answer.status_code != 200:
            raise _failed(answer.status_code, (await answer.aread()).decode())
        async for line in answer.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
                continue
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            if name == "restart":
                texts = {key: text for key, text in texts.items() if key[0] != data["module"]}
            elif name == "text":
                key = (data["module"], data["field"])
                before = texts.get(key, "")
                texts[key] = before[: data.get("keep", len(before))] + data["delta"]
            elif name == "error":
                raise Outcome("refused", str(data["error"].get("message")))
            elif name == "output":
                streamed = "".join(texts.values())
                if streamed != data["output"]:
                    raise Outcome("wrong", f"streamed {streamed!r}, output {data['output']!r}")
                return str(data["output"])
    raise Outcome("lost", "the stream ended without its output event")


ASK: dict[str, Callable[[Any, str], Awaitable[str]]] = {
    "v1": ask_v1,
    "v1-stream": ask_v1_stream,
    "run": ask_run,
    "run-stream": ask_run_stream,
}


# -- the soak ---------------------------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.examples: dict[str, str] = {}
        self.done = 0

    def note(self, kind: str, outcome: str, detail: str = "") -> None:
        self.counts[(kind, outcome)] += 1
        self.done += 1
        if outcome != "ok" and outcome not in self.examples:
            self.examples[outcome] = f"{kind}: {detail}"[:400]

    def total(self, outcome: str) -> int:
        return sum(n for (_, o), n in self.counts.items() if o == outcome)


async def soak(url: str, pid: int, requests: int, clients: int) -> tuple[Tally, list[float]]:
    import httpx

    tally = Tally()
    readings: list[float] = []
    numbers = iter(range(requests))
    limits = httpx.Limits(max_connections=clients * 2, max_keepalive_connections=clients)
    timeout = httpx.Timeout(300.0)

    async def client(index: int, http: Any) -> None:
        for number in numbers:
            kind = KINDS[(number + index) % len(KINDS)]
            prompt = f"soak request {number} from client {index} {PADDING}"
            expected = f"echo: {prompt}"
            try:
                text = await ASK[kind](http, prompt)
            except Outcome as outcome:
                tally.note(kind, outcome.kind, outcome.detail)
                continue
            except httpx.HTTPError as exc:
                tally.note(kind, "lost", f"{type(exc).__name__}: {exc}")
                continue
            if text == expected:
                tally.note(kind, "ok")
            elif expected in text:
                tally.note(kind, "duplicated", text)
            else:
                tally.note(kind, "wrong", f"expected {expected!r}, got {text!r}")

    async def watch() -> None:
        half = requests // 2
        while tally.done < half:
            await asyncio.sleep(0.2)
        readings.append(rss_mb(pid))

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as http:
        started = time.monotonic()
        watcher = asyncio.ensure_future(watch())
        await asyncio.gather(*(client(i, http) for i in range(clients)))
        watcher.cancel()
        readings.append(rss_mb(pid))
        print(f"{tally.done} requests in {time.monotonic() - started:.1f} s")
    return tally, readings


async def warm_up(url: str) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for _ in range(600):
            try:
                if (await http.get("/readyz")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
        for number in range(200):
            await ask_run(http, f"warm-up {number}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--attempt-timeout", type=float, default=2.0)
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory() as folder,
        start_server_process(faults=faults(), stream_pieces=6) as (_, upstream),
    ):
        res = Path(folder) / "res.json"
        res.write_text(json.dumps(resources(upstream, args.attempt_timeout)))
        command = [sys.executable, "-m", "plait", "serve", f"chat={Path(__file__)}:make_program"]
        command += ["-r", str(res), "--port", "0", "--max-active", "256", "--max-queued", "256"]
        command += ["--no-access-log"]
        log = Path(folder) / "plait-serve.log"
        with _listening(command, "Uvicorn running on ", log) as (pid, url):
            asyncio.run(warm_up(url))
            start = rss_mb(pid)
            tally, (middle, end) = asyncio.run(soak(url, pid, args.requests, args.clients))
        upstream_seen = fetch_stats(upstream)
        root = upstream.removesuffix("/").removesuffix("/v1")
        with urllib.request.urlopen(f"{root}/faults", timeout=30) as answer:
            fired = {Fault.from_dict(f).describe(): f["fired"] for f in json.load(answer)}
    print(f"upstream: {upstream_seen['requests']} requests seen (retries included); faults {fired}")
    for kind in KINDS:
        row = {o: n for (k, o), n in sorted(tally.counts.items()) if k == kind}
        print(f"  {kind:<11} {row}")
    bad = {o: tally.total(o) for o in ("wrong", "duplicated", "lost")}
    print(f"ok {tally.total('ok')}, refused {tally.total('refused')}, " +
          ", ".join(f"{o} {n}" for o, n in bad.items()))  # fmt: skip
    for outcome, example in tally.examples.items():
        print(f"  first {outcome}: {example}")
    print(f"server RSS: start {start:.1f} MiB, middle {middle:.1f} MiB, end {end:.1f} MiB")
    sys.exit(1 if any(bad.values()) else 0)


if __name__ == "__main__":
    main()
