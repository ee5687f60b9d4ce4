"""``edge plan``: which candidate each stage would get, without serving a request.

Real echo and ort-cpu workers (a real ONNX bundle) and the real ort-directml probe
(unavailable off Windows). The autouse ``no_leaks`` fixture checks processes, segments
and descriptors after every test; in-process answers are checked against the ledger,
subprocess ones against the ledger snapshot the command prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime.preview import plan_by_opening, plan_by_probe
from edge_core.testing.leaks import descendants

from .conftest import build_scale_bundle, write_pipeline

GiB = 1024**3
PLUGINS = "echo,ort-cpu,ort-directml"


def _ort(bundle: Path, **extra: Any) -> dict[str, Any]:
    return {"manifest": str(bundle / "edge-manifest.json"), "backend": {"name": "ort-cpu"},
            "placement": {"target": "CPUExecutionProvider"}, **extra}


def _candidates(bundle: Path) -> list[dict[str, Any]]:
    """Refused at backend, at admission and at numerics; then ort-cpu serves."""
    return [
        {"backend": {"name": "ort-directml"}},
        _ort(bundle, resources={"demands": {"machine:ram": 64 * 1024 * GiB}}),
        {"backend": {"name": "echo", "options": {"wrong_numerics": True}}},
        _ort(bundle),
        {"backend": {"name": "echo"}},
    ]


def _edge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGE_PLUGINS": PLUGINS}
    return subprocess.run([sys.executable, "-m", "edge_core.cli", "plan", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=180, check=False)


def _outcomes(stage: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(c["backend"], c["outcome"], c["layer"]) for c in stage["candidates"]]


def _children() -> set[int]:
    return {p.pid for p in descendants()}


def test_plan_opens_each_stage_for_real_names_every_refusal_and_closes(tmp_path: Path) -> None:
    bundle = build_scale_bundle(tmp_path / "scale")
    path = write_pipeline(tmp_path, [{"id": "a", "candidates": _candidates(bundle)}],
                          selection="first-passing")
    result = _edge(str(path), "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["ok"] and answer["mode"] == "open" and answer["released"]
    (stage,) = answer["stages"]
    assert (stage["choice"], stage["backend"]) == (3, "ort-cpu")
    assert _outcomes(stage) == [("ort-directml", "refused", "backend"),
                                ("ort-cpu", "refused", "admission"),
                                ("echo", "refused", "numerics"),
                                ("ort-cpu", "chosen", None),
                                ("echo", "untried", None)]
    assert [c["outcome"] for c in stage["candidates"]].count("chosen") == 1
    assert "PoolExhausted" in stage["candidates"][1]["reason"]
    assert answer["plan"]["stages"][0]["placement"]["target"] == "CPUExecutionProvider"
    assert answer["closed"]["a"]["release"] == "released"
    assert answer["ledger_after"]["reservations"] == []

    human = _edge(str(path), cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "  stage a: chosen ort-cpu (candidate 3)" in human.stdout
    assert "    candidate 2 echo: refused at numerics: NumericsRefused: " in human.stdout
    assert "reservations released: True" in human.stdout


def test_plan_probe_only_starts_no_worker_and_names_the_expected_choice(
    tmp_path: Path,
) -> None:
    bundle = build_scale_bundle(tmp_path / "scale")
    path = write_pipeline(tmp_path, [{"id": "a", "candidates": _candidates(bundle)}])
    result = _edge(str(path), "--probe-only", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["mode"] == "probe-only" and answer["plan"] is None
    (stage,) = answer["stages"]
    # numerics are not known without a worker: the echo candidate is the expected choice
    assert (stage["choice"], stage["backend"]) == (2, "echo")
    assert _outcomes(stage) == [("ort-directml", "refused", "backend"),
                                ("ort-cpu", "refused", "admission"),
                                ("echo", "would-try", None),
                                ("ort-cpu", "would-try", None),
                                ("echo", "would-try", None)]
    assert answer["ledger_after"]["reservations"] == []
    human = _edge(str(path), "--probe-only", cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "  stage a: expected echo (candidate 2)" in human.stdout
    assert "    candidate 1 ort-cpu: refused at admission: PoolExhausted" in human.stdout


def test_plan_exits_1_when_a_stage_has_no_candidate(tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, [
        {"id": "a", "backend": {"name": "echo"}},
        {"id": "b", "input_transform": "edge_echo.transforms:passthrough", "candidates": [
            {"backend": {"name": "ort-directml"}},
            {"backend": {"name": "echo", "options": {"wrong_numerics": True}}}]},
        {"id": "c", "input_transform": "edge_echo.transforms:passthrough",
         "backend": {"name": "echo"}},
    ])
    result = _edge(str(path), "--json", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    answer = json.loads(result.stdout)
    assert not answer["ok"] and answer["plan"] is None and answer["released"]
    a, b, c = answer["stages"]
    assert _outcomes(a) == [("echo", "chosen", None)]
    assert b["choice"] is None and _outcomes(b) == [("ort-directml", "refused", "backend"),
                                                    ("echo", "refused", "numerics")]
    assert _outcomes(c) == [("echo", "untried", None)]
    assert c["candidates"][0]["reason"] == "stage b has no candidate"
    assert answer["closed"]["a"]["release"] == "released"
    assert answer["ledger_after"]["reservations"] == []

    probed = _edge(str(path), "--probe-only", cwd=tmp_path)
    assert probed.returncode == 0, probed.stderr  # numerics are not probed
    human = _edge(str(path), cwd=tmp_path)
    assert human.returncode == 1
    assert "  stage b: no candidate" in human.stdout
    assert "edge: no candidate for stage(s) b" in human.stderr


def test_plan_probe_only_exits_1_when_nothing_passes_probe_and_admission(
    tmp_path: Path,
) -> None:
    path = write_pipeline(tmp_path, [{"id": "a", "candidates": [
        {"backend": {"name": "ort-directml"}},
        {"backend": {"name": "echo"}, "resources": {"demands": {"machine:ram": 1 << 60}}}]}])
    result = _edge(str(path), "--probe-only", "--json", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    (stage,) = json.loads(result.stdout)["stages"]
    assert stage["choice"] is None
    assert _outcomes(stage) == [("ort-directml", "refused", "backend"),
                                ("echo", "refused", "admission")]


@pytest.mark.parametrize("body", [
    '{"name": "bad", "stages": [{"id": "a", "candidates": []}]}',
    '{"name": "bad", "stages": [{"id": "a"}]}',
    "not json",
])
def test_plan_exits_2_on_a_bad_pipeline_file(tmp_path: Path, body: str) -> None:
    (tmp_path / "bad.json").write_text(body, encoding="utf-8")
    for extra in ((), ("--probe-only",)):
        result = _edge("bad.json", "--json", *extra, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert json.loads(result.stdout)["ok"] is False


def test_plan_usage_error_exits_2(tmp_path: Path) -> None:
    assert _edge(cwd=tmp_path).returncode == 2


def _ledger() -> ResourceLedger:
    return ResourceLedger([Pool(name="machine:ram", total=4 * GiB)])


def test_in_process_both_modes_leave_the_ledger_and_the_host_as_they_were(
    tmp_path: Path,
) -> None:
    plugins = load_plugins(env={"EDGE_PLUGINS": PLUGINS})
    bundle = build_scale_bundle(tmp_path / "scale")
    config = load_pipeline({"name": "p", "selection": "first-passing", "stages": [
        {"id": "a", "candidates": [
            _ort(bundle, resources={"demands": {"machine:ram": 3 * GiB}}),
            {"backend": {"name": "echo"}}]},
        {"id": "b", "input_transform": "edge_echo.transforms:passthrough", "candidates": [
            {"backend": {"name": "echo"}, "resources": {"demands": {"machine:ram": 2 * GiB}}},
            {"backend": {"name": "echo", "options": {"scale": 2.0}},
             "resources": {"demands": {"machine:ram": 512 * 1024**2}}}]}]})
    before = _children()
    ledger = _ledger()
    probed = plan_by_probe(config, plugins, ledger)
    assert ledger.is_empty() and _children() <= before
    # the expected choice of stage a stays charged while b is checked: b's 2 GiB does not fit
    assert [s.choice for s in probed.stages] == [0, 1]
    assert probed.stages[1].candidates[0]["layer"] == "admission"
    opened = plan_by_opening(config, plugins, ledger, retire_deadline_s=3.0)
    assert [s.choice for s in opened.stages] == [0, 1] and opened.ok and opened.released
    assert ledger.is_empty() and not ledger.quarantined()
    assert _children() <= before
    # measured (the default): every candidate that fits is opened and timed, then all go
    measured = plan_by_opening(attrs.evolve(config, selection="measured"), plugins, ledger,
                               retire_deadline_s=3.0)
    assert measured.ok and measured.released
    assert ledger.is_empty() and not ledger.quarantined()
    assert _children() <= before
