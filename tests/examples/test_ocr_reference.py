"""The real PP-OCR graphs: bundles, the direct onnxruntime reference, the model source.

These run the actual models from the pinned rapidocr-onnxruntime wheel (downloaded into
the cache on first use) on the CPU.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from edge_core.artifacts import verify_bundle
from edge_core.config import InputTransform, load_pipeline, resolve_input_transform
from edge_ocr_example.bucket_examples import BUCKET_DIR, bucket_grid
from edge_ocr_example.buckets import DET_SHAPE, REC_CLASSES, REC_STRIDE
from edge_ocr_example.bundle import build_bundles
from edge_ocr_example.bundle_layout import (
    DESCRIPTION,
    EXAMPLE_INPUTS,
    EXPECTED_OUTPUTS,
    IMAGE,
    MANIFEST,
    PIPELINE,
    graph_path,
    stage_dir,
)
from edge_ocr_example.chain import STAGES
from edge_ocr_example.decode import CHARACTERS_FILE, load_characters
from edge_ocr_example.errors import ModelSourceError, OcrError
from edge_ocr_example.make_image import DEFAULT_LINES, render_lines
from edge_ocr_example.models import GRAPH_SHA256, WHEEL_FILENAME, fetch_wheel, read_graph
from edge_ocr_example.npz import load_npz
from edge_ocr_example.pages import load_font
from edge_ocr_example.reference import DirectRunner, check_bundles, main, recognize
from edge_ocr_example.transforms import classify_to_recognize, detect_to_classify


@pytest.fixture(scope="module")
def runner(ocr_bundles: Path) -> DirectRunner:
    return DirectRunner.from_bundles(ocr_bundles)


@pytest.fixture(scope="module")
def characters(ocr_bundles: Path) -> tuple[str, ...]:
    return load_characters(stage_dir(ocr_bundles, STAGES[-1]) / CHARACTERS_FILE)


def test_reference_reads_the_rendered_page_exactly(
    runner: DirectRunner, characters: tuple[str, ...]
) -> None:
    lines, trace = recognize(runner, render_lines(), characters)
    assert [line.text for line in lines] == list(DEFAULT_LINES)  # edit distance 0
    assert all(line.score > 0.9 for line in lines)
    tops = [float(line.box[0, 1]) for line in lines]
    assert tops == sorted(tops)
    assert trace.final["carry:angle"].tolist() == [0] * len(trace.final["carry:angle"])


def test_reference_reads_an_upside_down_page_through_the_classifier(
    runner: DirectRunner, characters: tuple[str, ...]
) -> None:
    lines, trace = recognize(runner, np.ascontiguousarray(render_lines()[::-1, ::-1]), characters)
    assert [line.text for line in lines] == list(reversed(DEFAULT_LINES))
    count = int(trace.final["carry:count"][0])
    assert trace.final["carry:angle"][:count].tolist() == [180] * count


def test_reference_reads_a_large_letterboxed_page(
    runner: DirectRunner, characters: tuple[str, ...]
) -> None:
    page = np.pad(render_lines(), ((0, 200), (0, 600), (0, 0)), constant_values=255)
    lines, _ = recognize(runner, page, characters)
    # Scaled by 0.52, the invoice line is 23 px high and its crop is 537 px wide at the
    # recogniser's height; padded to the 640 bucket the recogniser loses the narrow gap
    # before "98.50" (measured: padded to 544 it reads it, 560 to 960 do not). Every
    # character is read; spaces are compared apart.
    assert ["".join(line.text.split()) for line in lines] == [
        "".join(text.split()) for text in DEFAULT_LINES]
    assert [line.text for line in lines][::2] == list(DEFAULT_LINES)[::2]


def test_reference_reads_turned_small_print_its_classifier_calls_upright(
    runner: DirectRunner, characters: tuple[str, ...]
) -> None:
    # benchmarks/ocr_small_print.py's image small010 of seed 5 (10 px), turned by 180
    # degrees: the classifier's squeezed row calls the first line upright (180 degrees at
    # about 0.24), which was read upside down ('5'); it is small print, so it is also read
    # the other way (directions.line_direction) and the recogniser's surer reading is kept
    font = load_font("DejaVuSerif-Bold.ttf", 10)
    page = Image.new("RGB", (236, 63), "white")
    draw = ImageDraw.Draw(page)
    for top, text in ((4, "quantity section 944 6530 7073"),
                      (21, "table quantity 3861 customer brown")):
        draw.text((6, top), text, font=font, fill=(20, 20, 20))
    lines, trace = recognize(runner, np.asarray(page.rotate(180)), characters)
    angles = trace.final["carry:angle"].tolist()
    second = trace.final["carry:second"].tolist()
    assert [angles[i] for i in second].count(0) >= 1  # read both ways though called upright
    assert "quantity section 944 6530 7073" in [line.text for line in lines]


def test_bundles_are_complete_at_their_buckets_and_verify(ocr_bundles: Path) -> None:
    assert (ocr_bundles / IMAGE).is_file()
    description = json.loads((ocr_bundles / DESCRIPTION).read_text())
    assert [stage["id"] for stage in description["stages"]] == [s.id for s in STAGES]
    assert description["example_text"] == list(DEFAULT_LINES)
    for stage in STAGES:
        folder = stage_dir(ocr_bundles, stage)
        grid = bucket_grid(stage.id)
        expected_files = {graph_path(ocr_bundles, stage).name, EXAMPLE_INPUTS, EXPECTED_OUTPUTS}
        if stage is STAGES[-1]:
            expected_files.add(CHARACTERS_FILE)
        expected_files.add(BUCKET_DIR)  # every stage serves a shape set
        assert {p.name for p in folder.iterdir()} == expected_files | {MANIFEST}
        with verify_bundle(folder) as verified:
            metadata = verified.manifest.metadata
            assert metadata.graph == graph_path(ocr_bundles, stage).name
            assert metadata.example_inputs == EXAMPLE_INPUTS
            assert metadata.validation is not None
            assert metadata.validation["expected_outputs"] == EXPECTED_OUTPUTS
            shapes = verified.shapes
            assert shapes is not None
            inputs = load_npz(folder / EXAMPLE_INPUTS)
            shapes.match({k: ("float32", v.shape) for k, v in inputs.items()})
            if not grid:  # detection: a range gated at its minimum, the page, its maximum
                assert inputs["x"].shape == DET_SHAPE
                assert [(c.entry, c.point, c.specs["x"][1][2:]) for c in
                        verified.warmup_cases] == [("page", "min", (320, 320)),
                                                   ("page", "between", (640, 640)),
                                                   ("page", "max", (960, 960))]
                assert all(c.expected_outputs for c in verified.warmup_cases)
                continue
            assert [(e.inputs["x"].dims[0], e.inputs["x"].dims[3]) for e in shapes.entries] == [
                (b, w) for b, _, w in grid]
            for case in verified.warmup_cases:
                x = load_npz(verified.path(case.example_inputs))["x"]
                batch, width = x.shape[0], x.shape[3]
                assert case.entry == f"b{batch}_w{width}" and case.point == "static"
                if case.expected_outputs is None:
                    assert stage.id == "recognize" and batch > 1
                    continue
                (out,) = load_npz(verified.path(case.expected_outputs)).values()
                wanted = ((batch, 2) if stage.id == "classify"
                          else (batch, width // REC_STRIDE, REC_CLASSES))
                assert out.shape == wanted
        assert graph_path(ocr_bundles, stage).read_bytes() == read_graph(stage.graph_member)


def test_pipeline_file_names_the_bundles_and_transforms(ocr_bundles: Path) -> None:
    config = load_pipeline(ocr_bundles / PIPELINE)
    assert [stage.id for stage in config.stages] == [s.id for s in STAGES]
    for stage in config.stages:
        assert stage.manifest == ocr_bundles / stage.id / MANIFEST
        assert stage.backend.name == "ort-cpu"
    transforms = [
        resolve_input_transform(s.input_transform) for s in config.stages[1:] if s.input_transform
    ]
    assert transforms == [detect_to_classify, classify_to_recognize]


def test_transforms_are_registered_as_named_adapters() -> None:
    assert resolve_input_transform(InputTransform("ocr_detect_to_classify")) is detect_to_classify
    assert (
        resolve_input_transform(InputTransform("ocr_classify_to_recognize"))
        is classify_to_recognize
    )


def test_expected_outputs_equal_a_fresh_direct_run_bit_for_bit(
    runner: DirectRunner, ocr_bundles: Path
) -> None:
    assert check_bundles(runner, ocr_bundles) == []


def test_rebuilding_gives_byte_identical_bundles(
    ocr_bundles: Path, ocr_wheel: Path, tmp_path: Path
) -> None:
    again = build_bundles(tmp_path / "again", wheel=ocr_wheel, write_manifest=None).root
    for stage in STAGES:
        folder = stage_dir(ocr_bundles, stage)
        buckets = sorted(f"{BUCKET_DIR}/{p.name}" for p in (folder / BUCKET_DIR).glob("*.npz"))
        names = [EXAMPLE_INPUTS, EXPECTED_OUTPUTS, *buckets]
        for name in names:
            first = (folder / name).read_bytes()
            assert first == (stage_dir(again, stage) / name).read_bytes(), (stage.id, name)
        assert not (stage_dir(again, stage) / MANIFEST).exists()


def test_builder_refuses_a_foreign_non_empty_directory(ocr_wheel: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OcrError, match=r"^out: non-empty directory without bundle.json"):
        build_bundles(tmp_path, wheel=ocr_wheel)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_reference_command_prints_the_text_and_checks_parity(
    ocr_bundles: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(ocr_bundles), "--image", str(ocr_bundles / IMAGE), "--check"]) == 0
    assert capsys.readouterr().out.splitlines() == list(DEFAULT_LINES)


def test_a_wheel_with_a_tampered_graph_is_refused(ocr_wheel: Path, tmp_path: Path) -> None:
    member = STAGES[1].graph_member
    tampered = tmp_path / WHEEL_FILENAME
    with zipfile.ZipFile(ocr_wheel) as source, zipfile.ZipFile(tampered, "w") as target:
        data = bytearray(source.read(member))
        data[-1] ^= 0xFF
        target.writestr(member, bytes(data))
    with pytest.raises(ModelSourceError, match=rf"sha256 is not {GRAPH_SHA256[member]}"):
        read_graph(member, wheel=tampered)
    with pytest.raises(ModelSourceError, match=r"cannot read"):
        read_graph(STAGES[0].graph_member, wheel=tampered)


def test_a_corrupt_cached_wheel_is_refused_not_used(tmp_path: Path) -> None:
    (tmp_path / WHEEL_FILENAME).write_bytes(b"not a wheel")
    with pytest.raises(ModelSourceError, match=r"sha256 is not 971d7d5f"):
        fetch_wheel(tmp_path)


def test_an_unknown_graph_member_is_refused() -> None:
    with pytest.raises(ModelSourceError, match=r"^member: not a pinned PP-OCR graph: 'x.onnx'$"):
        read_graph("x.onnx")


def test_an_installed_rapidocr_package_is_read_without_importing_it(
    ocr_wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    package = site / "rapidocr_onnxruntime"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    detect, classify = STAGES[0].graph_member, STAGES[1].graph_member
    with zipfile.ZipFile(ocr_wheel) as wheel:
        (site / detect).write_bytes(wheel.read(detect))
        tampered = bytearray(wheel.read(classify))
        tampered[-1] ^= 0xFF
        (site / classify).write_bytes(bytes(tampered))
    corrupt_cache = tmp_path / "cache"
    corrupt_cache.mkdir()
    (corrupt_cache / WHEEL_FILENAME).write_bytes(b"not a wheel")
    monkeypatch.delenv("EDGE_OCR_WHEEL", raising=False)
    monkeypatch.syspath_prepend(str(site))
    # the intact installed graph is used: the (corrupt) cache is never touched
    assert read_graph(detect, cache_dir=corrupt_cache) == (site / detect).read_bytes()
    # a changed installed graph is not used: the pinned wheel is, here the corrupt cache
    with pytest.raises(ModelSourceError, match=r"sha256 is not 971d7d5f"):
        read_graph(classify, cache_dir=corrupt_cache)
    assert read_graph(classify, cache_dir=ocr_wheel.parent) == read_graph(classify, wheel=ocr_wheel)
