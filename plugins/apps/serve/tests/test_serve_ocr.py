"""The PP-OCRv4 pipeline behind ``edge serve``: real models, real workers, real HTTP.

A page rendered here is uploaded as a file; the answer equals ``edge run``'s for the same
file. Each refusal (400, 413, 429, 504) is provoked, ``/metrics`` is read back with
prometheus_client's own parser, the page at ``/`` uploads an image in headless Chromium,
and 16 concurrent clients send 200 requests: each is answered (result or 429) and the
server leaves no process, segment or reservation after SIGTERM.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import EDGE, Served, running

from edge_contracts.heap import REST_S

pytestmark = pytest.mark.slow

MAX_BODY = 1 << 20


@pytest.fixture(scope="module")
def server(ocr_dir: Path) -> Iterator[Served]:
    # no admission queue: a burst beyond admission is refused at once (429)
    with running([ocr_dir / "served.toml"], "--max-body-bytes", str(MAX_BODY),
                  "--queue-length", "0") as served:
        yield served


@pytest.fixture(scope="module")
def edge_run_answer(ocr_dir: Path) -> list[dict[str, Any]]:
    """What ``edge run`` answers for the rendered page."""
    done = subprocess.run([EDGE, "run", str(ocr_dir / "pipeline.toml"), "--input",
                           str(ocr_dir / "page.png"), "--json"], capture_output=True, text=True,
                          check=True, timeout=300)
    (result,) = json.loads(done.stdout)["results"]  # one entry per --input
    answer: list[dict[str, Any]] = result["lines"]
    return answer


def _upload(client: httpx.Client, image: bytes, **data: str) -> httpx.Response:
    return client.post("/v1/pipelines/ocr/run", files={"file": ("page.png", image, "image/png")},
                       data=data)


def _wait_ready(client: httpx.Client, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while client.get("/health").status_code != 200:
        assert time.monotonic() < deadline, client.get("/health").text
        time.sleep(0.2)


def _error(reply: httpx.Response) -> dict[str, Any]:
    assert "Traceback" not in reply.text
    edge: dict[str, Any] = reply.json()["error"]["edge"]
    return edge


def test_the_text_of_a_rendered_page_equals_edge_runs(
        server: Served, ocr_dir: Path, edge_run_answer: list[dict[str, Any]]) -> None:
    image = (ocr_dir / "page.png").read_bytes()
    with httpx.Client(base_url=server.url, timeout=120) as client:
        reply = _upload(client, image)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert [line["text"] for line in body["answer"]] == ["Served over HTTP today",
                                                        "Total 12.75 for 3 pages"]
    assert body["answer"] == edge_run_answer
    assert set(body["latency_ms"]) == {"detect", "classify", "recognize"}


def test_refusals_400_413_429_504_and_metrics_parsed(server: Served, ocr_dir: Path) -> None:
    image = (ocr_dir / "page.png").read_bytes()
    with httpx.Client(base_url=server.url, timeout=120) as client:
        bad = _upload(client, b"this is not an image")
        assert bad.status_code == 400
        assert _error(bad)["field"] == "file" and "ImageInputError" in bad.text
        assert "/tmp" not in bad.text  # no server path in the answer

        large = _upload(client, image + b"\0" * MAX_BODY)
        assert large.status_code == 413 and _error(large)["field"] == "body"

        with ThreadPoolExecutor(8) as pool:  # admission 2: eight at once cannot all enter
            burst = list(pool.map(lambda _: _upload(client, image), range(8)))
        codes = Counter(r.status_code for r in burst)
        assert set(codes) <= {200, 429} and codes[200] >= 1 and codes[429] >= 1, codes
        refused = next(r for r in burst if r.status_code == 429)
        assert int(refused.headers["retry-after"]) >= 1

        late = _upload(client, image, deadline_s="0.001")
        assert late.status_code == 504 and _error(late)["field"] == "deadline_s"
        # A stage whose call overran the deadline was retired and restarts (served.toml
        # restarts on failure); wait until it serves again.
        _wait_ready(client)

        text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    outcomes = Counter()
    for sample in families["edge_requests"].samples:
        if sample.name == "edge_requests_total" and sample.labels["pipeline"] == "ocr":
            outcomes[sample.labels["outcome"]] += int(sample.value)
    assert outcomes["bad_request"] >= 1 and outcomes["too_large"] >= 1
    assert outcomes["refused"] == codes[429] and outcomes["deadline"] >= 1
    refusals = families["edge_admission_refusals"].samples
    assert sum(s.value for s in refusals if s.name.endswith("_total")) == codes[429]
    stage_counts = {s.labels["stage"]: s.value for s in families["edge_stage_seconds"].samples
                    if s.name == "edge_stage_seconds_count"}
    assert set(stage_counts) == {"detect", "classify", "recognize"}
    assert min(stage_counts.values()) >= codes[200]
    capacity = {s.labels["pool"]: s.value
                for s in families["edge_ledger_capacity_bytes"].samples}
    reserved = {s.labels["pool"]: s.value
                for s in families["edge_ledger_reserved_bytes"].samples}
    assert 0 < reserved["machine:ram"] <= capacity["machine:ram"]


def test_the_page_uploads_an_image_in_headless_chromium(server: Served, ocr_dir: Path,
                                                        tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (make test installs Debian's chromium)")
    image = base64.b64encode((ocr_dir / "page.png").read_bytes()).decode()
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=60000"]
    dom = subprocess.run([*flags, "--dump-dom", f"{server.url}/#image=data:image/png;base64,"
                          f"{image}"], capture_output=True, text=True, timeout=180,
                         check=True).stdout
    status = dom[dom.find('<body'):dom.find('<form')] + dom[dom.find('<div id="status"'):
                                                          dom.find('<ol id="lines"')]
    assert 'data-state="answered"' in dom, status
    assert ('<li class="line">Served over HTTP today</li>'
            '<li class="line">Total 12.75 for 3 pages</li>') in dom


def test_the_serving_controller_imports_no_onnxruntime_and_stays_lean(
        server: Served, ocr_dir: Path) -> None:
    """After the requests: no onnxruntime mapped in the controller; at rest, USS <= 80 MiB."""
    image = (ocr_dir / "page.png").read_bytes()
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for _ in range(3):
            assert _upload(client, image).status_code == 200
        health = client.get("/health").json()
    pid = server.process.pid
    with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
        assert "onnxruntime" not in maps.read()  # only the workers load it
    deadline = time.monotonic() + REST_S + 10  # the heap is given back once at rest
    while (uss := psutil.Process(pid).memory_full_info().uss) > 80 * 1024 * 1024:
        assert time.monotonic() < deadline, f"controller USS {uss / 2**20:.1f} MiB at rest"
        time.sleep(0.5)
    assert health["memory_over_demand"] == []  # every stage within its declared demand


def test_16_clients_200_requests_each_answered_and_nothing_left(ocr_dir: Path) -> None:
    image = (ocr_dir / "page.png").read_bytes()
    codes: Counter[int] = Counter()
    lock = threading.Lock()
    texts: set[tuple[str, ...]] = set()

    def client_loop(count: int, url: str) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            for _ in range(count):
                reply = _upload(client, image)
                with lock:
                    codes[reply.status_code] += 1
                    if reply.status_code == 200:
                        texts.add(tuple(line["text"] for line in reply.json()["answer"]))
                    elif reply.status_code == 429:
                        assert int(reply.headers["retry-after"]) >= 1

    # A short queue: beyond admission and 4 waiting, requests are refused at once, so the
    # 200 requests are answered and refused together under 16-way concurrency.
    with running([ocr_dir / "served.toml"], "--queue-length", "4") as served:
        per_client = [200 // 16 + (1 if i < 200 % 16 else 0) for i in range(16)]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(client_loop, per_client, [served.url] * 16))
        served.record_tree()
        assert len(served.tree) >= 4  # the server and its three stage workers
        # large tensors went through shared memory (named segments are checked gone after)
        assert served.segments or served.memfds
    assert sum(codes.values()) == 200
    assert set(codes) == {200, 429}, codes
    assert codes[200] >= 2, codes
    assert texts == {("Served over HTTP today", "Total 12.75 for 3 pages")}
    print(f"16 clients, 200 requests: {dict(codes)}", file=sys.stderr)
