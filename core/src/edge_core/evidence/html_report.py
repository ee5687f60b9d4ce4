"""The self-contained HTML form of the matrix report.

Inline CSS and SVG, no script, no network: it renders the same from a file, offline.

Every matrix cell is a ``td.cell`` with ``data-status`` and the status colour as its
background, holding a link to the record and the four verdicts (``span.verdict`` with
``data-verdict`` and ``data-value``: met, failed, unjudged, or "not recorded" in a
version 1 record); the counts, the per-cell evidence and an SVG latency distribution per
cell follow.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from edge_core.evidence import reportdata
from edge_core.evidence.matrix import Matrix
from edge_core.evidence.records import QualificationRecord
from edge_core.evidence.status import COLOURS, MEANINGS
from edge_core.evidence.svgplot import latency_svg

__all__ = ["render_html"]

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1f2328}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px;margin-top:22px}
table{border-collapse:collapse;margin:8px 0}
th,td{border:1px solid #d0d7de;padding:5px 9px;font-size:13px;text-align:left;
vertical-align:top}
th{background:#f6f8fa}
td.cell{color:#fff;font-weight:600;min-width:120px}
td.cell a{color:#fff;text-decoration:underline}
td.empty{color:#8c959f}
span.swatch{display:inline-block;width:12px;height:12px;margin-right:6px;
vertical-align:middle;border-radius:2px}
span.badge{color:#fff;padding:1px 7px;border-radius:10px;font-size:12px}
code{background:#f6f8fa;padding:1px 4px;border-radius:4px;font-size:12px}
span.verdict{display:inline-block;margin:3px 3px 0 0;padding:0 5px;border-radius:8px;
font-size:11px;background:rgba(255,255,255,.25);color:#fff}
small{color:#57606a}
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _anchor(index: int) -> str:
    return f"cell-{index}"


def _verdicts(record: QualificationRecord) -> str:
    return "".join(
        f'<span class="verdict" data-verdict="{name}" data-value="{_e(value)}" '
        f'title="{_e(name)}: {_e(value)}: {_e(basis)}">'
        f"{reportdata.VERDICT_LETTERS[name]}{reportdata.VERDICT_MARKS.get(value, '?')}</span>"
        for name, value, basis in reportdata.verdict_marks(record))


def render_html(matrix: Matrix, *, title: str = "Qualification matrix") -> str:
    """The whole report as one HTML document."""
    keys = sorted(matrix.entries)
    anchors = {key: _anchor(i) for i, key in enumerate(keys)}
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
           f"<h1>{_e(title)}</h1>",
           f"<p>{len(matrix.entries)} cell(s); newest record per cell.</p>",
           "<h2>Counts</h2>", '<table class="counts"><thead><tr><th>status</th>'
           "<th>cells</th><th>meaning</th></tr></thead><tbody>"]
    for status, count in matrix.counts.items():
        out.append(f'<tr data-status="{status.value}"><td><span class="swatch" '
                   f'style="background:{COLOURS[status]}"></span>{status.value}</td>'
                   f"<td>{count}</td><td>{_e(MEANINGS[status])}</td></tr>")
    out.append("</tbody></table><h2>Matrix</h2>")
    out.append('<table class="matrix"><thead><tr><th>model</th>')
    out += [f"<th>{_e(device)}<br><small>{_e(conf)}</small></th>"
            for device, conf in matrix.columns]
    out.append("</tr></thead><tbody>")
    for model in matrix.models:
        out.append(f"<tr><th>{_e(model)}</th>")
        for column in matrix.columns:
            entry = matrix.entry(model, column)
            if entry is None:
                out.append('<td class="empty">-</td>')
                continue
            status = entry.record.status
            text = reportdata.headline(entry.record)
            anchor = anchors[(model, column[0], column[1])]
            out.append(f'<td class="cell" data-status="{status.value}" '
                       f'style="background:{COLOURS[status]}">'
                       f'<a href="{_e(entry.href)}">{status.value}</a>'
                       f'<br><small style="color:#fff">{_e(text)}</small> '
                       f'<a href="#{anchor}">details</a><br>{_verdicts(entry.record)}</td>')
        out.append("</tr>")
    out.append("</tbody></table><h2>Cells</h2>")
    for key in keys:
        out += _details(matrix, key, anchors[key])
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _details(matrix: Matrix, key: tuple[str, str, str], anchor: str) -> list[str]:
    entry = matrix.entries[key]
    record = entry.record
    status = record.status
    model, device, conf = key
    out = [f'<section id="{anchor}"><h3>{_e(model)} x {_e(device)} / {_e(conf)} '
           f'<span class="badge" style="background:{COLOURS[status]}">{status.value}'
           "</span></h3><ul>",
           f'<li>record: <a href="{_e(entry.href)}">{_e(entry.href)}</a> '
           f"(<code>{_e(record.record_id)}</code>, {_e(record.source.get('kind'))}, "
           f"{_e(record.created_at)})</li>"]
    if record.command.get("shell"):
        out.append(f"<li>command: <code>{_e(record.command['shell'])}</code></li>")
    if record.failure is not None:
        failure = record.failure
        out += [f"<li>failing layer: <b>{_e(failure.layer)}</b>"
                + (f" (step {_e(failure.step)})" if failure.step else "") + "</li>",
                f"<li>observed: {_e(failure.reason)}</li>",
                f"<li>next step: {_e(failure.next_step)}</li>"]
    out += [f"<li>note: {_e(note)}</li>" for note in record.notes]
    if entry.superseded:
        out.append(f"<li>superseded records: {_e(', '.join(entry.superseded))}</li>")
    out.append("</ul>")
    out += ["<p>Verdicts</p>", _table(["verdict", "value", "basis"],
                                      reportdata.verdict_rows(record))]
    if stages := reportdata.stage_rows(record):
        out += ["<p>Functional</p>",
                _table(["stage", "target", "placement", "numerics", "evidence"], stages)]
    if latency := reportdata.latency_rows(record):
        out += ["<p>Latency (Pipeline.run to result, controller clock)</p>",
                _table(["group@concurrency", "n", "p50", "p95", "throughput"], latency)]
    samples = record.performance.get("latency_samples_ms") or {}
    if samples:
        out.append(latency_svg(samples, colour=COLOURS[status],
                               title=f"{model} on {device}: latency samples (ms)"))
    if streams := reportdata.stream_rows(record):
        out += ["<p>Streams (controller arrival times; per token)</p>",
                _table(["class@concurrency", "n", "TTFT p50 / p95", "inter-token p50 / p95",
                        "decode", "effective prefill"], streams)]
        ttft = record.performance.get("ttft_samples_ms") or {}
        if ttft:
            out.append(latency_svg(ttft, colour=COLOURS[status],
                                   title=f"{model} on {device}: time to first token (ms)"))
    if realtime := reportdata.realtime_rows(record):
        out += ["<p>Real time (media streams)</p>",
                _table(["class@concurrency", "n", "first chunk p95", "RTF max",
                        "playback deficits"], realtime)]
    if cases := reportdata.case_rows(record):
        out += ["<p>Stream cases</p>", _table(["case", "observed"], cases)]
    head, startup = reportdata.startup_rows(record)
    if startup:
        out += ["<p>Start-up (traced run; baseline untraced)</p>", _table(head, startup)]
    if overhead := reportdata.overhead_rows(record):
        out += ["<p>Instrumentation (untraced and traced runs, in order)</p>",
                _table(["figure", "untraced", "traced", "tracer overhead", "order effect"],
                       overhead)]
    if memory := reportdata.memory_told_rows(record):
        out += ["<p>Memory (loading and runtime peaks per worker tree)</p>",
                _table(["stage", "pool", "demand", "observation", "loading peak",
                        "runtime peak", "runtime vs demand"], memory)]
    elif memory := reportdata.memory_rows(record):
        out += ["<p>Memory</p>", _table(["stage", "worker-tree peak RSS", "reserved"], memory)]
    out += ["<p>Operating conditions</p>",
            _table(["what", "observed"], reportdata.condition_rows(record))]
    out.append("</section>")
    return out
