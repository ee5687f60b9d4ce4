"""Quality checks core ships for pipelines to name (``quality = "...:reference_tokens"``).

A check takes the golden set's ``(answer, truth)`` pairs and returns its metrics (and,
under ``items``, one row per pair); the golden set's ``passes`` judge them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["max_abs_error", "reference_tokens"]


def _ids(value: Any, where: str) -> list[int]:
    ids = value.get("token_ids") if isinstance(value, Mapping) else value
    if not isinstance(ids, list | tuple) or not all(isinstance(i, int) for i in ids):
        raise ValueError(f"{where}: needs a list of token ids (or an object with "
                         f"'token_ids'): {value!r}")
    return [int(i) for i in ids]


def reference_tokens(pairs: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
    """Generated token ids against reference ids produced at temperature 0.

    Metrics: ``exact_match`` (the fraction of items whose ids equal the reference),
    ``token_agreement`` (the fraction of reference positions with the same id,
    position by position; a missing or extra token counts as a disagreement).

    Raises:
        ValueError: an answer or a truth that holds no token ids.
    """
    rows = []
    agree = total = exact = 0
    for index, (answer, truth) in enumerate(pairs):
        got = _ids(answer, f"answer[{index}]")
        want = _ids(truth, f"truth[{index}]")
        same = sum(1 for a, b in zip(got, want, strict=False) if a == b)
        length = max(len(got), len(want))
        agree += same
        total += length
        exact += got == want
        rows.append({"index": index, "exact": got == want, "agreeing": same,
                     "length": length})
    return {"exact_match": exact / len(pairs) if pairs else 0.0,
            "token_agreement": agree / total if total else 1.0, "items": rows}


def max_abs_error(pairs: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
    """Outputs against reference outputs: the largest absolute difference over all items.

    Each answer and truth is a mapping of output name to (nested lists of) numbers; every
    name of the truth must be in the answer with the same shape. Metric
    ``max_abs_error``; per item, its own.

    Raises:
        ValueError: an answer without a truth's output, or with another shape.
    """
    import numpy as np

    worst = 0.0
    rows = []
    for index, (answer, truth) in enumerate(pairs):
        if not isinstance(answer, Mapping) or not isinstance(truth, Mapping):
            raise ValueError(f"pair[{index}]: answer and truth must map output names to "
                             f"values: {type(answer).__name__}, {type(truth).__name__}")
        item = 0.0
        for name, expected in truth.items():
            if name not in answer:
                raise ValueError(f"answer[{index}]: no output {name!r}: {sorted(answer)}")
            got = np.asarray(answer[name], dtype=np.float64)
            want = np.asarray(expected, dtype=np.float64)
            if got.shape != want.shape:
                raise ValueError(f"answer[{index}].{name}: shape {list(got.shape)} is not "
                                 f"the truth's: {list(want.shape)}")
            if got.size:
                item = max(item, float(np.max(np.abs(got - want))))
        worst = max(worst, item)
        rows.append({"index": index, "max_abs_error": item})
    return {"max_abs_error": worst, "items": rows}
