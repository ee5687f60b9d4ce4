"""Both official OpenAI clients, unchanged, run on the same cases with the same result shape.

The Python ``openai`` package is a dev dependency. The Node ``openai`` package (pinned:
:data:`NODE_OPENAI`) is installed with ``npm`` into a cache directory outside the
repository (``$EDGE_NODE_CACHE``, else ``~/.cache/edge-serve-tests``) the first time and
reused afterwards; where ``node`` or ``npm`` is missing, or the registry cannot be reached,
:func:`node_openai` says why and the Node half of a test is skipped with that reason.

A case is ``{"name", "kind": "completions" | "chat", "params", "stream", ...}``; its result,
from either client: ``{"name", "ok", "chunks", "choices": {index: {"text", "finish",
"logprobs": [[token, logprob], ...]}}, "usage", "error": {"class", "status", "param",
"code", "type", "message"} | None}`` (see ``openai_node.cjs``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import openai

NODE_OPENAI = "6.49.0"
"""The Node ``openai`` package version the tests install (the one the issue was found with)."""

SCRIPT = Path(__file__).with_name("openai_node.cjs")
CACHE_ENV = "EDGE_NODE_CACHE"


def _cache() -> Path:
    configured = os.environ.get(CACHE_ENV)
    root = Path(configured) if configured else Path.home() / ".cache" / "edge-serve-tests"
    return root / f"node-openai-{NODE_OPENAI}"


def node_openai() -> tuple[Path | None, str]:
    """The installed Node package's directory, or None and why there is none."""
    node = shutil.which("node")
    if node is None:
        return None, "node is not installed"
    package = _cache() / "node_modules" / "openai"
    manifest = package / "package.json"
    if manifest.is_file() and json.loads(manifest.read_text()).get("version") == NODE_OPENAI:
        return package, ""
    npm = shutil.which("npm")
    if npm is None:
        return None, "npm is not installed (needed once, to install the Node openai package)"
    try:
        done = subprocess.run([npm, "install", "--prefix", str(_cache()),
                               f"openai@{NODE_OPENAI}", "--no-audit", "--no-fund",
                               "--loglevel=error"], capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return None, "npm install openai timed out (is the registry reachable?)"
    if done.returncode != 0 or not manifest.is_file():
        return None, f"npm install openai@{NODE_OPENAI} failed: {done.stderr.strip()[-300:]}"
    return package, ""


def _node_input(base_url: str, api_key: str, cases: list[Mapping[str, Any]],
                concurrent: bool) -> str:
    return json.dumps({"baseURL": base_url, "apiKey": api_key, "concurrent": concurrent,
                       "cases": cases})


def run_node(package: Path, base_url: str, api_key: str, cases: list[Mapping[str, Any]], *,
             concurrent: bool = False, timeout_s: float = 600.0) -> dict[str, dict[str, Any]]:
    """Run the cases with the Node client; each case's result by name."""
    done = subprocess.run(["node", str(SCRIPT)], input=_node_input(base_url, api_key, cases,
                                                                    concurrent),
                          capture_output=True, text=True, timeout=timeout_s, check=False,
                          env={**os.environ, "EDGE_NODE_OPENAI": str(package)})
    results = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return {result["name"]: result for result in results if "first" not in result}


class NodeRun:
    """The Node client running cases concurrently in the background (for cut streams).

    :meth:`first` waits until a case announced its first chunk; :meth:`results` waits for
    every case's result.
    """

    def __init__(self, package: Path, base_url: str, api_key: str,
                 cases: list[Mapping[str, Any]]) -> None:
        self._process = subprocess.Popen(
            ["node", str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env={**os.environ, "EDGE_NODE_OPENAI": str(package)})
        assert self._process.stdin is not None
        self._process.stdin.write(_node_input(base_url, api_key, cases, True))
        self._process.stdin.close()
        self._firsts: set[str] = set()
        self._started = False
        self._results: dict[str, dict[str, Any]] = {}
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if not line.strip():
                continue
            item = json.loads(line)
            with self._changed:
                if item.get("started"):
                    self._started = True
                elif item.get("first"):
                    self._firsts.add(item["name"])
                else:
                    self._results[item["name"]] = item
                self._changed.notify_all()

    def started(self, timeout_s: float = 60.0) -> bool:
        """Wait until the client is loaded and its requests go out."""
        with self._changed:
            return self._changed.wait_for(lambda: self._started, timeout_s)

    def first(self, name: str, timeout_s: float = 300.0) -> bool:
        """Wait until case ``name`` received its first chunk (False: it ended first)."""
        with self._changed:
            self._changed.wait_for(lambda: name in self._firsts or name in self._results,
                                   timeout_s)
            return name in self._firsts

    def ended(self, name: str) -> bool:
        """Whether case ``name`` has ended (its result is in)."""
        with self._changed:
            return name in self._results

    def results(self, timeout_s: float = 300.0) -> dict[str, dict[str, Any]]:
        """Every case's result, once the process has ended (killed past ``timeout_s``)."""
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            raise
        self._reader.join(10.0)
        assert self._process.stderr is not None
        assert self._process.returncode == 0, self._process.stderr.read()[-2000:]
        return dict(self._results)


def _describe(error: BaseException) -> dict[str, Any]:
    return {"class": type(error).__name__, "status": getattr(error, "status_code", None),
            "param": getattr(error, "param", None), "code": getattr(error, "code", None),
            "type": getattr(error, "type", None), "message": str(error)}


def _absorb(result: dict[str, Any], answer: Any, chat: bool, streamed: bool) -> None:
    for choice in answer.choices or ():
        entry = result["choices"].setdefault(str(choice.index),
                                             {"text": "", "finish": None, "logprobs": []})
        if chat:
            part = choice.delta if streamed else choice.message
            entry["text"] += (part.content if part is not None else None) or ""
            content = choice.logprobs.content if choice.logprobs is not None else None
            entry["logprobs"] += [[item.token, item.logprob] for item in content or ()]
        else:
            entry["text"] += choice.text or ""
            if choice.logprobs is not None and choice.logprobs.tokens:
                entry["logprobs"] += [list(pair) for pair in zip(
                    choice.logprobs.tokens, choice.logprobs.token_logprobs or (), strict=True)]
        if choice.finish_reason:
            entry["finish"] = choice.finish_reason
    if getattr(answer, "usage", None) is not None:
        result["usage"] = answer.usage.model_dump()


def run_python(client: openai.OpenAI, case: Mapping[str, Any],
               on_first: Any = None) -> dict[str, Any]:
    """Run one case with the Python client (its fields beyond OpenAI's in ``extra_body``).

    ``on_first`` is called once the first chunk of a stream has arrived.
    """
    chat = case["kind"] == "chat"
    api: Any = client.chat.completions if chat else client.completions
    params = dict(case["params"])
    known = _CHAT_FIELDS if chat else _COMPLETION_FIELDS
    extra = {key: params.pop(key) for key in list(params) if key not in known}
    result: dict[str, Any] = {"name": case["name"], "ok": False, "chunks": 0, "choices": {},
                              "usage": None, "error": None}
    try:
        if case.get("stream"):
            for chunk in _chunks(api.create(**params, stream=True, extra_body=extra or None)):
                result["chunks"] += 1
                if result["chunks"] == 1 and on_first is not None:
                    on_first()
                _absorb(result, chunk, chat, True)
        else:
            _absorb(result, api.create(**params, extra_body=extra or None), chat, False)
        result["ok"] = True
    except openai.APIError as error:
        result["error"] = _describe(error)
    return result


def _chunks(stream: Any) -> Iterator[Any]:
    with stream:
        yield from stream


_COMMON_FIELDS = frozenset({"model", "max_tokens", "temperature", "top_p", "seed", "stop",
                            "n", "presence_penalty", "frequency_penalty", "logprobs",
                            "stream_options", "user"})
_COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "echo", "logit_bias", "suffix", "best_of"}
_CHAT_FIELDS = _COMMON_FIELDS | {"messages", "max_completion_tokens", "top_logprobs",
                                 "response_format", "tools", "logit_bias"}
