"""Records of every status for the report tests (rendering input, no processes)."""

from __future__ import annotations

from typing import Any

from edge_core.evidence.hubjob import record_from_hub_job
from edge_core.evidence.records import Cell, Failure, QualificationRecord
from edge_core.evidence.status import Status

HUB: dict[str, Any] = {
    "status": "success", "device": "Galaxy S24", "model": "detect",
    "job_ids": {"compile": "jc", "profile": "jp"}, "estimated_inference_time": 1500,
}


def _verdicts(**values: str) -> dict[str, Any]:
    return {name: {"verdict": values.get(name, "unjudged"), "basis": f"{name} as set"}
            for name in ("functional", "quality", "performance", "reliability")}


def _local(status: Status, model: str, device: str, samples: list[float],
           created: str = "2026-01-02T00:00:00+00:00",
           failure: Failure | None = None,
           verdicts: dict[str, Any] | None = None) -> QualificationRecord:
    latency = {"g@c1": {"n": len(samples), "p50_ms": sorted(samples)[len(samples) // 2],
                        "p95_ms": max(samples), "throughput_rps": 10.0}} if samples else {}
    return QualificationRecord(
        status=status, cell=Cell(device, model, "ort-cpu / CPUExecutionProvider"),
        created_at=created, source={"kind": "profile", "path": None}, device={},
        artifact={}, backend={}, command={"argv": ["edge", "profile", "p.toml"],
                                          "shell": "edge profile p.toml"},
        execution_plan=None, functional={}, performance={
            "latency": latency, "latency_samples_ms": {"g@c1": samples} if samples else {}},
        failure=failure, verdicts=verdicts or _verdicts())


def every_status() -> list[QualificationRecord]:
    """Eight records, one per status, over three models and three devices."""
    return [
        _local(Status.PASS, "ocr", "EPYC", [10.0, 11.0, 12.5, 30.0],
               verdicts=_verdicts(functional="met", quality="met", performance="met",
                                  reliability="met")),
        _local(Status.MET_AS_JUDGED, "recognize", "Radeon 780M", [7.0],
               verdicts=_verdicts(functional="met", reliability="met")),
        _local(Status.PARTIAL, "detect", "EPYC", [5.0, 6.0]),
        record_from_hub_job({**HUB, "numerics": {"passed": True, "max_abs_error": 0.0}}),
        record_from_hub_job({**HUB, "model": "ocr"}),
        _local(Status.FAILED, "recognize", "EPYC", [], failure=Failure(
            "numerics", "max_abs_error 3 > 1e-4", "check the export")),
        record_from_hub_job({**HUB, "model": "recognize", "status": "failed",
                             "failed_job": "compile", "failure_reason": "op <Foo> & more"}),
        _local(Status.BLOCKED, "ocr", "Radeon 780M", [], failure=Failure(
            "backend", "ort-directml: windows only", "run on Windows")),
    ]
