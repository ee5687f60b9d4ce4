"""The request classes of ``edge profile --workload FILE`` (JSONL) and ``--params JSON``.

One request per line::

    {"class": "short", "prompt": "Summarise ...", "params": {"max_tokens": 32}}
    {"class": "chat", "messages": [{"role": "user", "content": "..."}]}
    {"class": "long", "prompt_token_ids": [1, 2, 3], "params": {"temperature": 0}}

``class`` names the request class its measures are pooled under; the request's params for
the final stage are ``params`` with the prompt (``prompt``, ``messages`` or
``prompt_token_ids``: one at most) added. A line with only ``params`` (``{}`` too) is a
request whose prompt a transform makes (a graph → generate pipeline), or a graph or
streaming stage's request over the ``--input``/``--inputs`` arrays. Blank lines are
skipped; anything else is refused with its line number (``workload:LINE.field: reason:
value``).

A class's lines are its distinct requests; a level sends them in turn, round robin, until
it has sent ``--requests``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from edge_core.evidence.errors import RecordInvalid

__all__ = ["PROMPT_KEYS", "RequestClass", "classes_from_params", "read_workload"]

PROMPT_KEYS = ("prompt", "messages", "prompt_token_ids")
"""The keys that carry a request's prompt (at most one per line)."""

_KEYS = frozenset({"class", "params", *PROMPT_KEYS})


@attrs.frozen
class RequestClass:
    """A named class of requests: the final stage's params of each, sent in turn."""

    name: str
    requests: tuple[Mapping[str, Any], ...]
    source: str


def _line(text: str, where: str) -> tuple[str, dict[str, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordInvalid(where, f"not a JSON object ({exc.msg})", text[:200]) from None
    if not isinstance(data, dict):
        raise RecordInvalid(where, "must be a JSON object", data)
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise RecordInvalid(f"{where}.{unknown[0]}", f"unknown key (known: {sorted(_KEYS)})",
                            data[unknown[0]])
    name = data.get("class")
    if not isinstance(name, str) or not name.strip() or not name.isprintable():
        raise RecordInvalid(f"{where}.class", "must be a non-empty printable string", name)
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise RecordInvalid(f"{where}.params", "must be an object", params)
    prompts = [key for key in PROMPT_KEYS if key in data]
    if len(prompts) > 1:
        raise RecordInvalid(where, "give one of prompt, messages, prompt_token_ids", prompts)
    if not prompts and "params" not in data:
        raise RecordInvalid(where, "a request needs a prompt, messages, prompt_token_ids or "
                            "params", data)
    request = dict(params)
    for key in prompts:
        value = data[key]
        if key == "prompt" and not isinstance(value, str):
            raise RecordInvalid(f"{where}.prompt", "must be a string", value)
        if key == "messages" and not (isinstance(value, list) and value and all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in value)):
            raise RecordInvalid(f"{where}.messages", "must be a non-empty list of "
                                "{role, content} strings", value)
        if key == "prompt_token_ids" and not (isinstance(value, list) and value and all(
                isinstance(i, int) and not isinstance(i, bool) for i in value)):
            raise RecordInvalid(f"{where}.prompt_token_ids", "must be a non-empty list of "
                                "integers", value)
        request[key] = value
    return name.strip(), request


def read_workload(path: str | os.PathLike[str]) -> list[RequestClass]:
    """The request classes of a workload file, in order of first appearance.

    Raises:
        RecordInvalid: the file cannot be read or is not UTF-8, holds no request, or a line
            is malformed.
    """
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise RecordInvalid("--workload", f"cannot read ({exc.strerror})", str(file)) from None
    except UnicodeDecodeError as exc:
        raise RecordInvalid("--workload", f"not valid UTF-8 (byte {exc.start}: {exc.reason})",
                            str(file)) from None
    found: dict[str, list[Mapping[str, Any]]] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        name, request = _line(text, f"workload:{number}")
        found.setdefault(name, []).append(request)
    if not found:
        raise RecordInvalid("--workload", "the file holds no request", str(file))
    return [RequestClass(name, tuple(requests), f"workload({file.name})")
            for name, requests in found.items()]


def classes_from_params(params: Mapping[str, Any]) -> list[RequestClass]:
    """``--params JSON``: one class, ``params``, of that single request.

    Raises:
        RecordInvalid: ``params`` is not an object.
    """
    if not isinstance(params, Mapping):
        raise RecordInvalid("--params", "must be a JSON object", params)
    return [RequestClass("params", (dict(params),), "--params")]
