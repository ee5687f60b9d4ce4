"""OCR text as a generate request: the transform from the recogniser to a language model.

``lines_to_prompt(previous, source, bundles)`` decodes the recogniser's gathered outputs
into lines (with the character table of the recognise stage's verified bundle) and returns
an ``edge_core.fanout.Call`` whose only parameter is the prompt: the recognised lines,
one per line. The runtime merges it over the caller's parameters (sampling settings,
``max_tokens`` ...), so a pipeline detect -> classify -> recognise -> generate answers with
the language model's continuation of the page's text.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edge_core.fanout import Call
from edge_ocr_example.decode import CHARACTERS_FILE, decode, load_characters
from edge_ocr_example.errors import OcrError

__all__ = ["lines_to_prompt", "page_text"]


def page_text(previous: Mapping[str, Any], bundles: Mapping[str, Path | None]) -> str:
    """The recognised lines of a page, joined by newlines."""
    directory = bundles.get("recognize")
    if directory is None:
        raise OcrError("bundles.recognize", "the recognise stage has no bundle", None)
    characters = load_characters(Path(directory) / CHARACTERS_FILE)
    return "\n".join(line.text for line in decode(previous, {}, characters=characters))


def lines_to_prompt(previous: Mapping[str, Any], source: Mapping[str, Any],
                    bundles: Mapping[str, Path | None]) -> Call:
    """Recogniser outputs -> a generate call whose prompt is the page's text.

    Raises:
        OcrError: no text was recognised (an empty prompt is refused by the backend too).
    """
    del source
    text = page_text(previous, bundles)
    if not text:
        raise OcrError("prompt", "no text recognised on the page", "")
    return Call(params={"prompt": text})
