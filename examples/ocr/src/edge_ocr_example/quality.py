"""Task-level quality of the page pipeline: the character error rate against known text.

The pipeline names :func:`page_cer` as its ``quality`` check and the golden set the
bundle directory ships (``golden.json``: the demo page and its text, see
:mod:`edge_ocr_example.page_bundle`); ``edge profile`` reads every golden page through
the pipeline and hands the answers (``finish``'s ``[{"text", ...}]``) and the truth (the
page's lines) here.

Scoring (page CER, pooled): per page the truth's lines and the answer's texts are each
concatenated with all whitespace removed (reading order matters, line breaks and spaces
do not); the sum of the edit distances over the sum of the truth lengths.
``benchmarks/ocr_accuracy.py`` scores RapidOCR and this pipeline the same way.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["edit_distance", "page_cer", "squeeze"]


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance, one numpy row per character of ``a``."""
    if not a or not b:
        return len(a) + len(b)
    target = np.frombuffer(b.encode("utf-32-le"), dtype=np.uint32)
    index = np.arange(len(b) + 1)
    row = index.copy()
    for i, char in enumerate(a, start=1):
        cost = (target != ord(char)).astype(np.int64)
        best = np.empty_like(row)
        best[0] = i
        best[1:] = np.minimum(row[1:] + 1, row[:-1] + cost)
        # insertions along the row: row[j] = min_k (best[k] + j - k)
        row = np.minimum.accumulate(best - index) + index
    return int(row[-1])


def squeeze(lines: Sequence[str]) -> str:
    """Lines concatenated in order with all whitespace removed."""
    return re.sub(r"\s+", "", "".join(lines))


def _texts(answer: Any, index: int) -> list[str]:
    if not isinstance(answer, list) or not all(
            isinstance(line, dict) and isinstance(line.get("text"), str) for line in answer):
        raise ValueError(f"answer[{index}]: not the page pipeline's answer "
                         f"([{{'text', 'score', 'box'}}]): {answer!r}"[:300])
    return [line["text"] for line in answer]


def page_cer(pairs: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
    """The pooled page CER of the answers against the truths; per page, its own.

    Raises:
        ValueError: an answer that is not the page pipeline's, or a truth that is not a
            list of lines.
    """
    errors = total = 0
    rows = []
    for index, (answer, truth) in enumerate(pairs):
        if not isinstance(truth, list) or not all(isinstance(t, str) for t in truth):
            raise ValueError(f"truth[{index}]: must be the page's lines: {truth!r}"[:300])
        reference = squeeze(truth)
        read = squeeze(_texts(answer, index))
        distance = edit_distance(reference, read)
        errors += distance
        total += len(reference)
        rows.append({"index": index, "errors": distance, "length": len(reference),
                     "cer": distance / max(1, len(reference)),
                     "lines_read": len(answer), "lines_true": len(truth)})
    return {"cer": errors / total if total else 0.0, "items": rows}
