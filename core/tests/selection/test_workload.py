"""The workload a measurement times: --input, else the pipeline's, else (later) the examples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.errors import ConfigError
from edge_core.selection.workload import examples_workload, load_workload

STAGES = [{"id": "a", "backend": {"name": "echo"}}]


def test_sources_go_through_prepare_and_given_ones_come_first(tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text("1 2 3")
    (tmp_path / "two.txt").write_text("4 5")
    config = load_pipeline({"name": "p", "stages": STAGES, "prepare": "edge_echo.ends:prepare",
                            "workload": ["one.txt"]}, base_dir=tmp_path)
    own = load_workload(config)
    assert own is not None and own.origin == "workload"
    np.testing.assert_array_equal(own.inputs[0]["x"], np.array([1, 2, 3], np.float32))
    assert own.sources == (str(tmp_path / "one.txt"),)
    given = load_workload(config, [tmp_path / "two.txt"])
    assert given is not None and given.origin == "--input"
    assert given.note == "--input: two.txt"
    np.testing.assert_array_equal(given.inputs[0]["x"], np.array([4, 5], np.float32))


def test_without_prepare_sources_are_npz_inputs(tmp_path: Path) -> None:
    path = tmp_path / "x.npz"
    with path.open("wb") as handle:
        np.savez(handle, x=np.ones((2, 2), np.float32))
    config = load_pipeline({"name": "p", "stages": STAGES, "workload": [str(path)]})
    workload = load_workload(config)
    assert workload is not None and workload.inputs[0]["x"].shape == (2, 2)
    assert workload.to_json()["requests"] == 1


def test_nothing_given_means_the_examples_later() -> None:
    assert load_workload(load_pipeline({"name": "p", "stages": STAGES})) is None
    examples = examples_workload("a", {"x": np.zeros(2)}, "examples/a.npz")
    assert examples.origin == "examples" and "bundled with stage 'a'" in examples.note


def test_bad_sources_name_their_place(tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_text("one two")
    config = load_pipeline({"name": "p", "stages": STAGES, "prepare": "edge_echo.ends:prepare",
                            "workload": ["bad.txt", "missing.txt"]}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"^workload\[0\]: ValueError: .*not a list of numbers"):
        load_workload(config)
    with pytest.raises(ConfigError, match=r"^input\[0\]: FileNotFoundError"):
        load_workload(config, [tmp_path / "missing.txt"])
    npz = load_pipeline({"name": "p", "stages": STAGES, "workload": [str(tmp_path / "bad.txt")]})
    with pytest.raises(ConfigError, match=r"^workload\[0\]: not a readable \.npz"):
        load_workload(npz)
