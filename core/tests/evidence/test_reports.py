"""The matrix, its Markdown and its self-contained HTML, rendered in headless Chromium."""

from __future__ import annotations

import html.parser
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest

from edge_core.evidence.html_report import render_html
from edge_core.evidence.markdown_report import render_markdown
from edge_core.evidence.matrix import Matrix, build_matrix
from edge_core.evidence.status import COLOURS, Status
from edge_core.evidence.svgplot import latency_svg

from .reports_fixtures import _local, every_status

FIXTURES = Path(__file__).parent / "fixtures"


def _matrix() -> Matrix:
    return build_matrix([(r, f"records/{i}.json") for i, r in enumerate(every_status())])


def _with_v1() -> Matrix:
    """Every status, and a committed version 1 record (edge.qualification/1)."""
    from edge_core.evidence.records import load_record

    old = load_record(FIXTURES / "record-v1.json")
    return build_matrix([(old, "records/old.json"),
                         *((r, f"records/{i}.json") for i, r in enumerate(every_status()))])


def test_a_version_1_record_is_read_and_rendered_beside_version_2_ones() -> None:
    from edge_core.evidence.records import RECORD_SCHEMA, QualificationRecord, load_record

    old = load_record(FIXTURES / "record-v1.json")
    assert old.schema == "edge.qualification/1" and old.verdicts == {}
    assert old.status is Status.PASS  # as it was written then: no verdicts behind it
    assert QualificationRecord.from_json(old.to_json()) == old  # kept as version 1
    assert old.to_json()["schema"] == "edge.qualification/1" and "verdicts" not in old.to_json()
    assert every_status()[0].to_json()["schema"] == RECORD_SCHEMA
    matrix = _with_v1()
    assert len(matrix.entries) == 9
    text = render_markdown(matrix)
    assert "[PASS](records/old.json) p50 " in text
    assert "verdicts not recorded (edge.qualification/1)" in text
    assert "| functional | not recorded | not recorded (edge.qualification/1) |" in text
    page = render_html(matrix)
    assert page.count('data-value="not recorded"') == 4
    assert page.count('<td class="cell"') == 9


def test_one_entry_per_cell_and_every_status_counted() -> None:
    matrix = build_matrix([(r, f"r{i}.json") for i, r in enumerate(every_status())])
    assert len(matrix.entries) == 8
    assert set(matrix.counts.values()) == {1}
    assert matrix.models == ("detect", "ocr", "recognize")
    assert len(matrix.columns) == 3


def test_the_newest_record_of_a_cell_wins_and_older_ones_are_listed() -> None:
    old = _local(Status.FAILED, "ocr", "EPYC", [], created="2026-01-01T00:00:00+00:00",
                 failure=next(r.failure for r in every_status() if r.status is Status.FAILED))
    new = _local(Status.PASS, "ocr", "EPYC", [1.0], created="2026-01-03T00:00:00+00:00")
    matrix = build_matrix([(new, "new.json"), (old, "old.json")])
    (entry,) = matrix.entries.values()
    assert entry.record.status is Status.PASS and entry.href == "new.json"
    assert entry.superseded == ("old.json",)
    assert "superseded records: old.json" in render_markdown(matrix)


def test_markdown_links_every_cell_to_its_record_and_explains_failures() -> None:
    text = render_markdown(_matrix(), title="T")
    assert text.startswith("# T\n")
    for status in Status:
        assert f"| {status.value} | 1 |" in text
    assert "[PASS](records/0.json) p50 12.5 ms (n=4) F✓ Q✓ P✓ R✓" in text
    assert "[MET_AS_JUDGED](records/1.json) p50 7.0 ms (n=1) F✓ Q? P? R✓" in text
    assert "| quality | unjudged | quality as set |" in text
    assert "- failing layer: **compile**" in text
    assert "- next step: check the export" in text
    assert "op <Foo> & more" in text


def test_html_is_self_contained_and_escapes_what_it_shows() -> None:
    page = render_html(_matrix())
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    assert "op &lt;Foo&gt; &amp; more" in page
    assert page.count('<td class="cell"') == 8
    assert page.count('<span class="verdict"') == 8 * 4  # four verdicts in every cell
    assert page.count("<svg") == 3  # the three records with samples


def test_the_latency_plot_draws_every_sample_and_the_percentiles() -> None:
    svg = latency_svg({"a@c1": [1.0, 2.0, 3.0], "b@c1": [4.0]})
    assert svg.count("<circle") == 4
    assert svg.count('class="p50"') == 2 and svg.count('class="p95"') == 2
    assert "a@c1 (n=3)" in svg
    assert "no samples" in latency_svg({})


class _Cells(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict[str, str]] = []
        self.verdicts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if tag == "td" and found.get("class") == "cell":
            self.cells.append(found)
        if tag == "span" and found.get("class") == "verdict" and found.get("data-verdict"):
            self.verdicts += 1


def _png_colours(path: Path) -> Counter[tuple[int, int, int]]:
    """Pixel colours of an 8-bit RGB/RGBA non-interlaced PNG (stdlib only)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks, header = 8, [], b""
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        body = data[offset + 8:offset + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        offset += 12 + length
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour_type in (2, 6) and interlace == 0
    channels = 3 if colour_type == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    previous = bytearray(stride)
    colours: Counter[tuple[int, int, int]] = Counter()
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                predictor = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + predictor) & 0xFF
        for i in range(0, stride, channels):
            colours[(line[i], line[i + 1], line[i + 2])] += 1
        previous = line
    return colours


def _rgb(colour: str) -> tuple[int, int, int]:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))


@pytest.mark.slow
def test_headless_chromium_renders_one_coloured_cell_per_pairing(tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (make test installs Debian's chromium)")
    page = tmp_path / "matrix.html"
    page.write_text(render_html(_with_v1()), encoding="utf-8")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    parser = _Cells()
    parser.feed(dom)
    assert len(parser.cells) == 9  # every status, and the version 1 record's PASS
    assert sorted(c["data-status"] for c in parser.cells) == sorted(
        [*(s.value for s in Status), "PASS"])
    assert parser.verdicts == 9 * 4  # four verdicts per cell, the version 1 one's too
    for cell in parser.cells:
        assert f"background:{COLOURS[Status(cell['data-status'])]}" in cell["style"]
    shot = tmp_path / "matrix.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1400,1000",
                    page.as_uri()], capture_output=True, timeout=120, check=True)
    colours = _png_colours(shot)
    for status in Status:
        assert colours[_rgb(COLOURS[status])] > 500, status  # a filled cell, not a speck
