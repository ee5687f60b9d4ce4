"""The kit validates what ``edge_conformance_stage`` returns, naming field and value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.testing.conformance_stage import (
    DEFAULT_BOUND,
    ConformanceStage,
    ConformanceStageInvalid,
)
from edge_core.testing.harness import compare_outputs

GOOD: dict[str, Any] = {"stage": {"backend": {"name": "b"}}, "inputs": {"x": np.ones(2)}}


def test_a_minimal_answer_gets_the_default_bound_and_no_slow_request(tmp_path: Path) -> None:
    stage = ConformanceStage.parse("b", GOOD, tmp_path)
    assert stage.bound == DEFAULT_BOUND and stage.expected is None
    assert not stage.has_slow_request and stage.manifest_dir is None
    assert stage.pipeline(("a", "c"))["stages"][1] == {"backend": {"name": "b"}, "id": "c"}


@pytest.mark.parametrize(("answer", "message"), [
    ([1, 2], "edge_conformance_stage[b]: expected a mapping or None: [1, 2]"),
    ({**GOOD, "extra": 1}, "unknown keys"),
    ({**GOOD, "stage": {"backend": {"name": "other"}}},
     "edge_conformance_stage[b].stage.backend.name: must name the backend 'b'"),
    ({**GOOD, "stage": {"id": "s", "backend": {"name": "b"}}},
     "edge_conformance_stage[b].stage.id: the kit names the stage: 's'"),
    ({**GOOD, "inputs": [1]}, "edge_conformance_stage[b].inputs: expected a mapping"),
    ({**GOOD, "bound": {"max_abs_error": -1}},
     "edge_conformance_stage[b].bound.max_abs_error: must be a number >= 0: -1"),
])
def test_malformed_answers_name_the_field(answer: object, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConformanceStageInvalid) as info:
        ConformanceStage.parse("b", answer, tmp_path)
    assert message in str(info.value)


def test_outputs_are_compared_within_the_bound_or_exactly() -> None:
    want = {"y": np.array([1.0, 2.0], np.float32), "n": np.array([3]), "text": "hi"}
    bound = {"max_abs_error": 1e-3, "normalised_error": 1e-3}
    assert compare_outputs({"y": want["y"] + 1e-4, "n": np.array([3])}, {"text": "hi"},
                           want, bound) == []
    problems = compare_outputs({"y": want["y"] + 0.5, "n": np.array([4])}, {}, want, bound)
    assert problems[0].startswith("outputs.y: beyond the bound")
    assert problems[1].startswith("outputs.n: differs from the expected values exactly")
    assert problems[2] == "outputs.text: missing (got ['n', 'y']): None"
    assert compare_outputs({"y": np.zeros(3, np.float32)}, {}, {"y": want["y"]}, bound) == [
        "outputs.y.shape: expected (2,): (3,)"]
