"""Memory of the OCR page pipeline: ``edge run``, ``edge serve`` and RapidOCR, same pages.

One run, side by side. The pages are generated pages of varied size and content
(:func:`edge_ocr_example.pages.generate_pages`, the accuracy benchmark's generator and
seed: 90 to 2400 pixels a side, 1 to 30 lines) plus the demo page, saved as files:

* **peer**: RapidOCR (``rapidocr_onnxruntime``, the same PP-OCRv4 graphs and the same
  onnxruntime) reads every page once in a process of its own;
* **run**: ``edge run PIPELINE --input DIR --jsonl`` reads them: its controller, the
  stage workers and every process of their trees;
* **serve**: one ``edge serve`` per configuration (below), all open at once; every page
  is uploaded once to each (the warm-up pass). Then ``--rounds`` rounds of blocks: each
  configuration reads the whole page set back to back (a busy server), the order of the
  configurations rotated from round to round; after its last block each tree is measured
  (memory while busy). Then ``--sparse-rounds`` rounds with the configurations
  interleaved page by page: each server rests while the others work, so these are the
  requests that come after a rest. Then every server is left alone for ``REST_WAIT_S``
  and measured again (memory at rest), and ``/health`` gives the stage checks.

Configurations (``EDGE_HEAP``, the heap policy of every process: :mod:`edge_contracts.heap`;
and ONNX Runtime's CPU arena in every stage's worker):

==================  =========  ============================================================
``default``         ``rest``   the pipeline as built, no option set, ``EDGE_HEAP`` unset:
                               the arena on, shrunk once the worker rests; every heap
                               trimmed once its process rests
``today``           ``off``    the arena on, never shrunk (ONNX Runtime's defaults), glibc's
                               own heap policy: what edge-core did before this benchmark
``arena-never``     ``rest``   the arena never shrunk; heaps trimmed at rest
``every-call``      ``eager``  the arena shrunk after every call; large blocks unmapped at
                               once (every request pays for fresh pages)
``arena-same``      ``rest``   the arena growing by what is requested, shrunk at rest
``no-arena``        ``rest``   the arena off; heaps trimmed at rest
``no-arena-eager``  ``eager``  the arena off; large blocks unmapped at once
==================  =========  ============================================================

Measured per process: USS (what the process alone holds: its private pages), PSS and RSS
from ``/proc/PID/smaps``; a tree's USS adds, once, the resident pages of edge-core's
shared-memory segments that two of its processes map (such pages are private to neither,
so USS alone would miss them). ``run`` and ``peer`` are also sampled every
``--interval`` seconds while they read (USS from ``smaps_rollup``, so segments mapped
twice are missed there) for their peaks. The stage check is the runtime's own
(``/health``'s ``memory``: each stage's peak resident set since it started, summed over
its worker's tree, against its declared demand).

The last line is one JSON object:

* ``serve_tree_uss_over_rapidocr``: the ``default`` server's tree USS at rest after the
  requests / RapidOCR's USS after the same pages (goal <= 1.0); ``..._busy_...``: the same
  with the tree measured right after its last busy block;
* ``run_tree_uss_over_rapidocr``: the peak of ``edge run``'s sampled tree USS / RapidOCR's
  sampled peak (goal <= 1.0), with ``run_p50_s`` (median time between two of its answers)
  and ``rapidocr_p50_s`` (RapidOCR's median page) beside it;
* ``controller_uss_mib``: the ``default`` server's controller at rest after the requests
  (goal <= 80), and ``controller_uss_busy_mib``;
* ``peak_over_demand``: per stage of the ``default`` server (goal <= 1.0 each);
* ``warm_p50_over_today``: the ``default`` server's busy p50 against ``today``'s (goal
  <= 1.10: the page pipeline's warm p50 within 10 % of today's), and
  ``sparse_p50_over_today`` for requests after a rest;
* ``configs``: per configuration its trees (busy, at rest), controller and workers, stage
  checks, ``warm_p50_s`` and ``p50_over_today`` (median of the per-page, per-round ratios
  against ``today``, with a 95 % bootstrap interval), the same for the sparse requests,
  and ``cpu_s_per_request`` per process (user + system CPU seconds per busy request),
  which says where a difference comes from.

Run: ``.venv/bin/python benchmarks/memory.py [--pages 12] [--rounds 3] [--sparse-rounds 1]
[--configs a,b] [--bundles DIR]``; ``--quick`` is a smoke run (4 pages, one round of each,
two configurations).
"""

from __future__ import annotations

import argparse
import itertools
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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil

from edge_contracts.heap import REST_S

MIB = 1024 * 1024
EDGE = str(Path(sys.executable).with_name("edge"))
SEED = 17

#: name -> (EDGE_HEAP or None for unset, ORT options for every stage or None for none)
CONFIGS: dict[str, tuple[str | None, dict[str, Any] | None]] = {
    "default": (None, None),
    "today": ("off", {"cpu_mem_arena": True, "arena_shrinkage": "never"}),
    "arena-never": ("rest", {"arena_shrinkage": "never"}),
    "every-call": ("eager", {"arena_shrinkage": "every-call"}),
    "arena-same": ("rest", {"arena_extend_strategy": "same_as_requested"}),
    "no-arena": ("rest", {"cpu_mem_arena": False}),
    "no-arena-eager": ("eager", {"cpu_mem_arena": False}),
}
REST_WAIT_S = REST_S + 3.0
"""How long the servers are left alone before the memory at rest is measured."""
ANCHOR = "today"


# -- measuring processes ----------------------------------------------------------------------

def _shm_mapping(path: str) -> bool:
    """A mapping of a shared-memory segment (POSIX shm or a memfd)."""
    return path.startswith(("/dev/shm/", "/memfd:"))


def read_smaps(pid: int) -> dict[str, Any]:
    """USS, PSS, RSS (bytes) of one process, and its shared segments' resident bytes.

    ``shm_shared`` maps each shared-memory segment the process maps to the bytes of it
    that are resident and shared with another process.
    """
    uss = pss = rss = 0
    shared: dict[str, int] = {}
    mapping = ""
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as smaps:
        for line in smaps:
            head, _, rest = line.partition(":")
            if " " in head:  # a mapping's first line: "start-end perms offset dev:ino ino path"
                parts = line.split(None, 5)
                mapping = parts[5].strip() if len(parts) > 5 else ""
                continue
            value = rest.split()
            if not value or not value[0].isdigit():
                continue
            size = int(value[0]) * 1024
            if head in ("Private_Clean", "Private_Dirty"):
                uss += size
            elif head == "Pss":
                pss += size
            elif head == "Rss":
                rss += size
            elif head in ("Shared_Clean", "Shared_Dirty") and _shm_mapping(mapping) and size:
                key = mapping.removesuffix(" (deleted)")
                shared[key] = shared.get(key, 0) + size
    return {"uss": uss, "pss": pss, "rss": rss, "shm_shared": shared}


def rollup_uss(pid: int) -> int:
    """A process's USS from ``smaps_rollup`` (cheap enough to sample)."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
        for line in rollup:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def peak_rss(pid: int) -> int:
    """A process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def tree(pid: int) -> list[psutil.Process]:
    """A process and its descendants (empty when it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def role_of(process: psutil.Process, root: int, workers: Mapping[int, str]) -> str:
    """``controller`` (the tree's root: RapidOCR's own process for the peer),
    ``worker:<stage>``, ``supervisor``, ``zygote`` (the warm pool's), or ``worker`` /
    ``child``."""
    if process.pid == root:
        return "controller"
    if process.pid in workers:
        return f"worker:{workers[process.pid]}"
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return "gone"
    if "supervisor.py" in command:
        return "supervisor"
    if "edge_core.host.zygote" in command:  # the warm pool's: it, and what it forked
        if process.ppid() == root:
            return "zygote"
        return "supervisor" if os.getsid(process.pid) == process.pid else "worker"
    return "worker" if "edge_contracts" in command or "import sys" in command else "child"


def cpu_seconds(root: int, workers: Mapping[int, str]) -> dict[str, float]:
    """CPU time (user + system) used so far by each process of ``root``'s tree, by role."""
    found: dict[str, float] = {}
    for process in tree(root):
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        role = role_of(process, root, workers)
        found[role] = found.get(role, 0.0) + times.user + times.system
    return found


def snapshot(root: int, workers: Mapping[int, str] | None = None) -> dict[str, Any]:
    """Every process of ``root``'s tree: role, USS, PSS, RSS, peak RSS; the tree's sums.

    ``tree_uss_mib`` adds, once per segment, the shared-memory pages two processes of the
    tree map (USS leaves them out of both).
    """
    rows = []
    segments: dict[str, int] = {}
    for process in tree(root):
        try:
            found = read_smaps(process.pid)
            hwm = peak_rss(process.pid)
        except OSError:
            continue
        for name, size in found["shm_shared"].items():
            segments[name] = max(segments.get(name, 0), size)
        rows.append({"role": role_of(process, root, workers or {}),
                     "uss_mib": round(found["uss"] / MIB, 1),
                     "pss_mib": round(found["pss"] / MIB, 1),
                     "rss_mib": round(found["rss"] / MIB, 1),
                     "peak_rss_mib": round(hwm / MIB, 1)})
    shm = sum(segments.values()) / MIB
    return {"processes": rows,
            "tree_uss_mib": round(sum(r["uss_mib"] for r in rows) + shm, 1),
            "tree_pss_mib": round(sum(r["pss_mib"] for r in rows), 1),
            "tree_rss_mib": round(sum(r["rss_mib"] for r in rows), 1),
            "shared_segments_mib": round(shm, 1)}


class Sampler:
    """Samples a process tree's USS every ``interval`` seconds; keeps the peaks."""

    def __init__(self, root: int, interval: float) -> None:
        self.root = root
        self.interval = interval
        self.peak_tree = 0
        self.peak_by_pid: dict[int, int] = {}
        self.role_by_pid: dict[int, str] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for process in tree(self.root):
                try:
                    uss = rollup_uss(process.pid)
                except OSError:
                    continue
                total += uss
                self.peak_by_pid[process.pid] = max(self.peak_by_pid.get(process.pid, 0), uss)
                if process.pid not in self.role_by_pid:
                    self.role_by_pid[process.pid] = role_of(process, self.root, {})
            self.peak_tree = max(self.peak_tree, total)
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def to_json(self) -> dict[str, Any]:
        """Peaks in MiB and the number of samples."""
        return {"peak_tree_uss_mib": round(self.peak_tree / MIB, 1),
                "peak_uss_mib": sorted(
                    ([self.role_by_pid.get(pid, "?"), round(v / MIB, 1)]
                     for pid, v in self.peak_by_pid.items()), key=lambda row: -row[1]),
                "samples": self.samples}


# -- inputs -----------------------------------------------------------------------------------

def make_pages(folder: Path, count: int) -> list[Path]:
    """``count`` generated pages and the demo page, saved in ``folder``; their paths."""
    from edge_ocr_example.pages import demo_page, generate_pages

    folder.mkdir(parents=True, exist_ok=True)
    files = [page.save(folder) for page in generate_pages(count, SEED)]
    image, _ = demo_page()
    demo = folder / "zz-demo.png"
    image.save(demo)
    return [*files, demo]


def page_sizes(files: Sequence[Path]) -> list[list[int]]:
    """``[width, height]`` of every page."""
    from PIL import Image

    sizes = []
    for file in files:
        with Image.open(file) as image:
            sizes.append(list(image.size))
    return sizes


def bundles(directory: Path | None, scratch: Path) -> Path:
    """The page pipeline's bundles (built into ``scratch`` unless given)."""
    if directory is not None and (directory / "pipeline.toml").is_file():
        return directory
    from edge_ocr_example.page_bundle import build_page_bundles

    out = scratch / "bundles"
    build_page_bundles(out)
    return out


def variant(directory: Path, name: str, options: Mapping[str, Any] | None) -> Path:
    """``pipeline.toml`` with ``options`` in every stage's ``[stages.backend.options]``."""
    text = (directory / "pipeline.toml").read_text()
    if options:
        body = "".join(f"{key} = {json.dumps(value)}\n" for key, value in options.items())
        text = text.replace('[stages.backend]\nname = "ort-cpu"\n',
                            f'[stages.backend]\nname = "ort-cpu"\n\n'
                            f"[stages.backend.options]\n{body}")
    path = directory / f"pipeline-memory-{name}.toml"
    path.write_text(text)
    return path


def environment(heap: str | None) -> dict[str, str]:
    """This process's environment with ``EDGE_HEAP`` set (or removed for ``None``)."""
    env = {k: v for k, v in os.environ.items() if k != "EDGE_HEAP"}
    if heap is not None:
        env["EDGE_HEAP"] = heap
    return env


# -- the peer ---------------------------------------------------------------------------------

def peer_child(files: Sequence[str]) -> int:
    """In the peer's own process: read every page, one JSON line each, then wait."""
    from rapidocr_onnxruntime import RapidOCR

    engine = RapidOCR()
    for file in files:
        started = time.perf_counter()
        result, _ = engine(file)
        print(json.dumps({"file": file, "s": time.perf_counter() - started,
                          "lines": len(result or [])}), flush=True)
    print("done", flush=True)
    sys.stdin.readline()  # the parent measures now
    return 0


def measure_peer(files: Sequence[Path], interval: float) -> dict[str, Any]:
    """RapidOCR in a process of its own: sampled peak, and USS after the last page."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--peer-child", *map(str, files)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdin is not None
    times: list[float] = []
    with Sampler(process.pid, interval) as sampler:
        for line in process.stdout:
            if line.strip() == "done":
                break
            times.append(json.loads(line)["s"])
        after = snapshot(process.pid)
    process.stdin.close()
    process.wait(60)
    row = after["processes"][0]
    return {"uss_mib": after["tree_uss_mib"], "rss_mib": row["rss_mib"],
            "peak_rss_mib": row["peak_rss_mib"], **sampler.to_json(),
            "p50_s": round(statistics.median(times), 3), "pages": len(times)}


# -- edge run ---------------------------------------------------------------------------------

def measure_run(pipeline: Path, folder: Path, count: int, heap: str | None,
                interval: float) -> dict[str, Any]:
    """``edge run --input DIR --jsonl``: sampled peak; the tree as the last answer came."""
    started = time.perf_counter()
    process = subprocess.Popen([EDGE, "run", str(pipeline), "--input", str(folder), "--jsonl"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=environment(heap))
    assert process.stdout is not None and process.stderr is not None
    stamps: list[float] = []
    last: dict[str, Any] | None = None
    with Sampler(process.pid, interval) as sampler:
        for _ in process.stdout:
            stamps.append(time.perf_counter())
            if len(stamps) == count:
                last = snapshot(process.pid)  # before it closes (best effort)
        error = process.stderr.read()
        code = process.wait(120)
    if code != 0:
        raise SystemExit(f"edge run failed ({code}): {error[-2000:]}")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {**sampler.to_json(), "at_last_answer": last, "pages": len(stamps),
            "wall_s": round(time.perf_counter() - started, 1),
            "p50_s_between_answers": round(statistics.median(gaps), 3) if gaps else None}


# -- edge serve -------------------------------------------------------------------------------

class Server:
    """One ``edge serve`` process for one configuration."""

    def __init__(self, name: str, pipeline: Path, heap: str | None) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [EDGE, "serve", str(pipeline), "--port", "0"], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=environment(heap))
        self.url = ""
        self.client: httpx.Client | None = None
        self.times: list[tuple[str, int, int, float]] = []  # (phase, round, page, seconds)

    def wait_listening(self) -> None:
        """Block until it prints its address."""
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if "listening on " in line:
                self.url = line.split("listening on ", 1)[1].split()[0]
                threading.Thread(target=self.process.stderr.read, daemon=True).start()
                self.client = httpx.Client(base_url=self.url, timeout=600)
                return
        raise SystemExit(f"edge serve ({self.name}) did not start")

    def read(self, file: Path) -> float:
        """Upload one page; the request's wall time."""
        assert self.client is not None
        started = time.perf_counter()
        reply = self.client.post("/v1/pipelines/ocr-page/run",
                                 files={"file": (file.name, file.read_bytes())})
        elapsed = time.perf_counter() - started
        reply.raise_for_status()
        return elapsed

    def workers(self) -> dict[int, str]:
        """Worker pid -> stage id, from the execution plan."""
        assert self.client is not None
        plan = self.client.get("/v1/pipelines/ocr-page").json()["plan"]
        return {int(s["worker"]["pid"]): s["id"] for s in plan["stages"] if s.get("worker")}

    def settings(self) -> dict[str, str]:
        """What each stage's worker reports of its memory settings (heap, arena)."""
        assert self.client is not None
        plan = self.client.get("/v1/pipelines/ocr-page").json()["plan"]
        found = {}
        for stage in plan["stages"]:
            memory = (stage.get("worker") or {}).get("load", {}).get("memory") or {}
            found[stage["id"]] = (f"heap {memory.get('heap', {}).get('policy')}, arena "
                                  f"{memory.get('cpu_mem_arena')}, shrinkage "
                                  f"{memory.get('arena_shrinkage')}, extend "
                                  f"{memory.get('arena_extend_strategy')}")
        return found

    def health(self) -> dict[str, Any]:
        """``/health``."""
        assert self.client is not None
        return dict(self.client.get("/health").json())

    def stop(self) -> None:
        """SIGINT, then wait for the pipelines to close."""
        if self.client is not None:
            self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.process.kill()


@contextmanager
def servers(directory: Path, names: Sequence[str]) -> Iterator[list[Server]]:
    """One server per configuration, all open at once; stopped at the end."""
    started = [Server(name, variant(directory, name, CONFIGS[name][1]), CONFIGS[name][0])
               for name in names]
    try:
        for server in started:
            server.wait_listening()
        yield started
    finally:
        for server in started:
            server.stop()


def ratio_interval(ratios: Sequence[float], resamples: int = 2000) -> list[float]:
    """95 % bootstrap interval of the median of ``ratios`` (fixed seed)."""
    rng = random.Random(SEED)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(resamples))
    return [round(medians[int(0.025 * resamples)], 3),
            round(medians[int(0.975 * resamples) - 1], 3)]


def _ratios(server: Server, base: Mapping[tuple[str, int, int], float],
            phase: str) -> list[float]:
    return [t / base[(phase, r, i)] for ph, r, i, t in server.times
            if ph == phase and (phase, r, i) in base]


def measure_serve(directory: Path, files: Sequence[Path], names: Sequence[str],
                  rounds: int, sparse_rounds: int) -> dict[str, Any]:
    """Every configuration's server: warm-up pass, timed rounds, then memory and checks.

    ``rounds`` of blocks (each configuration reads every page back to back; the order of
    the configurations rotates from round to round): the warm p50 of a busy server, and
    after its last block each tree's memory while busy. Then ``sparse_rounds`` with the
    configurations interleaved page by page (each server rests while the others work):
    the p50 of requests that come after a rest. Then, once every server has rested
    (``REST_WAIT_S``), the memory at rest and ``/health``'s stage checks.
    """
    results: dict[str, Any] = {}
    with servers(directory, names) as started:
        roles = {s.name: s.workers() for s in started}
        opened = {s.name: snapshot(s.process.pid, roles[s.name]) for s in started}
        for server in started:  # the warm-up pass: every shape seen once
            for file in files:
                server.read(file)
        cpu_before = {s.name: cpu_seconds(s.process.pid, roles[s.name]) for s in started}
        busy: dict[str, dict[str, Any]] = {}
        for number in range(rounds):
            shift = number % len(started)
            for server in [*started[shift:], *started[:shift]]:
                for index, file in enumerate(files):
                    server.times.append(("busy", number, index, server.read(file)))
                if number == rounds - 1:
                    busy[server.name] = snapshot(server.process.pid, roles[server.name])
            print(f"round {number + 1}/{rounds} done", file=sys.stderr, flush=True)
        cpu_used = {s.name: cpu_seconds(s.process.pid, roles[s.name]) for s in started}
        for number in range(sparse_rounds):
            for index, file in enumerate(files):
                shift = (number + index) % len(started)
                for server in [*started[shift:], *started[:shift]]:
                    server.times.append(("sparse", number, index, server.read(file)))
            print(f"sparse round {number + 1}/{sparse_rounds} done", file=sys.stderr,
                  flush=True)
        time.sleep(REST_WAIT_S)
        anchor = next((s for s in started if s.name == ANCHOR), None)
        base = ({(ph, r, i): t for ph, r, i, t in anchor.times} if anchor is not None
                else {})
        for server in started:
            before = cpu_before[server.name]
            used = cpu_used[server.name]
            timed = sum(1 for ph, *_ in server.times if ph == "busy")
            cpu = {role: round((used[role] - before.get(role, 0.0)) / max(1, timed), 4)
                   for role in sorted(used) if role != "supervisor"}
            rest = snapshot(server.process.pid, roles[server.name])
            memory = server.health()["pipelines"]["ocr-page"]["memory"]
            times = [t for ph, _, _, t in server.times if ph == "busy"]
            sparse = [t for ph, _, _, t in server.times if ph == "sparse"]
            ratios = _ratios(server, base, "busy")
            sparse_ratios = _ratios(server, base, "sparse")
            controller = next(p for p in rest["processes"] if p["role"] == "controller")
            held = busy.get(server.name, rest)
            busy_controller = next(p for p in held["processes"] if p["role"] == "controller")
            results[server.name] = {
                "heap": CONFIGS[server.name][0], "options": CONFIGS[server.name][1],
                "settings": server.settings(),
                "tree_uss_mib": rest["tree_uss_mib"],
                "tree_rss_mib": rest["tree_rss_mib"],
                "controller_uss_mib": controller["uss_mib"],
                "busy_tree_uss_mib": held["tree_uss_mib"],
                "busy_controller_uss_mib": busy_controller["uss_mib"],
                "opened_tree_uss_mib": opened[server.name]["tree_uss_mib"],
                "processes": rest["processes"],
                "busy_processes": held["processes"],
                "shared_segments_mib": rest["shared_segments_mib"],
                "peak_over_demand": {
                    sid: check["pools"]["machine:ram"]["peak_over_demand"]
                    for sid, check in memory["stages"].items()},
                "stage_peak_mib": {
                    sid: round(check["pools"]["machine:ram"]["peak_bytes"] / MIB, 1)
                    for sid, check in memory["stages"].items()},
                "over_demand": memory["over_demand"],
                "warm_p50_s": round(statistics.median(times), 3) if times else None,
                "p50_over_today": round(statistics.median(ratios), 3) if ratios else None,
                "p50_over_today_ci95": ratio_interval(ratios) if ratios else None,
                "sparse_p50_s": round(statistics.median(sparse), 3) if sparse else None,
                "sparse_p50_over_today": (round(statistics.median(sparse_ratios), 3)
                                          if sparse_ratios else None),
                "sparse_p50_over_today_ci95": (ratio_interval(sparse_ratios)
                                               if sparse_ratios else None),
                "requests_timed": len(times) + len(sparse),
                # CPU seconds per busy request, per process (load inflates wall time more)
                "cpu_s_per_request": cpu,
            }
    return results


# -- main -------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """Measure the three, print a table per configuration and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=12, help="generated pages (+ the demo)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed passes per configuration, each page set back to back")
    parser.add_argument("--sparse-rounds", type=int, default=1,
                        help="timed passes with the configurations interleaved page by page")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"configurations to serve (of {', '.join(CONFIGS)})")
    parser.add_argument("--bundles", type=Path, help="built page bundles (pipeline.toml)")
    parser.add_argument("--interval", type=float, default=0.25, help="sampling period (s)")
    parser.add_argument("--skip-peer", action="store_true", help="leave RapidOCR out")
    parser.add_argument("--skip-run", action="store_true", help="leave edge run out")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--peer-child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer_child:
        return peer_child(args.peer_child)
    names = [n for n in args.configs.split(",") if n]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown or "default" not in names:
        parser.error(f"--configs: unknown {unknown} (and 'default' is required)")
    if args.quick:
        args.pages, args.rounds, args.sparse_rounds = 4, 1, 1
        names = [n for n in names if n in ("default", ANCHOR)]

    with tempfile.TemporaryDirectory(prefix="edge-memory-bench-") as scratch:
        work = Path(scratch)
        directory = bundles(args.bundles, work)
        files = make_pages(work / "pages", args.pages)
        result: dict[str, Any] = {"pages": len(files), "page_sizes": page_sizes(files),
                                  "seed": SEED, "rounds": args.rounds}
        if not args.skip_peer:
            result["rapidocr"] = measure_peer(files, args.interval)
            print(f"rapidocr: {json.dumps(result['rapidocr'])}", file=sys.stderr)
        if not args.skip_run:
            result["run"] = measure_run(variant(directory, "default", None), work / "pages",
                                        len(files), None, args.interval)
            print(f"edge run: {json.dumps(result['run'])}", file=sys.stderr)
        configs = measure_serve(directory, files, names, args.rounds, args.sparse_rounds)
        for name, found in configs.items():
            workers = {p["role"]: p["uss_mib"] for p in found["processes"]}
            print(f"{name:14s} tree {found['tree_uss_mib']:7.1f} MiB at rest "
                  f"({found['busy_tree_uss_mib']:.1f} busy)  controller "
                  f"{found['controller_uss_mib']:6.1f}  {workers}  p50 "
                  f"{found['warm_p50_s']} s  x today {found['p50_over_today']} "
                  f"{found['p50_over_today_ci95']}  sparse x today "
                  f"{found['sparse_p50_over_today']}  cpu {found['cpu_s_per_request']}",
                  file=sys.stderr)
    default = configs["default"]
    peer = result.get("rapidocr")
    run = result.get("run")
    summary = {
        "serve_tree_uss_over_rapidocr": (round(default["tree_uss_mib"] / peer["uss_mib"], 3)
                                         if peer else None),
        "serve_tree_uss_busy_over_rapidocr": (
            round(default["busy_tree_uss_mib"] / peer["uss_mib"], 3) if peer else None),
        "run_tree_uss_over_rapidocr": (
            round(run["peak_tree_uss_mib"] / peer["peak_tree_uss_mib"], 3)
            if peer and run else None),
        "run_p50_s": run["p50_s_between_answers"] if run else None,
        "rapidocr_p50_s": peer["p50_s"] if peer else None,
        "controller_uss_mib": default["controller_uss_mib"],
        "controller_uss_busy_mib": default["busy_controller_uss_mib"],
        "peak_over_demand": default["peak_over_demand"],
        "warm_p50_s": default["warm_p50_s"],
        "warm_p50_over_today": default["p50_over_today"],
        "sparse_p50_over_today": default["sparse_p50_over_today"],
        "serve_tree_uss_mib": default["tree_uss_mib"],
        "run_peak_tree_uss_mib": run["peak_tree_uss_mib"] if run else None,
        "rapidocr_uss_mib": peer["uss_mib"] if peer else None,
        "rapidocr_peak_uss_mib": peer["peak_tree_uss_mib"] if peer else None,
    }
    print(json.dumps({**summary, **result, "configs": configs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
