"""Which way a text line is read: the classifier's turn, and when the recogniser checks it.

Both pipelines decide a line's direction here: the page reader
(:func:`edge_ocr_example.page_reader.apply_directions`, the classifier's windows combined)
and the letterbox pipeline (:func:`edge_ocr_example.transforms.classify_to_recognize`,
one squeezed row per line). :func:`line_direction` says whether the line is turned by 180
degrees and whether it is also read the other way; :func:`keep_second` says which of the
two readings stands.

The direction classifier is reliable on ordinary print and unreliable on small print:
upscaled to its 48-pixel rows, windows of upright 7-10 px text are called upside down
with high confidence, and turned lines upright (with a probability of 180 degrees as low
as a few hundredths), its verdicts moving with a pixel or two of margin around the text.
The recogniser's confidence in the two readings tells them apart, so a small line is read
both ways unless the classifier is all but sure that it is upright (measured:
``benchmarks/RESULTS.md``, ``ocr_small_print``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from edge_ocr_example.errors import TensorMismatch

__all__ = [
    "ANGLE_THRESH",
    "CHECK_HEIGHT",
    "CHECK_MARGIN",
    "CHECK_THRESH",
    "Direction",
    "keep_second",
    "line_direction",
]

ANGLE_THRESH: Final = 0.9
"""A line is turned by 180 degrees only when the classifier says so with this confidence."""
CHECK_THRESH: Final = 0.5
"""A line of small print (:data:`CHECK_HEIGHT`) whose probability of 180 degrees exceeds
this is read both ways, and the reading the recogniser is surer of is kept: the
classifier only picks which lines to ask about."""
CHECK_HEIGHT: Final = 32
"""A line crop less than this many pixels high counts as small print for :data:`CHECK_THRESH`.

On the generated images of ``benchmarks/ocr_small_print.py`` and ``ocr_accuracy.py``
every line the classifier misjudged was under this height; taller lines are turned or
not on its word alone, and read once."""
CHECK_MARGIN: Final = 0.01
"""A line read both ways keeps its second reading only when the recogniser is surer of it
by more than this; closer scores are a tie (``and 6986`` turned reads ``9869 pue``, about
as surely), and the first reading (the classifier's verdict) stands."""


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
    :data:`CHECK_HEIGHT` pixels high and above :data:`CHECK_THRESH`.

    Raises:
        TensorMismatch: ``upside_down`` is not a probability, or ``height`` is below 1.

    """
    probability = float(upside_down)
    if not 0.0 <= probability <= 1.0:  # NaN too
        raise TensorMismatch("upside_down", "must be a probability in [0, 1]", upside_down)
    if height < 1:
        raise TensorMismatch("height", "must be at least 1 pixel", height)
    return Direction(turn=probability > ANGLE_THRESH,
                     check=height < CHECK_HEIGHT and probability > CHECK_THRESH)


def keep_second(first: float, second: float, margin: float = CHECK_MARGIN) -> bool:
    """Whether a line read both ways keeps its second reading: the recogniser's score for
    it (``second``) is more than ``margin`` (:data:`CHECK_MARGIN`) above the first's."""
    return second > first + margin
