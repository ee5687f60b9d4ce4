"""Chat messages of ``/v1/chat/completions`` as a served pipeline takes them.

A message's ``content`` is a string or a list of OpenAI content parts. Text parts are
joined into the message's text. An ``image_url`` part is served only where the pipeline
has graph stages before its generate stage and a ``prepare`` to read an image with: its
``url`` must be a ``data:image/...;base64,...`` URL (the server fetches nothing), and a
request carries exactly one. Every other part is refused with 400 naming it
(``messages[1].content[0]``).
"""

from __future__ import annotations

import base64
import binascii
import re

from edge_serve.generation import ImagePart
from edge_serve.outcomes import HttpRefusal

__all__ = ["Chat", "read_chat"]

_DATA_URL = re.compile(r"data:(image/[A-Za-z0-9.+-]+);base64,(.*)", re.DOTALL)


class Chat:
    """A request's chat: the messages' text (role, content) and the image it carried."""

    __slots__ = ("image", "messages")

    def __init__(self, messages: list[dict[str, str]], image: ImagePart | None) -> None:
        self.messages = messages
        self.image = image


def _refuse(field: str, reason: str, value: object) -> HttpRefusal:
    return HttpRefusal(400, field, reason, value, kind="InvalidValue")


def _image(part: dict[str, object], field: str) -> ImagePart:
    """The image of an ``image_url`` part, decoded from its ``data:`` URL."""
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else None
    if not isinstance(url, str):
        raise _refuse(f"{field}.image_url.url", "must be a string", url)
    match = _DATA_URL.fullmatch(url)
    if match is None:
        raise _refuse(f"{field}.image_url.url", "must be a data:image/...;base64,... URL "
                      "(the server fetches nothing)", url[:64])
    try:
        data = base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError):
        raise _refuse(f"{field}.image_url.url", "not valid base64", url[:64]) from None
    if not data:
        raise _refuse(f"{field}.image_url.url", "the image is empty", url[:64])
    kind = match.group(1).split("/", 1)[1].lower()
    suffix = f".{kind}" if kind.isalnum() and len(kind) <= 8 else ""
    return ImagePart(data, suffix, f"{field}.image_url")


def read_chat(value: object, *, images: bool) -> Chat:
    """The chat of a request's ``messages``.

    Args:
        value: The ``messages`` field as sent.
        images: Whether the pipeline takes an image (then exactly one is required).

    Raises:
        HttpRefusal: 400 naming the message, part or field that cannot be served.
    """
    if not isinstance(value, list) or not value:
        raise _refuse("messages", "must be a non-empty list", value)
    messages: list[dict[str, str]] = []
    found: list[ImagePart] = []
    for index, message in enumerate(value):
        field = f"messages[{index}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _refuse(field, 'must be an object with a "role"', message)
        content = message.get("content", "")
        if isinstance(content, str):
            messages.append({"role": message["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise _refuse(f"{field}.content", "must be a string or a list of content parts",
                          content)
        texts: list[str] = []
        had_image = False
        for number, part in enumerate(content):
            where = f"{field}.content[{number}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "image_url" and isinstance(part, dict):
                if not images:
                    raise _refuse(where, "this pipeline's only stage generates: it takes "
                                  "text parts only", kind)
                if found:
                    raise _refuse(where, "one image per request is served", kind)
                found.append(_image(part, where))
                had_image = True
            else:
                raise _refuse(where, "only text and image_url parts are served", part)
        if texts or not had_image:  # a message that was only the image goes to prepare
            messages.append({"role": message["role"], "content": "".join(texts)})
    if images and not found:
        raise _refuse("messages", "this pipeline starts with graph stages fed by its "
                      "prepare: one message needs an image_url part (a data: URL)", None)
    return Chat(messages, found[0] if found else None)
