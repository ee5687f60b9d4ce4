"""The Markdown form of the matrix report."""

from __future__ import annotations

from collections.abc import Sequence

from edge_core.evidence import reportdata
from edge_core.evidence.matrix import Matrix
from edge_core.evidence.status import MEANINGS

__all__ = ["render_markdown"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(matrix: Matrix, *, title: str = "Qualification matrix") -> str:
    """The whole report: counts per status, the matrix, then every cell's evidence."""
    lines = [f"# {title}", "",
             f"{len(matrix.entries)} cell(s); newest record per cell.", "", "## Counts", ""]
    lines += _table(["status", "cells", "meaning"],
                    [[s.value, str(n), MEANINGS[s]] for s, n in matrix.counts.items()])
    lines += ["", "## Matrix", ""]
    header = ["model", *(f"{device} / {conf}" for device, conf in matrix.columns)]
    rows = []
    for model in matrix.models:
        row = [model]
        for column in matrix.columns:
            entry = matrix.entry(model, column)
            if entry is None:
                row.append("-")
                continue
            text = reportdata.headline(entry.record)
            row.append(f"[{entry.record.status.value}]({entry.href})"
                       + (f" {text}" if text else "")
                       + f" {reportdata.verdict_line(entry.record)}")
        rows.append(row)
    lines += _table(header, rows)
    lines += ["", "## Cells", ""]
    for (model, device, conf), entry in sorted(matrix.entries.items()):
        record = entry.record
        lines += [f"### {model} x {device} / {conf}: {record.status.value}", "",
                  f"- record: [{entry.href}]({entry.href}) (`{record.record_id}`, "
                  f"{record.source.get('kind')}, {record.created_at})"]
        if record.command.get("shell"):
            lines.append(f"- command: `{record.command['shell']}`")
        if record.failure is not None:
            lines += [f"- failing layer: **{record.failure.layer}**"
                      + (f" (step {record.failure.step})" if record.failure.step else ""),
                      f"- observed: {record.failure.reason}",
                      f"- next step: {record.failure.next_step}"]
        lines += [f"- note: {note}" for note in record.notes]
        if entry.superseded:
            lines.append(f"- superseded records: {', '.join(entry.superseded)}")
        lines.append("")
        lines += ["Verdicts:", ""]
        lines += _table(["verdict", "value", "basis"], reportdata.verdict_rows(record))
        lines.append("")
        if stages := reportdata.stage_rows(record):
            lines += ["Functional:", ""]
            lines += _table(["stage", "target", "placement", "numerics", "evidence"], stages)
            lines.append("")
        if latency := reportdata.latency_rows(record):
            lines += ["Latency (Pipeline.run to result, controller clock):", ""]
            lines += _table(["group@concurrency", "n", "p50", "p95", "throughput"], latency)
            lines.append("")
        if streams := reportdata.stream_rows(record):
            lines += ["Streams (controller arrival times; per token):", ""]
            lines += _table(["class@concurrency", "n", "TTFT p50 / p95",
                             "inter-token p50 / p95", "decode", "effective prefill"], streams)
            lines.append("")
        if realtime := reportdata.realtime_rows(record):
            lines += ["Real time (media streams):", ""]
            lines += _table(["class@concurrency", "n", "first chunk p95", "RTF max",
                             "playback deficits"], realtime)
            lines.append("")
        if cases := reportdata.case_rows(record):
            lines += ["Stream cases:", ""]
            lines += _table(["case", "observed"], cases)
            lines.append("")
        head, startup = reportdata.startup_rows(record)
        if startup:
            lines += ["Start-up (traced run; baseline untraced):", ""]
            lines += _table(head, startup)
            lines.append("")
        if overhead := reportdata.overhead_rows(record):
            lines += ["Instrumentation (untraced and traced runs, in order):", ""]
            lines += _table(["figure", "untraced", "traced", "tracer overhead",
                             "order effect"], overhead)
            lines.append("")
        if memory := reportdata.memory_told_rows(record):
            lines += ["Memory (loading and runtime peaks per worker tree):", ""]
            lines += _table(["stage", "pool", "demand", "observation", "loading peak",
                             "runtime peak", "runtime vs demand"], memory)
            lines.append("")
        elif memory := reportdata.memory_rows(record):
            lines += ["Memory:", ""]
            lines += _table(["stage", "worker-tree peak RSS", "reserved"], memory)
            lines.append("")
        lines += ["Operating conditions:", ""]
        lines += _table(["what", "observed"], reportdata.condition_rows(record))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
