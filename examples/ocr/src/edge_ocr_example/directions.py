"""Which way a text line is read: the classifier's turn, and when the recogniser checks it.

Both pipelines decide a line's direction here: the page reader
(:func:`edge_ocr_example.page_reader.apply_directions`, the classifier's windows combined)
and the letterbox pipeline (:func:`edge_ocr_example.transforms.classify_to_recognize`,
one squeezed row per line). :func:`line_direction` says whether the line is turned by 180
degrees and whether it is also read the other way; :func:`keep_second` says which of the
two readings stands.

The direction classifier is reliable on ordinary print and not on small print: upscaled
to its 48-pixel rows, windows of upright 7-10 px text are called upside down with high
confidence, and turned lines upright, its verdicts moving with a pixel or two of margin
around the text. The recogniser's confidence in the two readings tells them apart, so a
line of small print is read both ways whenever the classifier may have misjudged it
(measured: ``benchmarks/RESULTS.md``, ``ocr_small_print``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from edge_ocr_example.errors import TensorMismatch

__all__ = [
    "ANGLE_THRESH",
    "CHECK_ALL_HEIGHT",
    "CHECK_HEIGHT",
    "CHECK_MARGIN",
    "CHECK_THRESH",
    "Direction",
    "keep_second",
    "line_direction",
]

ANGLE_THRESH: Final = 0.9
"""A line is turned by 180 degrees only when the classifier says so with this confidence."""
CHECK_THRESH: Final = 0.05
"""A line of small print (:data:`CHECK_HEIGHT`) whose probability of 180 degrees exceeds
this is read both ways, and the reading with more evidence kept (:func:`keep_second`).

Between :data:`CHECK_ALL_HEIGHT` and :data:`CHECK_HEIGHT`, the turned lines the classifier
called upright still gave 180 degrees well above this, while it calls upright lines of
ordinary print upright far more surely: on ordinary pages few lines are read twice
(measured: ``benchmarks/RESULTS.md``, ``ocr_small_print``)."""
CHECK_HEIGHT: Final = 32
"""A line crop less than this many pixels high counts as small print for :data:`CHECK_THRESH`.

Taller lines are turned or not on the classifier's word alone, and read once: it seldom
misjudges them, and reading them both ways would double the recogniser's calls on most
pages."""
CHECK_ALL_HEIGHT: Final = 16
"""A line crop less than this many pixels high (a third of the classifier's row) is read
both ways whatever the classifier says.

So small, the classifier's verdict carries no weight: it called turned lines upright with
next to no doubt, and upright ones turned. Ordinary print is seldom cut this small, so
ordinary pages pay little for it."""
CHECK_MARGIN: Final = 0.01
"""A line read both ways keeps its second reading only when the recogniser's evidence for
it beats the first's with the first's score raised by this (:func:`keep_second`); closer
is a tie (``and 6986`` turned reads ``9869 pue``, about as surely), and the first reading
(the classifier's verdict) stands."""


@dataclass(frozen=True)
class Direction:
    """How one line is read."""

    turn: bool
    """Turn the line by 180 degrees before reading it (the first reading)."""
    check: bool
    """Also read it turned the other way (the second reading, :func:`keep_second`)."""


def line_direction(upside_down: float, height: int) -> Direction:
    """The direction of a line ``height`` pixels high whose probability of 180 degrees is
    ``upside_down``: turned above :data:`ANGLE_THRESH`; read both ways when under
    :data:`CHECK_ALL_HEIGHT` pixels high, or under :data:`CHECK_HEIGHT` and above
    :data:`CHECK_THRESH`.

    Raises:
        TensorMismatch: ``upside_down`` is not a probability, or ``height`` is below 1.

    """
    probability = float(upside_down)
    if not 0.0 <= probability <= 1.0:  # NaN too
        raise TensorMismatch("upside_down", "must be a probability in [0, 1]", upside_down)
    if height < 1:
        raise TensorMismatch("height", "must be at least 1 pixel", height)
    check = height < CHECK_ALL_HEIGHT or (height < CHECK_HEIGHT and probability > CHECK_THRESH)
    return Direction(turn=probability > ANGLE_THRESH, check=check)


def keep_second(first: tuple[float, int], second: tuple[float, int],
                margin: float = CHECK_MARGIN) -> bool:
    """Whether a line read both ways keeps its second reading.

    Each reading is ``(score, characters)``: the recogniser's mean confidence over the
    characters it read, and how many it read. Its evidence is the two multiplied: read
    upside down, upright small print often gives fewer characters, each as sure as the
    right reading's or surer (``and thc`` turned reads ``pue``), so the mean score alone
    turned upright lines. The second reading is kept when its evidence exceeds the
    first's with the first's score raised by ``margin`` (:data:`CHECK_MARGIN`); for
    readings of one length, when its score is more than ``margin`` above the first's.
    """
    (first_score, first_count), (second_score, second_count) = first, second
    return second_score * second_count > (first_score + margin) * first_count
