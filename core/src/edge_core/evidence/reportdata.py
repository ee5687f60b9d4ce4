"""What both report formats show of a record: headline, stage, latency and start-up rows."""

from __future__ import annotations

from typing import Any

from edge_core.evidence.records import QualificationRecord

__all__ = ["headline", "latency_rows", "memory_rows", "stage_rows", "startup_rows"]


def _ms(value: object) -> str:
    return f"{float(value):.1f} ms" if isinstance(value, int | float) else "-"


def _s_as_ms(value: object) -> str:
    return f"{float(value) * 1e3:.0f} ms" if isinstance(value, int | float) else "-"


def headline(record: QualificationRecord) -> str:
    """One short line for a matrix cell: p50 at concurrency 1 (with n), or the layer."""
    if record.failure is not None:
        return f"{record.failure.layer}"
    latency = record.performance.get("latency") or {}
    for key, row in latency.items():
        if key.endswith("@c1") and "p50_ms" in row:
            return f"p50 {_ms(row['p50_ms'])} (n={row['n']})"
    inference = record.performance.get("inference_time_ms")
    if isinstance(inference, int | float):
        return f"{_ms(inference)} (hosted)"
    return ""


def latency_rows(record: QualificationRecord) -> list[list[str]]:
    """Rows: group@concurrency, n, p50, p95, throughput (or the reason it was skipped)."""
    rows = []
    for key, row in (record.performance.get("latency") or {}).items():
        if "p50_ms" not in row:
            rows.append([key, "0", "-", "-", f"{row.get('status')}: {row.get('reason')}"])
            continue
        rps = row.get("throughput_rps")
        rows.append([key, str(row["n"]), _ms(row["p50_ms"]), _ms(row["p95_ms"]),
                     f"{rps:.2f} req/s" if isinstance(rps, int | float) else "-"])
    return rows


def stage_rows(record: QualificationRecord) -> list[list[str]]:
    """Rows: stage, target, provider split, numerics (max abs vs bound), evidence label."""
    rows = []
    for sid, stage in (record.functional.get("stages") or {}).items():
        split = ", ".join(f"{name} {nodes}" for name, nodes in stage["providers"].items())
        numerics: dict[str, Any] = stage.get("numerics") or {}
        bound = (numerics.get("bound") or {}).get("max_abs_error")
        check = (f"max_abs {numerics.get('max_abs_error')} (bound {bound}) "
                 f"{'passed' if numerics.get('passed') else 'NOT passed'}"
                 if numerics else "not compared")
        rows.append([sid, str(stage.get("target")), split or "-", check,
                     str(stage.get("evidence"))])
    return rows


_PHASES = ("process_start_s", "imports_s", "artifact_verification_s", "worker_load_s",
           "warmup_placement_s")


def startup_rows(record: QualificationRecord) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the traced start-up phases per stage, plus pipeline lines."""
    startup = record.performance.get("startup") or {}
    traced = startup.get("traced") or {}
    header = ["stage", "process start", "imports", "artifact verification", "load",
              "warm-up + placement", "warm restart"]
    restart = ((startup.get("warm_restart") or {}).get("stages")) or {}
    rows = []
    for sid, phases in (traced.get("stages") or {}).items():
        rows.append([sid, *(_s_as_ms(phases.get(p)) for p in _PHASES),
                     _s_as_ms((restart.get(sid) or {}).get("restart_s"))])
    opened = traced.get("open") or {}
    if opened:
        rows.append(["(pipeline)", "-", "-", "-", f"open {_s_as_ms(opened.get('open_s'))}",
                     f"first output {_s_as_ms(traced.get('first_output_s'))}",
                     "first output "
                     f"{_s_as_ms((startup.get('warm_restart') or {}).get('first_output_s'))}"])
        rows.append(["(baseline, untraced)", "-", "-", "-",
                     f"open {_s_as_ms(startup.get('baseline_open_total_s'))}",
                     f"first output {_s_as_ms(startup.get('baseline_first_output_s'))}", "-"])
    return header, rows


def memory_rows(record: QualificationRecord) -> list[list[str]]:
    """Rows: stage, worker-tree peak RSS, reserved demands."""
    rows = []
    for sid, memory in (record.performance.get("memory") or {}).items():
        peak = memory.get("worker_tree_peak_rss_bytes")
        reserved = memory.get("reserved") or {}
        rows.append([sid, f"{peak / 2**20:.0f} MiB" if isinstance(peak, int) else "-",
                     ", ".join(f"{pool} {n / 2**20:.0f} MiB" for pool, n in reserved.items())
                     or "-"])
    peak = record.performance.get("peak_memory_bytes")
    if peak is not None:
        rows.append(["(hosted job)", str(peak), "-"])
    return rows
