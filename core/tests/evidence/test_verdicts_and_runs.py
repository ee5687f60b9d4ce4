"""The four verdicts and the status they make; the runs' order, overhead and cache states."""

from __future__ import annotations

from typing import Any

import pytest

from edge_core.evidence import matched
from edge_core.evidence.records import Failure
from edge_core.evidence.status import Status
from edge_core.evidence.verdicts import decide, functional_verdict, quality_verdict


def _v(value: str, layer: str | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"verdict": value, "basis": f"{value} here"}
    if layer:
        found["layer"] = layer
    return found


@pytest.mark.parametrize(("verdicts", "functional", "status", "layer"), [
    ({"functional": "met", "quality": "met", "performance": "met", "reliability": "met"},
     None, Status.PASS, None),
    ({"functional": "met", "quality": "unjudged", "performance": "met",
      "reliability": "met"}, None, Status.MET_AS_JUDGED, None),
    ({"functional": "met", "quality": "failed", "performance": "unjudged",
      "reliability": "met"}, None, Status.FAILED, "quality"),
    ({"functional": "unjudged", "quality": "met", "performance": "failed",
      "reliability": "met"}, Status.PROFILE_ONLY, Status.FAILED, "performance"),
    ({"functional": "failed", "quality": "met", "performance": "met",
      "reliability": "met"}, Status.PARTIAL, Status.PARTIAL, None),
    ({"functional": "unjudged", "quality": "met", "performance": "met",
      "reliability": "met"}, Status.COMPONENT, Status.COMPONENT, None),
])
def test_pass_needs_all_four_judged_and_met_and_a_failed_one_names_its_layer(
        verdicts: dict[str, str], functional: Status | None, status: Status,
        layer: str | None) -> None:
    built = {name: _v(value, name if value == "failed" else None)
             for name, value in verdicts.items()}
    found, failure, notes = decide(built, functional, None)
    assert found is status
    assert (failure.layer if failure else None) == layer
    if status is Status.MET_AS_JUDGED:
        assert notes == ["judged and met: functional, performance, reliability; "
                         "unjudged: quality"]


def test_a_failed_run_keeps_its_own_status_and_layer() -> None:
    failure = Failure("backend", "unavailable", "install it", step="open")
    verdict, status = functional_verdict({}, failure)
    assert verdict["verdict"] == "unjudged" and status is None  # nothing ran
    built = {"functional": verdict, "quality": _v("unjudged"), "performance": _v("unjudged"),
             "reliability": _v("unjudged")}
    assert decide(built, status, (Status.BLOCKED, failure)) == (Status.BLOCKED, failure, [])
    ran, _ = functional_verdict({}, Failure("numerics", "beyond bound", "check"))
    assert ran == {"verdict": "failed", "basis": "the run failed at numerics",
                   "layer": "numerics"}


def test_quality_verdicts_say_what_was_declared_and_measured() -> None:
    assert quality_verdict({"declared": False, "reason": "the pipeline names no golden"}) == {
        "verdict": "unjudged", "basis": "the pipeline names no golden"}
    rows = [{"criterion": "cer <= 0.02", "value": 0.05, "met": False}]
    missed = quality_verdict({"declared": True, "function": "m:f", "metrics": {"cer": 0.05},
                              "passes": rows, "met": False})
    assert missed["verdict"] == "failed" and missed["layer"] == "quality"
    assert missed["basis"] == "missed: cer <= 0.02 (measured 0.05)"
    broken = quality_verdict({"declared": True, "met": False,
                              "error": {"type": "ValueError", "message": "no ids"}})
    assert broken["verdict"] == "failed" and "ValueError: no ids" in broken["basis"]


def test_the_run_order_alternates_and_the_overhead_and_order_effect_are_told_apart() -> None:
    assert matched.sequence(0) == ["untraced"]
    assert matched.sequence(2) == ["untraced", "traced", "untraced", "traced", "untraced"]

    def run(traced: bool, open_s: float, totals: list[float]) -> dict[str, Any]:
        return {"instrumented": traced, "open_s": open_s, "first_output_s": open_s / 10,
                "matched": {"samples": [{"total_s": t} for t in totals]}}

    runs = [run(False, 3.0, [0.010, 0.012]), run(True, 2.5, [0.020, 0.022]),
            run(False, 2.0, [0.011, 0.013])]
    found = matched.overhead(runs)
    assert found["sequence"] == ["untraced", "traced", "untraced"]
    assert found["open_s"]["overhead"] == pytest.approx(0.0)  # 2.5 vs the mean of 3 and 2
    assert found["open_s"]["order_effect"] == pytest.approx(-1.0)  # the cold first run
    assert found["matched_p50_ms"]["overhead"] == pytest.approx(21.0 - 11.5)
    assert found["matched_requests"] == 2


@pytest.mark.parametrize(("load", "state"), [
    ({}, "none"),
    ({"ep_context": {"reused": True}}, "hit"),
    ({"ep_context": {"reused": False, "written": True}}, "miss"),
    ({"bucket_sessions": {"a": {"ep_context": {"reused": True}},
                          "b": {"ep_context": {"reused": False}}}}, "mixed"),
])
def test_the_compiled_cache_state_of_a_stage(load: dict[str, Any], state: str) -> None:
    assert matched.cache_state({"id": "s", "worker": {"load": load}}) == state
    plan = {"stages": [{"id": "s", "worker": {"load": load}}, {"id": "t", "worker": None}]}
    assert matched.cache_states(plan) == {"s": state, "t": "none"}


def test_start_up_figures_split_by_cache_state() -> None:
    runs = [{"open_s": 9.0, "compiled_cache": {"s": "miss"},
             "stages": {"s": {"load_s": 8.0}}},
            {"open_s": 2.0, "compiled_cache": {"s": "hit"}},
            {"open_s": 1.5, "compiled_cache": {"s": "hit"}, "stages": {"s": {"load_s": 1.0}}}]
    assert matched.by_cache(runs) == {"s": {"miss": {"open_s": [9.0], "load_s": [8.0]},
                                            "hit": {"open_s": [2.0, 1.5], "load_s": [1.0]}}}


def test_the_cancellation_bound_is_the_conformance_kits() -> None:
    from edge_core.evidence.stream_levels import CANCEL_BOUND_S
    from edge_core.testing.checks import CANCEL_EFFECT_S

    assert CANCEL_BOUND_S == CANCEL_EFFECT_S
