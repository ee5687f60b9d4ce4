"""HTTP overhead of ``edge serve`` on the OCR pipeline, and its throughput.

Side by side in this one run (the machine is shared and noisy): the PP-OCRv4 page is sent
to a real ``edge serve`` process as a multipart file upload, and the same bytes go
through ``prepare``, ``Pipeline.run`` and ``finish`` in this process (its own workers), in
alternating blocks. Then 4 clients at once upload pages to the server (each request may
wait for admission up to its deadline) for the throughput.

The last line is one JSON object with ``http_overhead_ms`` = HTTP p50 - in-process p50
(goal <= 2) and ``pages_per_s`` at 4 concurrent clients, plus the p50s and sample counts.
An OCR request takes ~100 ms of model work whose noise on a shared machine is larger than
the overhead itself, so the same comparison is also made on a tiny echo stage (a 2x2
tensor as JSON against ``Pipeline.run``): ``echo_http_overhead_ms``, the cost of the HTTP
layer alone.

Run: ``.venv/bin/python benchmarks/serve.py [--quick] [--bundles DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
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

from edge_core.config.transforms import resolve_input_transform
from edge_core.runtime.opening import open_pipeline

EDGE = str(Path(sys.executable).with_name("edge"))


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


def interleave(first: Any, second: Any, blocks: int, per_block: int
               ) -> tuple[list[float], list[float]]:
    """Time ``first`` and ``second`` in alternating blocks; both sample lists."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(blocks):
        for run, into in ((first, a), (second, b)):
            for _ in range(per_block):
                started = time.perf_counter()
                run()
                into.append(time.perf_counter() - started)
    return a, b


def echo_overhead(folder: Path, blocks: int, per_block: int) -> tuple[float, float]:
    """p50 of a 2x2 echo request over HTTP (JSON) and through ``Pipeline.run``, in ms."""
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
            http_s, local_s = interleave(over_http, in_process, blocks, per_block)
    finally:
        pipeline.close()
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    return statistics.median(http_s) * 1e3, statistics.median(local_s) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--bundles", type=Path, help="built OCR bundles (pipeline.toml)")
    args = parser.parse_args()
    blocks, per_block, pages = (3, 5, 16) if args.quick else (8, 10, 60)
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
            inputs = dict(prepare(str(image_path)))  # type: ignore[call-overload]
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
            http_s, local_s = interleave(over_http, in_process, blocks, per_block)

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
    echo_http, echo_local = echo_overhead(directory, blocks, 4 * per_block)
    http_p50 = statistics.median(http_s) * 1e3
    local_p50 = statistics.median(local_s) * 1e3
    ok = codes.count(200)
    summary = {
        "http_overhead_ms": round(http_p50 - local_p50, 3),
        "pages_per_s": round(ok / wall, 2),
        "http_p50_ms": round(http_p50, 3),
        "in_process_p50_ms": round(local_p50, 3),
        "samples_each": len(http_s),
        "echo_http_overhead_ms": round(echo_http - echo_local, 3),
        "echo_http_p50_ms": round(echo_http, 3),
        "echo_in_process_p50_ms": round(echo_local, 3),
        "blocks": blocks,
        "concurrent_clients": 4,
        "pages_ok": ok,
        "pages_refused": len(codes) - ok,
        "server_exit": process.returncode,
        "cpus": os.cpu_count(),
    }
    for key, value in summary.items():
        print(f"{key:20s} {value}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
