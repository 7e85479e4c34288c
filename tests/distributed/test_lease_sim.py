"""The lease ledger's invariants on a simulated cluster (`plait.testing.lease_sim`).

Real `LeasedLimiter`s and a real `LeaseLedger`, on virtual time, with workers joining,
leaving and dying; small scales with a short lease term, so each test takes a moment.
``benchmarks/ray_lease_sim.py`` runs the same at 8 to 128 workers.
"""

from __future__ import annotations

from plait.testing.lease_sim import Scenario, simulate


def small(**options: object) -> Scenario:
    defaults: dict[str, object] = {
        "workers": 8,
        "limit": 16,
        "per_worker": 8,
        "duration": 12.0,
        "term": 2.0,
        "churn": 0.25,
        "seed": 3,
    }
    defaults.update(options)
    return Scenario(**defaults)  # type: ignore[arg-type]


def test_the_limit_holds_while_workers_join_leave_and_die():
    result = simulate(small())

    assert result.calls > 1000
    assert result.peak_leased == 16 and result.peak_in_flight == 16
    assert result.limit_held


def test_a_dead_workers_permits_come_back_within_its_term():
    result = simulate(small())

    assert len(result.returned_after) == 2 and all(result.held_at_death)
    assert all(0 < seconds <= 2.0 for seconds in result.returned_after)


def test_no_worker_starves_while_a_dead_worker_holds_permits():
    # The dead workers keep their permits for up to a term; the live ones share the rest
    # evenly (the dead ones' shares are not counted as anyone's).
    result = simulate(small(workers=16, limit=32, churn=0.25, term=8.0, duration=24.0))

    low, high = result.worst_fairness
    assert len(result.fairness) >= 12
    assert low >= 0.8 and high <= 1.2, result.fairness


def test_more_workers_than_permits_take_turns_fairly_and_cheaply():
    # A turn is many calls, not one: a handful of messages a turn instead of two a call.
    result = simulate(small(limit=4, duration=40.0, judged_after=10, ledger_options={"turn": 1.0}))

    low, high = result.worst_fairness
    assert result.limit_held
    assert result.messages_per_call < 0.2
    assert low >= 0.8 and high <= 1.2, result.fairness
    assert result.calls_per_second > 0.9 * 4 / 0.02
