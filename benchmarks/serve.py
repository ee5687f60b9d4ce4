"""HTTP overhead of ``edge serve`` on the OCR pipeline, and its throughput.

Side by side in this one run (the machine is shared and noisy): the PP-OCRv4 page is sent
to a real ``edge serve`` process as a multipart file upload, and the same bytes go
through ``prepare``, ``Pipeline.run`` and ``finish`` in this process (its own workers).
Both sides call ``prepare`` as ``call_prepare`` does, offering it the pipeline's input
buffers (the page's detection input is written straight into shared memory), so the
difference is the HTTP layer's and not a copy one side makes and the other does not.
The two alternate request by request in pairs, the order swapped every pair (HTTP first,
then in-process first, ...), so that drift in the machine's load falls on both alike and
each pair of samples shares the machine's state. Then 4 clients at once upload pages to
the server (each request may wait for admission up to its deadline) for the throughput.

The last line is one JSON object with ``http_overhead_ms`` = HTTP p50 - in-process p50
(goal <= 2) and ``pages_per_s`` at 4 concurrent clients, and the spread of that
difference: ``paired_median_ms`` (the median of the per-pair differences, HTTP minus
in-process), its 95 % bootstrap interval ``paired_ci95_ms`` (2000 resamples of the pairs,
fixed seed) and interquartile range ``paired_iqr_ms``, with the p50s and the pair count.
An OCR request's model work varies by more than the HTTP layer costs, so the interval
says whether the figure is resolved: a 95 % interval wider than the goal is not. The
same comparison on a tiny echo stage (a 2x2 tensor as JSON against ``Pipeline.run``),
``echo_*``, is the cost of the HTTP layer alone.

Run: ``.venv/bin/python benchmarks/serve.py [--quick] [--pairs N] [--bundles DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from edge_core.config.transforms import call_prepare, resolve_input_transform
from edge_core.runtime.pipeline_files import open_pipeline

EDGE = str(Path(sys.executable).with_name("edge"))
# The echo comparison runs the echo test backend, here and in the edge serve it starts.
os.environ["EDGE_TEST_BACKENDS"] = "1"


def bundles(directory: Path | None) -> Path:
    """The OCR bundles (built into a temporary directory unless given)."""
    if directory is not None and (directory / "pipeline.toml").is_file():
        return directory
    from edge_ocr_example.bundle import build_bundles
    from edge_ocr_example.models import fetch_wheel

    out = Path(tempfile.mkdtemp(prefix="edge-serve-bench-")) / "bundles"
    build_bundles(out, wheel=fetch_wheel())
    return out


def start_server(pipeline: Path) -> tuple[subprocess.Popen[str], str]:
    """``edge serve`` on a free port; returns the process and its URL."""
    process = subprocess.Popen([EDGE, "serve", str(pipeline), "--port", "0"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        if "listening on " in line:
            url = line.split("listening on ", 1)[1].split()[0]
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return process, url
    raise SystemExit("edge serve did not start")


ECHO = """
name = "echo"
admission = 2

[[stages]]
id = "echo"

[stages.backend]
name = "echo"
"""


def paired(first: Any, second: Any, pairs: int) -> tuple[list[float], list[float]]:
    """Time ``first`` and ``second`` once per pair, alternating which goes first.

    Returns both sample lists in seconds; entry ``i`` of each belongs to pair ``i``.
    """
    a: list[float] = []
    b: list[float] = []
    for index in range(pairs):
        order = ((first, a), (second, b)) if index % 2 == 0 else ((second, b), (first, a))
        for run, into in order:
            started = time.perf_counter()
            run()
            into.append(time.perf_counter() - started)
    return a, b


def compare(a: list[float], b: list[float], *, resamples: int = 2000) -> dict[str, Any]:
    """``a`` against ``b`` (paired samples, seconds), in milliseconds.

    The difference of the p50s, the median of the paired differences with its 95 %
    bootstrap interval (the pairs resampled with a fixed seed) and interquartile range.
    """
    diffs = sorted((x - y) * 1e3 for x, y in zip(a, b, strict=True))
    quartiles = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else [diffs[0]] * 3
    rng = random.Random(20)
    medians = sorted(statistics.median(rng.choices(diffs, k=len(diffs)))
                     for _ in range(resamples))
    low, high = medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]
    p50_a, p50_b = statistics.median(a) * 1e3, statistics.median(b) * 1e3
    return {"overhead_ms": round(p50_a - p50_b, 3), "paired_median_ms": round(
        statistics.median(diffs), 3), "paired_ci95_ms": [round(low, 3), round(high, 3)],
        "paired_iqr_ms": [round(quartiles[0], 3), round(quartiles[2], 3)],
        "http_p50_ms": round(p50_a, 3), "in_process_p50_ms": round(p50_b, 3),
        "pairs": len(diffs)}


def echo_overhead(folder: Path, pairs: int) -> dict[str, Any]:
    """A 2x2 echo request over HTTP (JSON) against ``Pipeline.run``: :func:`compare`."""
    import base64

    import numpy as np

    path = folder / "echo-bench.toml"
    path.write_text(ECHO)
    x = np.ones((2, 2), dtype=np.float32)
    body = {"inputs": {"x": {"dtype": "float32", "shape": [2, 2],
                             "data": base64.b64encode(x.tobytes()).decode()}}}
    pipeline = open_pipeline(path)
    process, url = start_server(path)
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            def over_http() -> None:
                client.post("/v1/pipelines/echo/run", json=body).raise_for_status()

            def in_process() -> None:
                with pipeline.run({"x": x}) as result:
                    result.outputs["x"].tobytes()

            for _ in range(20):
                over_http()
                in_process()
            http_s, local_s = paired(over_http, in_process, pairs)
    finally:
        pipeline.close()
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    return compare(http_s, local_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--pairs", type=int, help="OCR pairs (default 200, quick 10); "
                        "the echo comparison takes 5 times as many")
    parser.add_argument("--bundles", type=Path, help="built OCR bundles (pipeline.toml)")
    args = parser.parse_args()
    pairs = args.pairs or (10 if args.quick else 200)
    pages = 16 if args.quick else 60
    directory = bundles(args.bundles)
    text = (directory / "pipeline.toml").read_text()
    served_toml = directory / "served-bench.toml"
    served_toml.write_text(text.replace('name = "ocr"\n', 'name = "ocr"\nadmission = 4\n', 1))
    image_path = directory / "image.png"
    image = image_path.read_bytes()

    pipeline = open_pipeline(directory / "pipeline.toml")
    process, url = start_server(served_toml)
    try:
        config = pipeline.config
        assert config.prepare is not None and config.finish is not None
        prepare = resolve_input_transform(config.prepare, "prepare")
        finish = resolve_input_transform(config.finish, "finish")
        folders = pipeline.bundle_directories()

        def in_process() -> Any:
            inputs = dict(call_prepare(prepare, str(image_path), pipeline))  # type: ignore[call-overload]
            with pipeline.run(inputs) as result:
                return finish(result.outputs, inputs, folders)

        files = {"file": ("image.png", image, "image/png")}
        with httpx.Client(base_url=url, timeout=120) as client:
            def over_http() -> Any:
                reply = client.post("/v1/pipelines/ocr/run", files=files)
                reply.raise_for_status()
                return reply.json()["answer"]

            assert over_http() == in_process()  # and warm both
            for _ in range(2):
                over_http()
                in_process()
            http_s, local_s = paired(over_http, in_process, pairs)

        codes: list[int] = []

        def client_loop(count: int) -> None:
            with httpx.Client(base_url=url, timeout=120) as client:
                for _ in range(count):
                    reply = client.post("/v1/pipelines/ocr/run", files=files,
                                        data={"deadline_s": "60"})
                    codes.append(reply.status_code)

        started = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(client_loop, [pages // 4] * 4))
        wall = time.perf_counter() - started
    finally:
        pipeline.close()
        process.send_signal(signal.SIGTERM)
        process.wait(120)
    echo = echo_overhead(directory, 5 * pairs)
    ocr = compare(http_s, local_s)
    ok = codes.count(200)
    summary = {
        "http_overhead_ms": ocr.pop("overhead_ms"),
        "pages_per_s": round(ok / wall, 2),
        **ocr,
        "echo_http_overhead_ms": echo.pop("overhead_ms"),
        **{f"echo_{key}": value for key, value in echo.items()},
        "concurrent_clients": 4,
        "pages_ok": ok,
        "pages_refused": len(codes) - ok,
        "server_exit": process.returncode,
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    for key, value in summary.items():
        print(f"{key:26s} {value}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
