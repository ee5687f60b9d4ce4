"""Generated texts as output tensors: what the worker's DONE carries instead of JSON text.

An event's header, its ``data`` included, must fit the worker channel's
``max_header_bytes`` (64 KiB; a longer one fails the request with ``EventTooLarge``), and
a request's texts do not: ``n`` choices of ``max_tokens`` each reach megabytes. So the
worker sends every choice's text as two outputs beside ``token_ids``:

* :data:`TEXT_BYTES` (``text_utf8``): uint8, the UTF-8 bytes of every choice's text, one
  after the other in choice order;
* :data:`TEXT_LENGTHS` (``text_lengths``): int64, each choice's length in those bytes
  (one entry per choice, also for a single choice).

The stage reads them back (:func:`decode_texts`) and puts each text where the DONE's
``data`` always had it (``text``, ``choices[i].text``), so what users get is unchanged.

Imports only numpy: the worker (in the vLLM environment) and the controller both use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edge_contracts.error_copies import whole_reduction

__all__ = ["TEXT_BYTES", "TEXT_LENGTHS", "TextsMalformed", "decode_texts", "encode_texts",
           "with_texts"]

TEXT_BYTES = "text_utf8"
"""The output holding every choice's text as UTF-8 bytes, in choice order (uint8)."""
TEXT_LENGTHS = "text_lengths"
"""The output holding each choice's length in :data:`TEXT_BYTES` (int64, one per choice)."""


class TextsMalformed(ValueError):
    """The worker's text outputs do not describe its choices (a worker of another version).

    Attributes:
        field: The output or data field at fault (``outputs.text_lengths`` ...).
        value: What was found there.
        reason: What was expected.
    """

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        super().__init__(f"{field}: {reason}: {value!r}")

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        return whole_reduction(self)


def encode_texts(texts: Sequence[str]) -> dict[str, np.ndarray]:
    """The two outputs carrying ``texts`` (one per choice, in order)."""
    encoded = [text.encode("utf-8") for text in texts]
    return {TEXT_BYTES: np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(),
            TEXT_LENGTHS: np.asarray([len(e) for e in encoded], dtype=np.int64)}


def decode_texts(outputs: Mapping[str, Any], count: int) -> list[str]:
    """The ``count`` texts :func:`encode_texts` put in ``outputs``.

    Raises:
        TextsMalformed: an output is missing, of the wrong dtype or rank, the lengths are
            not ``count`` non-negative numbers adding up to the bytes, or a text is not
            UTF-8.
    """
    for name, dtype in ((TEXT_BYTES, np.uint8), (TEXT_LENGTHS, np.int64)):
        array = outputs.get(name)
        if array is None:
            raise TextsMalformed(f"outputs.{name}", "missing beside the other",
                                 sorted(outputs))
        if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != 1:
            raise TextsMalformed(f"outputs.{name}", f"must be a 1-D {np.dtype(dtype).name} "
                                 "array", f"{getattr(array, 'dtype', type(array).__name__)} "
                                 f"{getattr(array, 'shape', '')}")
    blob = bytes(outputs[TEXT_BYTES])  # a copy: the outputs may be views of worker memory
    lengths = [int(n) for n in outputs[TEXT_LENGTHS]]
    if len(lengths) != count:
        raise TextsMalformed(f"outputs.{TEXT_LENGTHS}", f"must hold one length per choice "
                             f"({count})", len(lengths))
    if any(n < 0 for n in lengths) or sum(lengths) != len(blob):
        raise TextsMalformed(f"outputs.{TEXT_LENGTHS}", f"must be lengths adding up to "
                             f"the {len(blob)} bytes of {TEXT_BYTES}", lengths[:8])
    texts, start = [], 0
    for index, length in enumerate(lengths):
        try:
            texts.append(blob[start:start + length].decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise TextsMalformed(f"outputs.{TEXT_BYTES}", f"choice {index}'s text is not "
                                 f"UTF-8 ({exc.reason} at byte {exc.start})",
                                 blob[start:start + length][:32]) from None
        start += length
    return texts


def with_texts(data: Mapping[str, Any], texts: Sequence[str]) -> dict[str, Any]:
    """The DONE's ``data`` with ``text`` (the first choice's) and ``choices[i].text`` back.

    Keys keep the order the DONE's data always had: ``text`` after ``finish_reason``, and
    in each choice after its ``finish_reason``.

    Raises:
        TextsMalformed: ``data.choices`` is not one object per text.
    """
    choices = data.get("choices")
    if not texts or not isinstance(choices, Sequence) or len(choices) != len(texts) or not all(
            isinstance(choice, Mapping) for choice in choices):
        raise TextsMalformed("data.choices", f"must hold one object per text ({len(texts)})",
                             choices if not isinstance(choices, Sequence) else len(choices))
    rebuilt: dict[str, Any] = {}
    for key, value in data.items():
        if key == "choices":
            value = [_with_text(choice, text) for choice, text in zip(choices, texts,
                                                                     strict=True)]
        rebuilt[key] = value
        if key == "finish_reason":
            rebuilt["text"] = texts[0]
    rebuilt.setdefault("text", texts[0])
    return rebuilt


def _with_text(choice: Mapping[str, Any], text: str) -> dict[str, Any]:
    rebuilt: dict[str, Any] = {}
    for key, value in choice.items():
        rebuilt[key] = value
        if key == "finish_reason":
            rebuilt["text"] = text
    rebuilt.setdefault("text", text)
    return rebuilt
