"""`edge profile` and `edge qualify` on the OCR page pipeline: verdicts claim what was shown.

The bundle directory ships a golden set (the demo page and its ground truth); the
pipeline names its quality check (page CER). One profile — 20 requests of a small page,
the protocol's minimum — is qualified three ways: without targets (performance
``unjudged``: MET_AS_JUDGED, not PASS), with targets it meets (PASS: all four verdicts
judged and met) and with one it misses (FAILED at the performance layer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from edge_ocr_example.bundle_layout import PIPELINE
from edge_ocr_example.page_bundle import GOLDEN, GOLDEN_MAX_CER
from edge_ocr_example.pages import load_font

pytestmark = pytest.mark.slow


def _edge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGE_PLUGINS": "ort-cpu", "EDGE_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "edge_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def profiled(page_bundles: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding ``p.json``: the page pipeline profiled on a one-line page."""
    folder = tmp_path_factory.mktemp("ocr-evidence")
    image = Image.new("RGB", (420, 70), "white")
    ImageDraw.Draw(image).text((12, 16), "Invoice 2024-0417", fill=(20, 20, 20),
                               font=load_font("DejaVuSans.ttf", 28))
    image.save(folder / "line.png")
    result = _edge("profile", str(page_bundles / PIPELINE), "--input", "line.png",
                   "--requests", "20", "--warmup", "0", "--concurrency", "1",
                   "--startup-samples", "0", "--matched-requests", "1", "--out", "p.json",
                   cwd=folder)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return folder


def _qualify(folder: Path, *extra: str) -> dict[str, Any]:
    result = _edge("qualify", "--profile", "p.json", "--json", *extra, cwd=folder)
    assert result.returncode == 0, result.stderr
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


def test_the_bundle_ships_a_golden_page_with_its_truth(page_bundles: Path) -> None:
    golden = json.loads((page_bundles / GOLDEN).read_text())
    assert golden["passes"] == [f"cer <= {GOLDEN_MAX_CER}"]
    (item,) = golden["items"]
    assert (page_bundles / item["input"]).is_file() and len(item["truth"]) == 13
    text = (page_bundles / PIPELINE).read_text()
    assert 'quality = "edge_ocr_example.quality:page_cer"' in text
    assert f'golden = "{GOLDEN}"' in text


def test_without_targets_performance_is_unjudged_and_the_status_not_pass(
        profiled: Path) -> None:
    answer = _qualify(profiled)
    verdicts = answer["verdicts"]
    assert verdicts["performance"]["verdict"] == "unjudged"
    assert "no product targets declared" in verdicts["performance"]["basis"]
    assert answer["status"] != "PASS"
    # every other verdict was judged and met: the cell says so, and which was not judged
    assert answer["status"] == "MET_AS_JUDGED"
    assert {name: v["verdict"] for name, v in verdicts.items()} == {
        "functional": "met", "quality": "met", "performance": "unjudged",
        "reliability": "met"}


def test_the_golden_page_gives_the_quality_verdict_with_its_cer(profiled: Path) -> None:
    quality = _qualify(profiled)["verdicts"]["quality"]
    assert quality["verdict"] == "met"
    assert quality["function"] == "edge_ocr_example.quality:page_cer"
    assert 0.0 <= quality["metrics"]["cer"] <= GOLDEN_MAX_CER
    assert quality["passes"][0]["criterion"] == f"cer <= {GOLDEN_MAX_CER}"
    assert "cer <= 0.02 (measured" in quality["basis"]


@pytest.mark.parametrize(("targets", "verdict", "status"), [
    (["latency_p95_ms <= 600000", "open_s <= 3600"], "met", "PASS"),
    (["latency_p95_ms <= 600000", "latency_p50_ms <= 0.001"], "failed", "FAILED"),
])
def test_with_a_targets_file_performance_passes_or_fails_on_them(
        profiled: Path, targets: list[str], verdict: str, status: str) -> None:
    (profiled / f"{verdict}.toml").write_text(f"targets = {json.dumps(targets)}\n")
    answer = _qualify(profiled, "--targets", f"{verdict}.toml", "--out", f"{verdict}.json")
    performance = answer["verdicts"]["performance"]
    assert performance["verdict"] == verdict
    assert [t["target"] for t in performance["targets"]] == targets
    assert performance["below_protocol"] == []  # 20 requests: the protocol's minimum
    assert answer["status"] == status
    if verdict == "failed":
        assert answer["failure"]["layer"] == "performance"
        assert "latency_p50_ms <= 0.001" in answer["failure"]["reason"]
    record = json.loads((profiled / f"{verdict}.json").read_text())
    assert record["schema"] == "edge.qualification/2"
    conditions = record["conditions"]["summary"]
    assert conditions["load_average"]["before"] and conditions["frequency"]["source"]
    assert record["identity"]["runtime"]["backends"]["ort-cpu"]["runtime"]["onnxruntime"]
