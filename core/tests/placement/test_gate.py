from __future__ import annotations

import pytest

from edge_core.errors import PlacementRefused
from edge_core.placement import (
    PlacementPolicy,
    PlacementRefusal,
    PlacementReport,
    ProviderShare,
    WarmupReport,
    check_placement,
)
from edge_core.runtime.errors import NumericsRefused
from edge_core.runtime.gate import check_warmup

QNN = "QNNExecutionProvider"
CPU = "CPUExecutionProvider"


def report(split: dict[str, int], available: tuple[str, ...] = (QNN, CPU),
           target: str = QNN) -> PlacementReport:
    return PlacementReport(
        target=target,
        available_providers=available,
        providers={
            name: ProviderShare(nodes=n, op_types={"Conv": n}, node_names=[f"{name}_{i}" for i in
                                                                           range(n)])
            for name, n in split.items()
        },
        method="graph-assignment-info",
    )


def test_everything_on_target_passes_at_the_default_minimum() -> None:
    check_placement("det", report({QNN: 12}), PlacementPolicy(target=QNN))


def test_absent_target_provider_is_refused_not_run_on_cpu() -> None:
    rep = report({CPU: 12}, available=(CPU,), target="DmlExecutionProvider")
    with pytest.raises(PlacementRefused, match="'DmlExecutionProvider' is not available"):
        check_placement("det", rep, PlacementPolicy(target="DmlExecutionProvider"))


def test_no_observed_nodes_is_refused_as_unverified() -> None:
    with pytest.raises(PlacementRefused, match="placement unverified"):
        check_placement("det", report({}), PlacementPolicy(target=QNN))


def test_a_split_is_refused_at_the_default_minimum_and_keeps_the_real_split() -> None:
    rep = report({QNN: 9, CPU: 3})
    with pytest.raises(PlacementRefusal) as info:
        check_placement("rec", rep, PlacementPolicy(target=QNN, allowed_providers=(CPU,)))
    assert "fraction on QNNExecutionProvider is 0.7500" in str(info.value)
    assert info.value.report.split() == {CPU: 3, QNN: 9}
    assert info.value.report.to_json()["providers"][CPU]["nodes"] == 3


def test_a_split_is_accepted_when_the_minimum_is_lowered_and_cpu_allowed() -> None:
    rep = report({QNN: 9, CPU: 3})
    check_placement("rec", rep, PlacementPolicy(target=QNN, min_fraction_on_target=0.7,
                                                allowed_providers=(CPU,)))
    assert rep.fraction_on_target == pytest.approx(0.75)


def test_a_provider_outside_the_allowed_set_is_refused_naming_its_nodes() -> None:
    rep = report({QNN: 9, CPU: 3})
    with pytest.raises(PlacementRefused, match=r"CPUExecutionProvider ran 3 node\(s\) "
                                               r"\(CPUExecutionProvider_0"):
        check_placement("rec", rep, PlacementPolicy(target=QNN, min_fraction_on_target=0.5))


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, True, "1"])
def test_min_fraction_outside_zero_one_is_invalid(bad: object) -> None:
    with pytest.raises(ValueError, match="min_fraction_on_target: must be in"):
        PlacementPolicy(min_fraction_on_target=bad)  # type: ignore[arg-type]


def test_report_json_keeps_every_provider() -> None:
    body = report({QNN: 2, CPU: 1}).to_json()
    assert body["total_nodes"] == 3
    assert set(body["providers"]) == {QNN, CPU}
    assert body["method"] == "graph-assignment-info"


def _refusal(numerics: dict[str, object]) -> str:
    """The message ``check_warmup`` refuses a CPU warm-up with these numerics with."""
    warmup = WarmupReport(placement=report({CPU: 2}, available=(CPU,), target=CPU),
                          numerics=numerics)
    with pytest.raises(NumericsRefused) as info:
        check_warmup("classify", warmup, PlacementPolicy(target=CPU))
    return str(info.value)


BOUND = {"max_abs_error": 1e-4, "normalised_error": 1e-4}


@pytest.mark.parametrize(("record", "why"), [
    ({"passed": False, "why": "missing", "problem": "output missing"},
     "output 'y': missing from the stage's outputs (the reference has it)"),
    ({"passed": False, "why": "shape", "expected": {"dtype": "float32", "shape": [3, 2]},
      "got": {"dtype": "float32", "shape": [2, 3]}},
     "output 'y': shape mismatch: expected [3, 2], got [2, 3]"),
    ({"passed": False, "why": "shape", "expected": {"dtype": "float64", "shape": [3, 2]},
      "got": {"dtype": "float32", "shape": [2, 3]}},
     "output 'y': shape mismatch: expected [3, 2], got [2, 3] (and dtype float64, got "
     "float32)"),
    ({"passed": False, "why": "dtype", "expected": {"dtype": "float64", "shape": [2, 3]},
      "got": {"dtype": "float32", "shape": [2, 3]}},
     "output 'y': dtype mismatch: expected float64, got float32 (shape [2, 3])"),
    ({"passed": False, "why": "tolerance", "max_abs_error": 0.5, "normalised_error": 3e-5,
      "exceeds": ["max_abs_error"], "worst": {"index": [1, 1], "expected": 0.5, "got": 0.0}},
     "output 'y': values out of tolerance (max_abs_error 0.5 > tolerance 0.0001): "
     "worst element [1, 1]: expected 0.5, got 0.0"),
    ({"passed": False, "why": "tolerance", "max_abs_error": "inf", "normalised_error": "inf",
      "exceeds": ["max_abs_error", "normalised_error"],
      "worst": {"index": [0, 2], "expected": 4.0, "got": "inf"}},
     "output 'y': values out of tolerance (max_abs_error inf > tolerance 0.0001, "
     "normalised_error inf > tolerance 0.0001): worst element [0, 2]: expected 4.0, got inf"),
    ({"passed": False, "why": "nan", "exceeds": [],
      "worst": {"index": [1, 0], "expected": "nan", "got": 6.0}},
     "output 'y': NaN mismatch (a NaN where the reference has a number, or the reverse): "
     "element [1, 0]: expected nan, got 6.0"),
    ({"passed": False, "problem": "a backend's own words"}, "output 'y': a backend's own words"),
])
def test_a_numerics_refusal_says_which_output_failed_and_why(
    record: dict[str, object], why: str
) -> None:
    message = _refusal({"reference": "expected-outputs", "bound": BOUND, "passed": False,
                        "max_abs_error": 0.5, "normalised_error": 0.1,
                        "outputs": {"y": record, "z": {"passed": True, "max_abs_error": 0.0}}})
    assert message == ("stages[classify].numerics: outputs differ from the expected-outputs "
                       f"reference: {why}")


def test_a_numerics_refusal_without_per_output_detail_names_the_errors_and_bound() -> None:
    message = _refusal({"reference": "formula", "bound": BOUND, "passed": False,
                        "max_abs_error": 1.0, "normalised_error": 0.5})
    assert message == ("stages[classify].numerics: outputs differ from the formula reference "
                       f"beyond the bound {BOUND}: max_abs_error=1.0, normalised_error=0.5")
