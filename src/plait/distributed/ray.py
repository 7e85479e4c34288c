"""A plait program over a Ray Dataset, with endpoint limits shared by the whole cluster.

How a limit holds across workers: each endpoint of the configuration gets
one named, detached-free Ray actor (``plait-limits:<namespace>:<endpoint>``)
that holds a plain plait `Limiter` — the same FIFO slots, rpm and tpm token
buckets and pauses a single process uses. A worker's `ResourceManager` gets a
`RemoteLimiter` per endpoint instead of its own: ``acquire`` waits for the
actor to grant a slot (and the request and token reservations), ``release``
hands it back and corrects the token estimate from real usage, and a 429's
``Retry-After`` pauses the endpoint for every worker. So 2 or 200 workers
together never have more than ``max_concurrent`` requests in flight.

The other way, ``limits="shares"``, gives each of ``concurrency`` workers
1/``concurrency`` of every limit locally: no round trip to an actor, but a
worker cannot use what an idle worker leaves, and it holds only while
exactly ``concurrency`` workers run (``benchmarks/ray_bench.py`` compares
both). ``limits="local"`` gives every worker the whole limit (what you get
without plait.distributed: the limit multiplied by the worker count).

A slot held by a worker that dies is not returned; restart the job (the
actors go with the Ray job that created them).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import ray

from plait.module import Module
from plait.resources.config import EndpointConfig, ResourceConfig
from plait.resources.limits import Limiter, limiter_shares

if TYPE_CHECKING:
    from ray.actor import ActorClass

__all__ = [
    "EndpointLimits",
    "PlaitMapper",
    "RemoteLimiter",
    "build_config",
    "cluster_limiters",
    "config_spec",
    "map_dataset",
]

Limits = str
"""``"cluster"`` (one actor per endpoint), ``"shares"`` or ``"local"``."""


# ray's typed overloads of remote() leave out max_concurrency, an actor option it documents.
@ray.remote(num_cpus=0, max_concurrency=100_000)  # type: ignore[call-overload]
class EndpointLimits:
    """A Ray actor holding one endpoint's `Limiter` for every worker of the cluster.

    Async methods, so thousands of waiting ``acquire`` calls wait on the
    actor's event loop without a thread each.
    """

    def __init__(self, max_concurrent: int | None, rpm: float | None, tpm: float | None) -> None:
        # adaptive lowering needs 429s from every worker to be seen in one place: it is,
        # since on_rate_limited comes here too.
        self.limiter = Limiter(max_concurrent=max_concurrent, rpm=rpm, tpm=tpm)
        self.peak = 0

    async def acquire(self, tokens: int) -> float:
        waited = await self.limiter.acquire(tokens)
        self.peak = max(self.peak, self.limiter.in_flight)
        return waited

    def release(self, reserved: int, used: int | None) -> None:
        self.limiter.release(reserved, used)

    def on_success(self) -> None:
        self.limiter.on_success()

    def on_rate_limited(self, retry_after: float | None) -> None:
        self.limiter.on_rate_limited(retry_after)

    def pause_for(self, seconds: float) -> None:
        self.limiter.pause_for(seconds)

    def stats(self) -> dict[str, Any]:
        """In flight now, the most ever granted at once, acquisitions, waits, 429s."""
        limiter = self.limiter
        return {
            "in_flight": limiter.in_flight,
            "peak": self.peak,
            "acquired": limiter.acquired,
            "waited": limiter.waited,
            "wait_time_total": limiter.wait_time_total,
            "rate_limited": limiter.rate_limited,
        }


class RemoteLimiter:
    """Stands in for a worker's `Limiter`: every slot comes from the endpoint actor.

    ``release``, ``on_success`` and the 429 notes are sent without waiting
    for an answer (Ray runs one caller's calls to an actor in order, so a
    release never overtakes its acquire).

    An endpoint limited by ``max_concurrent`` alone has slots to pass on: a
    worker that frees a slot while its own calls wait hands it straight to
    the next of them, with no round trip, up to ``handoffs`` times in a row;
    then the slot goes back to the actor, whose queue is first come, first
    served across workers, so a busy worker cannot starve the others (nor
    hand over while a ``Retry-After`` it received pauses the endpoint). The
    number of slots held cluster-wide never changes by a hand-over, so the
    limit holds as before; only the actor's traffic drops. With rpm or tpm
    every call asks the actor, which owns the token buckets.
    """

    def __init__(self, actor: Any, config: EndpointConfig, handoffs: int = 32) -> None:
        self._actor = actor
        self.max_concurrent = config.max_concurrent
        self.rpm = config.rpm
        self.tpm = config.tpm
        self._slots_only = config.rpm is None and config.tpm is None
        self._handoffs = handoffs
        self._chain = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._asking = 0
        """Slot requests sent to the actor and not yet granted."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._paused_until = 0.0
        self.in_flight = 0
        self.queue_depth = 0
        self.acquired = 0
        self.waited = 0
        self.wait_time_total = 0.0
        self.rate_limited = 0

    async def acquire(self, tokens: int = 0) -> float:
        self.acquired += 1
        self.queue_depth += 1
        started = time.monotonic()
        try:
            if self._slots_only:
                await self._wait_for_slot()
            else:
                await self._actor.acquire.remote(tokens)
        finally:
            self.queue_depth -= 1
        self.in_flight += 1
        waited = time.monotonic() - started
        if waited > 0.001:
            self.waited += 1
            self.wait_time_total += waited
        return waited

    async def _wait_for_slot(self) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._ask()
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._give(None)  # a slot arrived as we were cancelled: pass it on
            else:
                self._waiters.remove(waiter)
            raise

    def _ask(self) -> None:
        """Asks the actor for slots until every local waiter has a request out for it."""
        while self._asking < len(self._waiters):
            self._asking += 1
            task = asyncio.get_running_loop().create_task(self._granted())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _granted(self) -> None:
        await self._actor.acquire.remote(0)
        self._asking -= 1
        self._chain = 0
        self._give(None)

    def _give(self, _: object) -> None:
        """Hands a held slot to the first local waiter, or back to the actor."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._actor.release.remote(0, None)

    def release(self, reserved: int = 0, used: int | None = None) -> None:
        self.in_flight -= 1
        if not self._slots_only:
            self._actor.release.remote(reserved, used)
            return
        paused = self._paused_until > time.monotonic()  # a Retry-After: ask the actor
        if self._waiters and self._chain < self._handoffs and not paused:
            self._chain += 1
            self._give(None)
            return
        self._chain = 0
        self._actor.release.remote(0, None)
        self._ask()

    def on_success(self) -> None:
        # Only a limiter lowered by 429s has anything to recover; a worker that has seen
        # none spares the actor a message per call.
        if self.rate_limited:
            self._actor.on_success.remote()

    def on_rate_limited(self, retry_after: float | None = None) -> None:
        self.rate_limited += 1
        if retry_after:
            self._paused_until = max(self._paused_until, time.monotonic() + retry_after)
        self._actor.on_rate_limited.remote(retry_after)

    def pause_for(self, seconds: float) -> None:
        self._paused_until = max(self._paused_until, time.monotonic() + seconds)
        self._actor.pause_for.remote(seconds)

    # EndpointStats reads these; the cluster-wide truth is `EndpointLimits.stats`.
    effective_rpm = property(lambda self: self.rpm)
    effective_tpm = property(lambda self: self.tpm)
    effective_max_concurrent = property(lambda self: self.max_concurrent)
    paused_for = property(lambda self: 0.0)


def config_spec(resources: Any) -> dict[str, Any] | str:
    """Returns what a worker rebuilds the configuration from: a mapping, or a file path.

    Raises:
        TypeError: a `ResourceConfig` built in code (it has no file to read again), or
            something that is neither a mapping nor a path.
    """
    if isinstance(resources, str | os.PathLike):
        return str(Path(resources).resolve())
    if isinstance(resources, ResourceConfig):
        if resources.source:
            return str(Path(resources.source).resolve())
        raise TypeError(
            "a ResourceConfig built in code cannot be sent to Ray workers; pass the mapping "
            "it was built from, or the path of its file (ResourceConfig.from_file)"
        )
    if isinstance(resources, Mapping):
        ResourceConfig(resources)  # check it here, not in every worker
        return json.loads(json.dumps(resources))
    raise TypeError(
        f"resources must be a mapping of alias -> endpoint settings or a config file path, "
        f"got {type(resources).__name__}"
    )


def build_config(spec: dict[str, Any] | str) -> ResourceConfig:
    """Returns the configuration a worker rebuilds from `config_spec`'s answer."""
    return ResourceConfig.from_file(spec) if isinstance(spec, str) else ResourceConfig(spec)


def _actor_name(namespace: str, endpoint: str) -> str:
    return f"plait-limits:{namespace}:{endpoint}"


def endpoint_actor(namespace: str, config: EndpointConfig, lifetime: str | None = None) -> Any:
    """Returns the limits actor of an endpoint, creating it on first use (any worker may).

    Args:
        lifetime: Ray's actor lifetime: None ties the actor to the worker that created
            it (it goes with the job); ``"detached"`` keeps it while the cluster runs, for
            workers that come and go, such as Ray Serve replicas.
    """
    # ray.remote made the class an actor class; a type checker does not apply class decorators.
    actor_class = cast("ActorClass[EndpointLimits]", EndpointLimits)
    return actor_class.options(
        name=_actor_name(namespace, config.name), get_if_exists=True, lifetime=lifetime
    ).remote(config.max_concurrent, config.rpm, config.tpm)


def cluster_limiters(namespace: str, lifetime: str | None = None) -> Callable:
    """Returns a ``limiter_factory`` for `ResourceManager` whose limiters ask the endpoint
    actors of ``namespace``, so each endpoint's limits hold across every worker using it."""
    return lambda config: RemoteLimiter(endpoint_actor(namespace, config, lifetime), config)


def _limiter_factory(limits: Limits, namespace: str, workers: int) -> Callable | None:
    if limits == "local":
        return None
    if limits == "cluster":
        return cluster_limiters(namespace)
    if limits == "shares":
        return limiter_shares(workers)
    raise ValueError(f"limits must be 'cluster', 'shares' or 'local', got {limits!r}")


class PlaitMapper:
    """A callable class for ``ds.map_batches``: runs a program on each batch of rows.

    Columns fill ``forward``'s arguments by name (``columns`` renames); every
    input column is kept, and ``output`` (the output; text as it is, anything
    else as JSON) and ``error`` (None, or why the row failed) are added. One
    row failing never fails the batch.

    Args:
        program: the program (pickled to the workers), or a function that builds it.
        resources: a mapping of alias -> endpoint settings, or a config file path.
        limits: ``"cluster"`` (default), ``"shares"`` or ``"local"`` (see the module doc).
        workers: how many mappers run at once (for ``"shares"``).
        namespace: names this job's limit actors (two jobs with one namespace share limits).
        max_concurrent: LLM calls one worker keeps in flight (default 64).
        columns: ``{argument: column}`` for arguments whose column has another name.

    Example::

        ds.map_batches(PlaitMapper, fn_constructor_kwargs={"program": Summarize(),
                       "resources": "res.toml"}, concurrency=4, batch_size=256)
    """

    def __init__(
        self,
        program: Module | Callable[[], Module],
        resources: Any,
        *,
        limits: Limits = "cluster",
        workers: int = 1,
        namespace: str = "default",
        max_concurrent: int = 64,
        columns: Mapping[str, str] | None = None,
    ) -> None:
        from plait.cli.programs import RowMapper

        self.program = program if isinstance(program, Module) else program()
        self.program.eval()
        self.mapper = RowMapper(self.program, columns)
        self.config = build_config(resources)
        self.max_concurrent = max_concurrent
        self._factory = _limiter_factory(limits, namespace, workers)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._manager: Any = None

    async def _run(self, items: list[Any]) -> list[Any]:
        from plait.execution import run
        from plait.resources import ResourceManager

        if self._manager is None:
            self._manager = ResourceManager(self.config, limiter_factory=self._factory)
        return await run(
            self.mapper.module,
            items,
            resources=self._manager,
            max_concurrent=self.max_concurrent,
            on_error="collect",
            progress=False,
        )

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        names = list(batch)
        size = len(batch[names[0]]) if names else 0
        rows = [{name: _plain(batch[name][i]) for name in names} for i in range(size)]
        items, positions = [], []
        errors: list[str | None] = [None] * size
        for i, row in enumerate(rows):
            try:
                items.append(self.mapper.item(i, row, "batch"))
                positions.append(i)
            except Exception as exc:  # a missing column fails its row only
                errors[i] = f"{type(exc).__name__}: {exc}"
        outputs: list[Any] = [None] * size
        if items:
            done = asyncio.run_coroutine_threadsafe(self._run(items), self._loop).result()
            for position, output in zip(positions, done, strict=True):
                if isinstance(output, BaseException):
                    errors[position] = f"{type(output).__name__}: {output}"
                else:
                    outputs[position] = output if isinstance(output, str) else _json(output)
        result = {name: list(batch[name]) for name in names}
        result["output"] = outputs
        result["error"] = errors
        return result


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value it holds."""
    item = getattr(value, "item", None)
    return item() if callable(item) and getattr(value, "shape", None) == () else value


def _json(output: Any) -> str:
    from pydantic_core import to_jsonable_python

    return json.dumps(to_jsonable_python(output, fallback=str), ensure_ascii=False)


def map_dataset(
    program: Module | Callable[[], Module],
    ds: Any,
    *,
    resources: Any,
    limits: Limits = "cluster",
    concurrency: int = 2,
    batch_size: int = 256,
    max_concurrent: int = 64,
    columns: Mapping[str, str] | None = None,
    namespace: str | None = None,
) -> Any:
    """Runs ``program`` on every row of a Ray Dataset; returns the Dataset of results.

    Rows keep their input order (the dataset's ``preserve_order`` is switched
    on) and every input column, plus ``output`` and ``error``. ``concurrency``
    mapper actors run at once, each keeping up to ``max_concurrent`` calls in
    flight; with ``limits="cluster"`` every endpoint limit holds across all
    of them. The result is lazy, like any Ray Dataset: ``.take_all()``,
    ``.write_parquet(...)``, ``.iter_rows()`` run it.

    Args:
        program: the program, or a function that builds it in each worker.
        ds: a ``ray.data.Dataset``.
        resources: a mapping of alias -> endpoint settings, or a config file path.
        limits: ``"cluster"``, ``"shares"`` or ``"local"`` (see the module doc).
        concurrency: mapper actors (worker processes).
        batch_size: rows handed to one mapper call.
        max_concurrent: LLM calls in flight per worker (endpoint limits apply too).
        columns: ``{argument: column}`` renames.
        namespace: names the endpoint actors; default: one per call, so
            separate jobs do not share limits unless asked to.
    """
    # A Dataset keeps the context it was created with: ordering is set on its own.
    ds.context.execution_options.preserve_order = True
    if namespace is None:
        namespace = os.urandom(4).hex()
    return ds.map_batches(
        PlaitMapper,
        fn_constructor_kwargs={
            "program": program,
            "resources": config_spec(resources),
            "limits": limits,
            "workers": concurrency,
            "namespace": namespace,
            "max_concurrent": max_concurrent,
            "columns": dict(columns or {}),
        },
        concurrency=concurrency,
        batch_size=batch_size,
        batch_format="numpy",
        zero_copy_batch=True,
    )
