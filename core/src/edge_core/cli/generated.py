"""What ``edge run`` prints for a pipeline whose last stage generates text.

A generate stage's terminal event carries the text and the finish reason in its data and
the token ids as an output; the answer shows those, not the array's dtype and shape. On a
terminal (and without ``--json``) the text of one request is streamed as its tokens
arrive, before the timed requests run.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = ["generated_answer", "is_generate", "stream_text"]


def is_generate(pipeline: Any) -> bool:
    """True when the pipeline's last stage is served by a ``generate`` backend."""
    kinds = pipeline.execution_plan()["stages"][-1]["kind"]
    return "generate" in kinds


def generated_answer(result: Any) -> dict[str, Any] | None:
    """Text, token ids and finish reason of a generate result (``None`` for other kinds)."""
    data: Mapping[str, Any] = result.final.data
    if "text" not in data or "finish_reason" not in data:
        return None
    ids = result.outputs.get("token_ids")
    answer: dict[str, Any] = {
        "text": data["text"],
        "token_ids": [int(i) for i in ids] if ids is not None else None,
        "finish_reason": data["finish_reason"],
    }
    for key in ("num_tokens", "prompt_tokens"):
        if key in data:
            answer[key] = data[key]
    return answer


def stream_text(pipeline: Any, inputs: Mapping[str, Any], params: Mapping[str, Any] | None,
                out: TextIO | None = None) -> str:
    """Serve one request and write each token event's text to ``out`` as it arrives.

    Returns the whole text.
    """
    out = sys.stdout if out is None else out
    pieces: list[str] = []
    for event, _outputs in pipeline.stream(inputs, params=params):
        text = event.data.get("text") if event.data else None
        if text:
            pieces.append(str(text))
            out.write(str(text))
            out.flush()
    out.write("\n")
    out.flush()
    return "".join(pieces)
