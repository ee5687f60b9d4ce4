"""Page-scale geometry: the detection frame, rotated DB boxes, perspective crops, mapping back."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from edge_ocr_example.errors import OcrError, TensorMismatch
from edge_ocr_example.page_scale import (
    FOLD_GAP,
    FOLD_MAX_SCALE,
    FOLD_OVERLAP,
    MAX_ENLARGE,
    band_windows,
    page_frame,
    page_input,
    to_frame_points,
    to_image_points,
)
from edge_ocr_example.perspective import crop_quad, perspective_coefficients, upright_crop
from edge_ocr_example.quads import (
    convex_hull,
    min_area_rect,
    order_corners,
    point_in_quad_mask,
    quad_size,
    unclip_rect,
)
from edge_ocr_example.regions import component_runs, detect_quads


def _rotated(cx: float, cy: float, w: float, h: float, degrees: float) -> np.ndarray:
    a = math.radians(degrees)
    u, v = np.array([math.cos(a), math.sin(a)]), np.array([-math.sin(a), math.cos(a)])
    c = np.array([cx, cy])
    return np.array([c - w / 2 * u - h / 2 * v, c + w / 2 * u - h / 2 * v,
                     c + w / 2 * u + h / 2 * v, c - w / 2 * u + h / 2 * v])


# --- the detection frame ----------------------------------------------------------------

def test_a_large_page_is_scaled_to_the_limit_and_padded_to_32() -> None:
    frame = page_frame(1500, 2000)
    assert (frame.height, frame.width) == (720, 960)
    assert (frame.padded_height, frame.padded_width) == (736, 960)
    assert frame.scale_x == pytest.approx(0.48) and frame.scale_y == pytest.approx(0.48)


def test_a_small_page_is_enlarged_towards_the_limit_at_most_max_enlarge_times() -> None:
    frame = page_frame(100, 301)  # to the limit: 960 / 301 times
    assert (frame.height, frame.width, frame.padded_height, frame.padded_width) == (
        319, 960, 320, 960)
    frame = page_frame(16, 16)  # the limit is further than MAX_ENLARGE
    assert MAX_ENLARGE == 4
    assert (frame.height, frame.width, frame.padded_height, frame.padded_width) == (
        64, 64, 64, 64)
    assert page_frame(16, 16, limit=32).height == 32  # the limit still caps it
    frame = page_frame(960, 500)  # a page as large as the limit is left as it is
    assert (frame.scale_x, frame.scale_y) == (1.0, 1.0)


def test_the_limit_is_configurable_and_checked() -> None:
    assert page_frame(3000, 1000, limit=1280).height == 1280
    with pytest.raises(OcrError, match="limit: must be at least the multiple 32: 16"):
        page_frame(10, 10, limit=16)
    with pytest.raises(OcrError, match="image: the image has no pixels"):
        page_frame(0, 10)


def test_page_input_normalises_and_pads_with_white() -> None:
    image = np.zeros((50, 70, 3), np.uint8)
    image[:, :, 0] = 255
    tensor, frame = page_input(image)  # enlarged four times: 200 x 280
    assert tensor.shape == (1, 3, 224, 288) and tensor.dtype == np.float32
    assert (frame.height, frame.width) == (200, 280)
    np.testing.assert_array_equal(tensor[0, 0, :200, :280], 1.0)
    np.testing.assert_array_equal(tensor[0, 1, :200, :280], -1.0)
    np.testing.assert_array_equal(tensor[0, :, 200:, :], 1.0)  # padding is white paper
    np.testing.assert_array_equal(tensor[0, :, :, 280:], 1.0)
    with pytest.raises(TensorMismatch, match="HxWx3 uint8"):
        page_input(np.zeros((5, 5), np.uint8))


def test_points_map_back_to_the_original_image_pixels() -> None:
    frame = page_frame(1500, 3000)  # scale 0.32
    block = np.array([[1500.0, 700.0], [2500.0, 700.0], [2500.0, 800.0], [1500.0, 800.0]])
    in_frame = to_frame_points(block, frame)
    np.testing.assert_allclose(in_frame[0], [480.0, 224.0])
    np.testing.assert_allclose(to_image_points(in_frame, frame), block, atol=1e-3)
    # beyond the page: clipped to the image
    np.testing.assert_allclose(to_image_points(np.array([[-5.0, 999.0]]), frame), [[0, 1500]])


def test_a_long_thin_page_is_folded_into_bands_at_full_scale() -> None:
    # a page 3000 px wide, 216 high: scaled to 960 its text would be a third as high;
    # four bands of 216 and their gaps fill the 960 rows exactly, so it is read at 1:1
    frame = page_frame(216, 3000)
    assert (frame.height, frame.width) == (216, 3000)  # not scaled at all
    assert (frame.folds, frame.band, frame.step, frame.gap) == (4, 960, 960 - FOLD_OVERLAP,
                                                                 FOLD_GAP)
    assert (frame.padded_height, frame.padded_width) == (960, 960)
    windows = band_windows(frame)
    assert [(w.row, w.column, w.height, w.width) for w in windows] == [
        (k * (216 + FOLD_GAP), 0, 216, 960) for k in range(4)]
    starts = [w.x for w in windows]
    assert starts == [0, 896, 1792, 3000 - 960]  # the last ends at the page's end
    assert all(b - a <= 960 - FOLD_OVERLAP for a, b in itertools.pairwise(starts))


def test_a_line_as_wide_as_a_screen_is_folded_and_enlarged_as_far_as_the_bands_fit() -> None:
    # one line of 24 px text 4972 px wide: scaled to 960 it would be 5 px high
    frame = page_frame(52, 4972)
    assert frame.scale_y == pytest.approx(1.5) and frame.scale_x == pytest.approx(1.5, abs=0.01)
    assert (frame.folds, frame.padded_height, frame.padded_width) == (9, 960, 960)
    windows = band_windows(frame)
    assert [(w.row, w.height, w.width) for w in windows] == [
        (k * (78 + FOLD_GAP), 78, 960) for k in range(9)]
    assert windows[-1].x + 960 == frame.width  # the last band ends at the page's end


@pytest.mark.parametrize(("height", "width", "scale", "folds"), [
    (120, 1400, 1.96, 3),  # one short line of small print on a wide strip
    (40, 900, FOLD_MAX_SCALE, 2),  # a line of text alone: at most FOLD_MAX_SCALE
    (68, 5000, 1.35, 8),
])
def test_a_thin_page_folding_enlarges_is_folded_at_most_fold_max_scale(
        height: int, width: int, scale: float, folds: int) -> None:
    frame = page_frame(height, width)
    assert frame.folds == folds
    assert frame.scale_y == pytest.approx(scale, abs=0.01)
    assert frame.scale_x <= FOLD_MAX_SCALE and frame.scale_y <= FOLD_MAX_SCALE
    assert frame.padded_height <= 960 and frame.padded_width <= 960


def test_a_tall_thin_page_is_folded_side_by_side_and_scaled_as_far_as_it_fits() -> None:
    frame = page_frame(2632, 300)  # a till receipt
    assert frame.folds == 3 and frame.scale_y == pytest.approx(frame.scale_x, abs=0.01)
    assert frame.scale_y > 2 * 960 / 2632  # over twice the plain scale
    windows = band_windows(frame)
    assert [(w.row, w.column, w.height, w.width, w.x) for w in windows] == [
        (0, k * (frame.width + FOLD_GAP), 960, frame.width, 0) for k in range(3)]
    assert windows[-1].y + 960 == frame.height
    assert frame.padded_width <= 960 and frame.padded_height == 960


@pytest.mark.parametrize(("height", "width"), [(848, 1492), (1400, 3000), (500, 1400),
                                               (245, 68), (16, 16), (8000, 8000)])
def test_a_page_folding_would_not_enlarge_enough_is_not_folded(height: int, width: int) -> None:
    frame = page_frame(height, width)
    assert frame.folds == 1
    assert band_windows(frame) == [band_windows(frame)[0]]
    window = band_windows(frame)[0]
    assert (window.row, window.column, window.height, window.width) == (
        0, 0, frame.height, frame.width)


def test_page_input_lays_each_band_of_a_folded_page_out_with_white_between() -> None:
    rng = np.random.default_rng(4)
    image = rng.integers(0, 255, (216, 3000, 3), dtype=np.uint8)
    tensor, frame = page_input(image)  # folded at 1:1 (see above)
    assert frame.folds == 4 and (frame.height, frame.width) == (216, 3000)
    page = image.astype(np.float32).transpose(2, 0, 1) * np.float32(2 / 255) - 1
    covered = np.zeros(tensor.shape[2:], bool)
    for w in band_windows(frame):
        np.testing.assert_array_equal(
            tensor[0, :, w.row : w.row + w.height, w.column : w.column + w.width],
            page[:, w.y : w.y + w.height, w.x : w.x + w.width])
        covered[w.row : w.row + w.height, w.column : w.column + w.width] = True
    np.testing.assert_array_equal(tensor[0][:, ~covered], 1.0)  # the rest is white paper
    assert frame.as_array().tolist() == [216, 3000, 216, 3000, *tensor.shape[2:], 4, 960, 896,
                                         FOLD_GAP]


# --- quadrilaterals ---------------------------------------------------------------------

def test_convex_hull_drops_inner_and_collinear_points() -> None:
    points = np.array([[0, 0], [2, 0], [4, 0], [4, 3], [0, 3], [2, 1], [1, 2]], float)
    hull = convex_hull(points)
    assert sorted(map(tuple, hull.tolist())) == [(0, 0), (0, 3), (4, 0), (4, 3)]


def test_convex_hull_equals_the_chain_over_numpys_unique_points() -> None:
    # the hull sorts and de-duplicates its points faster than np.unique(axis=0): same hull
    rng = np.random.default_rng(4)
    clouds = [rng.integers(-40, 40, size=(int(rng.integers(3, 300)), 2)).astype(float)
              for _ in range(200)]
    clouds += [rng.normal(size=(50, 2)) * 10 for _ in range(50)]
    clouds.append(np.array([[0.0, 1.0], [-0.0, 1.0], [2.0, 0.0], [1.0, 3.0], [0.0, 1.0]]))
    for points in clouds:
        unique = np.unique(points, axis=0)
        expected = unique if len(unique) <= 2 else _chain_reference(unique)
        np.testing.assert_array_equal(convex_hull(points), expected)
    with_nan = np.array([[0.0, 0.0], [1.0, np.nan], [2.0, 0.0], [1.0, 2.0]])
    assert convex_hull(with_nan).shape[1] == 2  # np.unique's path, as before


def _chain_reference(unique: np.ndarray) -> np.ndarray:
    """Andrew's monotone chain, written out again, over points sorted by x then y."""
    def chain(points: list[list[float]]) -> list[list[float]]:
        hull: list[list[float]] = []
        for p in points:
            while len(hull) >= 2 and ((hull[-1][0] - hull[-2][0]) * (p[1] - hull[-2][1])
                                      - (hull[-1][1] - hull[-2][1]) * (p[0] - hull[-2][0])
                                      <= 1e-9):
                hull.pop()
            hull.append(p)
        return hull

    rows = unique.tolist()
    return np.asarray(chain(rows)[:-1] + chain(rows[::-1])[:-1])


@pytest.mark.parametrize("degrees", [0.0, 7.0, -10.0, 33.0, 90.0])
def test_min_area_rect_recovers_a_rotated_rectangle(degrees: float) -> None:
    rect = _rotated(100, 80, 60, 12, degrees)
    rng = np.random.default_rng(1)
    inside = rect[0] + rng.random((200, 1)) * (rect[1] - rect[0]) + \
        rng.random((200, 1)) * (rect[3] - rect[0])
    found = min_area_rect(np.concatenate([rect, inside]))
    width, height = quad_size(found)
    assert sorted([width, height]) == pytest.approx([12, 60], abs=1e-6)
    np.testing.assert_allclose(found.mean(axis=0), [100, 80], atol=1e-6)
    np.testing.assert_allclose(found, order_corners(found))


def test_corners_are_ordered_left_side_first_top_first() -> None:
    shuffled = np.array([[10, 5], [0, 6], [1, 0], [11, 11]], float)
    np.testing.assert_array_equal(order_corners(shuffled), [[1, 0], [10, 5], [11, 11], [0, 6]])


def test_unclip_grows_every_side_by_area_ratio_over_perimeter() -> None:
    grown = unclip_rect(_rotated(50, 50, 40, 10, 20.0), 1.6)
    d = 40 * 10 * 1.6 / 100
    assert quad_size(grown) == pytest.approx((40 + 2 * d, 10 + 2 * d))
    np.testing.assert_allclose(grown.mean(axis=0), [50, 50], atol=1e-9)


def test_point_in_quad_mask_counts_pixel_centres() -> None:
    square = np.array([[2, 2], [6, 2], [6, 5], [2, 5]], float)
    mask = point_in_quad_mask(square, 0, 0, 8, 8)
    assert mask.sum() == 12 and mask[2:5, 2:6].all()


# --- DB post-processing -----------------------------------------------------------------

def test_components_are_8_connected_runs_largest_first() -> None:
    mask = np.zeros((6, 8), bool)
    mask[0, 0:2] = True
    mask[1, 2] = True  # diagonal neighbour joins
    mask[4:6, 5:8] = True
    groups = component_runs(mask)
    assert [int((g[:, 2] - g[:, 1]).sum()) for g in groups] == [6, 3]
    assert groups[1].tolist() == [[0, 0, 2], [1, 2, 3]]


def _paint(quad: np.ndarray, shape: tuple[int, int], value: float = 0.9) -> np.ndarray:
    prob = np.zeros(shape, np.float32)
    prob[point_in_quad_mask(quad, 0, 0, shape[1], shape[0])] = value
    return prob


@pytest.mark.parametrize("degrees", [0.0, 6.0, -9.0])
def test_a_rotated_region_becomes_a_rotated_unclipped_box(degrees: float) -> None:
    shrunk = _rotated(120, 60, 160, 10, degrees)
    quads, scores = detect_quads(_paint(shrunk, (128, 256)))
    # the score averages the component's own pixels: the 2x2 dilation adds a ring below
    # the threshold (0.9 * 1600 / (161 * 11) = 0.81 when upright)
    assert len(quads) == 1 and 0.65 < scores[0] < 0.83
    quad = quads[0]
    top = quad[1] - quad[0]
    assert math.degrees(math.atan2(top[1], top[0])) == pytest.approx(degrees, abs=1.0)
    w, h = quad_size(quad)
    d = 160 * 10 * 1.6 / 340  # the unclip distance for the painted size
    slack = 2.5 if degrees == 0 else 6.0  # pixel staircases widen a rotated outline
    assert w == pytest.approx(160 + 2 * d, abs=slack)
    assert h == pytest.approx(10 + 2 * d, abs=slack)


def test_a_line_of_words_joined_by_thin_bridges_is_kept() -> None:
    prob = np.zeros((64, 400), np.float32)
    for x in range(10, 390):
        rows = slice(20, 32) if (x // 40) % 2 == 0 else slice(25, 26)  # words, then gaps
        prob[rows, x] = 0.9
    quads, scores = detect_quads(prob)
    assert len(quads) == 1 and scores[0] > 0.6
    # the rectangle's mean (PP-OCR's "fast" score) would have dropped it
    rect = np.array([[10, 20], [390, 20], [390, 32], [10, 32]], float)
    assert prob[point_in_quad_mask(rect, 0, 0, 400, 64)].mean() < 0.5


def test_weak_thin_and_empty_regions_give_no_box() -> None:
    assert detect_quads(np.zeros((32, 32), np.float32))[0].shape == (0, 4, 2)
    weak = _paint(_rotated(16, 16, 20, 8, 0), (32, 32), value=0.4)  # above 0.3, below 0.5
    assert len(detect_quads(weak)[0]) == 0
    thin = np.zeros((32, 32), np.float32)
    thin[10, 2:30] = 0.9  # a 1-pixel line (2 px after dilation) is below min_size
    assert len(detect_quads(thin)[0]) == 0
    with pytest.raises(TensorMismatch):
        detect_quads(np.zeros((2, 2, 2), np.float32))


# --- perspective crop -------------------------------------------------------------------

def test_perspective_coefficients_map_target_corners_to_source_corners() -> None:
    src = np.array([[10, 5], [50, 9], [48, 30], [8, 25]], float)
    dst = np.array([[0, 0], [40, 0], [40, 20], [0, 20]], float)
    a, b, c, d, e, f, g, h = perspective_coefficients(src, dst)
    for (x, y), (u, v) in zip(dst, src, strict=True):
        w = g * x + h * y + 1
        assert (a * x + b * y + c) / w == pytest.approx(u)
        assert (d * x + e * y + f) / w == pytest.approx(v)
    with pytest.raises(TensorMismatch, match="degenerate"):
        perspective_coefficients(np.zeros((4, 2)), dst)


def test_a_rotated_block_is_cut_out_straight() -> None:
    image = np.full((200, 300, 3), 255, np.uint8)
    quad = _rotated(150, 100, 120, 30, 10.0)
    inside = point_in_quad_mask(_rotated(150, 100, 100, 20, 10.0), 0, 0, 300, 200)
    image[inside] = 0
    crop = crop_quad(image, order_corners(quad))
    assert crop.shape[:2] == (30, 120)
    core = crop[8:22, 12:108]
    assert core.max() < 60  # the inner block is solid ink all along the straightened crop
    assert crop[:3].min() > 180 and crop[-3:].min() > 180  # white margins above and below


def test_a_box_past_the_page_edge_repeats_edge_pixels_not_black() -> None:
    image = np.full((40, 40, 3), 200, np.uint8)
    crop = crop_quad(image, np.array([[-10, -10], [50, -10], [50, 20], [-10, 20]], float))
    assert crop.shape == (30, 60, 3) and crop.min() >= 190


def test_tall_crops_turn_a_quarter_counter_clockwise() -> None:
    tall = np.zeros((30, 20, 3), np.uint8)
    tall[0, -1] = 255  # top-right corner goes to the top-left
    turned, did = upright_crop(tall)
    assert did and turned.shape == (20, 30, 3) and turned[0, 0, 0] == 255
    square, did = upright_crop(np.zeros((29, 20, 3), np.uint8))
    assert not did and square.shape == (29, 20, 3)
