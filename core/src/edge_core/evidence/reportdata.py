"""What both report formats show of a record: headline, verdicts, and the rows of each table.

Version 1 records have no verdicts, streams, conditions or told-apart memory: their
rows say "not recorded" (or are absent) rather than empty figures.
"""

from __future__ import annotations

from typing import Any

from edge_core.evidence.records import QualificationRecord

__all__ = ["VERDICT_LETTERS", "VERDICT_MARKS", "case_rows", "condition_rows", "headline",
           "latency_rows", "memory_rows", "memory_told_rows", "overhead_rows", "realtime_rows",
           "stage_rows", "startup_rows", "stream_rows", "verdict_line", "verdict_marks",
           "verdict_rows"]


def _ms(value: object) -> str:
    return f"{float(value):.1f} ms" if isinstance(value, int | float) else "-"


def _s_as_ms(value: object) -> str:
    return f"{float(value) * 1e3:.0f} ms" if isinstance(value, int | float) else "-"


def headline(record: QualificationRecord) -> str:
    """One short line for a matrix cell: p50 (or TTFT p50) at concurrency 1, or the layer."""
    if record.failure is not None:
        return f"{record.failure.layer}"
    for key, row in (record.performance.get("streams") or {}).items():
        ttft = row.get("ttft_ms") or {}
        if key.endswith("@c1") and "p50_ms" in ttft:
            return f"TTFT p50 {_ms(ttft['p50_ms'])} (n={ttft['n']})"
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


VERDICT_MARKS = {"met": "✓", "failed": "✗", "unjudged": "?", "not recorded": "-"}
"""The mark of each verdict value in a matrix cell (``-``: a version 1 record has none)."""
VERDICT_LETTERS = {"functional": "F", "quality": "Q", "performance": "P", "reliability": "R"}
"""The one-letter label of each verdict in a matrix cell."""


def verdict_marks(record: QualificationRecord) -> list[tuple[str, str, str]]:
    """``(verdict name, value, basis)`` of the four verdicts, in order.

    A version 1 record has none: each is ``not recorded``.
    """
    found = []
    for name in VERDICT_LETTERS:
        verdict = record.verdicts.get(name) or {}
        found.append((name, str(verdict.get("verdict", "not recorded")),
                      str(verdict.get("basis") or f"not recorded ({record.schema})")))
    return found


def verdict_line(record: QualificationRecord) -> str:
    """One short line: ``F✓ Q? P? R✓`` (a version 1 record: its schema says none)."""
    if not record.verdicts:
        return f"verdicts not recorded ({record.schema})"
    return " ".join(f"{VERDICT_LETTERS[name]}{VERDICT_MARKS.get(value, '?')}"
                    for name, value, _ in verdict_marks(record))


def verdict_rows(record: QualificationRecord) -> list[list[str]]:
    """Rows: verdict, value, basis."""
    return [[name, value, basis] for name, value, basis in verdict_marks(record)]


def _num(value: object, digits: int = 1) -> str:
    return f"{float(value):.{digits}f}" if isinstance(value, int | float) else "-"


def stream_rows(record: QualificationRecord) -> list[list[str]]:
    """Rows per class@concurrency: n, TTFT p50/p95, inter-token p50/p95, decode, prefill."""
    rows = []
    for key, row in (record.performance.get("streams") or {}).items():
        ttft, gap = row.get("ttft_ms") or {}, row.get("inter_token_ms") or {}
        rows.append([key, str(row.get("n")),
                     f"{_num(ttft.get('p50_ms'))} / {_num(ttft.get('p95_ms'))} ms",
                     f"{_num(gap.get('p50_ms'), 2)} / {_num(gap.get('p95_ms'), 2)} ms"
                     f" (n={gap.get('n', 0)})",
                     f"{_num((row.get('decode_tokens_per_s') or {}).get('pooled'))} tok/s",
                     f"{_num((row.get('prefill_tokens_per_s') or {}).get('pooled'))} tok/s"])
    return rows


def realtime_rows(record: QualificationRecord) -> list[list[str]]:
    """Rows per class@concurrency of media streams: first chunk, RTF, deficits."""
    rows = []
    for key, row in (record.performance.get("streams") or {}).items():
        realtime = row.get("realtime")
        if not realtime:
            continue
        first = realtime.get("first_chunk_ms") or {}
        rows.append([key, str(realtime.get("n")), f"{_num(first.get('p95_ms'))} ms",
                     _num((realtime.get("rtf") or {}).get("max"), 3),
                     f"{realtime.get('deficits')} ({_num(realtime.get('deficit_s'), 3)} s)"])
    return rows


def memory_told_rows(record: QualificationRecord) -> list[list[str]]:
    """Rows per stage and charged pool: demand, observation, loading/runtime peak, over."""
    rows = []
    told = record.performance.get("memory_told_apart") or {}
    for stage, pools in (told.get("pools") or {}).items():
        for pool, row in pools.items():
            loading = row.get("loading_peak_bytes")
            runtime = row.get("runtime_peak_bytes", row.get("peak_bytes"))
            rows.append([stage, pool, f"{row.get('demand_bytes', 0) / 2**20:.0f} MiB",
                         str(row.get("observation")),
                         f"{loading / 2**20:.0f} MiB" if isinstance(loading, int) else "-",
                         f"{runtime / 2**20:.0f} MiB" if isinstance(runtime, int) else "-",
                         {True: "OVER DEMAND", False: "within", None: "unknown"}[
                             row.get("runtime_over_demand")]])
    sampled = (told.get("sampled") or {}).get("peak_of_sum_bytes")
    if isinstance(sampled, int) and sampled:
        rows.append(["(all trees)", "machine:ram", "-", "sampled sum", "-",
                     f"{sampled / 2**20:.0f} MiB", "-"])
    return rows


def condition_rows(record: QualificationRecord) -> list[list[str]]:
    """Rows: what was observed of the operating conditions and the stack's identity."""
    rows = []
    summary = (record.conditions or {}).get("summary") or {}
    if summary:
        load = summary.get("load_average") or {}
        freq = summary.get("frequency") or {}
        power = summary.get("power") or {}
        rows += [["load average", f"{load.get('before')} → {load.get('after')}"],
                 ["CPU frequency", f"{freq.get('source')}; changed: {freq.get('changed')}; "
                                   f"governors: {freq.get('governors', '-')}"],
                 ["temperature", str(summary.get("temperature_c"))],
                 ["power", f"source {(power.get('before') or {}).get('source')}, mode "
                           f"{(power.get('before') or {}).get('mode')}"]]
    cache = (record.conditions or {}).get("compiled_cache")
    if cache:
        rows.append(["compiled / EP-context cache",
                     ", ".join(f"{k} {v}" for k, v in cache.items())])
    identity = record.identity or {}
    if identity.get("digest"):
        rows.append(["runtime identity", f"sha256 {str(identity['digest'])[:16]}…"])
    source = identity.get("source") or {}
    if source:
        rows.append(["source", f"{source.get('vcs')} {source.get('commit', '')[:12]}"
                               + (" (dirty)" if source.get("dirty") else "")
                     if source.get("vcs") else str(source.get("reason"))])
    packages = (identity.get("controller_packages") or {}).get("packages")
    if packages:
        rows.append(["controller packages", f"{len(packages)} distributions recorded"])
    if not rows:
        rows.append(["conditions", f"not recorded ({record.schema})"])
    return rows


def overhead_rows(record: QualificationRecord) -> list[list[str]]:
    """Rows: open, first output and matched p50: traced vs untraced, overhead, order."""
    found = record.performance.get("instrumentation") or {}
    rows = []
    for key, unit, scale in (("open_s", "ms", 1e3), ("first_output_s", "ms", 1e3),
                             ("matched_p50_ms", "ms", 1.0)):
        row = found.get(key) or {}
        if not row:
            continue

        def show(values: list[Any], scale: float = scale) -> str:
            return ", ".join(_num(v * scale) if isinstance(v, int | float) else "-"
                             for v in values)

        overhead, order = row.get("overhead"), row.get("order_effect")
        rows.append([key.removesuffix("_s").removesuffix("_ms"),
                     show(row.get("untraced") or []), show(row.get("traced") or []),
                     f"{_num(overhead * scale if isinstance(overhead, int | float) else None)}"
                     f" {unit}",
                     f"{_num(order * scale if isinstance(order, int | float) else None)} {unit}"])
    return rows


def case_rows(record: QualificationRecord) -> list[list[str]]:
    """Rows: the slow-consumer and cancellation cases of a streamed stage."""
    cases = record.performance.get("stream_cases") or {}
    rows = []
    slow = cases.get("slow_consumer") or {}
    if slow.get("error"):
        rows.append(["slow consumer", f"error: {slow['error'].get('type')}"])
    elif slow:
        gaps = slow.get("delivery_gaps_ms") or {}
        rows.append(["slow consumer",
                     f"paused {slow.get('pause_s')} s: {slow.get('buffered_events')} event(s) "
                     f"waited ({slow.get('buffered_data_bytes')} B of data), largest gap "
                     f"{_num(gaps.get('max'))} ms; complete {slow.get('complete')}, in order "
                     f"{slow.get('in_order')}"])
    cancel = cases.get("cancellation") or {}
    if cancel.get("measured"):
        # (records made before events_during_cancel was measured have none)
        during = ("" if "events_during_cancel" not in cancel
                  else f"{cancel['events_during_cancel']} event(s) during the cancel, ")
        rows.append(["cancellation",
                     f"{cancel.get('outcome')}, {cancel.get('ended')}: acknowledged in "
                     f"{_num(cancel.get('cancel_call_ms'))} ms, ended in "
                     f"{_num(cancel.get('cancel_to_end_ms'))} ms (bound "
                     f"{_num(cancel.get('bound_ms'), 0)} ms: within {cancel.get('within_bound')}"
                     f"); {during}{cancel.get('events_after_cancel')} event(s) after "
                     "the cancel"])
    elif cancel:
        rows.append(["cancellation", f"not measured: {cancel.get('reason')}"])
    return rows
