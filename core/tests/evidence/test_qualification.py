"""Qualification records from real profiles and from AI Hub job records; the JSON form."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from edge_core.evidence.errors import RecordInvalid
from edge_core.evidence.hubjob import record_from_hub_job
from edge_core.evidence.profiling import ProfileSettings, run_profile
from edge_core.evidence.qualify import record_from_profile
from edge_core.evidence.records import (
    RECORD_SCHEMA,
    Cell,
    Failure,
    QualificationRecord,
    load_record,
    write_record,
)
from edge_core.evidence.status import COLOURS, MEANINGS, Status, classify_error

from .conftest import build_scale_bundle, echo_stage, ort_stage, write_pipeline

QUICK = ProfileSettings(requests=2, warmup_requests=0, concurrency=(1,),
                        process_start_repeats=1, warm_restart=False)


def _profile(tmp_path: Path, stages: list[dict[str, Any]], npz: Path | None = None,
             **kwargs: Any) -> dict[str, Any]:
    path = write_pipeline(tmp_path, stages, **kwargs)
    return run_profile(path, npz_files=[str(npz)] if npz else [], settings=QUICK,
                       command=["edge", "profile", str(path)])


def test_every_status_has_its_own_meaning_and_colour() -> None:
    assert len({MEANINGS[s] for s in Status}) == len(Status) == 8
    assert len({COLOURS[s] for s in Status}) == len(Status)
    assert {s for s in Status if s.needs_failure} == {Status.FAILED, Status.REJECTED,
                                                     Status.BLOCKED}


def test_error_classes_map_to_distinct_statuses_most_specific_first() -> None:
    assert classify_error(["DemandExceeded", "ResourceUnavailable"]).status is Status.FAILED
    assert classify_error(["ResourceUnavailable", "EdgeError"]).status is Status.BLOCKED
    assert classify_error(["BundleChanged", "ManifestInvalid"]).status is Status.REJECTED
    assert classify_error(["PlacementRefusal", "PlacementRefused"]).layer == "placement"
    assert classify_error(["Strange"]).layer == "unknown"
    # a gate or call past its bound (gate_timeout_s of a candidate) is a runtime refusal
    from edge_core.errors import DeadlineExceeded
    from edge_core.host.errors import WorkerUnresponsive

    assert classify_error([c.__name__ for c in DeadlineExceeded.__mro__]).layer == "runtime"
    assert classify_error([c.__name__ for c in WorkerUnresponsive.__mro__]).layer == "worker"


def test_a_real_onnx_stage_on_target_without_golden_set_or_targets_is_not_pass(
        tmp_path: Path) -> None:
    bundle = build_scale_bundle(tmp_path / "scale")
    profile = _profile(tmp_path, [ort_stage("scale", bundle)])
    record = record_from_profile(profile, profile_path="p.json")
    # functional and reliability are judged and met; quality and performance were not
    # judged, so the cell says which were, and is never PASS
    assert record.status is Status.MET_AS_JUDGED
    assert record.failure is None
    verdicts = {name: v["verdict"] for name, v in record.verdicts.items()}
    assert verdicts == {"functional": "met", "quality": "unjudged",
                        "performance": "unjudged", "reliability": "met"}
    assert any("judged and met: functional, reliability; unjudged: quality, performance"
               in note for note in record.notes)
    assert record.cell.model == "t"
    assert record.cell.configuration == "ort-cpu / CPUExecutionProvider"
    stage = record.functional["stages"]["scale"]
    assert stage["on_target"] and stage["numerics"]["passed"]
    assert stage["evidence_buckets"] == {"compared": 1, "declared": 1, "runs_compared": 1,
                                         "runs": 1, "not_compared": {}}
    # the record says how the load gate ran: the evidence run's is always full
    assert stage["gate"]["mode"] == "full"
    assert stage["gate"]["note"].startswith("full gate, 1 of 1 points checked now")
    untraced = record.performance["startup"]["untraced_gates"]
    assert untraced and all(gates["scale"]["points_checked"] == 1 for gates in untraced)
    assert record.performance["latency"]["example@c1"]["n"] == 2
    assert len(record.performance["latency_samples_ms"]["example@c1"]) == 2
    assert record.artifact["scale"]["component"] == "scale"
    assert record.backend["scale"]["runtime"]["onnxruntime"]
    assert record.command["shell"].startswith("edge profile ")
    assert record.execution_plan is not None


def _judged_pipeline(tmp_path: Path, target: str) -> Path:
    """An ort-cpu scale stage with a golden set, a quality check and one target."""
    import numpy as np

    from .conftest import X

    bundle = build_scale_bundle(tmp_path / "scale")
    np.savez(tmp_path / "golden-x.npz", x=X)
    (tmp_path / "golden.json").write_text(json.dumps({
        "schema": "edge.golden/1", "passes": ["max_abs_error <= 1e-6"],
        "items": [{"name": "x", "npz": "golden-x.npz", "truth": {"y": (X * 3).tolist()}}]}))
    path = tmp_path / "judged.json"
    path.write_text(json.dumps({
        "name": "judged", "quality": "edge_core.evidence.quality_checks:max_abs_error",
        "golden": "golden.json", "targets": [target],
        "stages": [ort_stage("scale", bundle)]}))
    return path


@pytest.mark.parametrize(("target", "status", "performance"), [
    ("latency_p95_ms <= 60000", Status.PASS, "met"),
    ("latency_p50_ms <= 0.000001", Status.FAILED, "failed"),
])
def test_pass_needs_all_four_verdicts_judged_and_met(
        tmp_path: Path, target: str, status: Status, performance: str) -> None:
    settings = ProfileSettings(requests=20, warmup_requests=0, concurrency=(1,),
                               process_start_repeats=1, warm_restart=False,
                               matched_requests=2)
    profile = run_profile(_judged_pipeline(tmp_path, target), settings=settings)
    record = record_from_profile(profile)
    verdicts = {name: v["verdict"] for name, v in record.verdicts.items()}
    assert verdicts == {"functional": "met", "quality": "met", "performance": performance,
                        "reliability": "met"}
    assert record.verdicts["quality"]["metrics"] == {"max_abs_error": 0.0}
    assert record.status is status
    if status is Status.FAILED:
        assert record.failure is not None and record.failure.layer == "performance"
        assert target in record.failure.reason


def test_fewer_requests_than_the_protocol_leave_performance_unjudged(tmp_path: Path) -> None:
    profile = _profile(tmp_path, [ort_stage("scale", build_scale_bundle(tmp_path / "s"))])
    record = record_from_profile(profile, targets=["latency_p95_ms <= 60000"],
                                 targets_origin="test")
    performance = record.verdicts["performance"]
    assert performance["verdict"] == "unjudged"
    assert performance["below_protocol"] == ["example@c1 (n=2)"]
    assert performance["targets"][0]["outcome"] == "met"  # evaluated, not claimed
    assert any("fewer than the protocol's 20 requests" in note for note in record.notes)


def test_a_stage_without_a_reference_makes_the_record_component(tmp_path: Path) -> None:
    first = build_scale_bundle(tmp_path / "first")
    second = build_scale_bundle(tmp_path / "second", expected=False, source="y", target="z")
    profile = _profile(tmp_path, [ort_stage("first", first),
                                  ort_stage("second", second, chained=True)])
    record = record_from_profile(profile)
    assert record.functional["stages"]["second"]["evidence"] == "backend-execution"
    assert record.functional["stages"]["second"]["evidence_buckets"]["compared"] == 0
    assert record.status is Status.COMPONENT
    assert "second" in record.notes[0]


def test_no_stage_with_a_reference_is_profile_only(tmp_path: Path) -> None:
    bundle = build_scale_bundle(tmp_path / "scale", expected=False)
    record = record_from_profile(_profile(tmp_path, [ort_stage("scale", bundle)]))
    assert record.status is Status.PROFILE_ONLY
    assert record.performance["latency"]["example@c1"]["n"] == 2


def test_a_split_onto_a_fallback_provider_is_partial(tmp_path: Path) -> None:
    bundle = build_scale_bundle(tmp_path / "scale")
    profile = _profile(tmp_path, [ort_stage("scale", bundle)])
    # The CPU backend cannot split here; give the real plan a second provider's share.
    split = copy.deepcopy(profile)
    split["plan"]["stages"][0]["placement"]["providers"]["QNNExecutionProvider"] = {
        "nodes": 1, "op_types": {"Mul": 1}, "node_names": ["scale"]}
    assert record_from_profile(split).status is Status.PARTIAL


def test_a_tampered_artifact_is_rejected_at_the_artifact_layer(tmp_path: Path) -> None:
    bundle = build_scale_bundle(tmp_path / "scale")
    graph = bundle / "model.onnx"
    graph.write_bytes(graph.read_bytes() + b"\0")
    record = record_from_profile(_profile(tmp_path, [ort_stage("scale", bundle)]))
    assert record.status is Status.REJECTED
    assert record.failure is not None
    assert record.failure.layer == "artifact" and record.failure.step == "open"
    assert "model.onnx" in record.failure.reason
    assert record.performance == {}


@pytest.mark.parametrize(("stage", "status", "layer"), [
    ({"id": "a", "backend": {"name": "ort-directml"}}, Status.BLOCKED, "backend"),
    ({**echo_stage("a"), "resources": {"demands": {"machine:ram": 1 << 60}}},
     Status.BLOCKED, "admission"),
    (echo_stage("a", fail_at="load"), Status.FAILED, "runtime"),
    (echo_stage("a", wrong_numerics=True), Status.FAILED, "numerics"),
])
def test_failures_name_their_layer_and_a_next_step(
        tmp_path: Path, echo_inputs: Path, stage: dict[str, Any], status: Status,
        layer: str) -> None:
    record = record_from_profile(_profile(tmp_path, [stage], echo_inputs))
    assert record.status is status
    assert record.failure is not None
    assert record.failure.layer == layer
    assert record.failure.reason and record.failure.next_step


def test_records_round_trip_through_json_files(tmp_path: Path, echo_inputs: Path) -> None:
    record = record_from_profile(_profile(tmp_path, [echo_stage("a", fail_at="load")],
                                          echo_inputs))
    path = write_record(record, tmp_path / "records" / "a.json")
    data = json.loads(path.read_text())
    assert data["schema"] == RECORD_SCHEMA and data["record_id"] == record.record_id
    assert data["status"] == "FAILED"
    assert load_record(path) == record


def test_a_record_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "latin.json"
    path.write_bytes('{"schema": "edge.qualification/2", "cell": "café"}'.encode("latin-1"))
    with pytest.raises(RecordInvalid) as refused:
        load_record(path)
    assert str(refused.value) == f"{path}: not valid UTF-8 (byte 47: invalid continuation byte)"


def _minimal(**changes: Any) -> dict[str, Any]:
    record = QualificationRecord(
        status=Status.BLOCKED, cell=Cell("dev", "model", "conf"),
        created_at="2026-01-01T00:00:00+00:00", source={"kind": "ai-hub"}, device={},
        artifact={}, backend={}, command={}, execution_plan=None, functional={},
        performance={}, failure=Failure("prerequisite", "no token", "configure it"))
    return {**record.to_json(), **changes}


@pytest.mark.parametrize(("changes", "message"), [
    ({"schema": "other/1"}, "schema: must be one of ['edge.qualification/1', "
                            "'edge.qualification/2']: 'other/1'"),
    ({"status": "GREAT"}, "status: must be one of"),
    ({"failure": None}, "failure: required for status BLOCKED"),
    ({"cell": {"device": "", "model": "m", "configuration": "c"}},
     "cell.device: must be a non-empty string: ''"),
    ({"source": {"kind": "guess"}}, "source.kind: must be 'profile' or 'ai-hub': 'guess'"),
])
def test_malformed_records_are_refused_naming_the_field(changes: dict[str, Any],
                                                         message: str) -> None:
    with pytest.raises(RecordInvalid, match=re.escape(message)):
        QualificationRecord.from_json(_minimal(**changes))


def test_a_pass_record_cannot_carry_a_failure() -> None:
    with pytest.raises(RecordInvalid, match="failure: only FAILED, REJECTED and BLOCKED"):
        QualificationRecord.from_json(_minimal(status="PASS"))


def test_missing_fields_are_listed() -> None:
    data = _minimal()
    del data["device"], data["command"]
    with pytest.raises(RecordInvalid, match=r"record: missing fields: \['command', 'device'\]"):
        QualificationRecord.from_json(data)


HUB_OK = {
    "status": "SUCCESS", "device": {"name": "Samsung Galaxy S24", "os": "Android 14"},
    "model": "ocr-detect", "target_runtime": "qnn_context_binary",
    "job_ids": {"compile": "jc1", "profile": "jp1", "inference": "ji1"},
    "compute_units": {"NPU": 120, "CPU": 2}, "estimated_inference_time": 2150,
    "peak_memory_bytes": [1000, 5000],
}


def test_a_successful_hub_job_compared_within_bound_is_component_not_pass() -> None:
    job = {**HUB_OK, "numerics": {"max_abs_error": 0.001, "passed": True}}
    record = record_from_hub_job(job, job_path="job.json")
    assert record.status is Status.COMPONENT
    assert record.cell.device == "Samsung Galaxy S24"
    assert record.source["job_ids"]["profile"] == "jp1"
    assert record.performance["inference_time_ms"] == pytest.approx(2.15)
    assert record.performance["peak_memory_bytes"] == [1000, 5000]
    assert record.functional["delegation_reported"]["observed"] is False
    assert any("not evidence of local deployment" in n for n in record.notes)


def test_a_hub_profile_without_comparison_is_profile_only() -> None:
    assert record_from_hub_job(HUB_OK).status is Status.PROFILE_ONLY


@pytest.mark.parametrize(("job", "status", "layer"), [
    ({"status": "FAILED", "failed_job": "compile", "failure_reason": "op not supported"},
     Status.REJECTED, "compile"),
    ({"status": "failed", "failed_job": "profile", "failure_reason": "device timeout"},
     Status.FAILED, "profile"),
    ({"status": "blocked", "failure_reason": "no API token configured"},
     Status.BLOCKED, "prerequisite"),
    ({"numerics": {"max_abs_error": 3.0, "passed": False}}, Status.FAILED, "numerics"),
])
def test_hub_failures_are_told_apart(job: dict[str, Any], status: Status, layer: str) -> None:
    record = record_from_hub_job({**HUB_OK, **job})
    assert record.status is status
    assert record.failure is not None and record.failure.layer == layer


def test_the_failed_hub_job_id_is_in_the_next_step() -> None:
    record = record_from_hub_job({**HUB_OK, "status": "FAILED", "failed_job": "profile"})
    assert record.failure is not None and "jp1" in record.failure.next_step


@pytest.mark.parametrize(("job", "message"), [
    ({"status": 3}, "status: must be a string: 3"),
    ({"status": "maybe"}, "status: unknown job status"),
    ({"device": ""}, "device: must be a name or an object with a name: ''"),
    ({"job_ids": ["a"]}, r"job_ids: must be an object of job kind to id: \['a'\]"),
    ({"estimated_inference_time": "fast"}, "estimated_inference_time: must be a number"),
    ({"peak_memory_bytes": [1, 2, 3]}, "peak_memory_bytes: must be an integer or a"),
])
def test_malformed_hub_job_records_are_refused_naming_the_field(
        job: dict[str, Any], message: str) -> None:
    with pytest.raises(RecordInvalid, match=message):
        record_from_hub_job({**HUB_OK, **job})


def _edge_hub_record(status: str, jobs: dict[str, str], comparison: Any = None,
                     error: str | None = None) -> dict[str, Any]:
    """A record made by edge hub's own record builder, filled as its workflow fills it."""
    evidence = pytest.importorskip("edge_qnn.hub.evidence")
    record: dict[str, Any] = evidence.new_record(
        "infer", {"component": "ocr-detect", "digest": "ab" * 32},
        {"name": "Snapdragon 8 Elite QRD", "os": "15", "attributes": ["chipset:x"]},
        "http://127.0.0.1:1", "0.0")
    record["jobs"].update(jobs)
    record["status"] = status
    record["error"] = error
    record["delegation"] = evidence.delegation([{"compute_unit": "NPU"}] * 3)
    record["estimated_inference_time_us"] = 1200
    if comparison is not None:
        record["execution"] = {"evidence": "outputs-compared", "comparison": comparison}
    record["label"] = evidence.label_for(record)
    return record


@pytest.mark.parametrize(("status", "jobs", "comparison", "expected", "layer"), [
    ("passed", {"compile": "jc", "inference": "ji"}, {"passed": True, "max_abs_error": 0.0},
     Status.COMPONENT, None),
    ("passed", {"compile": "jc", "profile": "jp"}, None, Status.PROFILE_ONLY, None),
    ("failed", {"compile": "jc", "inference": "ji"}, {"passed": False, "max_abs_error": 2.0},
     Status.FAILED, "numerics"),
    ("failed", {"compile": "jc"}, None, Status.REJECTED, "compile"),
    ("failed", {"compile": "jc", "profile": "jp"}, None, Status.FAILED, "profile"),
    ("failed", {}, None, Status.BLOCKED, "prerequisite"),
])
def test_edge_hub_evidence_records_are_read_with_the_same_label_rules(
        status: str, jobs: dict[str, str], comparison: Any, expected: Status,
        layer: str | None) -> None:
    hub = _edge_hub_record(status, jobs, comparison, error=None if status == "passed"
                           else "hub.x: failed: 'detail'")
    record = record_from_hub_job(hub, job_path="hub.json")
    assert record.status is expected
    assert (record.failure.layer if record.failure else None) == layer
    assert record.cell.device == "Snapdragon 8 Elite QRD"
    assert record.cell.model == "ocr-detect"
    assert record.functional["delegation_reported"]["compute_units"] == {"NPU": 3}
    if expected in (Status.COMPONENT, Status.PROFILE_ONLY):
        assert hub["label"] == expected.value  # edge hub's own label agrees


def test_a_pipeline_that_never_opened_still_names_its_cell(tmp_path: Path,
                                                           echo_inputs: Path) -> None:
    stage = {"id": "a", "backend": {"name": "ort-directml"},
             "placement": {"target": "DmlExecutionProvider"}}
    record = record_from_profile(_profile(tmp_path, [stage], echo_inputs, name="gpu"))
    assert record.status is Status.BLOCKED
    assert record.cell.model == "gpu"
    assert record.cell.configuration == "ort-directml / DmlExecutionProvider"
    assert record.device["probes"] == []  # not installed: no plugin answers for it


def test_a_run_that_failed_before_tracing_says_so_not_startup_samples_0(
        tmp_path: Path, echo_inputs: Path) -> None:
    stage = {"id": "a", "backend": {"name": "ort-directml"}}
    profile = _profile(tmp_path, [stage], echo_inputs, name="gpu")
    assert profile["settings"]["startup_samples"] == 1
    notes = record_from_profile(profile).notes
    assert "no traced run (the run failed at open first): no start-up phases, no tracer " \
           "overhead" in notes
    assert not any("--startup-samples 0" in note for note in notes)
    asked_none = {**profile, "settings": {**profile["settings"], "startup_samples": 0}}
    assert any("no traced run (--startup-samples 0)" in note
               for note in record_from_profile(asked_none).notes)
