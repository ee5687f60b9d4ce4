"""The page pipeline served by the edge runtime: shape sets, fan-outs, boxes in image pixels.

Real ort-cpu worker processes and the real ledger; the answers equal the direct page reader's
(the same transforms on in-process onnxruntime sessions).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_ocr_example.bundle_layout import PIPELINE
from edge_ocr_example.decode import CHARACTERS_FILE, load_characters
from edge_ocr_example.images import read_image
from edge_ocr_example.page_bundle import PAGE, REC_REPLICAS
from edge_ocr_example.page_pipeline import finish, prepare
from edge_ocr_example.page_reader import read_page
from edge_ocr_example.pages import demo_page, load_font
from edge_ocr_example.reference import DirectRunner

pytestmark = pytest.mark.slow


def _read(pipeline: Pipeline, path: Path) -> list[dict[str, Any]]:
    inputs = prepare(str(path))
    with pipeline.run(inputs) as result:
        return finish(result.outputs, inputs, pipeline.bundle_directories())


def test_pages_through_the_edge_runtime_equal_the_direct_reader(
    page_bundles: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from edge_core.artifacts import shared_verification

    verified: list[str] = []  # each full verification of a bundle at open
    real = shared_verification.verify_bundle
    monkeypatch.setattr(shared_verification, "verify_bundle",
                        lambda d, **kw: verified.append(Path(d).name) or real(d, **kw))
    big = Image.new("RGB", (3000, 1400), "white")  # scaled to 960 x 448 for detection
    ImageDraw.Draw(big).text((1500, 800), "Total 98.50", font=load_font("DejaVuSans.ttf", 48),
                             fill="black")
    big.save(tmp_path / "big.png")
    Image.new("RGB", (300, 200), "white").save(tmp_path / "blank.png")
    long_font = load_font("DejaVuSans.ttf", 24)
    long_text = " ".join(f"item{i} costs {i * 7 % 90}.50" for i in range(1, 25))
    long = Image.new("RGB", (int(long_font.getlength(long_text)) + 20, 44), "white")
    ImageDraw.Draw(long).text((10, 8), long_text, font=long_font, fill="black")
    long.save(tmp_path / "long.png")  # folded into bands for detection
    small = Image.new("RGB", (1579, 243), "white")  # upright 8 px print the classifier
    small_lines = ["River balance service station", "summary"]  # calls upside down
    small_font = load_font("DejaVuSans.ttf", 8)
    for xy, text in zip(((305, 32), (1337, 45)), small_lines, strict=True):
        ImageDraw.Draw(small).text(xy, text, font=small_font, fill=(20, 20, 20))
    small.save(tmp_path / "small.png")  # 'summary' is read both ways, kept upright
    runner = DirectRunner.from_bundles(page_bundles)
    characters = load_characters(page_bundles / "recognize" / CHARACTERS_FILE)
    ledger = ResourceLedger([Pool(name="machine:ram", total=8 * 1024**3)])
    pipeline = Pipeline.open(load_pipeline(page_bundles / PIPELINE),
                             load_plugins(env={"EDGE_PLUGINS": "ort-cpu"}), ledger)
    try:
        # the recogniser's REC_REPLICAS replicas share one verification of their bundle
        assert sorted(verified) == ["classify", "detect", "recognize"], verified
        plan = pipeline.execution_plan()
        points = {s["id"]: sorted(b["point"] for b in s["buckets"]) for s in plan["stages"]}
        assert points == {s: ["between", "max", "min"] for s in ("detect", "classify",
                                                                  "recognize")}
        _, expected_lines = demo_page()
        for path in (page_bundles / PAGE, tmp_path / "big.png", tmp_path / "blank.png",
                     tmp_path / "long.png", tmp_path / "small.png"):
            got = _read(pipeline, path)
            direct = read_page(read_image(path), runner, characters=characters, batch=4)
            assert [g["text"] for g in got] == [d.text for d in direct], path.name
            for g, d in zip(got, direct, strict=True):
                np.testing.assert_allclose(g["box"], d.box, atol=0.06)
            if path.name == PAGE:
                assert [g["text"] for g in got] == list(expected_lines)
            elif path.name == "big.png":
                (line,) = got
                assert line["text"] == "Total 98.50"
                assert 1480 < min(x for x, _ in line["box"]) < 1505  # image pixels, not 960
            elif path.name == "long.png":
                assert "".join(g["text"] for g in got).replace(" ", "") == long_text.replace(
                    " ", "")
            elif path.name == "small.png":
                assert [g["text"] for g in got] == small_lines
            else:
                assert got == []
        # the declared demands hold after pages of every size, not only after warm-up
        after = pipeline.execution_plan()
        assert after["memory_over_demand"] == [], {s["id"]: s["memory"]
                                                   for s in after["stages"]}
        assert all(s["memory"]["pools"]["machine:ram"]["verdict"] == "within"
                   for s in after["stages"])
    finally:
        pipeline.close()
    assert ledger.snapshot()["reservations"] == []


def _edge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGE_PLUGINS": "ort-cpu"}
    return subprocess.run([sys.executable, "-m", "edge_core.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def _bad_files(folder: Path) -> dict[str, str]:
    """Bad inputs and the reason each must be refused with."""
    (folder / "empty.png").write_bytes(b"")
    (folder / "notes.jpg").write_text("shopping list\n")
    whole = folder / "whole.png"
    noise = np.random.default_rng(0).integers(0, 255, (300, 300, 3), dtype=np.uint8)
    Image.fromarray(noise).save(whole)
    (folder / "cut.png").write_bytes(whole.read_bytes()[:20000])
    Image.new("1", (8200, 8200), 1).save(folder / "bomb.png")  # 67 Mpx in a few kB
    return {"missing.png": "no such file", "empty.png": "the file is empty",
            "notes.jpg": "not an image Pillow can read", "cut.png": "truncated or corrupt",
            "bomb.png": "pixels exceeds the limit of 64000000 pixels"}


def test_bad_images_exit_2_naming_the_file_before_any_worker_starts(
    page_bundles: Path, tmp_path: Path,
) -> None:
    pipeline = str(page_bundles / PIPELINE)
    for name, reason in _bad_files(tmp_path).items():
        result = _edge("run", pipeline, "--input", str(page_bundles / PAGE), "--input", name,
                       cwd=tmp_path)
        assert result.returncode == 2, (name, result.stderr)
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert result.stderr.startswith(f"edge: input {name}: ImageInputError: {name}: ")
        assert reason in result.stderr
        assert "loading stage" not in result.stderr  # refused before the pipeline opened
        as_json = _edge("run", pipeline, "--input", name, "--json", cwd=tmp_path)
        assert as_json.returncode == 2 and reason in json.loads(as_json.stdout)["error"]


def test_a_folder_with_bad_images_mixed_in_names_each_of_them_before_any_worker_starts(
    page_bundles: Path, tmp_path: Path,
) -> None:
    scans = tmp_path / "scans"
    scans.mkdir()
    demo_page()[0].save(scans / "a.png")
    (scans / "b.png").write_bytes(b"")  # empty
    (scans / "c.jpg").write_text("shopping list\n")  # not an image
    (scans / "notes.txt").write_text("not an image, not read")  # skipped by suffix
    result = _edge("run", str(page_bundles / PIPELINE), "--input", "scans", "--json",
                   cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    body = json.loads(result.stdout)
    assert [(r["file"], r["error"].split(": ")[0]) for r in body["refused"]] == [
        (str(Path("scans") / "b.png"), "ImageInputError"),
        (str(Path("scans") / "c.jpg"), "ImageInputError")]
    assert "the file is empty" in body["refused"][0]["error"]
    assert "not an image Pillow can read" in body["refused"][1]["error"]
    assert body["error"].startswith(f"2 of 3 inputs refused: input {Path('scans') / 'b.png'}: ")
    assert "loading stage" not in result.stderr  # refused before the pipeline opened


def test_edge_run_reads_a_directory_into_one_json_document(
    page_bundles: Path, tmp_path: Path,
) -> None:
    pages = tmp_path / "pages"
    pages.mkdir()
    image, lines = demo_page()
    image.save(pages / "a.png")
    image.rotate(180, expand=True).convert("L").save(pages / "b.jpg", quality=90)
    (pages / "notes.txt").write_text("not an image, not read")
    result = _edge("run", str(page_bundles / PIPELINE), "--input", str(pages), "--json",
                   cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [r["file"] for r in report["results"]] == [str(pages / "a.png"), str(pages / "b.jpg")]
    for entry in report["results"]:
        assert [line["text"] for line in entry["lines"]] == list(lines), entry["file"]
    flipped = report["results"][1]["lines"][0]["box"]
    assert min(x for x, _ in flipped) > image.width / 2  # the first line is bottom right now
    # the shipped pipeline runs the recogniser in REC_REPLICAS workers: the plan lists each
    assert [s["id"] for s in report["plan"]["stages"]] == (
        ["detect", "classify"] + ["recognize"] * REC_REPLICAS)


def test_without_input_the_bundled_example_page_is_read_and_said_so(
    page_bundles: Path, tmp_path: Path,
) -> None:
    result = _edge("run", str(page_bundles / PIPELINE), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert ("input: no --input given, so this read the example inputs bundled with stage "
            "'detect' (examples/page-2.npz)") in result.stdout
    assert "Invoice 2024-0417 total 98.50" in result.stdout  # read at the detection scale


def test_pipeline_auto_falls_back_to_ort_cpu_and_reads_the_same_text(
    page_bundles: Path,
) -> None:
    """Without the qnn plugin the classifier's first candidate is refused at the backend
    layer; ort-cpu serves the padded calls and the text is the plain pipeline's.

    (The qnn candidate on the HTP simulator: plugins/backends/qnn/tests/test_qnn_auto_ocr.py.)
    """
    from edge_ort.derive.build import derive_bundle
    from edge_ort.derive.specs import parse_bucket

    from edge_ocr_example.page_bundle import AUTO_CLASSIFY, AUTO_PIPELINE
    from edge_ocr_example.page_pipeline import BATCH

    if not (page_bundles / AUTO_CLASSIFY).exists():
        derive_bundle(page_bundles / "classify", page_bundles / AUTO_CLASSIFY,
                      [parse_bucket(f"{BATCH}x3x48x192", 0)])
    ledger = ResourceLedger([Pool(name="machine:ram", total=8 * 1024**3)])
    pipeline = Pipeline.open(load_pipeline(page_bundles / AUTO_PIPELINE),
                             load_plugins(env={"EDGE_PLUGINS": "ort-cpu"}), ledger)
    try:
        tried = {s["id"]: [(c["backend"], c["outcome"], c["layer"]) for c in s["candidates"]]
                 for s in pipeline.execution_plan()["stages"]}
        assert tried["classify"] == [("qnn", "refused", "backend"),
                                     ("ort-cpu", "chosen", None)]
        assert tried["detect"] == tried["recognize"] == [("ort-cpu", "chosen", None)]
        _, expected_lines = demo_page()
        got = _read(pipeline, page_bundles / PAGE)
        assert [g["text"] for g in got] == list(expected_lines)
    finally:
        pipeline.close()
    assert ledger.snapshot()["reservations"] == []
