"""OCR text as a generate request: the transform from the recogniser to a language model.

``lines_to_prompt(previous, source, bundles)`` decodes the recogniser's gathered outputs
into lines (with the character table of the recognise stage's verified bundle) and returns
an ``edge_core.fanout.Call`` whose only parameter is the prompt: the recognised lines,
one per line. The runtime merges it over the caller's parameters (sampling settings,
``max_tokens`` ...), so a pipeline detect -> classify -> recognise -> generate answers with
the language model's continuation of the page's text.

``page_chat`` does the same for a chat: the caller's messages (the pipeline input
``carry:messages``, as ``edge serve`` hands a chat's text to the transforms) followed by
one user message holding the page's text, rendered by the worker with the model's own
chat template.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edge_core.fanout import Call
from edge_ocr_example.decode import bundle_characters, decode
from edge_ocr_example.errors import OcrError

__all__ = ["PAGE_HEADING", "lines_to_prompt", "page_chat", "page_text"]

PAGE_HEADING = "The page reads:\n"
"""What precedes the page's text in the message ``page_chat`` adds."""


def page_text(previous: Mapping[str, Any], bundles: Mapping[str, Path | None]) -> str:
    """The recognised lines of a page, joined by newlines."""
    characters = bundle_characters(bundles)
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


def page_chat(previous: Mapping[str, Any], source: Mapping[str, Any],
              bundles: Mapping[str, Path | None]) -> Call:
    """Recogniser outputs -> a generate call whose chat is the caller's, then the page.

    The caller's messages come from the input ``carry:messages`` (a list of
    ``{"role", "content"}``; none when absent); the page's text is added as one user
    message, :data:`PAGE_HEADING` first.

    Raises:
        OcrError: no text was recognised, or ``carry:messages`` is not a list of messages.
    """
    text = page_text(previous, bundles)
    if not text:
        raise OcrError("prompt", "no text recognised on the page", "")
    chat = source.get("carry:messages", [])
    if not isinstance(chat, list) or not all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in chat):
        raise OcrError("carry:messages", "must be a list of {role, content} strings", chat)
    messages = [{"role": m["role"], "content": m["content"]} for m in chat]
    return Call(params={"messages": [*messages, {"role": "user",
                                                 "content": PAGE_HEADING + text}]})
