"""The profiling harness on real pipelines: phases, request levels, raw samples, memory."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from edge_core.evidence.profiling import PROFILE_SCHEMA, ProfileSettings, run_profile

from .conftest import build_scale_bundle, echo_stage, ort_stage, write_pipeline

SMALL = ProfileSettings(requests=5, warmup_requests=1, concurrency=(1, 2, 4),
                        process_start_repeats=1)


@pytest.fixture(scope="module")
def echo_profile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One profile of a two-stage echo pipeline with admission 2 (shared by the tests)."""
    import numpy as np

    tmp = tmp_path_factory.mktemp("echo")
    np.savez(tmp / "x.npz", x=np.ones((2, 2), dtype=np.float32))
    stages = [echo_stage("a"), echo_stage("b", chained=True, scale=0.5)]
    path = write_pipeline(tmp, stages, admission=2)
    mp = pytest.MonkeyPatch()
    mp.setenv("EDGE_PLUGINS", "echo")
    try:
        return run_profile(path, npz_files=[str(tmp / "x.npz")], settings=SMALL,
                           command=["edge", "profile", str(path)])
    finally:
        mp.undo()


def test_profile_of_a_working_pipeline_is_ok_and_self_describing(
        echo_profile: dict[str, Any]) -> None:
    assert echo_profile["schema"] == PROFILE_SCHEMA
    assert echo_profile["outcome"] == {"ok": True}
    assert echo_profile["command"]["argv"][:2] == ["edge", "profile"]
    assert echo_profile["host"]["logical_cpus"] >= 1
    assert "Pipeline.run" in echo_profile["boundaries"]["requests"]
    assert [s["id"] for s in echo_profile["plan"]["stages"]] == ["a", "b"]
    (probe,) = echo_profile["probes"]
    assert probe["backend"] == "echo" and probe["available"] is True


def test_every_stage_has_separately_measured_startup_phases(
        echo_profile: dict[str, Any]) -> None:
    traced = echo_profile["traced"]
    assert traced["instrumented"] is True
    for sid in ("a", "b"):
        phases = traced["stages"][sid]
        assert phases["worker_start_s"] > 0
        assert phases["worker_load_s"] > 0
        assert phases["worker_warmup_s"] > 0
        assert phases["warmup_placement_s"] >= phases["worker_warmup_s"]
        assert phases["load_s"] >= phases["worker_start_s"] + phases["worker_load_s"]
        assert phases["artifact_verification_s"] == 0.0  # echo stages have no bundle
        assert phases["process_start_s"] > 0
        # measured in the worker itself, within its own spawn -> hello span
        assert phases["imports_basis"] == "worker"
        assert phases["entry_import_s"] > 0 and phases["handler_s"] >= 0
        assert phases["imports_s"] == pytest.approx(phases["entry_import_s"]
                                                    + phases["handler_s"])
        assert phases["imports_s"] < phases["worker_start_s"]
        assert phases["imports_derived_s"] == pytest.approx(phases["worker_start_s"]
                                                            - phases["process_start_s"])
    assert traced["first_output_s"] > 0
    assert traced["process_start"]["a"]["entry"] == "edge_contracts.worker:BaseHandler"
    assert len(traced["process_start"]["a"]["samples_s"]) == 1
    # timed as the stage's own start goes: forked by the warm pool where it serves
    pooled = sys.platform.startswith("linux") and hasattr(os, "pidfd_open")
    assert traced["process_start"]["a"]["start_paths"] == ["forked" if pooled else "spawned"]


def test_warm_restart_reloads_every_stage_under_a_new_generation(
        echo_profile: dict[str, Any]) -> None:
    restart = echo_profile["traced"]["warm_restart"]
    for sid in ("a", "b"):
        assert restart["stages"][sid]["generation"] == 2
        assert restart["stages"][sid]["worker_retire_s"] > 0
        assert restart["stages"][sid]["worker_start_s"] > 0
    assert restart["first_output_s"] > 0


def test_baseline_is_uninstrumented_and_keeps_every_raw_sample(
        echo_profile: dict[str, Any]) -> None:
    baseline = echo_profile["baseline"]
    assert baseline["instrumented"] is False
    (group,) = baseline["groups"]
    assert group["name"] == "x.npz" and group["inputs"]["x"]["shape"] == [2, 2]
    assert len(group["warmup_samples"]) == 1
    levels = {level["concurrency"]: level for level in group["levels"]}
    for concurrency in (1, 2):
        level = levels[concurrency]
        assert level["status"] == "measured"
        assert len(level["samples"]) == 5
        assert sorted(s["request"] for s in level["samples"]) == list(range(5))
        assert level["summary"]["total"]["n"] == 5
        assert set(level["summary"]["stages"]) == {"a", "b"}
        assert all(set(s["stages_s"]) == {"a", "b"} for s in level["samples"])
    assert levels[4] == {"concurrency": 4, "status": "skipped",
                         "reason": "pipeline admission is 2"}


def test_memory_peaks_and_reservations_are_recorded_and_released(
        echo_profile: dict[str, Any]) -> None:
    memory = echo_profile["baseline"]["memory"]
    for sid in ("a", "b"):
        assert memory["stages"][sid]["worker_tree_peak_rss_bytes"] > 0
    assert memory["ledger"]["pools"]["machine:ram"]["reserved"] > 0
    assert len(memory["ledger"]["reservations"]) == 2
    after = echo_profile["baseline"]["ledger_after_close"]
    assert after["reservations"] == []
    assert after["pools"]["machine:ram"]["reserved"] == 0
    assert after["pools"]["machine:ram"]["quarantined"] == 0
    assert all(v["release"] == "released" for v in echo_profile["baseline"]["closed"].values())


@pytest.mark.parametrize(("options", "step", "error_type"), [
    ({"fail_at": "load"}, "open", "RemoteError"),
    ({"wrong_numerics": True}, "open", "NumericsRefused"),
])
def test_a_failing_pipeline_gives_a_failed_outcome_with_its_error_chain(
        tmp_path: Path, echo_inputs: Path, options: dict[str, Any], step: str,
        error_type: str) -> None:
    path = write_pipeline(tmp_path, [echo_stage("a", **options)])
    profile = run_profile(path, npz_files=[str(echo_inputs)], settings=SMALL)
    outcome = profile["outcome"]
    assert outcome["ok"] is False
    assert outcome["step"] == step
    assert outcome["error_type"] == error_type
    assert error_type in outcome["chain"][0]["classes"]
    assert "baseline" not in profile
    (first,) = profile["runs"]  # the first run (untraced) failed: nothing after it ran
    assert first["role"] == "untraced" and first["reached"][0]["stage"] == "a"


def test_a_real_onnx_stage_reports_artifact_verification_and_placement(
        tmp_path: Path) -> None:
    bundle = build_scale_bundle(tmp_path / "scale")
    path = write_pipeline(tmp_path, [ort_stage("scale", bundle)])
    settings = ProfileSettings(requests=3, warmup_requests=0, concurrency=(1,),
                               process_start_repeats=1, warm_restart=False)
    profile = run_profile(path, settings=settings)
    assert profile["outcome"] == {"ok": True}
    phases = profile["traced"]["stages"]["scale"]
    assert phases["artifact_verification_s"] > 0
    assert phases["imports_basis"] == "worker"
    assert 0 < phases["entry_import_s"] <= phases["imports_s"] < phases["worker_start_s"]
    (group,) = profile["baseline"]["groups"]
    assert group["name"] == "example"
    stage = profile["plan"]["stages"][0]
    assert stage["placement"]["providers"]["CPUExecutionProvider"]["nodes"] == 1
    assert stage["evidence"] == "complete-model"


def test_request_errors_keep_their_class_and_layer_and_the_level_goes_on(
        tmp_path: Path, echo_inputs: Path) -> None:
    from edge_core.evidence.qualify import record_from_profile
    from edge_core.evidence.status import Status
    from edge_core.evidence.workload_file import RequestClass

    stage = {**echo_stage("a"), "restart": "on-failure", "restart_backoff_s": 0.0}
    path = write_pipeline(tmp_path, [stage])
    classes = [RequestClass("fine", ({},), "test"),
               RequestClass("crashing", ({"crash": True},), "test")]
    settings = ProfileSettings(requests=2, warmup_requests=0, concurrency=(1,),
                               process_start_repeats=1, warm_restart=False,
                               matched_requests=1)
    profile = run_profile(path, npz_files=[str(echo_inputs)], classes=classes,
                          settings=settings)
    levels = {g["name"]: g["levels"][0] for g in profile["baseline"]["groups"]}
    assert levels["fine"]["status"] == "measured" and len(levels["fine"]["samples"]) == 2
    crashed = levels["crashing"]
    # the client thread went on after the first error: both requests were tried
    assert crashed["status"] == "failed" and len(crashed["errors"]) == 2
    first = crashed["errors"][0]
    assert first["type"] == "WorkerGone" and "WorkerLost" in first["classes"]
    assert first["layer"] == "worker"
    outcome = profile["outcome"]
    assert outcome["step"] == "requests" and outcome["failed_levels"] == [["crashing", 1]]
    record = record_from_profile(profile)
    assert record.status is Status.FAILED
    assert record.failure is not None and record.failure.layer == "worker"
    reliability = record.verdicts["reliability"]
    assert reliability["verdict"] == "failed" and reliability["request_errors"] == 2
    assert reliability["errors_by_layer"] == {"worker": 2}
    assert record.performance["latency"]["fine@c1"]["n"] == 2  # the figures are kept


def test_a_graph_stage_then_a_streaming_one_profiles_end_to_end_with_each_share(
        tmp_path: Path, echo_inputs: Path) -> None:
    streaming = {"id": "speak", "input_transform": "edge_echo.transforms:passthrough",
                 "backend": {"name": "echo-preemptible", "options": {
                     "stream_chunks": 5, "chunk_rate_hz": 100.0, "delay_s": 0.05}}}
    path = write_pipeline(tmp_path, [echo_stage("read", delay_s=0.05), streaming])
    settings = ProfileSettings(requests=3, warmup_requests=0, concurrency=(1,),
                               startup_samples=0, matched_requests=1,
                               slow_consumer_pause_s=0.05)
    profile = run_profile(path, npz_files=[str(echo_inputs)], settings=settings)
    assert profile["outcome"] == {"ok": True} and profile["streamed"] is True
    (level,) = profile["baseline"]["groups"][0]["levels"]
    stages = level["stream"]["stages"]
    assert set(stages) == {"read", "speak"}
    for stage in stages.values():
        assert stage["n"] == 3 and 0.0 < stage["share_of_request"] < 1.0
    # the first token comes after the graph stage's 50 ms and the stream's own delay
    assert level["stream"]["ttft_ms"]["min_ms"] >= 100.0
    assert profile["runs"] == [] and "traced" not in profile
    assert profile["instrumentation"]["sequence"] == ["untraced"]


def test_a_generation_golden_set_is_judged_by_reference_tokens(
        tmp_path: Path, echo_inputs: Path) -> None:
    import json

    from edge_core.evidence.qualify import record_from_profile
    from edge_core.evidence.status import Status

    (tmp_path / "golden.json").write_text(json.dumps({
        "schema": "edge.golden/1", "passes": ["exact_match >= 1"],
        "items": [
            {"name": "four", "npz": echo_inputs.name, "params": {"stream_chunks": 4},
             "truth": {"token_ids": [0, 1, 2, 3]}},
            {"name": "two", "npz": echo_inputs.name, "params": {"stream_chunks": 2},
             "truth": {"token_ids": [0, 7]}},
        ]}))
    (tmp_path / echo_inputs.name).write_bytes(echo_inputs.read_bytes())
    path = tmp_path / "gen.json"
    path.write_text(json.dumps({
        "name": "gen", "quality": "edge_core.evidence.quality_checks:reference_tokens",
        "golden": "golden.json",
        "stages": [{"id": "g", "backend": {"name": "echo-preemptible",
                                           "options": {"stream_chunks": 3}}}]}))
    settings = ProfileSettings(requests=1, warmup_requests=0, concurrency=(1,),
                               startup_samples=0, matched_requests=1,
                               slow_consumer_pause_s=0.01)
    profile = run_profile(path, npz_files=[str(echo_inputs)], settings=settings)
    quality = profile["baseline"]["quality"]
    assert quality["declared"] is True and quality["golden"]["items"] == ["four", "two"]
    assert quality["metrics"] == {"exact_match": 0.5, "token_agreement": pytest.approx(5 / 6)}
    assert quality["passes"] == [{"criterion": "exact_match >= 1", "value": 0.5,
                                  "met": False}]
    record = record_from_profile(profile)
    assert record.verdicts["quality"]["verdict"] == "failed"
    assert record.status is Status.FAILED
    assert record.failure is not None and record.failure.layer == "quality"
    assert "exact_match >= 1 (measured 0.5)" in record.failure.reason


def test_imports_fall_back_to_the_derived_difference_without_the_workers_figures() -> None:
    from edge_core.evidence.startup import stage_startup

    opened = {"stages": {"a": {"worker_start_s": 0.5}, "b": {"worker_start_s": 0.4}}}
    bare = {"a": {"median_s": 0.1}, "b": {"median_s": 0.1}}
    rows = stage_startup(opened, bare, {"a": {"entry_import_s": 0.25, "handler_s": 0.05}})
    assert rows["a"]["imports_s"] == pytest.approx(0.3)
    assert rows["a"]["imports_basis"] == "worker"
    assert rows["a"]["imports_derived_s"] == pytest.approx(0.4)
    assert rows["b"]["imports_s"] == pytest.approx(0.3)
    assert rows["b"]["imports_basis"] == "derived"
    assert "entry_import_s" not in rows["b"]


#: The two plugins of the tests below that do not load, as the profile lists them.
NOT_LOADED = [
    {"plugin": "no-such-entry-point", "named_by": "EDGE_PLUGINS",
     "error": "not installed: no installed distribution has an entry point "
              "'no-such-entry-point' in group 'edge'"},
    {"plugin": "no_such_edge_plugin", "named_by": "configuration",
     "error": "import failed: ModuleNotFoundError: No module named 'no_such_edge_plugin'"},
]

#: A profile as short as it can be (one request, one level, one process start).
QUICK = ProfileSettings(requests=1, warmup_requests=0, concurrency=(1,),
                        process_start_repeats=1)


@pytest.mark.parametrize("options", [{}, {"fail_at": "load"}], ids=["ok", "failed"])
def test_the_profile_itself_lists_the_plugins_that_did_not_load(
        tmp_path: Path, echo_inputs: Path, monkeypatch: pytest.MonkeyPatch,
        options: dict[str, Any]) -> None:
    """``plugin_errors`` is run_profile's own, not only ``edge profile``'s, failed run too."""
    monkeypatch.setenv("EDGE_PLUGINS", "echo,no-such-entry-point")
    path = write_pipeline(tmp_path, [echo_stage("a", **options)],
                          plugins=["no_such_edge_plugin"])
    profile = run_profile(path, npz_files=[str(echo_inputs)], settings=QUICK)
    assert profile["outcome"]["ok"] is (not options)
    assert profile["plugin_errors"] == NOT_LOADED


def test_a_profile_whose_plugins_all_loaded_lists_none(echo_profile: dict[str, Any]) -> None:
    assert echo_profile["plugin_errors"] == []


def test_a_profile_that_loaded_no_plugin_set_says_null(
        tmp_path: Path, echo_inputs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unknown, not none: a file that cannot be read, or strict loading refusing one."""
    missing = run_profile(tmp_path / "missing.json", settings=QUICK)
    assert missing["outcome"]["ok"] is False and missing["plugin_errors"] is None
    monkeypatch.setenv("EDGE_STRICT_PLUGINS", "1")
    path = write_pipeline(tmp_path, [echo_stage("a")], plugins=["no_such_edge_plugin"])
    strict = run_profile(path, npz_files=[str(echo_inputs)], settings=QUICK)
    assert strict["outcome"]["ok"] is False and strict["plugin_errors"] is None


@pytest.mark.parametrize("field", ["slow_consumer_pause_s", "chunk_seconds", "duration_s",
                                   "window_s", "memory_interval_s"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_settings_refuse_seconds_that_are_not_finite(field: str, value: float) -> None:
    # the settings are written into the profile, and JSON has no NaN nor Infinity
    with pytest.raises(ValueError, match=f"^{field}: must be a finite number"):
        ProfileSettings(**{field: value})


@pytest.mark.parametrize(("field", "good", "bad"), [
    ("requests", 100_000, 100_001), ("warmup_requests", 100_000, 10**23),
    ("matched_requests", 100_000, 100_001), ("process_start_repeats", 1_000, 1_001),
    ("startup_samples", 100, 101), ("duration_s", 7 * 24 * 3600.0, 7 * 24 * 3600.0 + 1),
    ("window_s", 24 * 3600.0, 1e300)])
def test_profile_settings_have_the_command_line_s_ceilings(field: str, good: float,
                                                            bad: float) -> None:
    """The Python API took any count or length the CLI refuses (``requests=10**23``): its
    ceilings are the same numbers, from one place (edge_core.evidence.profile_limits)."""
    from edge_core.evidence import profile_limits
    from edge_core.evidence.profiling import ProfileSettings

    assert getattr(ProfileSettings(**{field: good}), field) == good
    with pytest.raises(ValueError, match=rf"^{field}: must be at most ") as refused:
        ProfileSettings(**{field: bad})
    assert repr(bad) in str(refused.value)
    ceilings = {"requests": "MAX_REQUESTS", "warmup_requests": "MAX_REQUESTS",
                "matched_requests": "MAX_REQUESTS", "process_start_repeats":
                "MAX_PROCESS_STARTS", "startup_samples": "MAX_STARTUP_SAMPLES",
                "duration_s": "MAX_DURATION_S", "window_s": "MAX_WINDOW_S"}
    assert getattr(profile_limits, ceilings[field]) == good
