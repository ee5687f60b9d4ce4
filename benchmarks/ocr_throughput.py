"""OCR page throughput: ``edge serve`` at 1 and 4 clients, ``edge run --input DIR``, RapidOCR.

What a user gets, as shipped: the page pipeline as ``make demo`` writes it
(``build/ocr/pipeline.toml``: :mod:`edge_ocr_example.page_bundle`, its default admission,
replicas, threads and recogniser batch), served by ``edge serve`` with its default
admission queue, and read by ``edge run PIPELINE --input DIR``; against RapidOCR
(``rapidocr-onnxruntime``, the ``[bench]`` extra: the same PP-OCRv4 graphs on the same
onnxruntime) with its defaults and with its best thread setting from a small sweep whose
grid is printed. The pages are ones the pipeline was not made for:
:func:`edge_ocr_example.pages.generate_pages` (DejaVu and Aileron fonts, 12-120 px,
rotations, two columns, low contrast, noise, blur, RGBA, grayscale, JPEG), saved as files;
every side reads the same files.

Each side is measured in blocks of one pass over every page, the blocks alternating
round by round (the order rotating), so that the shared machine's drift falls on all
alike. The sides:

* ``serve_c1``: one client uploads the pages one after another (multipart, as ``curl
  -F file=@page`` does) to one ``edge serve`` process, opened once before the rounds;
* ``serve_c4``: four clients at once share the pages (no deadline: each request waits for
  admission in the server's queue); ``serve_c4_errors`` counts answers other than 200;
* ``edge_run``: ``edge run PIPELINE --input DIR --json`` in a fresh process, whole (its
  ``open_s`` is printed beside: the start-up is part of what a user waits for);
* ``rapidocr_default`` / ``rapidocr_best``: RapidOCR in a process of its own, kept
  between blocks, each page by path (``engine(path)``).

Printed per side: pages/s (median over rounds) and CPU seconds per page (the process tree's
user + system time over the block: the server and its stage workers; ``edge run`` and its
workers; RapidOCR's process; for ``edge serve`` the controller's own share beside,
``controller_cpu_s_per_page``: HTTP, ``prepare``, the transforms and ``finish``, on the
cores the stages need), and the resident set size (the tree's sum, MiB, after the
rounds; ``edge run``'s peak sampled while it runs). Every edge side's text must be equal,
page by page (``edge_texts_equal``); the page CER against the generator's text
(:mod:`benchmarks.ocr_accuracy`'s pooled page CER) of edge and of RapidOCR is printed beside.

The last line is one JSON object: ``serve_c4_errors`` (goal 0), ``serve_c4_over_c1``
(goal >= 1.2; on 2 cores one client already uses both for the larger operators: read the
CPU seconds per page against the core count for the ceiling, which
``serve_c4_ceiling_over_c1`` computes: the usable cores over four clients' CPU seconds per
page, in pages/s, over one client's pages/s), ``serve_c1_over_rapidocr_best``
(goal >= 1.0) and ``serve_c1_over_rapidocr_default``, with every side's raw figures.

``--sweep`` instead measures ``serve_c1`` and ``serve_c4`` for a grid of the page
pipeline's settings (admission, recogniser replicas, ort-cpu intra-op threads, the
recogniser's rows per call, ``EDGE_OCR_REC_BATCH``; ``--configs a2-r2-t1-b1,...`` names
them, :data:`SWEEP` by default) on bundles built with a recogniser batch range of 8, in
rounds whose order rotates, and prints each configuration's pages/s and CPU
seconds per page, then one JSON line (``texts_equal``: configurations of the same
recogniser batch read the same text; one row per call pads rows less than several, see
:func:`edge_ocr_example.page_reader.own_width`): the way the defaults were chosen (docs/config.md,
"Choosing admission, replicas, threads and the recogniser batch").

Run: ``.venv/bin/python benchmarks/ocr_throughput.py [--pages 12] [--rounds 2]
[--bundles build/ocr] [--sweep [--configs LABELS]]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil

from edge_core.identity import host_identity

EDGE = str(Path(sys.executable).with_name("edge"))
RAPIDOCR_THREADS = (1, 2, 4)
"""RapidOCR's thread sweep (``intra_op_num_threads``; its default, -1, is ONNX Runtime's)."""
CLIENTS = 4


# -- pages --------------------------------------------------------------------------------------


def write_pages(folder: Path, count: int, seed: int) -> tuple[list[Path], list[tuple[str, ...]]]:
    """Generated pages saved as files, and the text drawn on each."""
    from edge_ocr_example.pages import generate_pages

    folder.mkdir(parents=True, exist_ok=True)
    paths, truths = [], []
    for page in generate_pages(count, seed=seed):
        path = folder / page.name
        page.image.save(path, quality=60) if path.suffix == ".jpg" else page.image.save(path)
        paths.append(path)
        truths.append(page.lines)
    return paths, truths


def page_cer(truths: Sequence[Sequence[str]], outputs: Sequence[Sequence[str]]) -> float:
    """Pooled page CER: edit distances over reference lengths, whitespace removed."""
    from edge_ocr_example.quality import edit_distance, squeeze

    errors = total = 0
    for truth, lines in zip(truths, outputs, strict=True):
        reference = squeeze(truth)
        errors += edit_distance(reference, squeeze(lines))
        total += len(reference)
    return errors / max(total, 1)


# -- process trees --------------------------------------------------------------------------------


def tree(pid: int) -> list[psutil.Process]:
    """The process and everything below it."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_cpu_s(pid: int) -> float:
    """User + system seconds of the live tree."""
    total = 0.0
    for proc in tree(pid):
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def tree_rss_mib(pid: int) -> float:
    """Resident set size of the live tree, summed, in MiB."""
    total = 0
    for proc in tree(pid):
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


# -- edge serve ---------------------------------------------------------------------------------


class Server:
    """``edge serve PIPELINE`` on a free port, as shipped (default queue and limits)."""

    def __init__(self, pipeline: Path, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [EDGE, "serve", str(pipeline), "--port", "0"], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})})
        assert self.process.stderr is not None
        self.url = ""
        self.name = ""
        for line in self.process.stderr:
            if "listening on " in line:
                rest = line.split("listening on ", 1)[1]
                self.url = rest.split()[0]
                self.name = rest.split("(", 1)[1].split(")", 1)[0].split(",")[0]
                break
        if not self.url:
            self.process.wait()
            raise SystemExit(f"edge serve {pipeline} did not start")
        threading.Thread(target=self.process.stderr.read, daemon=True).start()
        # The clients are made once, before anything is timed, and kept (as a client keeps
        # its connection): making an httpx.Client costs about 20 ms of CPU (its TLS
        # context), which a block that made its own would charge to the server's time.
        self.clients = [httpx.Client(base_url=self.url, timeout=300) for _ in range(CLIENTS)]

    def read(self, client: httpx.Client, path: Path) -> tuple[int, tuple[str, ...]]:
        """Upload one page: the status and the text lines."""
        reply = client.post(f"/v1/pipelines/{self.name}/run",
                            files={"file": (path.name, path.read_bytes())})
        if reply.status_code != 200:
            return reply.status_code, ()
        return 200, tuple(str(line["text"]) for line in reply.json()["answer"])

    def block(self, paths: Sequence[Path], clients: int) -> dict[str, Any]:
        """Every page once with ``clients`` clients at once: pages/s, CPU, texts, errors."""
        texts: list[tuple[str, ...]] = [()] * len(paths)
        errors = 0
        lock = threading.Lock()
        queue = list(range(len(paths)))

        def client_loop(client: httpx.Client) -> None:
            nonlocal errors
            while True:
                with lock:
                    if not queue:
                        return
                    index = queue.pop(0)
                status, lines = self.read(client, paths[index])
                with lock:
                    texts[index] = lines
                    errors += status != 200

        controller = psutil.Process(self.process.pid)
        cpu, own = tree_cpu_s(self.process.pid), sum(controller.cpu_times()[:2])
        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            for future in [pool.submit(client_loop, c) for c in self.clients[:clients]]:
                future.result()
        wall = time.perf_counter() - started
        cpu = tree_cpu_s(self.process.pid) - cpu
        own = sum(controller.cpu_times()[:2]) - own
        return {"pages_per_s": len(paths) / wall, "cpu_s_per_page": cpu / len(paths),
                "controller_cpu_s_per_page": own / len(paths), "texts": texts,
                "errors": errors}

    def stop(self) -> None:
        """SIGTERM and wait (it closes its pipeline with verified retirement)."""
        for client in self.clients:
            client.close()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# -- edge run -----------------------------------------------------------------------------------


def edge_run_block(pipeline: Path, folder: Path, count: int,
                   env: dict[str, str] | None = None) -> dict[str, Any]:
    """``edge run PIPELINE --input DIR --json`` in a fresh process, whole."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen([EDGE, "run", str(pipeline), "--input", str(folder), "--json"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})})
    peak = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                peak = max(peak, tree_rss_mib(process.pid))
            except psutil.NoSuchProcess:
                return
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate(timeout=1800)
    done.set()
    sampler.join()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise SystemExit(f"edge run failed ({process.returncode}): {err[-2000:]}")
    report = json.loads(out)
    by_file = {Path(r["file"]).name: tuple(str(line["text"]) for line in r["lines"])
               for r in report["results"]}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"pages_per_s": count / wall, "cpu_s_per_page": cpu / count, "wall_s": wall,
            "open_s": report["open_s"], "by_file": by_file, "rss_mib": peak}


# -- RapidOCR -------------------------------------------------------------------------------------


def rapidocr_worker(threads: int) -> int:
    """In a process of its own: read page paths from stdin, one JSON answer per block."""
    from rapidocr_onnxruntime import RapidOCR

    engine = RapidOCR() if threads < 0 else RapidOCR(intra_op_num_threads=threads)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        paths = json.loads(line)
        if paths and paths[0] == "warm":
            engine(paths[1])
            print(json.dumps({"warm": True}), flush=True)
            continue
        usage = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        texts = []
        for path in paths:
            result, _ = engine(path)
            texts.append([str(item[1]) for item in result or []])
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
        print(json.dumps({"wall_s": wall, "cpu_s": cpu, "texts": texts}), flush=True)
    return 0


class RapidOcr:
    """A RapidOCR process (``threads`` < 0: its defaults) kept between blocks."""

    def __init__(self, threads: int, warm: Path) -> None:
        self.threads = threads
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--rapidocr-worker", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._ask(None)
        self._ask(["warm", str(warm)])

    def _ask(self, message: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        if message is not None:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"RapidOCR (threads {self.threads}) ended")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def block(self, paths: Sequence[Path]) -> dict[str, Any]:
        """Every page once, one after another."""
        answer = self._ask([str(p) for p in paths])
        return {"pages_per_s": len(paths) / answer["wall_s"],
                "cpu_s_per_page": answer["cpu_s"] / len(paths),
                "texts": [tuple(t) for t in answer["texts"]]}

    def rss_mib(self) -> float:
        """Its resident set size now."""
        return tree_rss_mib(self.process.pid)

    def stop(self) -> None:
        """Close its stdin and wait."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


# -- helpers ------------------------------------------------------------------------------------


def page_bundles(directory: Path | None, rec_batch: int | None = None) -> Path:
    """Built page bundles: ``directory`` when it holds ``pipeline.toml``, else fresh ones."""
    if directory is not None and (directory / "pipeline.toml").is_file():
        built = json.loads((directory / "bundle.json").read_text(encoding="utf-8"))
        if rec_batch is None or built.get("rec_batch") == rec_batch:
            return directory
    from edge_ocr_example.page_bundle import build_page_bundles
    from edge_ocr_example.page_pipeline import REC_BATCH

    out = Path(tempfile.mkdtemp(prefix="edge-ocr-throughput-")) / "ocr"
    print(f"building the page bundles into {out} ...", file=sys.stderr, flush=True)
    build_page_bundles(out, rec_batch=rec_batch or REC_BATCH)
    return out


def rounds_of(sides: Sequence[str], rounds: int) -> list[list[str]]:
    """Each round's order: the sides rotated by the round's number."""
    return [list(sides[r % len(sides):]) + list(sides[: r % len(sides)]) for r in range(rounds)]


def median_of(blocks: Sequence[dict[str, Any]], key: str) -> float:
    """The median of ``key`` over the blocks."""
    return statistics.median(block[key] for block in blocks)


def rounded(value: float, digits: int = 3) -> float:
    """``value`` rounded for the printout."""
    return round(value, digits)


# -- the comparison ------------------------------------------------------------------------------


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """The shipped page pipeline against RapidOCR, in alternating blocks."""
    bundles = page_bundles(args.bundles)
    pipeline = bundles / "pipeline.toml"
    work = Path(tempfile.mkdtemp(prefix="edge-ocr-pages-"))
    paths, truths = write_pages(work / "pages", args.pages, args.seed)
    print(f"{len(paths)} generated pages (seed {args.seed}) in {work / 'pages'}; "
          f"pipeline {pipeline}", file=sys.stderr, flush=True)

    # RapidOCR's thread sweep: one block each, the grid printed; the best is kept.
    sweep: dict[str, float] = {}
    best_threads, best_rate = -1, 0.0
    grid = [int(t) for t in args.rapidocr_grid.split(",")] if args.rapidocr_grid else \
        list(RAPIDOCR_THREADS)
    for threads in (-1, *grid):
        engine = RapidOcr(threads, paths[0])
        rate = engine.block(paths)["pages_per_s"]
        engine.stop()
        label = "default" if threads < 0 else str(threads)
        sweep[label] = rounded(rate)
        print(f"rapidocr sweep intra_op_num_threads={label}: {rate:.3f} pages/s",
              file=sys.stderr, flush=True)
        if rate > best_rate:
            best_threads, best_rate = threads, rate

    server = Server(pipeline)
    rapid = {"rapidocr_default": RapidOcr(-1, paths[0])}
    if best_threads >= 0:
        rapid["rapidocr_best"] = RapidOcr(best_threads, paths[0])
    blocks: dict[str, list[dict[str, Any]]] = {}
    try:
        server.read(server.clients[0], paths[0])  # one unmeasured page: the first-call costs
        sides = ["serve_c1", "serve_c4", *rapid, "edge_run"]
        for number, order in enumerate(rounds_of(sides, args.rounds)):
            for side in order:
                if side == "serve_c1":
                    block = server.block(paths, 1)
                elif side == "serve_c4":
                    block = server.block(paths, CLIENTS)
                elif side == "edge_run":
                    block = edge_run_block(pipeline, work / "pages", len(paths))
                    block["texts"] = [block["by_file"].get(p.name, ()) for p in paths]
                else:
                    block = rapid[side].block(paths)
                blocks.setdefault(side, []).append(block)
                print(f"round {number + 1} {side}: {block['pages_per_s']:.3f} pages/s, "
                      f"{block['cpu_s_per_page']:.3f} CPU s/page", file=sys.stderr, flush=True)
        rss = {"serve": rounded(tree_rss_mib(server.process.pid), 1),
               **{side: rounded(engine.rss_mib(), 1) for side, engine in rapid.items()},
               "edge_run_peak": rounded(max(b["rss_mib"] for b in blocks["edge_run"]), 1)}
    finally:
        server.stop()
        for engine in rapid.values():
            engine.stop()
    if "rapidocr_best" not in blocks:
        blocks["rapidocr_best"] = blocks["rapidocr_default"]
    edge_sides = ("serve_c1", "serve_c4", "edge_run")
    reference = blocks["serve_c1"][0]["texts"]
    equal = all(block["texts"] == reference for side in edge_sides for block in blocks[side])
    rate = {side: median_of(found, "pages_per_s") for side, found in blocks.items()}
    cpu = {side: rounded(median_of(found, "cpu_s_per_page")) for side, found in blocks.items()}
    result = {
        "benchmark": "ocr_throughput",
        "pages": len(paths), "rounds": args.rounds, "seed": args.seed,
        "cpu_count": os.cpu_count(),
        "serve_c4_errors": sum(b["errors"] for b in blocks["serve_c4"] + blocks["serve_c1"]),
        "serve_c4_over_c1": rounded(rate["serve_c4"] / rate["serve_c1"]),
        # the most four clients could reach: every usable core busy at their CPU per page
        "serve_c4_ceiling_over_c1": rounded(len(os.sched_getaffinity(0))
                                            / median_of(blocks["serve_c4"], "cpu_s_per_page")
                                            / rate["serve_c1"]),
        "serve_c1_over_rapidocr_best": rounded(rate["serve_c1"] / rate["rapidocr_best"]),
        "serve_c1_over_rapidocr_default": rounded(rate["serve_c1"] / rate["rapidocr_default"]),
        "serve_c4_over_rapidocr_best": rounded(rate["serve_c4"] / rate["rapidocr_best"]),
        "edge_texts_equal": equal,
        "pages_per_s": {side: rounded(value) for side, value in rate.items()},
        "cpu_s_per_page": cpu,
        "controller_cpu_s_per_page": {
            side: rounded(median_of(blocks[side], "controller_cpu_s_per_page"))
            for side in ("serve_c1", "serve_c4")},
        "rss_mib": rss,
        "edge_run_open_s": rounded(median_of(blocks["edge_run"], "open_s")),
        "edge_run_wall_s": rounded(median_of(blocks["edge_run"], "wall_s")),
        "rapidocr_threads_grid": sweep,
        "rapidocr_best_threads": "default" if best_threads < 0 else best_threads,
        "cer": {"edge": rounded(page_cer(truths, reference), 4),
                "rapidocr_default": rounded(page_cer(truths,
                                                     blocks["rapidocr_default"][0]["texts"]), 4),
                "rapidocr_best": rounded(page_cer(truths,
                                                  blocks["rapidocr_best"][0]["texts"]), 4)},
    }
    return result


# -- the sweep -----------------------------------------------------------------------------------

SWEEP = ("a1-r1-tdef-b4", "a2-r1-tdef-b4", "a2-r1-t1-b4", "a3-r1-t1-b4", "a2-r2-t1-b4",
         "a2-r1-tdef-b1", "a2-r1-tdef-b8", "a2-r1-t1-b8")
"""The default grid: ``aA-rR-tT-bB`` is admission A, R recogniser replicas, T intra-op
threads per worker (``tdef``: ONNX Runtime's default, one per core) and B rows per
recogniser call (``EDGE_OCR_REC_BATCH``, at most 8 here)."""


def parse_configuration(label: str) -> tuple[int, int, int | None, int]:
    """``aA-rR-tT-bB`` -> (admission, replicas, threads or None, batch)."""
    try:
        a, r, t, b = label.split("-")
        if not (a[0], r[0], t[0], b[0]) == ("a", "r", "t", "b"):
            raise ValueError(label)
        threads = None if t == "tdef" else int(t[1:])
        found = int(a[1:]), int(r[1:]), threads, int(b[1:])
    except (ValueError, IndexError):
        raise SystemExit(f"--configs: not aA-rR-tT-bB (tT may be tdef): {label!r}") from None
    if min(found[0], found[1], found[3]) < 1 or not 1 <= found[3] <= 8 or \
            (threads is not None and threads < 1):
        raise SystemExit(f"--configs: out of range (batch 1..8): {label!r}")
    return found


SWEEP_REC_DEMAND = "896 MiB"
"""The recogniser's RAM demand in the sweep (8-row bundle; the 4-row one peaks at 330)."""


def variant(text: str, admission: int, replicas: int, threads: int | None) -> str:
    """The page pipeline's file with admission, recogniser replicas and threads set.

    The recogniser's RAM demand is raised to :data:`SWEEP_REC_DEMAND`: its bundle here
    serves 8 rows a call, whose warm-up peaks above the shipped 4-row demand. The file's
    own admission, replicas and backend options (the shipped intra-op threads) are
    replaced: ``threads`` None leaves ONNX Runtime's default.
    """
    lines = text.splitlines()
    out: list[str] = []
    stage = ""
    for line in lines:
        if line.startswith(("admission =", "options = ", "replicas =")):
            continue
        if line.startswith("id = "):
            stage = line.split('"')[1]
        if line.startswith("demands = ") and stage == "recognize":
            line = f'demands = {{ "machine:ram" = "{SWEEP_REC_DEMAND}" }}'

        out.append(line)
        if line.startswith('name = "ocr-page"'):
            out.append(f"admission = {admission}")
        if line.startswith("id = ") and stage == "recognize" and replicas > 1:
            out.append(f"replicas = {replicas}")
        if line.startswith('name = "ort-cpu"') and threads is not None:
            out.append(f"options = {{ intra_op_threads = {threads} }}")
    return "\n".join(out) + "\n"


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Each configuration (``--configs``, else :data:`SWEEP`) served at 1 and 4 clients,
    in rounds whose order rotates."""
    bundles = page_bundles(args.bundles, rec_batch=8)
    base = (bundles / "pipeline.toml").read_text(encoding="utf-8")
    work = Path(tempfile.mkdtemp(prefix="edge-ocr-sweep-"))
    paths, _ = write_pages(work / "pages", args.pages, args.seed)
    results: dict[str, dict[str, list[float]]] = {}
    texts: dict[str, list[tuple[str, ...]]] = {}
    grid = args.configs.split(",") if args.configs else list(SWEEP)
    parsed = {label: parse_configuration(label) for label in grid}
    for number in range(args.rounds):
        order = grid[number % len(grid):] + grid[: number % len(grid)]
        for label in order:
            admission, replicas, threads, batch = parsed[label]
            file = bundles / f"sweep-{label}.toml"
            file.write_text(variant(base, admission, replicas, threads), encoding="utf-8")
            server = Server(file, env={"EDGE_OCR_REC_BATCH": str(batch)})
            try:
                server.read(server.clients[0], paths[0])
                c1 = server.block(paths, 1)
                c4 = server.block(paths, CLIENTS)
                rss = tree_rss_mib(server.process.pid)
            finally:
                server.stop()
                file.unlink()
            found = results.setdefault(label, {})
            for key, value in (("c1", c1["pages_per_s"]), ("c4", c4["pages_per_s"]),
                               ("cpu_c1", c1["cpu_s_per_page"]),
                               ("cpu_c4", c4["cpu_s_per_page"]),
                               ("errors", float(c1["errors"] + c4["errors"])),
                               ("rss_mib", rss)):
                found.setdefault(key, []).append(value)
            texts.setdefault(label, c1["texts"])
            print(f"round {number + 1} {label}: c1 {c1['pages_per_s']:.3f} pages/s "
                  f"({c1['cpu_s_per_page']:.3f} CPU s/page), c4 {c4['pages_per_s']:.3f} "
                  f"({c4['cpu_s_per_page']:.3f}), errors {c1['errors'] + c4['errors']}, "
                  f"{rss:.0f} MiB", file=sys.stderr, flush=True)
    table = {label: {key: rounded(statistics.median(values)) for key, values in found.items()}
             for label, found in results.items()}
    first: dict[int, list[tuple[str, ...]]] = {}  # per batch: one row per call pads less
    for label, found_texts in texts.items():
        first.setdefault(parsed[label][3], found_texts)
    return {"benchmark": "ocr_throughput_sweep", "pages": len(paths), "rounds": args.rounds,
            "cpu_count": os.cpu_count(), "configurations": table,
            "texts_equal": all(t == first[parsed[label][3]] for label, t in texts.items()),
            "best_c4": max(table, key=lambda k: table[k]["c4"]),
            "best_c1": max(table, key=lambda k: table[k]["c1"])}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison (or the sweep) and print its JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=12, help="generated pages (default 12)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--seed", type=int, default=23, help="page generator seed")
    parser.add_argument("--bundles", type=Path, default=None,
                        help="built page bundles with pipeline.toml (make demo: build/ocr)")
    parser.add_argument("--sweep", action="store_true",
                        help="measure a grid of admission/replicas/threads/recogniser batch")
    parser.add_argument("--configs", default="",
                        help="with --sweep: comma-separated aA-rR-tT-bB labels (default: "
                        "the built-in grid)")
    parser.add_argument("--rapidocr-grid", default="",
                        help="RapidOCR's intra_op_num_threads values to sweep besides its "
                        "default (comma-separated; default 1,2,4)")
    parser.add_argument("--rapidocr-worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rapidocr_worker is not None:
        return rapidocr_worker(args.rapidocr_worker)
    if args.pages < CLIENTS or args.rounds < 1:
        parser.error(f"--pages must be at least {CLIENTS} and --rounds at least 1")
    run: Callable[[argparse.Namespace], dict[str, Any]] = sweep if args.sweep else compare
    result = {**run(args), "machine": host_identity()}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
