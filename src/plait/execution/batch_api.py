"""Provider Batch APIs: a large batch answered offline, at the batch price, level by level.

`BatchJob` runs every item of a batch through the program as usual, except
that LLM calls are not sent one by one: each call waits in a *round* until
every unfinished item is waiting on at least one call, then the round goes
to the provider as one batch (OpenAI: a JSONL file on ``/v1/files`` and a
``/v1/batches`` job; Anthropic: a Message Batch through its SDK), is polled
until it finishes (within the run's ``deadline``, if it has one; a status the
Batch API does not have stops the polling), and each answer resumes the call
that asked it. A program with several levels of LLM calls (extract, then
judge) therefore takes one round per level, and ``async def forward`` leaves
and structured re-asks simply add rounds.

Resuming: with ``checkpoint_dir``, the id of each submitted batch is stored
(``batch_api.json``) under the SHA-256 of its exact request lines before it is
polled. A rerun builds the same rounds, finds their batches and reads their
results instead of paying again, so an interrupted job resumes where it
stopped, even if the provider took hours.

Cost is recorded at the endpoint's price times ``price_factor`` (0.5: the
providers' batch discount). Batch answers skip the response cache and the
live limits (a batch is one request), and a line that failed with a
retryable status goes into the next round, up to the endpoint's ``max_retries``.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait import _context, _files
from plait.backends import providers
from plait.backends.types import Request, Response
from plait.errors import BackendError, ConfigError, locate
from plait.execution.batch import unfinished_error
from plait.execution.checkpoint_codec import CheckpointError
from plait.execution.executor import Executor
from plait.execution.graph_cache import RunGraphs
from plait.execution.scheduler import execute_graph
from plait.module import Module

__all__ = ["BatchJob"]

_ITEM: contextvars.ContextVar[int | None] = contextvars.ContextVar("plait_batch_item", default=None)
_STATE = "batch_api.json"
_FORMAT = "plait.batch_api/1"
_SETTLE_SPINS = 5
"""Loop turns with no new call before a round is considered complete."""
_UNKNOWN_STATUS_POLLS = 3
"""Polls in a row that may report a status the Batch API does not have before polling stops."""


def _check_endpoint(alias: str, endpoint: Any) -> None:
    # import time: `import plait.execution` stays without the resource layer
    from plait.resources.endpoint import missing_credential

    spec = providers.get(endpoint.provider)
    if spec is None or spec.batch_api is None:
        first, *others = [repr(s.name) for s in providers.specs() if s.batch_api is not None]
        raise ConfigError(
            f"alias {alias!r} is a {endpoint.provider!r} endpoint; batch_api=True needs an "
            f"{first} endpoint whose server has the Batch API"
            + "".join(f", or an {other} one" for other in others)
        )
    missing = missing_credential(endpoint)
    if missing is not None:  # the Batch API's clients are built outside the manager
        raise ConfigError(f"alias {alias!r}: {missing}")


def _client_for(endpoint: Any) -> Any:
    spec = providers.get(endpoint.provider)
    assert spec is not None  # _check_endpoint passed
    return spec.batch_client(endpoint)


def _name_alias(error: BackendError, alias: str) -> None:
    """Sets the alias of a failure that reaches the program, and names it in the message."""
    error.alias = alias
    error.args = (f"alias {alias!r}: {error}", *error.args[1:])


@dataclass
class _Call:
    item: int | None
    alias: str
    request: Request
    future: asyncio.Future[Response]
    accept: Any
    attempts: int = 0


@dataclass
class _Collector:
    """Stands in for the ResourceManager inside the job: every call joins the next round."""

    pending: list[_Call] = field(default_factory=list)

    async def complete(
        self, alias: str, request: Request, *, cache: bool = True, accept: Any = None, **_: Any
    ) -> Response:
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.pending.append(_Call(_ITEM.get(), alias, request, future, accept))
        return await future

    def blocked(self) -> set[int | None]:
        return {call.item for call in self.pending}


class BatchJob:
    """Runs a batch of inputs through a provider's Batch API (see the module doc).

    Args:
        module: the program.
        resources: ResourceConfig / mapping / ResourceManager; every alias the
            program uses must be an ``openai`` endpoint (its ``base_url`` may be
            any server with the Batch API) or an ``anthropic`` one (Message Batches).
        checkpoint_dir: where submitted batch ids are kept, so a rerun resumes.
        poll_interval: seconds between status checks of a running batch.
        price_factor: the share of the endpoint's price a batch call costs.

    Example::

        job = BatchJob(program, config, checkpoint_dir="runs/nightly")
        outputs = await job.run(rows)          # or plait.run(program, rows, batch_api=True)
    """

    def __init__(
        self,
        module: Module,
        resources: Any,
        *,
        checkpoint_dir: str | Path | None = None,
        poll_interval: float = 30.0,
        price_factor: float = 0.5,
    ) -> None:
        self.module = module
        self.resources = resources
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.poll_interval = poll_interval
        self.price_factor = price_factor
        self.rounds = 0
        """Rounds (provider batches) this job's last `run` went through."""
        self.batch_ids: list[str] = []
        """Provider batch ids of the last `run`, in round order (resumed ones included)."""
        self._clients: dict[str, Any] = {}

    async def run(
        self,
        items: list[Any],
        *extra: Any,
        on_error: str = "raise",
        deadline: float | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Runs every item; returns the outputs in input order.

        Args:
            items: the batch.
            *extra: further positional arguments of ``forward``, shared by all items.
            on_error: ``raise`` (the first failed item raises) or ``collect``
                (a failed item's place holds its exception).
            deadline: seconds the whole job may take, polling included; an item
                unfinished by then fails with `DeadlineExceededError`. Its
                provider batch is not cancelled: with ``checkpoint_dir``, a
                rerun collects it instead of paying again.
            **kwargs: keyword arguments of ``forward``, shared by all items.
        """
        return await self.run_traced(
            RunGraphs(self.module), items, extra, kwargs, on_error, deadline
        )

    async def run_traced(
        self,
        graphs: RunGraphs,
        items: list[Any],
        extra: tuple[Any, ...],
        kwargs: dict[str, Any],
        on_error: str = "raise",
        deadline: float | None = None,
    ) -> list[Any]:
        """`run`, looking up each input shape's graph in ``graphs`` (``plait.run`` reports them)."""
        # import time: `import plait.execution` stays without the resource layer
        from plait.resources import ResourceManager

        manager = ResourceManager.shared(self.resources)
        for sub in self.module.modules():  # refuse before anything runs, where it can be seen
            alias = getattr(sub, "alias", None)
            if isinstance(alias, str):
                _check_endpoint(alias, manager.config.resolve(alias))
        collector = _Collector()
        executor = Executor(collector, max_concurrent=2**31 - 1)
        self.rounds, self.batch_ids = 0, []
        tasks = [
            asyncio.create_task(self._item(executor, graphs, index, item, extra, kwargs))
            for index, item in enumerate(items)
        ]
        try:
            async with asyncio.timeout(deadline) as scope:
                while await self._settle(collector, tasks):
                    calls, collector.pending = collector.pending, []
                    await self._round(manager, calls, collector)
                results = await asyncio.gather(*tasks, return_exceptions=True)
        except TimeoutError:
            if deadline is None or not scope.expired():
                raise
            results = self._late(tasks, deadline)
        finally:
            for task in tasks:
                task.cancel()
            for call in collector.pending:
                call.future.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for client in self._clients.values():
                await client.aclose()
            self._clients.clear()
        outputs = []
        for index, result in enumerate(results):
            if isinstance(result, BaseException) and on_error != "collect":
                raise locate(result, f"input {index} failed", input_index=index)
            outputs.append(result)
        return outputs

    def _late(self, tasks: list[asyncio.Task[Any]], deadline: float) -> list[Any]:
        """Returns each item's result, or its `DeadlineExceededError` when it had not finished."""
        finished = [task.done() and not task.cancelled() for task in tasks]
        unfinished = finished.count(False)
        detail = (
            "; its provider batch was not cancelled: a rerun with the same checkpoint_dir "
            "collects it instead of paying again"
            if self.checkpoint_dir is not None
            else ""
        )
        return [
            (task.exception() or task.result())
            if done
            else unfinished_error(index, deadline, unfinished, len(tasks), detail)
            for index, (task, done) in enumerate(zip(tasks, finished, strict=True))
        ]

    async def _item(
        self,
        executor: Executor,
        graphs: RunGraphs,
        index: int,
        item: Any,
        extra: tuple[Any, ...],
        kwargs: dict,
    ) -> Any:
        _ITEM.set(index)  # this task's context: every call it makes is noted as item ``index``
        args = (item, *extra)
        graph = graphs.graph_for(args, kwargs)
        output, _ = await execute_graph(graph, executor, args, kwargs, index)
        return output

    async def _settle(self, collector: _Collector, tasks: list[asyncio.Task[Any]]) -> bool:
        """Waits until every unfinished item waits on a call; False when all are done.

        Correctness never depends on this: a call made after a round was sent
        just waits for the next one.
        """
        quiet, seen = 0, -1
        while True:
            unfinished = sum(not task.done() for task in tasks)
            if not unfinished:
                return False
            count = len(collector.pending)
            quiet = quiet + 1 if count == seen else 0
            seen = count
            if count and quiet >= _SETTLE_SPINS and len(collector.blocked()) >= unfinished:
                return True
            # An item busy with something else (a tool, a thread) gets real time to finish.
            await asyncio.sleep(0 if quiet < 50 else 0.01)

    # -- one round ----------------------------------------------------------------------

    async def _round(self, manager: Any, calls: list[_Call], collector: _Collector) -> None:
        self.rounds += 1
        by_endpoint: dict[str, list[_Call]] = {}
        for call in calls:
            endpoint = manager.config.resolve(call.alias)
            try:
                _check_endpoint(call.alias, endpoint)
            except ConfigError as error:
                call.future.set_exception(error)
                continue
            by_endpoint.setdefault(endpoint.name, []).append(call)
        await asyncio.gather(
            *(self._submit(manager, name, group, collector) for name, group in by_endpoint.items())
        )

    async def _submit(
        self, manager: Any, endpoint: str, calls: list[_Call], collector: _Collector
    ) -> None:
        config = manager.config.resolve(calls[0].alias)
        client = self._clients.get(endpoint)
        if client is None:
            client = self._clients[endpoint] = _client_for(config)
        lines = [client.input_line(f"request-{n}", call.request) for n, call in enumerate(calls)]
        key = hashlib.sha256(b"\n".join(lines)).hexdigest()
        started = time.perf_counter()
        try:
            batch_id = self._stored(key)
            if batch_id is None:
                created = await client.submit(lines, {"plait_round": str(self.rounds)})
                batch_id = created["id"]
                self._store(key, batch_id)
            self.batch_ids.append(batch_id)
            batch = await self._poll(client, batch_id)
            replies = await client.results(batch, [f"request-{n}" for n in range(len(calls))])
        except BackendError as exc:  # the whole round failed: every call of it says so
            _name_alias(exc, calls[0].alias)
            for call in calls:
                call.future.set_exception(exc)
            return
        latency = time.perf_counter() - started
        for n, call in enumerate(calls):
            self._deliver(manager, call, replies.get(f"request-{n}"), batch, latency, collector)

    def _deliver(
        self, manager: Any, call: _Call, reply: Any, batch: dict, latency: float, collector: Any
    ) -> None:
        call.attempts += 1
        if reply is None or reply.response is None:
            error = reply.error if reply is not None else None
            if error is None:
                error = BackendError(
                    f"batch {batch.get('id')} ended {batch.get('status')!r} without an answer "
                    "for this request",
                    retryable=batch.get("status") == "expired",
                )
            retries = manager.config.resolve(call.alias).max_retries
            if error.retryable and call.attempts <= retries:
                collector.pending.append(call)  # asked again in the next round
                return
            _name_alias(error, call.alias)
            error.attempts = call.attempts
            call.future.set_exception(error)
            return
        response = reply.response
        manager.record_usage(call.alias, response.usage, price_factor=self.price_factor)
        profiler = _context.PROFILE.get()
        if profiler is not None:
            profiler.record_usage(call.alias, response.usage)
        response.meta.update(
            alias=call.alias, attempts=call.attempts, latency=latency, wait_time=0.0,
            batch_id=batch.get("id"),
        )  # fmt: skip
        if call.accept is not None:
            call.accept(response)
        call.future.set_result(response)

    async def _poll(self, client: Any, batch_id: str) -> dict[str, Any]:
        """Polls until the batch is done; gives up on a status the Batch API does not have.

        A running batch is polled for as long as it runs (the ``deadline`` of
        the run bounds that); a server that keeps answering a status no batch
        has would otherwise be polled forever.
        """
        # import time: only a Batch API run
        from plait.backends.openai.batch import BATCH_DONE, BATCH_RUNNING

        unknown = 0
        while True:
            batch = await client.retrieve(batch_id)
            status = batch.get("status")
            named = isinstance(status, str)  # a hostile server may send a list here
            if named and status in BATCH_DONE:
                return batch
            if named and status in BATCH_RUNNING:
                unknown = 0
            else:
                unknown += 1
                if unknown >= _UNKNOWN_STATUS_POLLS:
                    raise BackendError(
                        f"batch {batch_id} reported status {status!r} on {unknown} polls in a "
                        "row, which is not a Batch API status (running: "
                        f"{', '.join(sorted(BATCH_RUNNING))}; done: "
                        f"{', '.join(sorted(BATCH_DONE))}); stopped polling it"
                    )
            await asyncio.sleep(self.poll_interval)

    # -- the stored batch ids ------------------------------------------------------------

    def _state(self) -> dict[str, str]:
        if self.checkpoint_dir is None:
            return {}
        path = self.checkpoint_dir / _STATE
        remedy = "delete it, or use another checkpoint_dir"
        data = _files.read_json(path, error=CheckpointError, remedy=remedy)
        if data is None:
            return {}
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise CheckpointError(f"{path} is not a plait batch checkpoint: {remedy}")
        batches = data.get("batches")
        return {str(k): str(v) for k, v in batches.items()} if isinstance(batches, dict) else {}

    def _stored(self, key: str) -> str | None:
        return self._state().get(key)

    def _store(self, key: str, batch_id: str) -> None:
        if self.checkpoint_dir is None:
            return
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        batches = {**self._state(), key: batch_id}
        text = json.dumps({"format": _FORMAT, "batches": batches}, indent=2) + "\n"
        _files.write_atomically(self.checkpoint_dir / _STATE, text, error=CheckpointError)
