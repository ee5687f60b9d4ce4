"""CTC decoding on synthetic probabilities, the character table, and the final decode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_ocr_example.buckets import CARRY_PREFIX, REC_OUTPUT
from edge_ocr_example.decode import (
    TextLine,
    character_table,
    ctc_greedy_decode,
    decode,
    load_characters,
)
from edge_ocr_example.errors import OcrError, TensorMismatch

TABLE = character_table(["a", "b", "c"])  # blank, a, b, c, space


def one_hot_steps(indices: list[int], confidence: list[float]) -> np.ndarray:
    """A 1 x T x 5 array whose best class per step is ``indices`` with ``confidence``."""
    steps = np.full((1, len(indices), len(TABLE)), 0.0, dtype=np.float32)
    for step, (index, value) in enumerate(zip(indices, confidence, strict=True)):
        steps[0, step, :] = (1.0 - value) / (len(TABLE) - 1)
        steps[0, step, index] = value
    return steps


def test_table_puts_blank_first_and_space_last() -> None:
    assert TABLE == ("", "a", "b", "c", " ")


def test_table_refuses_multi_character_entries() -> None:
    with pytest.raises(
        OcrError, match=r"^dictionary\[1\]: each entry must be one character: 'bc'$"
    ):
        character_table(["a", "bc"])


def test_greedy_decode_collapses_repeats_and_drops_blanks() -> None:
    # a a blank a b b space c -> "aab c"; kept steps: 0, 3, 4, 6, 7
    confidence = [0.9, 0.5, 0.6, 0.7, 0.8, 0.3, 0.95, 0.85]
    steps = one_hot_steps([1, 1, 0, 1, 2, 2, 4, 3], confidence)
    [(text, score)] = ctc_greedy_decode(steps, TABLE)
    assert text == "aab c"
    assert score == pytest.approx(np.mean([0.9, 0.7, 0.8, 0.95, 0.85]), abs=1e-6)


def test_greedy_decode_of_only_blanks_is_empty_with_zero_score() -> None:
    assert ctc_greedy_decode(one_hot_steps([0, 0, 0], [0.9, 0.9, 0.9]), TABLE) == [("", 0.0)]


def test_greedy_decode_refuses_a_class_count_other_than_the_table() -> None:
    with pytest.raises(TensorMismatch, match=r"^probabilities: expected N x T x 5: \(1, 2, 4\)$"):
        ctc_greedy_decode(np.zeros((1, 2, 4), dtype=np.float32), TABLE)


def test_load_characters_keeps_unusual_characters_exactly(tmp_path: Path) -> None:
    path = tmp_path / "characters.txt"
    path.write_bytes("x\n\u3000\n\u00e9\n\u7801".encode())
    assert load_characters(path) == ("", "x", "\u3000", "\u00e9", "\u7801", " ")


def rec_outputs(rows: list[tuple[list[int], float]], count: int) -> dict[str, np.ndarray]:
    probabilities = np.concatenate([one_hot_steps(i, [c] * len(i)) for i, c in rows])
    boxes = np.arange(len(rows) * 8, dtype=np.float32).reshape(len(rows), 4, 2)
    return {
        REC_OUTPUT: probabilities,
        CARRY_PREFIX + "boxes": boxes,
        CARRY_PREFIX + "count": np.array([count], dtype=np.int64),
    }


def test_decode_returns_valid_rows_with_boxes_and_skips_padding_and_low_scores() -> None:
    previous = rec_outputs(
        [
            ([1, 0, 2], 0.9),  # "ab"
            ([3, 3, 3], 0.4),  # "c", below the score limit
            ([4, 0, 4], 0.9),  # " " only: no visible text
            ([2, 0, 0], 0.9),  # "b"
            ([1, 1, 1], 0.9),  # padding row: beyond count
        ],
        count=4,
    )
    lines = decode(previous, {}, characters=TABLE)
    assert [(line.text, round(line.score, 4)) for line in lines] == [("ab", 0.9), ("b", 0.9)]
    assert all(isinstance(line, TextLine) for line in lines)
    np.testing.assert_array_equal(lines[1].box, previous[CARRY_PREFIX + "boxes"][3])
    assert [line.text for line in decode(previous, {}, characters=TABLE, min_score=0.3)] == [
        "ab",
        "c",
        "b",
    ]


def test_decode_keeps_the_surer_reading_of_a_crop_read_both_ways() -> None:
    previous = rec_outputs(
        [
            ([1, 0, 2], 0.6),    # crop 0: "ab"
            ([3, 0, 3], 0.9),    # crop 1: "cc"
            ([2, 0, 0], 0.9),    # crop 2: "b", read once
            ([2, 0, 1], 0.95),   # crop 0 the other way: "ba", surer
            ([1, 0, 1], 0.905),  # crop 1 the other way: "aa", within the margin
        ],
        count=3,
    )
    previous[CARRY_PREFIX + "second"] = np.array([0, 1], dtype=np.int64)
    lines = decode(previous, {}, characters=TABLE)
    assert [(line.text, round(line.score, 3)) for line in lines] == [
        ("ba", 0.95), ("cc", 0.9), ("b", 0.9)]
    np.testing.assert_array_equal(lines[0].box, previous[CARRY_PREFIX + "boxes"][0])


@pytest.mark.parametrize("second", [[3], [-1], [0, 0], [[0]], [0.0]])
def test_decode_refuses_second_readings_of_crops_it_does_not_have(second: list[object]) -> None:
    previous = rec_outputs([([1, 0, 2], 0.9)] * 4, count=3)
    previous[CARRY_PREFIX + "second"] = np.array(second)
    with pytest.raises(TensorMismatch, match=r"^carry:second: distinct crop indices below 3: "):
        decode(previous, {}, characters=TABLE)


def test_decode_requires_the_carried_boxes() -> None:
    previous = rec_outputs([([1], 0.9)], count=1)
    del previous[CARRY_PREFIX + "boxes"]
    with pytest.raises(TensorMismatch, match=r"^carry:boxes: carried tensor missing: "):
        decode(previous, {}, characters=TABLE)
