"""Joint or greedy measurement, the fewest-backend placement, and the split's verdict."""

from __future__ import annotations

import pytest

from edge_core.selection.combinations import (
    Figures,
    backends_of,
    fewest_backends,
    greedy_entrants,
    joint_entrants,
    judge_split,
    plan_schedule,
)


def test_few_combinations_are_measured_jointly_many_greedily() -> None:
    assert plan_schedule([1, 2, 1], 16).mode == "joint"
    assert plan_schedule([4, 4], 16).mode == "joint"
    many = plan_schedule([3, 3, 2], 16)
    assert (many.mode, many.stages, many.combinations) == ("greedy", (0, 1, 2), 18)
    assert "greedily" in many.describe()
    assert plan_schedule([1, 1], 16).mode == "none"
    # one stage with a choice is always joint, however many candidates it has
    assert plan_schedule([1, 40], 16).mode == "joint"


def test_joint_entrants_are_in_order_of_preference() -> None:
    assert joint_entrants([2, 1, 2]) == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]


def test_a_greedy_step_varies_one_stage_and_fixes_the_others() -> None:
    assert greedy_entrants([2, 3], 1, [1, 0]) == [(1, 0), (1, 1), (1, 2)]
    with pytest.raises(ValueError, match="fixed"):
        greedy_entrants([2, 3], 1, [2, 0])


def test_the_fewest_backend_placement() -> None:
    # detect ort-cpu; classify qnn or ort-cpu; recognise ort-cpu: all on ort-cpu
    assert fewest_backends([["ort-cpu"], ["qnn", "ort-cpu"], ["ort-cpu"]]) == (0, 1, 0)
    # no backend covers all: two backends, the earliest-listed among equals
    assert fewest_backends([["a", "b"], ["c", "a"], ["c"]]) == (0, 0, 0)  # {a, c}
    assert fewest_backends([["x", "y"], ["y", "x"]]) == (0, 1)
    assert backends_of([["a", "b"], ["c", "a"], ["c"]], (0, 0, 0)) == ["a", "c"]
    with pytest.raises(ValueError, match="every stage"):
        fewest_backends([["a"], []])


def test_a_split_is_kept_only_beyond_the_margin() -> None:
    single = Figures(cost_s=1.0)
    kept = judge_split("latency", Figures(cost_s=0.8), single, 0.05)
    assert kept.keep and kept.gain == pytest.approx(0.2) and "kept" in kept.reason
    close = judge_split("latency", Figures(cost_s=0.97), single, 0.05)
    assert not close.keep and "only 3.0% better" in close.reason
    worse = judge_split("throughput", Figures(cost_s=2.0), single, 0.05)
    assert not worse.keep and "100.0% worse" in worse.reason


def test_memory_splits_are_judged_within_the_latency_bound() -> None:
    single = Figures(cost_s=0.5, memory_bytes=1000)
    lean = Figures(cost_s=0.6, memory_bytes=500)
    assert judge_split("memory", lean, single, 0.05, 1.0).keep
    assert not judge_split("memory", lean, single, 0.05, 0.55).keep  # split over the bound
    fat = Figures(cost_s=0.2, memory_bytes=990)
    assert not judge_split("memory", fat, single, 0.05, 1.0).keep  # 1 % less: not enough
    with pytest.raises(ValueError, match="latency_bound_s"):
        judge_split("memory", lean, single, 0.05)
