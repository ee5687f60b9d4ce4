"""DB box extraction on synthetic probability maps: masks, components, unclip, order."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from edge_ocr_example.boxes import (
    Component,
    binarize,
    extract_boxes,
    label_components,
    reading_order,
    rectangle_corners,
    unclip,
)
from edge_ocr_example.errors import TensorMismatch


def flood_fill_components(mask: np.ndarray) -> set[Component]:
    """Independent 8-connected labelling by breadth-first search, pixel by pixel."""
    seen = np.zeros_like(mask, dtype=bool)
    found = set()
    height, width = mask.shape
    for y in range(height):
        for x in range(width):
            if not mask[y, x] or seen[y, x]:
                continue
            queue, pixels = deque([(y, x)]), []
            seen[y, x] = True
            while queue:
                cy, cx = queue.popleft()
                pixels.append((cy, cx))
                for dy in (-1, 0, 1):
                    for dx in (-1, 0, 1):
                        ny, nx = cy + dy, cx + dx
                        inside = 0 <= ny < height and 0 <= nx < width
                        if inside and mask[ny, nx] and not seen[ny, nx]:
                            seen[ny, nx] = True
                            queue.append((ny, nx))
            ys = [p[0] for p in pixels]
            xs = [p[1] for p in pixels]
            found.add(Component(min(xs), min(ys), max(xs) + 1, max(ys) + 1, len(pixels)))
    return found


def test_binarize_dilates_each_pixel_down_and_right() -> None:
    prob = np.zeros((5, 5), dtype=np.float32)
    prob[1, 1] = 0.9
    prob[3, 3] = 0.3  # not above the threshold
    mask = binarize(prob)
    expected = np.zeros((5, 5), dtype=bool)
    expected[1:3, 1:3] = True
    np.testing.assert_array_equal(mask, expected)
    np.testing.assert_array_equal(binarize(prob, dilate=False), prob > 0.3)


def test_components_join_diagonal_neighbours_and_merge_late() -> None:
    mask = np.zeros((6, 8), dtype=bool)
    mask[0, 0] = mask[1, 1] = True  # diagonal: one component
    mask[0, 4] = mask[0, 6] = True  # a U: two arms ...
    mask[1, 4:7] = True  # ... joined by the row below
    mask[4:6, 2:4] = True  # a separate block
    components = set(label_components(mask))
    assert components == {
        Component(0, 0, 2, 2, 2),
        Component(4, 0, 7, 2, 5),
        Component(2, 4, 4, 6, 4),
    }


def test_components_of_an_empty_mask_are_none() -> None:
    assert label_components(np.zeros((4, 4), dtype=bool)) == []


@pytest.mark.parametrize("seed", range(6))
def test_components_equal_a_flood_fill_on_random_masks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    mask = rng.random((40, 50)) < (0.2 + 0.1 * seed)
    components = label_components(mask)
    assert set(components) == flood_fill_components(mask)
    assert [c.pixels for c in components] == sorted((c.pixels for c in components), reverse=True)


def test_components_refuse_a_non_2d_mask() -> None:
    with pytest.raises(TensorMismatch, match=r"^mask: expected a 2-D mask: \(2, 2, 2\)$"):
        label_components(np.zeros((2, 2, 2), dtype=bool))


def test_unclip_grows_by_area_times_ratio_over_perimeter() -> None:
    # 40 x 10: area 400, perimeter 100, distance 400 * 1.5 / 100 = 6
    assert unclip(10, 20, 50, 30, ratio=1.5) == (4, 14, 56, 36)


def test_extract_boxes_finds_unclipped_rectangles_in_reading_order() -> None:
    prob = np.zeros((100, 200), dtype=np.float32)
    prob[60:70, 20:100] = 0.9  # second line
    prob[10:20, 120:180] = 0.8  # first line, right
    prob[12:22, 10:60] = 0.95  # first line, left (top 2 px lower: same line)
    boxes, scores = extract_boxes(prob)
    assert boxes.dtype == np.float32 and boxes.shape == (3, 4, 2)
    expected = []
    for x0, y0, x1, y1 in ((10, 12, 60, 22), (120, 10, 180, 20), (20, 60, 100, 70)):
        # the mask is dilated one pixel down and right before boxes are taken
        ux0, uy0, ux1, uy1 = unclip(x0, y0, x1 + 1, y1 + 1)
        expected.append(rectangle_corners(*np.round([ux0, uy0, ux1, uy1])))
    np.testing.assert_array_equal(boxes, np.stack(expected))
    assert scores.dtype == np.float32 and scores.shape == (3,)
    assert all(0.5 <= s <= 0.95 for s in scores)


def test_extract_boxes_drops_faint_thin_and_clips_at_the_edge() -> None:
    prob = np.zeros((50, 80), dtype=np.float32)
    prob[5:15, 5:40] = 0.35  # above the pixel threshold, mean below box_thresh
    prob[30, 10:60] = 0.99  # one pixel tall (two after dilation): thinner than min_size
    prob[40:50, 60:80] = 0.9  # touches the bottom-right corner
    boxes, _ = extract_boxes(prob)
    assert boxes.shape == (1, 4, 2)
    assert boxes[0, 2].tolist() == [80.0, 50.0]  # clipped to the map


def test_extract_boxes_of_an_empty_map_are_empty_arrays() -> None:
    boxes, scores = extract_boxes(np.zeros((32, 32), dtype=np.float32))
    assert boxes.shape == (0, 4, 2) and scores.shape == (0,)


def test_extract_boxes_refuses_an_integer_map() -> None:
    with pytest.raises(TensorMismatch, match=r"^prob: expected a 2-D float map: "):
        extract_boxes(np.zeros((4, 4), dtype=np.int32))


def test_reading_order_groups_lines_by_top_then_sorts_by_left() -> None:
    boxes = np.stack(
        [
            rectangle_corners(300, 105, 400, 130),  # line 2, right
            rectangle_corners(10, 12, 100, 40),  # line 1, right of x=5 but tops within 10
            rectangle_corners(5, 100, 90, 128),  # line 2, left
            rectangle_corners(200, 5, 290, 35),  # line 1, rightmost
            rectangle_corners(0, 3, 4, 30),  # line 1, leftmost
        ]
    )
    assert reading_order(boxes).tolist() == [4, 1, 3, 2, 0]
