"""A plait program over a Ray Dataset, with endpoint limits shared by the whole cluster.

How a limit holds across workers: each endpoint of the configuration (but one whose
model runs in each worker, ``local`` or ``test``: each keeps its own limit) gets one
named Ray actor (``plait-limits:<namespace>:<endpoint>``, `EndpointLimits`)
that owns the endpoint's ``max_concurrent``, rpm and tpm for the cluster and
lends them out in leases (`plait.distributed.leases`). A worker's
`ResourceManager` gets a `LeasedLimiter` per endpoint instead of its own
`Limiter`: it holds a few permits and rate tokens at a time and reuses them
call after call with no round trip, gives back what it has not used for 50
ms, and gives back what is above its fair share while another worker waits
below its own. A worker sends a request only while it holds a permit the
actor granted it, so 2 or 200 workers together never have more than
``max_concurrent`` requests in flight. A 429's ``Retry-After`` pauses the
endpoint for every worker. A worker that dies stops renewing its lease, and
its permits come back after the lease's term (10 s). A mapper opens its leases
(for the endpoints its program's modules name) in its constructor, before
Ray Data sends it rows, so its first calls do not wait for Ray to find the
actors and connect to them.

The other way, ``limits="shares"``, gives each of ``concurrency`` workers
1/``concurrency`` of every limit locally: no actor at all, but a worker
cannot use what an idle worker leaves, and it holds only while exactly
``concurrency`` workers run (``benchmarks/ray_bench.py`` compares both).
``limits="local"`` gives every worker the whole limit (what you get without
plait.distributed: the limit multiplied by the worker count).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import ray

from plait._jsondata import as_json_data
from plait.distributed.budgets import BudgetAccounts, LinkedBudgets
from plait.distributed.leased_limiter import LeasedLimiter
from plait.distributed.leases import DEFAULT_TERM, LeaseLedger
from plait.errors import UnknownAliasError, described
from plait.execution import run
from plait.module import Module
from plait.resources import ResourceManager
from plait.resources.budget import Budget, budgeted
from plait.resources.config import EndpointConfig, ResourceConfig
from plait.resources.limits import limiter_shares, runs_in_each_process
from plait.resources.shared_budget import BudgetStore
from plait.resources.state import StateURL, open_store

if TYPE_CHECKING:
    from ray.actor import ActorClass

__all__ = [
    "BudgetActor",
    "ClusterLimiters",
    "EndpointLimits",
    "PlaitMapper",
    "RayLink",
    "budget_actor",
    "build_config",
    "cluster_budgets",
    "cluster_limiters",
    "config_spec",
    "endpoints_used",
    "job_actors",
    "map_dataset",
    "state_spec",
]

Limits = str
"""``"cluster"`` (one actor per endpoint), ``"shares"`` or ``"local"``."""


# ray's typed overloads of remote() leave out max_concurrency, an actor option it documents.
@ray.remote(num_cpus=0, max_concurrency=100_000)  # type: ignore[call-overload]
class EndpointLimits(LeaseLedger):
    """A Ray actor holding one endpoint's limits for every worker of the cluster, which
    lends them out in leases (`plait.distributed.leases.LeaseLedger`).

    Async methods, so the watches and asks of thousands of workers wait on the actor's
    event loop without a thread each. ``stats()`` tells what is leased, to whom, and how
    many leases lapsed.
    """


@ray.remote(num_cpus=0, max_concurrency=100_000)  # type: ignore[call-overload]
class BudgetActor(BudgetAccounts):
    """A Ray actor keeping the books of the budgets every worker of a deployment or job
    shares (`plait.distributed.budgets.BudgetAccounts`): endpoint budgets, the manager's,
    and a job's own."""


class RayLink:
    """Reaches an endpoint's `EndpointLimits` actor: a message is a call of the actor."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self._actor, method).remote(*args)  # an ObjectRef, awaitable

    def send(self, method: str, *args: Any) -> None:
        getattr(self._actor, method).remote(*args)


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


def endpoint_actor(
    namespace: str,
    config: EndpointConfig,
    lifetime: str | None = None,
    lease_term: float = DEFAULT_TERM,
) -> Any:
    """Returns the limits actor of an endpoint, creating it on first use (any worker may).

    Args:
        lifetime: Ray's actor lifetime: None ties the actor to the worker that created
            it (it goes with the job); ``"detached"`` keeps it while the cluster runs, for
            workers that come and go, such as Ray Serve replicas.
        lease_term: seconds after which the permits of a worker that stopped answering
            (it died) come back; the actor's creator sets it.
    """
    # ray.remote made the class an actor class; a type checker does not apply class decorators.
    actor_class = cast("ActorClass[EndpointLimits]", EndpointLimits)
    return actor_class.options(
        name=_actor_name(namespace, config.name), get_if_exists=True, lifetime=lifetime
    ).remote(
        config.max_concurrent, config.rpm, config.tpm, term=lease_term, adaptive=config.adaptive
    )


def budget_actor(namespace: str, lifetime: str | None = None) -> Any:
    """Returns the `BudgetActor` of ``namespace``, creating it on first use (any worker
    may; ``lifetime`` as for `endpoint_actor`)."""
    actor_class = cast("ActorClass[BudgetActor]", BudgetActor)
    return actor_class.options(
        name=f"plait-budgets:{namespace}", get_if_exists=True, lifetime=lifetime
    ).remote()


def cluster_budgets(actor: Any) -> BudgetStore:
    """Returns a worker's budget store whose books ``actor`` (a `BudgetActor`) keeps, so
    every worker given the same actor spends each budget once with the others."""
    return BudgetStore(LinkedBudgets(RayLink(actor)))


class ClusterLimiters:
    """A ``limiter_factory`` for `ResourceManager` whose limiters lease permits and rate
    tokens from the endpoint actors of ``namespace``, so each endpoint's limits hold
    across every worker using it (see `endpoint_actor` for the arguments).

    One limiter per endpoint: the factory keeps those it made, so `open` can make them
    (and their leases) before the manager first asks for them. An endpoint whose model
    runs in each process (`runs_in_each_process`: ``local``, ``test``) gets none: each
    worker loads its own model, so each keeps the whole limit in its own `Limiter`.

    Args:
        actors: endpoint actors already made, by endpoint name (`map_dataset` makes them
            in the driver); an endpoint not among them has its actor found or made here.
    """

    def __init__(
        self,
        namespace: str,
        lifetime: str | None = None,
        lease_term: float = DEFAULT_TERM,
        actors: Mapping[str, Any] | None = None,
    ) -> None:
        self.namespace = namespace
        self.lifetime = lifetime
        self.lease_term = lease_term
        self.actors = dict(actors or {})
        self.limiters: dict[str, LeasedLimiter] = {}
        """The limiters made so far, by endpoint name."""

    def __call__(self, config: EndpointConfig) -> LeasedLimiter | None:
        if runs_in_each_process(config):
            return None  # the manager gives the endpoint its own local Limiter
        limiter = self.limiters.get(config.name)
        if limiter is None:
            actor = self.actors.get(config.name)
            if actor is None:
                actor = endpoint_actor(self.namespace, config, self.lifetime, self.lease_term)
            limiter = LeasedLimiter(
                RayLink(actor),
                max_concurrent=config.max_concurrent,
                rpm=config.rpm,
                tpm=config.tpm,
            )
            self.limiters[config.name] = limiter
        return limiter

    async def open(self, endpoints: Iterable[EndpointConfig]) -> None:
        """Makes the limiters of ``endpoints`` and opens their leases (`LeasedLimiter.open`).

        A worker calls this as it starts, so that finding or creating the actors (a
        blocking call to Ray) and the first connection to each are not paid by its first
        calls, and do not stall the event loop while calls are running.
        """
        limiters = [limiter for config in endpoints if (limiter := self(config)) is not None]
        await asyncio.gather(*(limiter.open() for limiter in limiters))


def cluster_limiters(
    namespace: str,
    lifetime: str | None = None,
    lease_term: float = DEFAULT_TERM,
    actors: Mapping[str, Any] | None = None,
) -> ClusterLimiters:
    """Returns a `ClusterLimiters` factory for the endpoint actors of ``namespace``."""
    return ClusterLimiters(namespace, lifetime, lease_term, actors)


def job_actors(namespace: str, config: ResourceConfig) -> dict[str, Any]:
    """Makes the limits actors of every endpoint of ``config`` that the cluster shares
    (all but those whose model runs in each process), in the calling process; returns them
    by endpoint name.

    `map_dataset` calls it in the driver, which then owns them for the whole job. A mapper
    that made one would own it, and Ray Data stops a mapper once it has no rows left: the
    actor would die with it, under the calls of the mappers still running.
    """
    return {
        endpoint.name: endpoint_actor(namespace, endpoint)
        for endpoint in config.endpoints()
        if not runs_in_each_process(endpoint)
    }


def endpoints_used(programs: Any, config: ResourceConfig) -> list[EndpointConfig]:
    """Returns the endpoints ``config`` gives the aliases the modules of ``programs`` name.

    ``programs`` is a `Module`, or a mapping or list of them. Only aliases a module holds
    (`LLMInference`, `Predict`…) are found; one a program picks at run time is not, and
    gets its limiter on first use. An alias ``config`` does not know is left out (its
    call will tell the error).
    """
    if isinstance(programs, Module):
        programs = [programs]
    elif isinstance(programs, Mapping):
        programs = list(programs.values())
    found: dict[str, EndpointConfig] = {}
    seen: set[str] = set()
    for program in programs:
        if not isinstance(program, Module):
            continue
        for module in program.modules():
            alias = getattr(module, "alias", None)
            if not isinstance(alias, str) or alias in seen:
                continue
            seen.add(alias)
            try:
                endpoints = config.fallbacks(alias)
            except UnknownAliasError:
                continue
            for endpoint in endpoints:
                found.setdefault(endpoint.name, endpoint)
    return list(found.values())


def _limiter_factory(
    limits: Limits, namespace: str, workers: int, actors: Mapping[str, Any] | None
) -> Callable | None:
    if limits == "local":
        return None
    if limits == "cluster":
        return cluster_limiters(namespace, actors=actors)
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
        budget: the job's ``(max_calls, max_tokens, max_cost)``, spent by all workers
            together (None: no job budget).
        budget_ledger: the `BudgetActor` keeping the books of the job's budgets (the
            endpoints' ``budget`` and ``budget``); default: the one of ``namespace``.
        limit_actors: the endpoints' limits actors, by endpoint name (`job_actors`);
            an endpoint left out has its actor found or made by the mapper, which then
            owns it: it dies with that mapper, so pass them when mappers come and go.
        state: a state store URL (`state_spec`'s answer): each batch's finished rows are
            kept there (`plait.execution.checkpoint_store`), so a job started again sends
            only the rows not done, whichever worker gets them.

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
        budget: tuple[int | None, int | None, float | None] | None = None,
        budget_ledger: Any = None,
        limit_actors: Mapping[str, Any] | None = None,
        state: str | None = None,
    ) -> None:
        # import time: cli.programs only for a program to map rows with
        from plait.cli.programs import RowMapper

        self.program = program if isinstance(program, Module) else program()
        self.program.eval()
        self.mapper = RowMapper(self.program, columns)
        self.config = build_config(resources)
        self._store: Any = None
        if state is not None:
            self.config = self.config.with_state(state)
            # Held for the worker's life, so a batch's checkpoint does not connect anew.
            self._store = open_store(state)
        self.max_concurrent = max_concurrent
        self._factory = _limiter_factory(limits, namespace, workers, limit_actors)
        # Budgets are one for the whole job, whatever ``limits`` says: money is not split.
        self._budgets = cluster_budgets(budget_ledger or budget_actor(namespace))
        self._budget_limits = budget
        self._budget: Any = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._manager: Any = None
        if isinstance(self._factory, ClusterLimiters):
            # Ray Data sends rows once the constructor returns: the leases are ready by then.
            endpoints = endpoints_used(self.program, self.config)
            opening = self._factory.open(endpoints)
            asyncio.run_coroutine_threadsafe(opening, self._loop).result()

    async def _run(self, items: list[Any]) -> list[Any]:
        if self._manager is None:
            self._manager = ResourceManager(
                self.config, limiter_factory=self._factory, budget_store=self._budgets
            )
            if self._budget_limits is not None:
                self._budget = self._budgets.share("job", Budget.of(*self._budget_limits))
        with budgeted(self._budget):
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
                if isinstance(output, BaseException):  # the error's class and its module
                    errors[position] = described(output, index=False)
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
    return json.dumps(as_json_data(output), ensure_ascii=False)


def state_spec(state: str | os.PathLike[str]) -> str:
    """Returns the state URL a worker opens: as given (its password unmasked), an SQLite
    path made absolute (a worker runs in another folder).

    Raises:
        ConfigError: ``state`` is not a state URL.
    """
    url = StateURL.parse(state)  # checked here, not in every worker
    return (
        str(Path(state).resolve())
        if url.kind == "sqlite" and "://" not in str(state)
        else str(state)
    )


def map_dataset(
    program: Module | Callable[[], Module],
    ds: Any,
    *,
    resources: Any,
    state: str | os.PathLike[str] | None = None,
    limits: Limits = "cluster",
    concurrency: int = 2,
    batch_size: int = 256,
    max_concurrent: int = 64,
    columns: Mapping[str, str] | None = None,
    namespace: str | None = None,
    max_calls: int | None = None,
    max_tokens: int | None = None,
    max_cost: float | None = None,
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
        state: a state store URL (``"postgresql://…"``, or an SQLite file every worker
            reaches): each finished row is kept there, keyed by the program and the row,
            so the job killed (its driver or a worker) and started again sends only the
            rows not done. Without it a job keeps no checkpoint (the resources file's
            ``[state]`` table works too).
        limits: ``"cluster"``, ``"shares"`` or ``"local"`` (see the module doc).
        concurrency: mapper actors (worker processes).
        batch_size: rows handed to one mapper call.
        max_concurrent: LLM calls in flight per worker (endpoint limits apply too).
        columns: ``{argument: column}`` renames.
        namespace: names the endpoint actors; default: one per call, so
            separate jobs do not share limits unless asked to.
        max_calls, max_tokens, max_cost: the job's hard budget, spent by all workers
            together (as `plait.resources.budget.Budget`): a row whose call it refuses
            gets its ``error``; endpoints' ``budget`` are spent once by the job too.
    """
    # A Dataset keeps the context it was created with: ordering is set on its own.
    ds.context.execution_options.preserve_order = True
    if namespace is None:
        namespace = os.urandom(4).hex()
    budget = Budget.of(max_calls, max_tokens, max_cost)  # the limits checked here, once
    # Made here, so the job's driver owns it: the books outlive any one worker, and the
    # handle each mapper holds keeps it alive for the job.
    ledger = budget_actor(namespace)
    spec = config_spec(resources)
    # The endpoints' limits actors too (`job_actors` says why).
    actors = job_actors(namespace, build_config(spec)) if limits == "cluster" else {}
    return ds.map_batches(
        PlaitMapper,
        fn_constructor_kwargs={
            "program": program,
            "resources": spec,
            "limits": limits,
            "workers": concurrency,
            "namespace": namespace,
            "max_concurrent": max_concurrent,
            "columns": dict(columns or {}),
            "budget": None if budget is None else (max_calls, max_tokens, max_cost),
            "budget_ledger": ledger,
            "limit_actors": actors,
            "state": None if state is None else state_spec(state),
        },
        concurrency=concurrency,
        batch_size=batch_size,
        batch_format="numpy",
        zero_copy_batch=True,
    )
