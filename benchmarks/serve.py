"""HTTP overhead of ``edge serve``: over a bare Starlette app on uvicorn, and on an OCR page.

**The HTTP layer alone** (the goal): in this one run, paired sample by sample (the order
rotating every pair, so the shared machine's drift falls on all alike), four timings:

* ``edge_http``: a 2x2 float32 tensor as JSON (base64) to ``edge serve`` of a one-stage
  echo pipeline, answered as JSON;
* ``edge_direct``: the same tensor through ``Pipeline.run`` of the same pipeline opened
  in this process (its own echo worker), outputs read;
* ``bare_http``: the same request body to a bare Starlette app on uvicorn (a process of
  its own, started as ``edge serve`` starts uvicorn: httptools, no access log, TCP_NODELAY)
  whose one route reads the body and returns the bytes ``edge serve`` answered;
* ``bare_direct``: a direct call of a function returning those bytes.

``http_overhead_over_bare_asgi`` = median(``edge_http - edge_direct``) ÷
median(``bare_http - bare_direct``), each a median of paired differences (goal <= 1.5):
what ``edge serve`` adds to a request over what any Python web app on the same stack
adds. The paired samples are printed (microseconds, one pair a row), and the medians'
95 % bootstrap intervals (2000 resamples of the pairs, fixed seed) beside.

**One OCR page**: the page pipeline's demo page (``make demo``'s ``build/ocr``, or bundles
built into a temporary directory) uploaded as a multipart file to ``edge serve`` against
the same bytes through ``prepare``, ``Pipeline.run`` and ``finish`` in this process; both
offer ``prepare`` the pipeline's input buffers (as ``call_prepare`` does), so the
difference is the HTTP layer's. ``ocr_paired_median_ms`` and ``ocr_paired_ci95_ms`` are
the paired difference's median and its 95 % interval; a page's model work varies by more
than HTTP costs, so the interval says whether the figure is resolved. Throughput under
concurrency is ``benchmarks/ocr_throughput.py``'s.

Run: ``.venv/bin/python benchmarks/serve.py [--quick] [--pairs N] [--bundles DIR]``. The
last line is one JSON object.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from edge_core.config.transforms import call_prepare, resolve_input_transform
from edge_core.identity import host_identity
from edge_core.runtime.pipeline_files import open_pipeline

EDGE = str(Path(sys.executable).with_name("edge"))
# The echo comparison runs the echo test backend, here and in the edge serve it starts.
os.environ["EDGE_TEST_BACKENDS"] = "1"


def bundles(directory: Path | None) -> Path:
    """The page pipeline's bundles (built into a temporary directory unless given)."""
    if directory is not None and (directory / "pipeline.toml").is_file():
        return directory
    from edge_ocr_example.page_bundle import build_page_bundles

    out = Path(tempfile.mkdtemp(prefix="edge-serve-bench-")) / "ocr"
    build_page_bundles(out)
    return out


def start_server(pipeline: Path | None, *, bare: Path | None = None,
                 ) -> tuple[subprocess.Popen[str], str]:
    """``edge serve`` (or the bare app, answering ``bare``'s bytes) on a free port."""
    command = [EDGE, "serve", str(pipeline), "--port", "0"] if bare is None else \
        [sys.executable, __file__, "--bare-server", str(bare)]
    process = subprocess.Popen(command,
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


def paired(calls: list[Callable[[], Any]], pairs: int) -> list[list[float]]:
    """Time every call once per pair, the order rotating from pair to pair.

    Returns one sample list (seconds) per call; entry ``i`` of each belongs to pair ``i``.
    """
    samples: list[list[float]] = [[] for _ in calls]
    for index in range(pairs):
        shift = index % len(calls)
        for position in list(range(shift, len(calls))) + list(range(shift)):
            started = time.perf_counter()
            calls[position]()
            samples[position].append(time.perf_counter() - started)
    return samples


def median_ci(values: list[float], *, resamples: int = 2000) -> tuple[float, float, float]:
    """The median of ``values`` and its 95 % bootstrap interval (fixed seed)."""
    rng = random.Random(20)
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(resamples))
    return (statistics.median(values), medians[int(0.025 * resamples)],
            medians[int(0.975 * resamples) - 1])


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


def bare_server(answer_file: Path) -> int:
    """A bare Starlette app on uvicorn, as ``edge serve`` runs it, answering fixed bytes."""
    import socket

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    answer = answer_file.read_bytes()

    async def run(request: Request) -> Response:
        await request.body()
        return Response(answer, media_type="application/json")

    app = Starlette(routes=[Route("/v1/pipelines/echo/run", run, methods=["POST"])])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    print(f"bare: listening on http://127.0.0.1:{sock.getsockname()[1]}", file=sys.stderr,
          flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def over_bare_asgi(folder: Path, pairs: int) -> dict[str, Any]:
    """The echo request four ways (:func:`paired`); the ratio of the added times."""
    import base64

    import numpy as np

    path = folder / "echo-bench.toml"
    path.write_text(ECHO)
    x = np.ones((2, 2), dtype=np.float32)
    body = json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [2, 2],
                                        "data": base64.b64encode(x.tobytes()).decode()}}}
                      ).encode()
    headers = {"content-type": "application/json"}
    pipeline = open_pipeline(path)
    edge, edge_url = start_server(path)
    bare: subprocess.Popen[str] | None = None
    try:
        with httpx.Client(base_url=edge_url, timeout=60) as client:
            answer = client.post("/v1/pipelines/echo/run", content=body, headers=headers)
            answer.raise_for_status()
            answer_file = folder / "echo-answer.json"
            answer_file.write_bytes(answer.content)
            bare, bare_url = start_server(None, bare=answer_file)
            with httpx.Client(base_url=bare_url, timeout=60) as bare_client:
                def edge_http() -> None:
                    client.post("/v1/pipelines/echo/run", content=body,
                                headers=headers).raise_for_status()

                def edge_direct() -> None:
                    with pipeline.run({"x": x}) as result:
                        result.outputs["x"].tobytes()

                def bare_http() -> None:
                    bare_client.post("/v1/pipelines/echo/run", content=body,
                                     headers=headers).raise_for_status()

                content = answer_file.read_bytes()

                def bare_direct() -> bytes:
                    return bytes(content)

                calls = [edge_http, edge_direct, bare_http, bare_direct]
                for _ in range(30):  # warm every path
                    for call in calls:
                        call()
                samples = paired(calls, pairs)
    finally:
        pipeline.close()
        for process in (edge, bare):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
    edge_http_s, edge_direct_s, bare_http_s, bare_direct_s = samples
    print("pair  edge_http_us edge_direct_us bare_http_us bare_direct_us  (paired samples)",
          file=sys.stderr)
    for index, row in enumerate(zip(*samples, strict=True)):
        print(f"{index:4d}  " + " ".join(f"{value * 1e6:14.1f}" for value in row),
              file=sys.stderr)
    edge_added = [(a - b) * 1e3 for a, b in zip(edge_http_s, edge_direct_s, strict=True)]
    bare_added = [(a - b) * 1e3 for a, b in zip(bare_http_s, bare_direct_s, strict=True)]
    edge_median, edge_low, edge_high = median_ci(edge_added)
    bare_median, bare_low, bare_high = median_ci(bare_added)
    return {
        "http_overhead_over_bare_asgi": round(edge_median / bare_median, 3),
        "edge_added_ms": round(edge_median, 4),
        "edge_added_ci95_ms": [round(edge_low, 4), round(edge_high, 4)],
        "bare_asgi_added_ms": round(bare_median, 4),
        "bare_asgi_added_ci95_ms": [round(bare_low, 4), round(bare_high, 4)],
        "edge_http_p50_ms": round(statistics.median(edge_http_s) * 1e3, 4),
        "edge_direct_p50_ms": round(statistics.median(edge_direct_s) * 1e3, 4),
        "bare_http_p50_ms": round(statistics.median(bare_http_s) * 1e3, 4),
        "bare_direct_p50_ms": round(statistics.median(bare_direct_s) * 1e3, 4),
        "echo_pairs": pairs,
    }


def ocr_page(directory: Path, pairs: int) -> dict[str, Any]:
    """The demo page over HTTP against in-process, paired (:func:`compare`)."""
    pipeline_file = directory / "pipeline.toml"
    image_path = directory / "page.png"
    image = image_path.read_bytes()
    pipeline = open_pipeline(pipeline_file)
    process, url = start_server(pipeline_file)
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

        files = {"file": ("page.png", image, "image/png")}
        with httpx.Client(base_url=url, timeout=120) as client:
            def over_http() -> Any:
                reply = client.post(f"/v1/pipelines/{config.name}/run", files=files)
                reply.raise_for_status()
                return reply.json()["answer"]

            assert over_http() == in_process()  # and warm both
            for _ in range(2):
                over_http()
                in_process()
            http_s, local_s = paired([over_http, in_process], pairs)
    finally:
        pipeline.close()
        process.send_signal(signal.SIGTERM)
        process.wait(120)
    return compare(http_s, local_s)


def main() -> int:
    """Both comparisons; one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--pairs", type=int, help="OCR pairs (default 100, quick 10); "
                        "the echo comparison takes 10 times as many")
    parser.add_argument("--bundles", type=Path, help="built page bundles (make demo: build/ocr)")
    parser.add_argument("--http-only", action="store_true",
                        help="only the comparison with the bare app (no OCR page)")
    parser.add_argument("--bare-server", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server is not None:
        return bare_server(args.bare_server)
    pairs = args.pairs or (10 if args.quick else 100)
    load = [round(x, 2) for x in os.getloadavg()]
    folder = Path(tempfile.mkdtemp(prefix="edge-serve-bench-"))
    http = over_bare_asgi(folder, 10 * pairs)
    ocr = {} if args.http_only else ocr_page(bundles(args.bundles), pairs)
    summary = {
        **http,
        **({"ocr_http_overhead_ms": ocr.pop("overhead_ms")} if ocr else {}),
        **{f"ocr_{key}": value for key, value in ocr.items()},
        "cpus": os.cpu_count(),
        "load_average": load,
        "machine": host_identity(),
    }
    for key, value in summary.items():
        print(f"{key:30s} {value}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
