"""The race's rules on given costs: stopping, budget, ties to the earlier-listed, memory."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence

import pytest

from edge_core.selection.racing import Race, RaceSettings


def drive(race: Race, cost_of: Callable[[int, int], float]) -> list[int]:
    """Run the race: ``cost_of(entrant, sample number)``; returns the order timed."""
    order: list[int] = []
    while (index := race.next()) is not None:
        race.record(index, cost_of(index, len(race.entrants[index].samples)))
        order.append(index)
        assert len(order) < 10_000
    return order


def jitter(base: Sequence[float], spread: float = 0.02, seed: int = 1) -> Callable[[int, int],
                                                                                     float]:
    rng = random.Random(seed)
    return lambda i, _n: base[i] * (1.0 + rng.uniform(-spread, spread))


def test_a_clearly_slower_entrant_stops_early_and_loses() -> None:
    race = Race(["slow", "fast"], RaceSettings(min_samples=3, max_samples=30))
    drive(race, jitter([2.0, 1.0]))
    result = race.result()
    slow, fast = result.entrants
    assert result.chosen == 1 and fast["outcome"] == "chosen"
    assert slow["outcome"] == "slower" and slow["stopped"] == "race"
    assert 6 <= slow["samples"] < 30  # stopped once its bounds separated, not at the cap
    assert slow["relative"] == pytest.approx(1.0, abs=0.05)
    assert "fast: the best p50 latency" in result.reason


def test_a_tie_within_the_margin_keeps_the_earlier_listed() -> None:
    race = Race(["first", "second"], RaceSettings(margin=0.05, max_samples=12))
    drive(race, jitter([1.03, 1.0], spread=0.001))
    result = race.result()
    assert result.chosen == 0
    assert result.entrants[1]["outcome"] == "tie"
    assert "earlier-listed is kept" in result.reason
    # neither can stop the other: both reach the cap
    assert [e["stopped"] for e in result.entrants] == [None, None]
    assert [e["samples"] for e in result.entrants] == [12, 12]


def test_beyond_the_margin_the_later_listed_wins() -> None:
    race = Race(["first", "second"], RaceSettings(margin=0.05, max_samples=12))
    drive(race, jitter([1.10, 1.0], spread=0.001))
    assert race.result().chosen == 1


def test_rounds_rotate_so_no_entrant_is_always_first() -> None:
    race = Race(["a", "b", "c"], RaceSettings(max_samples=4))
    order = drive(race, lambda i, n: 1.0)
    rounds = [order[i:i + 3] for i in range(0, len(order), 3)]
    assert {r[0] for r in rounds} == {0, 1, 2}


def test_the_budget_stops_the_race_but_every_entrant_gets_a_first_sample() -> None:
    race = Race(["a", "b", "c"], RaceSettings(budget_s=5.0, max_samples=50))
    drive(race, lambda i, n: [2.0, 30.0, 1.0][i])  # b's one sample spends the budget
    result = race.result()
    a, b, c = result.entrants
    assert [e["samples"] for e in result.entrants] == [1, 1, 1]
    assert [e["stopped"] for e in result.entrants] == ["budget"] * 3
    assert result.spent_s >= 5.0
    assert result.chosen == 2 and b["outcome"] == "slower" and a["outcome"] == "slower"
    assert c["p50_s"] == 1.0


def test_nothing_measured_keeps_the_first() -> None:
    race = Race(["a", "b"], RaceSettings(budget_s=1.0))
    while (index := race.next()) is not None:
        race.stop(index, "failed")  # every request failed
    result = race.result()
    assert result.chosen == 0 and "nothing was measured" in result.reason
    assert [e["outcome"] for e in result.entrants] == ["chosen", "failed"]


def test_a_lone_leader_finishes_once_every_rival_is_stopped_by_the_race() -> None:
    race = Race(["fast", "slow", "slower"], RaceSettings(min_samples=3, max_samples=100))
    drive(race, jitter([1.0, 3.0, 5.0]))
    result = race.result()
    assert [e["stopped"] for e in result.entrants] == [None, "race", "race"]
    assert result.entrants[0]["samples"] < 100


def test_memory_least_reserved_within_the_latency_bound() -> None:
    settings = RaceSettings(objective="memory", latency_bound_s=1.5, max_samples=20)
    race = Race(["big-fast", "small-slow", "small-ok"], settings,
                memory_bytes=[400, 100, 150])
    drive(race, jitter([0.5, 3.0, 1.0]))
    result = race.result()
    assert result.chosen == 2
    outcomes = [e["outcome"] for e in result.entrants]
    assert outcomes == ["more-memory", "over-bound", "chosen"]
    # decided (bound resolved, or more memory than one known inside), never capped
    assert all(e["stopped"] in ("bound", "race") for e in result.entrants)
    assert all(e["samples"] < 20 for e in result.entrants)
    assert result.entrants[0]["relative"] == pytest.approx(400 / 150 - 1)


def test_memory_with_nothing_within_the_bound_takes_the_fastest() -> None:
    settings = RaceSettings(objective="memory", latency_bound_s=0.1, max_samples=8)
    race = Race(["a", "b"], settings, memory_bytes=[100, 200])
    drive(race, jitter([0.5, 0.3]))
    result = race.result()
    assert result.chosen == 1 and "no entrant is within the latency bound" in result.reason


@pytest.mark.parametrize("seed", range(5))
def test_the_winner_is_within_the_margin_of_the_true_best(seed: int) -> None:
    rng = random.Random(seed)
    base = [rng.uniform(0.5, 2.0) for _ in range(4)]
    race = Race(["a", "b", "c", "d"], RaceSettings(margin=0.05, max_samples=25))
    drive(race, jitter(base, spread=0.1, seed=seed))
    assert base[race.result().chosen] <= min(base) * 1.05 * 1.1


def test_settings_and_records_are_checked() -> None:
    with pytest.raises(ValueError, match="latency_bound_s"):
        RaceSettings(objective="memory")
    with pytest.raises(ValueError, match="objective"):
        RaceSettings(objective="energy")
    with pytest.raises(ValueError, match="samples"):
        RaceSettings(min_samples=5, max_samples=4)
    with pytest.raises(ValueError, match="labels"):
        Race([], RaceSettings())
    race = Race(["a"], RaceSettings())
    with pytest.raises(ValueError, match="cost"):
        race.record(0, -1.0)
    with pytest.raises(ValueError, match="reason"):
        race.stop(0, "bored")


def test_every_combination_of_outcomes_is_json_ready() -> None:
    import json

    for objective in ("latency", "throughput"):
        race = Race([f"e{i}" for i in range(3)], RaceSettings(objective=objective,
                                                              max_samples=6))
        costs = itertools.cycle([1.0, 1.01, 5.0])
        drive(race, lambda i, n, costs=costs: next(costs) + i)
        json.dumps(race.result().to_json())


def test_a_failed_entrant_is_never_chosen() -> None:
    race = Race(["broken", "fine"], RaceSettings(max_samples=4))
    index = race.next()
    assert index == 0
    race.stop(0, "failed")
    drive(race, lambda i, n: 5.0)
    result = race.result()
    assert result.chosen == 1
    assert result.entrants[0]["outcome"] == "failed"
    assert result.entrants[1]["samples"] == 3  # alone once its rival failed: min_samples
