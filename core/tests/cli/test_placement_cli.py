"""``edge plan`` and ``edge run`` with a measured selection, in subprocesses on echo workers.

``edge plan`` measures (or reuses the stored decision, or re-measures with
``--remeasure``) and shows every candidate's figures; ``edge run --json`` times its own
``--input`` and gives every answer its placement receipt. The decisions go to the test's
own cache directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_echo.synthetic import pipeline, write_workload

QUICK = {"min_samples": 3, "max_samples": 6}


def edge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGE_PLUGINS": "echo", "EDGE_PLACEMENT_CACHE": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-m", "edge_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def _write(tmp_path: Path, **keys: object) -> Path:
    write_workload(tmp_path)
    file = tmp_path / "p.json"
    file.write_text(json.dumps(pipeline("preferred-slower", workload=["workload.npz"],
                                        measurement=QUICK, **keys)))
    return file


def test_plan_measures_then_reuses_then_remeasures(tmp_path: Path) -> None:
    _write(tmp_path)
    first = edge("plan", "p.json", "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    answer = json.loads(first.stdout)
    stage = answer["stages"][1]
    assert stage["choice"] == 1
    assert [c["outcome"] for c in stage["candidates"]] == ["passed", "chosen"]
    assert stage["candidates"][0]["measured"]["samples"] >= 1
    assert answer["plan"]["selection"]["decision"] == "measured"
    assert answer["released"] is True

    again = edge("plan", "p.json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "selection: latency; measured on " in again.stdout and ", reused" in again.stdout
    assert "candidate 0 echo: passed: passed every gate; not chosen" in again.stdout
    assert "[p50 " in again.stdout

    forced = edge("plan", "p.json", "--remeasure", "--json", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    selection = json.loads(forced.stdout)["plan"]["selection"]
    assert selection["decision"] == "measured" and "--remeasure" in selection["note"]


def test_plan_times_its_input_and_names_a_bad_one(tmp_path: Path) -> None:
    _write(tmp_path)
    timed = edge("plan", "p.json", "--input", "workload.npz", "--json", cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    workload = json.loads(timed.stdout)["plan"]["selection"]["workload"]
    assert workload["origin"] == "--input" and workload["note"] == "--input: workload.npz"
    (tmp_path / "bad.npz").write_text("not an archive")
    bad = edge("plan", "p.json", "--input", "bad.npz", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.startswith("edge: input[0]: not a readable .npz")


def test_run_gives_every_answer_its_placement(tmp_path: Path) -> None:
    _write(tmp_path)
    ran = edge("run", "p.json", "--inputs", "workload.npz", "--repeat", "2", "--json",
               cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    receipt = {s["stage"]: s for s in report["placement"]}
    assert receipt["b"]["candidate"] == 1 and receipt["b"]["decision"] == "measured"
    assert receipt["b"]["backend"] == "echo" and receipt["b"]["provider"] == "numpy"
    assert receipt["a"]["decision"] == "only"
    assert report["plan"]["selection"]["workload"]["origin"] == "--input"
    human = edge("run", "p.json", "--inputs", "workload.npz", cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "placement: a on echo (numpy, candidate 0, only); b on echo (numpy, candidate 1, "\
        "reused " in human.stdout


def test_probe_only_says_a_measured_choice_is_made_at_open(tmp_path: Path) -> None:
    _write(tmp_path)
    probed = edge("plan", "p.json", "--probe-only", cwd=tmp_path)
    assert probed.returncode == 0, probed.stderr
    assert "note: selection is measured: which would-try candidate of b serves" in \
        probed.stdout
    first = edge("plan", "p.json", "--probe-only", cwd=tmp_path)
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())
    assert first.returncode == 0  # nothing measured, nothing stored


def test_plan_refuses_an_input_its_pipeline_would_not_time(tmp_path: Path) -> None:
    """Without a measured choice nothing reads --input: refused naming it, before opening.

    Before, ``edge plan --input`` of a first-passing pipeline (or one where no stage has
    several candidates) opened every stage and answered as if the option were not given.
    """
    write_workload(tmp_path)
    first = pipeline("preferred-slower", selection="first-passing")
    (tmp_path / "first.json").write_text(json.dumps(first))
    only = pipeline("preferred-slower")
    only["stages"][1]["candidates"] = only["stages"][1]["candidates"][:1]
    (tmp_path / "only.json").write_text(json.dumps(only))
    for file, why in (("first.json", "its selection is 'first-passing': each stage takes "
                                     "the first candidate that passes"),
                      ("only.json", "no stage lists more than one candidate: there is no "
                                    "choice to time")):
        error = (f"--input: pipeline 'preferred-slower' times nothing to read it with "
                 f"({why}); drop --input")
        refused = edge("plan", file, "--input", "workload.npz", "--json", cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert json.loads(refused.stdout) == {"ok": False, "error": error,
                                              "options": ["--input"], "plugin_errors": []}
        assert "worker logs" not in refused.stderr  # nothing opened
        text = edge("plan", file, "--input", "workload.npz", cwd=tmp_path)
        assert (text.returncode, text.stdout, text.stderr) == (2, "", f"edge: {error}\n")
        planned = edge("plan", file, "--json", cwd=tmp_path)  # without it: the plan
        assert planned.returncode == 0, planned.stderr
        assert json.loads(planned.stdout)["plan"]["selection"]["decision"] in (
            "first-passing", "only")


def test_plan_says_a_stage_without_gate_points_has_none(tmp_path: Path) -> None:
    """A backend reporting no per-shape warm-ups (echo; docs/authoring.md's) has no points.

    Its one warm-up is gated whole; the plan said "full gate, 0 of 0 points checked now
    (no stored gate)", a count of nothing and a store that never holds such a gate.
    """
    note = ("full gate on the warm-up's placement and numerics; no gate points (the "
            "backend reports no per-shape warm-ups)")
    (tmp_path / "p.toml").write_text('name = "one"\n[[stages]]\nid = "a"\n'
                                     '[stages.backend]\nname = "echo"\n')
    text = edge("plan", "p.toml", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert f"    gate: {note}\n" in text.stdout and "0 of 0" not in text.stdout
    as_json = edge("plan", "p.toml", "--json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    (stage,) = json.loads(as_json.stdout)["plan"]["stages"]
    assert stage["gate"] == {"mode": "full", "points_checked": 0, "points": 0,
                             "note": note}


@pytest.mark.parametrize("command", ["plan", "run"])
def test_plan_and_run_say_when_the_decision_cannot_be_stored(tmp_path: Path,
                                                             command: str) -> None:
    """A cache directory that cannot be made: the command still answers, and says so."""
    _write(tmp_path)
    (tmp_path / "cache").write_text("a file where the directory should be")
    done = edge(command, "p.json", *(["--inputs", "workload.npz"] if command == "run" else []),
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "  warning: the decision could not be stored: " in done.stdout
    assert str(tmp_path / "cache") in done.stdout
