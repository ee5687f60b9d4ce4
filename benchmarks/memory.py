"""Memory of the OCR page pipeline: ``edge run``, ``edge serve`` and RapidOCR, same pages.

One run, side by side. The pages are generated pages of varied size and content
(:func:`edge_ocr_example.pages.generate_pages`, the accuracy benchmark's generator and
seed: 90 to 2400 pixels a side, 1 to 30 lines) plus the demo page, saved as files:

* **peer**: RapidOCR (``rapidocr_onnxruntime``, the same PP-OCRv4 graphs and the same
  onnxruntime) reads every page once in a process of its own;
* **run**: ``edge run PIPELINE --input DIR --jsonl`` reads them: its controller, the
  stage workers and every process of their trees;
* **serve**: one ``edge serve`` per configuration (below), all open at once; every page
  is uploaded once to each (the warm-up pass), then ``--rounds`` timed passes. Within a
  pass each page goes to every configuration in turn, the order rotated from page to page
  and round to round, so that a page's requests to all configurations fall within
  seconds of each other and the machine's drift falls on all alike. Memory is measured
  after the last request.

Configurations (ONNX Runtime's CPU arena in every stage's worker, and the heap policy of
every process, ``EDGE_HEAP``: :mod:`edge_contracts.heap`):

=================  ============  ===========================================================
``default``        as installed  the pipeline as built, no option set, ``EDGE_HEAP`` unset
                                 (the lean heap; the arena on, shrunk after every call)
``today``          default heap  the arena on, growing by powers of two, never shrunk (ONNX
                                 Runtime's defaults), glibc's own heap policy: what edge-core
                                 did before this benchmark existed
``arena``          lean          the arena on, never shrunk (ONNX Runtime's defaults)
``arena-same``     lean          the arena on, growing by what is requested, shrunk after
                                 every call
``no-arena``       lean          the arena off
``no-arena-heap``  default heap  the arena off, glibc's own heap policy
=================  ============  ===========================================================

Measured per process: USS (what the process alone holds: its private pages), PSS and RSS
from ``/proc/PID/smaps``; a tree's USS adds, once, the resident pages of edge-core's
shared-memory segments that two of its processes map (such pages are private to neither,
so USS alone would miss them). ``run`` and ``peer`` are also sampled every
``--interval`` seconds while they read (USS from ``smaps_rollup``, so segments mapped
twice are missed there) for their peaks. The stage check is the runtime's own
(``/health``'s ``memory``: each stage's peak resident set since it started, summed over
its worker's tree, against its declared demand).

The last line is one JSON object:

* ``serve_tree_uss_over_rapidocr``: the ``default`` server's tree USS after the requests
  / RapidOCR's USS after the same pages (goal <= 1.0);
* ``run_tree_uss_over_rapidocr``: the peak of ``edge run``'s sampled tree USS / RapidOCR's
  sampled peak (goal <= 1.0);
* ``controller_uss_mib``: the ``default`` server's controller after the requests (goal
  <= 80);
* ``peak_over_demand``: per stage of the ``default`` server (goal <= 1.0 each);
* ``configs``: per configuration, its tree, controller and workers, its stage checks,
  ``warm_p50_s`` (per request, over the timed rounds) and ``p50_over_today`` (median of
  the per-page, per-round ratios against ``today``, with its 95 % bootstrap interval):
  the page pipeline's warm p50 should stay within 10 % of today's.

Run: ``.venv/bin/python benchmarks/memory.py [--pages 12] [--rounds 3] [--configs a,b]
[--bundles DIR]``; ``--quick`` is a smoke run (4 pages, 1 round, 2 configurations).
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

MIB = 1024 * 1024
EDGE = str(Path(sys.executable).with_name("edge"))
SEED = 17

#: name -> (EDGE_HEAP or None for unset, ORT options for every stage or None for none)
CONFIGS: dict[str, tuple[str | None, dict[str, Any] | None]] = {
    "default": (None, None),
    "today": ("default", {"cpu_mem_arena": True, "arena_shrinkage": False}),
    "arena": ("lean", {"cpu_mem_arena": True, "arena_shrinkage": False}),
    "arena-same": ("lean", {"cpu_mem_arena": True, "arena_shrinkage": True,
                            "arena_extend_strategy": "same_as_requested"}),
    "no-arena": ("lean", {"cpu_mem_arena": False}),
    "no-arena-heap": ("default", {"cpu_mem_arena": False}),
}
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
    """``controller``, ``worker:<stage>``, ``supervisor``, or ``worker`` / ``child``."""
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
    return "worker" if "edge_contracts" in command or "import sys" in command else "child"


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
        rows.append({"pid": process.pid, "role": role_of(process, root, workers or {}),
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
                "peak_uss_mib_by_pid": {str(p): round(v / MIB, 1)
                                        for p, v in sorted(self.peak_by_pid.items())},
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
        self.times: list[tuple[int, int, float]] = []  # (round, page, seconds)

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

    def settings(self) -> dict[str, Any]:
        """What each stage's worker reports of its memory settings (arena, heap)."""
        assert self.client is not None
        plan = self.client.get("/v1/pipelines/ocr-page").json()["plan"]
        return {s["id"]: (s.get("worker") or {}).get("load", {}).get("memory")
                for s in plan["stages"]}

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


def measure_serve(directory: Path, files: Sequence[Path], names: Sequence[str],
                  rounds: int) -> dict[str, Any]:
    """Every configuration's server: warm-up pass, timed rounds, then memory and checks."""
    results: dict[str, Any] = {}
    with servers(directory, names) as started:
        opened = {s.name: snapshot(s.process.pid, s.workers()) for s in started}
        for server in started:  # the warm-up pass: every shape seen once
            for file in files:
                server.read(file)
        for number in range(rounds):
            for index, file in enumerate(files):
                shift = (number + index) % len(started)
                for server in [*started[shift:], *started[:shift]]:
                    server.times.append((number, index, server.read(file)))
            print(f"round {number + 1}/{rounds} done", file=sys.stderr, flush=True)
        anchor = next((s for s in started if s.name == ANCHOR), None)
        base = {(r, i): t for r, i, t in anchor.times} if anchor is not None else {}
        for server in started:
            after = snapshot(server.process.pid, server.workers())
            health = server.health()
            memory = health["pipelines"]["ocr-page"]["memory"]
            times = [t for _, _, t in server.times]
            ratios = [t / base[(r, i)] for r, i, t in server.times if (r, i) in base]
            controller = next(p for p in after["processes"] if p["role"] == "controller")
            results[server.name] = {
                "heap": CONFIGS[server.name][0], "options": CONFIGS[server.name][1],
                "settings": server.settings(),
                "tree_uss_mib": after["tree_uss_mib"],
                "tree_rss_mib": after["tree_rss_mib"],
                "controller_uss_mib": controller["uss_mib"],
                "opened_tree_uss_mib": opened[server.name]["tree_uss_mib"],
                "processes": after["processes"],
                "shared_segments_mib": after["shared_segments_mib"],
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
                "requests_timed": len(times),
            }
    return results


# -- main -------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """Measure the three, print a table per configuration and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=12, help="generated pages (+ the demo)")
    parser.add_argument("--rounds", type=int, default=3, help="timed passes per configuration")
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
        args.pages, args.rounds = 4, 1
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
        configs = measure_serve(directory, files, names, args.rounds)
        for name, found in configs.items():
            workers = {p["role"]: p["uss_mib"] for p in found["processes"]}
            print(f"{name:14s} tree {found['tree_uss_mib']:7.1f} MiB  controller "
                  f"{found['controller_uss_mib']:6.1f}  {workers}  p50 "
                  f"{found['warm_p50_s']} s  x today {found['p50_over_today']} "
                  f"{found['p50_over_today_ci95']}", file=sys.stderr)
    default = configs["default"]
    peer = result.get("rapidocr")
    run = result.get("run")
    summary = {
        "serve_tree_uss_over_rapidocr": (round(default["tree_uss_mib"] / peer["uss_mib"], 3)
                                         if peer else None),
        "run_tree_uss_over_rapidocr": (
            round(run["peak_tree_uss_mib"] / peer["peak_tree_uss_mib"], 3)
            if peer and run else None),
        "controller_uss_mib": default["controller_uss_mib"],
        "peak_over_demand": default["peak_over_demand"],
        "warm_p50_s": default["warm_p50_s"],
        "warm_p50_over_today": default["p50_over_today"],
        "serve_tree_uss_mib": default["tree_uss_mib"],
        "run_peak_tree_uss_mib": run["peak_tree_uss_mib"] if run else None,
        "rapidocr_uss_mib": peer["uss_mib"] if peer else None,
        "rapidocr_peak_uss_mib": peer["peak_tree_uss_mib"] if peer else None,
    }
    print(json.dumps({**summary, **result, "configs": configs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
