"""Transforms, preprocessing and crops produce exactly the bucket shapes, dtypes and pixels."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from edge_core.fanout import Fanout
from edge_ocr_example.buckets import (
    CARRY_PREFIX,
    CLS_HEIGHT,
    CLS_INPUT,
    CLS_OUTPUT,
    CLS_WIDTH,
    DET_HEIGHT,
    DET_INPUT,
    DET_OUTPUT,
    DET_SHAPE,
    DET_WIDTH,
    REC_HEIGHT,
    REC_INPUT,
)
from edge_ocr_example.chunks import batch_plan, chunk_crops, scatter, width_bucket
from edge_ocr_example.crops import crop_box, fit_crop, resize_bilinear, rotate_half_turn
from edge_ocr_example.errors import OcrError, TensorMismatch
from edge_ocr_example.npz import load_npz, save_npz
from edge_ocr_example.preprocess import normalize, preprocess, to_image_coordinates
from edge_ocr_example.transforms import (
    REC_CALL_BATCHES_ENV,
    classify_to_recognize,
    detect_to_classify,
    split_carry,
)


def source_image() -> dict[str, np.ndarray]:
    """A detection input whose pixels differ everywhere (a smooth 3-channel pattern)."""
    y, x = np.mgrid[0:DET_HEIGHT, 0:DET_WIDTH].astype(np.float32)
    channels = [np.sin(x / 37.0), np.cos(y / 23.0), np.sin((x + y) / 51.0)]
    return {DET_INPUT: np.stack(channels)[None].astype(np.float32)}


def detection(rectangles: list[tuple[int, int, int, int]]) -> dict[str, np.ndarray]:
    prob = np.zeros((1, 1, DET_HEIGHT, DET_WIDTH), dtype=np.float32)
    for x0, y0, x1, y1 in rectangles:
        prob[0, 0, y0:y1, x0:x1] = 0.9
    return {DET_OUTPUT: prob}


LINES = [(40, 30, 300, 50), (40, 100, 420, 118), (40, 170, 200, 190)]


def rows_of(fan: Fanout, name: str) -> dict[int, np.ndarray]:
    """Crop index -> its row, over every item of a fan-out (blank rows checked blank)."""
    found: dict[int, np.ndarray] = {}
    for item in fan.items:
        inputs, carried = split_carry(item)
        assert list(inputs) == [name]
        batch = inputs[name]
        assert batch.dtype == np.float32 and batch.flags.c_contiguous
        for row, crop in enumerate(carried[CARRY_PREFIX + "index"].tolist()):
            if crop < 0:
                assert not batch[row].any()  # blank padding
            else:
                found[crop] = batch[row]
    return found


def test_detect_to_classify_maps_every_crop_and_carries_boxes() -> None:
    fan = detect_to_classify(detection(LINES), source_image())
    assert isinstance(fan, Fanout)
    assert [split_carry(i)[0][CLS_INPUT].shape for i in fan.items] == [(4, 3, 48, 192)]
    assert fan.carry[CARRY_PREFIX + "count"].tolist() == [3]
    assert fan.carry[CARRY_PREFIX + "detected"].tolist() == [3]
    boxes = fan.carry[CARRY_PREFIX + "boxes"]
    assert boxes.shape == (3, 4, 2) and boxes.dtype == np.float32
    image = source_image()[DET_INPUT][0]
    rows = rows_of(fan, CLS_INPUT)
    assert sorted(rows) == [0, 1, 2]
    for index in range(3):
        expected = fit_crop(crop_box(image, boxes[index]), CLS_HEIGHT, CLS_WIDTH)
        np.testing.assert_array_equal(rows[index], expected)


def test_detect_to_classify_keeps_every_line_of_a_long_page() -> None:
    many = [(40, 8 + 30 * i, 300, 22 + 30 * i) for i in range(21)]
    fan = detect_to_classify(detection(many), source_image())
    assert fan.carry[CARRY_PREFIX + "count"].tolist() == [21]
    assert [split_carry(i)[0][CLS_INPUT].shape[0] for i in fan.items] == [16, 8]
    assert sorted(rows_of(fan, CLS_INPUT)) == list(range(21))  # nothing dropped
    tops = fan.carry[CARRY_PREFIX + "boxes"][:, 0, 1]
    assert (np.diff(tops) > 0).all()  # reading order


def test_detect_to_classify_with_no_text_makes_no_call() -> None:
    fan = detect_to_classify(detection([]), source_image())
    assert fan.items == ()
    assert fan.carry[CARRY_PREFIX + "count"].tolist() == [0]
    nothing = classify_to_recognize(dict(fan.carry), source_image())
    assert nothing.items == () and nothing.carry[CARRY_PREFIX + "angle"].shape == (0,)


def classified(up: list[float],
               lines: list[tuple[int, int, int, int]] = LINES) -> dict[str, object]:
    """What the runtime gathers from the classifier: lists of chunk outputs and indices."""
    fan = detect_to_classify(detection(lines), source_image())
    outputs, indices = [], []
    for item in fan.items:
        index = item[CARRY_PREFIX + "index"]
        probs = np.zeros((index.shape[0], 2), dtype=np.float32)
        for row, crop in enumerate(index.tolist()):
            if crop >= 0:
                probs[row] = [up[crop], 1.0 - up[crop]]
        outputs.append(probs)
        indices.append(index)
    return {CLS_OUTPUT: outputs, CARRY_PREFIX + "index": indices, **fan.carry}


def test_classify_to_recognize_turns_only_confident_upside_down_crops() -> None:
    # crop 0 upright; crop 1 180 degrees at 0.95 (turned); crop 2 180 at 0.6 (not turned)
    fan = classify_to_recognize(classified([0.99, 0.05, 0.4]), source_image())
    assert fan.carry[CARRY_PREFIX + "angle"].tolist() == [0, 180, 0]
    assert fan.carry[CARRY_PREFIX + "angle"].dtype == np.int64
    image = source_image()[DET_INPUT][0]
    boxes = fan.carry[CARRY_PREFIX + "boxes"]
    rows = rows_of(fan, REC_INPUT)
    assert sorted(rows) == [0, 1, 2]
    for index, turned in enumerate([False, True, False]):
        crop = crop_box(image, boxes[index])
        crop = rotate_half_turn(crop) if turned else crop
        width = rows[index].shape[2]
        assert width == width_bucket(int(np.ceil(48 * crop.shape[2] / crop.shape[1])),
                                     (320, 640, 960, 1280))
        np.testing.assert_array_equal(rows[index], fit_crop(crop, REC_HEIGHT, width))


SMALL = [(40, 250, 200, 258), (40, 300, 200, 304)]
"""Two lines of small print below :data:`LINES`: their crops are 23 and 13 px high."""


def test_small_crops_the_classifier_may_have_misjudged_are_also_read_the_other_way() -> None:
    # crops 0-2 are tall (read once whatever the classifier says); crop 3 (23 px) leans
    # upright (180 degrees at 0.3); crop 4 (13 px) is surely upright, but too small to trust
    fan = classify_to_recognize(classified([0.99, 0.05, 0.4, 0.7, 0.999], LINES + SMALL),
                                source_image())
    assert fan.carry[CARRY_PREFIX + "angle"].tolist() == [0, 180, 0, 0, 0]
    assert fan.carry[CARRY_PREFIX + "second"].tolist() == [3, 4]
    assert fan.carry[CARRY_PREFIX + "second"].dtype == np.int64
    image = source_image()[DET_INPUT][0]
    boxes = fan.carry[CARRY_PREFIX + "boxes"]
    assert [crop_box(image, box).shape[1] for box in boxes[3:]] == [23, 13]
    rows = rows_of(fan, REC_INPUT)
    assert sorted(rows) == list(range(7))  # the five crops, then the two turned
    for extra, index in enumerate([3, 4]):
        for row, crop in ((rows[index], crop_box(image, boxes[index])),
                          (rows[5 + extra], rotate_half_turn(crop_box(image, boxes[index])))):
            np.testing.assert_array_equal(row, fit_crop(crop, REC_HEIGHT, row.shape[2]))
    sure = classify_to_recognize(classified([0.99, 0.05, 0.4, 0.99, 0.999], LINES + SMALL),
                                 source_image())
    assert sure.carry[CARRY_PREFIX + "second"].tolist() == [4]  # crop 3 surely upright now
    assert sorted(rows_of(sure, REC_INPUT)) == list(range(6))


def test_recognition_calls_carry_one_crop_unless_the_environment_names_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(REC_CALL_BATCHES_ENV, raising=False)
    gathered = classified([0.99] * 3)
    single = classify_to_recognize(gathered, source_image())
    assert [item[REC_INPUT].shape[0] for item in single.items] == [1, 1, 1]
    monkeypatch.setenv(REC_CALL_BATCHES_ENV, "1,4,8")
    batched = classify_to_recognize(gathered, source_image())
    widths = {rows.shape[2] for rows in rows_of(single, REC_INPUT).values()}
    assert len(batched.items) == len(widths)  # one call per width bucket now
    assert sorted(rows_of(batched, REC_INPUT)) == sorted(rows_of(single, REC_INPUT))
    for wrong in ("2", "1,x", ","):
        monkeypatch.setenv(REC_CALL_BATCHES_ENV, wrong)
        with pytest.raises(OcrError) as info:
            classify_to_recognize(gathered, source_image())
        assert info.value.field == REC_CALL_BATCHES_ENV


def test_chunks_fill_the_largest_batch_then_the_smallest_that_holds_the_rest() -> None:
    assert batch_plan(37, (1, 4, 8, 16)) == [16, 16, 8]
    assert batch_plan(1, (1, 4, 8)) == [1]
    assert batch_plan(6, (1, 4, 8)) == [8]
    assert batch_plan(0, (1, 4, 8)) == []
    crops = [np.ones((3, 48, w), np.float32) for w in (100, 700, 300, 2000, 650)]
    chunks = chunk_crops(crops, height=48, widths=(320, 640, 960, 1280), batches=(1, 4))
    assert [(b.shape[0], b.shape[3], i.tolist()) for b, i in chunks] == [
        (4, 320, [0, 2, -1, -1]), (4, 960, [1, 4, -1, -1]), (1, 1280, [3])]
    back = scatter([b[:, 0, 0, :1] for b, _ in chunks], [i for _, i in chunks], 5)
    assert len(back) == 5
    with pytest.raises(TensorMismatch, match=r"every crop needs its row"):
        scatter([b[:, 0, 0, :1] for b, _ in chunks[:2]], [i for _, i in chunks[:2]], 5)


def test_transforms_refuse_tensors_off_the_bucket() -> None:
    wrong = {DET_OUTPUT: np.zeros((1, 1, 320, 320), dtype=np.float32)}
    with pytest.raises(
        TensorMismatch,
        match=r"^previous\['sigmoid_0.tmp_0'\]: expected float32\[1, 1, 640, 640\]: "
        r"'float32\[1, 1, 320, 320\]'$",
    ):
        detect_to_classify(wrong, source_image())
    with pytest.raises(TensorMismatch, match=r"^source\['x'\]: tensor missing: \[\]$"):
        detect_to_classify(detection(LINES), {})
    previous = classified([0.9, 0.9, 0.9])
    previous[CARRY_PREFIX + "count"] = np.array([4], dtype=np.int64)
    with pytest.raises(TensorMismatch, match=r"^previous\['carry:boxes'\]: expected "):
        classify_to_recognize(previous, source_image())
    previous = classified([0.9, 0.9, 0.9])
    previous[CLS_OUTPUT] = previous[CLS_OUTPUT][0]  # an array where a gathered list belongs
    with pytest.raises(TensorMismatch, match=r"expected the list a fan-out gathers"):
        classify_to_recognize(previous, source_image())


def test_preprocess_of_a_bucket_sized_image_is_exact_normalisation() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (DET_HEIGHT, DET_WIDTH, 3), dtype=np.uint8)
    x = preprocess(image)[DET_INPUT]
    assert x.shape == DET_SHAPE and x.dtype == np.float32
    expected = ((image.astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1)
    np.testing.assert_array_equal(x[0], expected)


def test_preprocess_letterboxes_a_large_image_and_boxes_map_back() -> None:
    image = np.full((1000, 2000, 3), 255, dtype=np.uint8)  # scale 0.32 -> 320 x 640
    x = preprocess(image)[DET_INPUT]
    assert x.shape == DET_SHAPE
    np.testing.assert_array_equal(x[0, :, :320, :], 1.0)  # white
    np.testing.assert_array_equal(x[0, :, 320:, :], 0.0)  # mid-grey padding
    box = np.array([[32.0, 16.0], [64.0, 16.0], [64.0, 32.0], [32.0, 32.0]], dtype=np.float32)
    back = to_image_coordinates(box, 1000, 2000)
    np.testing.assert_allclose(back, box / 0.32, rtol=1e-6)


def test_preprocess_writes_into_a_given_bucket_array() -> None:
    image = np.full((1000, 2000, 3), 255, dtype=np.uint8)
    out = np.full(DET_SHAPE, 7.0, dtype=np.float32)  # stale bytes of an earlier image
    x = preprocess(image, out=out)[DET_INPUT]
    assert x is out
    np.testing.assert_array_equal(x, preprocess(image)[DET_INPUT])
    with pytest.raises(TensorMismatch, match=r"^out: expected a writable float32 bucket"):
        preprocess(image, out=np.zeros(DET_SHAPE, dtype=np.float64))


def test_prepare_fills_the_pipeline_input_buffer_it_is_given(tmp_path: Path) -> None:
    from edge_ort.bundles import write_add_relu_graph
    from PIL import Image

    from edge_core.artifacts import create_manifest
    from edge_core.config import load_pipeline
    from edge_core.config.transforms import call_prepare
    from edge_core.ledger import ResourceLedger
    from edge_core.plugins import load_plugins
    from edge_core.pools import Pool
    from edge_core.runtime import Pipeline
    from edge_ocr_example.pipeline_io import prepare

    path = tmp_path / "white.png"
    Image.fromarray(np.full((40, 60, 3), 255, dtype=np.uint8)).save(path)
    bundle = tmp_path / "stage"
    bundle.mkdir()
    write_add_relu_graph(bundle, (2, 3))
    np.savez(bundle / "example.npz", x=np.ones((2, 3), np.float32))
    create_manifest(bundle, example_inputs="example.npz")
    config = load_pipeline({"name": "p", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu"}, "manifest": str(bundle)}]})
    ledger = ResourceLedger([Pool(name="machine:ram", total=8 * 1024**3)])
    with Pipeline.open(config, load_plugins(env={"EDGE_PLUGINS": "ort-cpu"}), ledger) as pipe:
        producer = pipe.stages[0].loaded.client._producer  # type: ignore[attr-defined]
        inputs: dict[str, np.ndarray] = call_prepare(prepare, str(path), pipe)  # type: ignore[assignment]
        assert producer.retained_buffers == 1  # the bucket lives in the pipeline's memory
        np.testing.assert_array_equal(inputs[DET_INPUT], prepare(str(path))[DET_INPUT])
        del inputs
    assert ledger.is_empty()


def test_preprocess_refuses_a_non_rgb_image() -> None:
    with pytest.raises(TensorMismatch, match=r"^image: expected an HxWx3 uint8 RGB array: "):
        preprocess(np.zeros((10, 10), dtype=np.uint8))


def test_normalize_maps_black_and_white_to_minus_one_and_one() -> None:
    pixels = np.array([[[0, 255, 0]]], dtype=np.uint8)
    assert normalize(pixels)[:, 0, 0].tolist() == [-1.0, 1.0, -1.0]


def test_bilinear_resize_keeps_constants_identity_and_interpolates_halfway() -> None:
    image = np.random.default_rng(1).random((3, 7, 9)).astype(np.float32)
    np.testing.assert_array_equal(resize_bilinear(image, 7, 9), image)
    constant = np.full((1, 5, 5), 0.25, dtype=np.float32)
    np.testing.assert_allclose(resize_bilinear(constant, 13, 3), 0.25, rtol=1e-6)
    ramp = np.array([[[0.0, 1.0]]], dtype=np.float32)  # 1 x 1 x 2 -> 1 x 1 x 4
    np.testing.assert_allclose(resize_bilinear(ramp, 1, 4)[0, 0], [0.0, 0.25, 0.75, 1.0])


def test_fit_crop_keeps_aspect_caps_width_and_pads_with_zero() -> None:
    crop = np.ones((3, 24, 40), dtype=np.float32)  # 48 high -> 80 wide
    fitted = fit_crop(crop, 48, 192)
    assert fitted.shape == (3, 48, 192)
    assert fitted[:, :, :80].min() == 1.0 and not fitted[:, :, 80:].any()
    wide = fit_crop(np.ones((3, 10, 500), dtype=np.float32), 48, 192)
    assert wide.min() == 1.0  # squeezed to the full width


def test_crop_box_refuses_a_box_outside_the_image() -> None:
    box = np.array([[700, 10], [720, 10], [720, 30], [700, 30]], dtype=np.float32)
    with pytest.raises(TensorMismatch, match=r"^box: covers no pixel of the image: "):
        crop_box(np.zeros((3, 640, 640), dtype=np.float32), box)


def test_npz_files_are_byte_reproducible_and_load_without_pickle(tmp_path: Path) -> None:
    arrays = {"save_infer_model/scale_0.tmp_1": np.eye(3, dtype=np.float32), "x": np.arange(4)}
    first, second = tmp_path / "a.npz", tmp_path / "b.npz"
    save_npz(first, arrays)
    save_npz(second, dict(reversed(arrays.items())))
    assert (
        hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(second.read_bytes()).digest()
    )
    loaded = load_npz(first)
    assert sorted(loaded) == sorted(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(loaded[name], value)
        assert loaded[name].dtype == value.dtype
