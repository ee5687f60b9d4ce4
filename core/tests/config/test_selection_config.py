"""selection, objective, start, workload and [measurement]: defaults, checks and their paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edge_core.config import (
    InvalidConfigError,
    MeasurementConfig,
    load_pipeline,
    load_pyproject_pipeline,
)
from edge_core.errors import ConfigError

STAGES = [{"id": "a", "candidates": [{"backend": {"name": "echo"}},
                                     {"backend": {"name": "echo-preemptible"}}]}]


def _load(**keys: Any) -> Any:
    return load_pipeline({"name": "p", "stages": STAGES, **keys})


def test_the_defaults_measure_latency_and_serve_when_all_are_ready() -> None:
    config = _load()
    assert (config.selection, config.objective, config.start) == ("measured", "latency",
                                                                   "all-ready")
    assert config.workload == ()
    assert config.measurement == MeasurementConfig()
    assert (config.measurement.margin, config.measurement.split_margin) == (0.05, 0.05)
    shown = config.to_json()
    assert shown["selection"] == "measured" and shown["measurement"]["joint_limit"] == 16


def test_every_key_is_read() -> None:
    config = _load(selection="first-passing", objective="memory", start="first-ready",
                   workload=["page.png"],
                   measurement={"latency_bound_s": 2, "margin": 0, "split_margin": 0.1,
                                "budget_s": 30, "min_samples": 2, "max_samples": 9,
                                "warmup_calls": 0, "joint_limit": 4, "reuse": False})
    assert config.selection == "first-passing" and config.start == "first-ready"
    assert config.measurement.latency_bound_s == 2.0
    assert config.measurement.reuse is False
    assert config.workload == (Path.cwd() / "page.png",)


def test_workload_paths_resolve_against_the_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    file = tmp_path / "sub" / "pipeline.toml"
    file.write_text('name = "p"\nworkload = ["page.png", "/abs/x.npz"]\n'
                    '[[stages]]\nid = "a"\nbackend = { name = "echo" }\n')
    config = load_pipeline(file)
    assert config.workload == (tmp_path / "sub" / "page.png", Path("/abs/x.npz"))


@pytest.mark.parametrize(("keys", "path", "reason"), [
    ({"selection": "fastest"}, "selection", "expected one of measured, first-passing"),
    ({"objective": "energy"}, "objective", "expected one of latency, throughput, memory"),
    ({"start": "now"}, "start", "expected one of all-ready, first-ready"),
    ({"workload": "page.png"}, "workload", "expected an array"),
    ({"workload": [""]}, "workload[0]", "must not be empty"),
    ({"measurement": {"margin": 1.0}}, "measurement.margin", "must be in [0, 1)"),
    ({"measurement": {"split_margin": -0.1}}, "measurement.split_margin", "must be in"),
    ({"measurement": {"margin": True}}, "measurement.margin", "expected a number"),
    ({"measurement": {"budget_s": 0}}, "measurement.budget_s", "must be above 0 seconds"),
    ({"measurement": {"min_samples": 0}}, "measurement.min_samples", "must be at least 1"),
    ({"measurement": {"warmup_calls": -1}}, "measurement.warmup_calls", "must be at least 0"),
    ({"measurement": {"joint_limit": 1.5}}, "measurement.joint_limit", "expected an integer"),
    ({"measurement": {"reuse": "yes"}}, "measurement.reuse", "expected true or false"),
    ({"measurement": {"samples": 3}}, "measurement.samples", "unknown key"),
    ({"measurement": {"min_samples": 5, "max_samples": 4}}, "measurement.min_samples",
     "must not exceed max_samples (4)"),
    ({"objective": "memory"}, "measurement.latency_bound_s",
     'required with objective = "memory"'),
    ({"measurement": {"latency_bound_s": 1}}, "measurement.latency_bound_s",
     'applies only to objective = "memory"'),
])
def test_bad_values_name_their_path(keys: dict[str, Any], path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(**keys)
    assert caught.value.path == path
    assert reason in caught.value.reason


def test_several_problems_are_named_at_once() -> None:
    with pytest.raises(InvalidConfigError) as caught:
        _load(selection="x", measurement={"margin": 2, "budget_s": -1})
    assert {p.path for p in caught.value.problems} == {
        "selection", "measurement.margin", "measurement.budget_s"}


def test_a_pyproject_pipeline_names_its_table(tmp_path: Path) -> None:
    file = tmp_path / "pyproject.toml"
    file.write_text('[tool.edge.pipelines.ocr]\nobjective = "speed"\n'
                    '[[tool.edge.pipelines.ocr.stages]]\nid = "a"\n'
                    'backend = { name = "echo" }\n')
    with pytest.raises(ConfigError, match=r"^tool\.edge\.pipelines\.ocr\.objective: "):
        load_pyproject_pipeline(file, "ocr")


def test_values_built_in_code_obey_the_same_rules() -> None:
    with pytest.raises(ConfigError, match="margin"):
        MeasurementConfig(margin=1.5)
    with pytest.raises(ConfigError, match="min_samples"):
        MeasurementConfig(min_samples=9, max_samples=3)


def test_the_docs_example_loads_with_every_key(tmp_path: Path) -> None:
    import re

    doc = Path(__file__).resolve().parents[3] / "docs" / "config.md"
    blocks = re.findall(r"```toml\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)
    example = next(b for b in blocks if b.startswith('name = "ocr-measured"'))
    file = tmp_path / "pipeline.toml"
    file.write_text(example, encoding="utf-8")
    config = load_pipeline(file)
    assert config.workload == (tmp_path / "page.png",)
    assert config.measurement == MeasurementConfig()  # the defaults, written out
    assert [c.backend.name for c in config.stages[0].candidates] == ["qnn", "ort-cpu"]
