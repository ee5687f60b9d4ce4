"""Transforms, preprocessing and crops produce exactly the bucket shapes, dtypes and pixels."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from edge_ocr_example.buckets import (
    CARRY_PREFIX,
    CLS_INPUT,
    CLS_OUTPUT,
    CLS_SHAPE,
    CROP_BATCH,
    DET_HEIGHT,
    DET_INPUT,
    DET_OUTPUT,
    DET_SHAPE,
    DET_WIDTH,
    REC_HEIGHT,
    REC_INPUT,
    REC_SHAPE,
    REC_WIDTH,
)
from edge_ocr_example.crops import crop_box, fit_crop, resize_bilinear, rotate_half_turn
from edge_ocr_example.errors import TensorMismatch
from edge_ocr_example.npz import load_npz, save_npz
from edge_ocr_example.preprocess import normalize, preprocess, to_image_coordinates
from edge_ocr_example.transforms import classify_to_recognize, detect_to_classify, split_carry


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


def test_detect_to_classify_fills_the_classifier_bucket_and_carries_boxes() -> None:
    result = detect_to_classify(detection(LINES), source_image())
    inputs, carried = split_carry(result)
    assert list(inputs) == [CLS_INPUT]
    assert inputs[CLS_INPUT].shape == CLS_SHAPE and inputs[CLS_INPUT].dtype == np.float32
    assert inputs[CLS_INPUT].flags.c_contiguous
    assert carried[CARRY_PREFIX + "count"].tolist() == [3]
    assert carried[CARRY_PREFIX + "detected"].tolist() == [3]
    boxes = carried[CARRY_PREFIX + "boxes"]
    assert boxes.shape == (CROP_BATCH, 4, 2) and boxes.dtype == np.float32
    assert not boxes[3:].any() and not inputs[CLS_INPUT][3:].any()  # blank padding
    image = source_image()[DET_INPUT][0]
    for index in range(3):
        expected = fit_crop(crop_box(image, boxes[index]), CLS_SHAPE[2], CLS_SHAPE[3])
        np.testing.assert_array_equal(inputs[CLS_INPUT][index], expected)


def test_detect_to_classify_truncates_to_the_batch_and_reports_all_found() -> None:
    many = [(40, 20 + 60 * i, 300, 40 + 60 * i) for i in range(CROP_BATCH + 2)]
    carried = split_carry(detect_to_classify(detection(many), source_image()))[1]
    assert carried[CARRY_PREFIX + "count"].tolist() == [CROP_BATCH]
    assert carried[CARRY_PREFIX + "detected"].tolist() == [CROP_BATCH + 2]
    tops = carried[CARRY_PREFIX + "boxes"][:, 0, 1]
    assert (np.diff(tops) > 0).all()  # the first CROP_BATCH lines, in reading order


def test_detect_to_classify_with_no_text_gives_an_all_blank_batch() -> None:
    inputs, carried = split_carry(detect_to_classify(detection([]), source_image()))
    assert inputs[CLS_INPUT].shape == CLS_SHAPE and not inputs[CLS_INPUT].any()
    assert carried[CARRY_PREFIX + "count"].tolist() == [0]


def classified(up: list[float]) -> dict[str, np.ndarray]:
    previous = detect_to_classify(detection(LINES), source_image())
    probs = np.zeros((CROP_BATCH, 2), dtype=np.float32)
    probs[: len(up), 0] = up
    probs[: len(up), 1] = 1.0 - np.asarray(up, dtype=np.float32)
    return {CLS_OUTPUT: probs, **split_carry(previous)[1]}


def test_classify_to_recognize_turns_only_confident_upside_down_crops() -> None:
    # crop 0 upright; crop 1 180 degrees at 0.95 (turned); crop 2 180 at 0.6 (not turned)
    result = classify_to_recognize(classified([0.99, 0.05, 0.4]), source_image())
    inputs, carried = split_carry(result)
    assert list(inputs) == [REC_INPUT]
    batch = inputs[REC_INPUT]
    assert batch.shape == REC_SHAPE and batch.dtype == np.float32
    assert carried[CARRY_PREFIX + "angle"].tolist() == [0, 180, 0] + [0] * (CROP_BATCH - 3)
    assert carried[CARRY_PREFIX + "angle"].dtype == np.int64
    image = source_image()[DET_INPUT][0]
    boxes = carried[CARRY_PREFIX + "boxes"]
    for index, turned in enumerate([False, True, False]):
        crop = crop_box(image, boxes[index])
        crop = rotate_half_turn(crop) if turned else crop
        np.testing.assert_array_equal(batch[index], fit_crop(crop, REC_HEIGHT, REC_WIDTH))
    assert not batch[3:].any()


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
    previous = classified([0.9])
    previous[CARRY_PREFIX + "count"] = np.array([CROP_BATCH + 1], dtype=np.int64)
    with pytest.raises(TensorMismatch, match=r"^previous\['carry:count'\]: must be in 0\.\.4: "):
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
