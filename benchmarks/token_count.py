"""What counting a prompt before admission costs a generate request: the worker's round trip.

Opens a one-stage ``vllm-cuda`` pipeline on the CPU engine (the tiny local Llama of the
vllm-cuda tests unless ``--model`` names another) and times, per request,
``Pipeline.check_params`` — what ``Pipeline.run``/``submit`` and the OpenAI routes do
before admission — for:

* ``ids``: a token-id prompt, counted on the controller (no round trip: the anchor);
* ``text`` / ``chat``: a text prompt / a chat never seen before, counted by the stage's
  worker with the model's tokenizer (and chat template) in a ``query`` (one round trip,
  taking no slot);
* ``memo``: the same text prompt again (the stage remembers a prompt's count: the second
  check of one request, which the serve routes make, asks nothing);
* ``ping``: the worker's bare control round trip (``WorkerClient.ping``);
* ``request``: a whole one-token request of the same text (``Pipeline.run``), for scale;

in alternating blocks (one of each per block, ``--blocks`` blocks of ``--per-block``
calls), idle and then while ``--streams`` requests stream on the same stage (the count is
answered between their frames, on the engine's loop, where vLLM detokenises them). Each
block prints one JSON line; the last line is the summary: medians over blocks in µs, and
``text_over_ids`` / ``text_over_request`` (the added cost against the check without a
round trip, and against the request it guards).

Run: ``.venv/bin/python benchmarks/token_count.py [--blocks N] [--per-block N]
[--streams N] [--python PY --model DIR]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from edge_core.runtime.pipeline import Pipeline
from edge_core.runtime.pipeline_files import open_pipeline

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_generate import environment, pipeline_file

KINDS = ("ids", "text", "chat", "memo", "ping", "request")


def _calls(pipeline: Pipeline) -> dict[str, Callable[[int], None]]:
    """One timed call of each kind; ``i`` makes text and chat prompts new every time."""
    client = pipeline.stage("gen").loaded.client  # type: ignore[attr-defined]

    def request(i: int) -> None:
        with pipeline.run({}, params={"prompt": "edge stage token", "max_tokens": 1}):
            pass

    return {
        "ids": lambda i: pipeline.check_params({"prompt_token_ids": [1, 5, 9, i % 300 + 2],
                                                "max_tokens": 4}),
        "text": lambda i: pipeline.check_params({"prompt": f"edge stage token {i} worker",
                                                 "max_tokens": 4}),
        "chat": lambda i: pipeline.check_params({"messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": f"edge stage token {i}"}], "max_tokens": 4}),
        "memo": lambda i: pipeline.check_params({"prompt": "edge stage token worker",
                                                 "max_tokens": 4}),
        "ping": lambda i: client.ping(timeout_s=30.0),
        "request": request,
    }


def _blocks(calls: dict[str, Callable[[int], None]], blocks: int, per_block: int,
            label: str, counter: itertools.count[int]) -> dict[str, list[float]]:
    """Alternating blocks: each kind ``per_block`` times per block; per-block medians (µs)."""
    medians: dict[str, list[float]] = {kind: [] for kind in KINDS}
    calls["memo"](next(counter))  # remembered from here on
    for block in range(blocks):
        line: dict[str, Any] = {"block": block, "mode": label}
        for kind in KINDS:
            times = []
            for _ in range(per_block):
                index = next(counter)
                started = time.perf_counter()
                calls[kind](index)
                times.append((time.perf_counter() - started) * 1e6)
            medians[kind].append(statistics.median(times))
            line[f"{kind}_us"] = round(medians[kind][-1], 1)
        print(json.dumps(line), flush=True)
    return medians


def _streaming(pipeline: Pipeline, count: int, stop: threading.Event) -> list[threading.Thread]:
    """``count`` threads, each streaming long requests until ``stop``."""

    def stream() -> None:
        while not stop.is_set():
            for _ in pipeline.stream({}, params={"prompt": "edge", "max_tokens": 200,
                                                 "ignore_eos": True, "temperature": 1.0}):
                if stop.is_set():
                    break

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print one JSON line per block and the summary last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--per-block", type=int, default=20)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--python", help="a vLLM environment's interpreter")
    parser.add_argument("--model", help="a model directory that environment loads")
    args = parser.parse_args(argv)
    python, model = environment(args.python, args.model)
    folder = Path(tempfile.mkdtemp(prefix="edge-bench-count-"))
    path = pipeline_file(folder, python, model, {"max_num_seqs": 8, "max_concurrency": 16},
                         admission=16)
    pipeline = open_pipeline(str(path))
    counter = itertools.count(1)
    try:
        calls = _calls(pipeline)
        idle = _blocks(calls, args.blocks, args.per_block, "idle", counter)
        stop = threading.Event()
        threads = _streaming(pipeline, args.streams, stop)
        try:
            time.sleep(1.0)  # the streams under way
            busy = _blocks(calls, args.blocks, args.per_block, "streaming", counter)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
    finally:
        summary = pipeline.close()

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 1)

    result: dict[str, Any] = {"benchmark": "token_count", "blocks": args.blocks,
                              "per_block": args.per_block, "streams": args.streams}
    for label, medians in (("idle", idle), ("streaming", busy)):
        figures = {f"{kind}_us": med(values) for kind, values in medians.items()}
        figures["text_over_ids"] = round(figures["text_us"] / figures["ids_us"], 1)
        figures["text_over_request"] = round(figures["text_us"] / figures["request_us"], 3)
        result[label] = figures
    result["retire_verified"] = all(s["retire"]["verified"] for s in summary.values())
    result["machine_load_1m"] = round(psutil.getloadavg()[0], 2)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
