"""Start-up as a CLI user sees it, each side in a fresh process, against what users run instead.

Needs ``make demo``'s ``build/ocr`` (the page pipeline and its page) and the ``[bench]``
extra (``rapidocr-onnxruntime``). Every figure is the wall time of a fresh process, from
its start to its exit, taken in alternating blocks of one run of each side per round
after one unmeasured run of each (the OS file cache warmed); the medians are compared.

* ``cold_first_answer_over_rapidocr``: ``edge run build/ocr/pipeline.toml --input PAGE``
  with a stored decision (the page pipeline's stored load gates from an earlier open)
  over RapidOCR's first answer on the same page in a fresh process
  (``RapidOCR()(PAGE)``, its defaults); ``..._first_ever`` is the same with no stored
  decision (an empty cache directory for every run). Goals 1.5 and 2.0.
* ``phases_stored``: where the stored side's wall time went, by its own ``--json``
  answers (medians): ``open_s``, ``page_s`` (the request), ``retire_s`` (the slowest
  worker's retirement) and ``outside_s`` (the rest: interpreter start, imports, checks,
  output, exit); also the older tree's with ``--baseline-edge``, and then
  ``stored_over_before``: the stored side's wall time over the older tree's, paired
  round by round (both ran in the same round, so under the same load): the median
  ratio, its 95 % bootstrap interval and the pairs (``trees.summary``).
* ``open_s``: the ``open_s`` ``edge run --json`` reports, first ever and stored; with
  ``--baseline-edge PATH`` (or ``$EDGE_BENCH_BASELINE_EDGE``: the ``edge`` of an older
  checkout, in its own virtual environment, byte-compiled) also that tree's, on the same
  pipeline without the keys it does not know, as ``before`` (``null`` without one);
  ``--baseline-pipeline PATH`` gives it the older tree's own built page pipeline instead
  (where the bundles changed between the trees: the older glue cannot read the newer
  bundles' outputs).
* ``edge_probe_over_import_onnxruntime`` and ``edge_plugins_over_import_onnxruntime``:
  ``edge probe --json`` and ``edge plugins --json`` over ``python -c "import
  onnxruntime"``. Goals 0.5 and 0.25. ``edge probe`` keeps its whole answer (and the QNN
  probe interpreter's) per boot and installed stack (the unmeasured run keeps it), so the
  measured runs give the kept answer back as a user's second ``edge probe`` does;
  ``edge_probe_uncached_over_import_onnxruntime`` is the first ``edge probe`` after a boot
  or an install (``EDGE_PROBE_CACHE=off``: every plugin asked, nothing kept).
  ``--cli-only`` measures these sides alone (no ``build/ocr`` needed) and prints their
  line.

The last line is one JSON object with the ratios and every side's raw medians. No
assertion: on a shared machine the figures are noisy; read them.

Environment: ``EDGE_BENCH_ROUNDS`` (default 5) rounds of the page runs,
``EDGE_BENCH_CLI_ROUNDS`` (default 15) of the command-line ones; ``EDGE_BENCH_PAGE``
another page.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from precompile import ensure_bytecode
from trees import summary

from edge_core.identity import host_identity

ROOT = Path(__file__).resolve().parents[1]
OCR = ROOT / "build" / "ocr"
GATE_CACHE_ENV = "EDGE_GATE_CACHE"
PLACEMENT_CACHE_ENV = "EDGE_PLACEMENT_CACHE"

RAPIDOCR = """\
import sys
from rapidocr_onnxruntime import RapidOCR
result, _ = RapidOCR()(sys.argv[1])
print(len(result or []), "lines")
"""


def wall(cmd: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[float, str]:
    """Seconds from start to exit of ``cmd`` (which must succeed), and its stdout."""
    started = time.perf_counter()
    done = subprocess.run(list(cmd), capture_output=True, text=True, env=dict(env or os.environ),
                          check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed, done.stdout


def cache_env(directory: Path) -> dict[str, str]:
    """The environment with the stored decisions and gates in ``directory``."""
    return {**os.environ, PLACEMENT_CACHE_ENV: str(directory),
            GATE_CACHE_ENV: str(directory / "gates")}


class Side:
    """One side of a comparison: how to run it once, and its samples."""

    def __init__(self, name: str, run: Callable[[], tuple[float, str]]) -> None:
        self.name = name
        self.run = run
        self.samples: list[float] = []
        self.outputs: list[str] = []

    def once(self, keep: bool = True) -> None:
        seconds, out = self.run()
        if keep:
            self.samples.append(seconds)
            self.outputs.append(out)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def alternate(sides: Sequence[Side], rounds: int) -> None:
    """One unmeasured run of each side, then ``rounds`` blocks of one run of each."""
    for side in sides:
        side.once(keep=False)
    for number in range(rounds):
        # the order turns each round, so no side always runs right after another
        turn = number % len(sides)
        for side in list(sides[turn:]) + list(sides[:turn]):
            side.once()


def baseline_pipeline(pipeline: Path, scratch: Path) -> Path:
    """The page pipeline as an older tree reads it: without the keys it does not know
    (``golden``, ``quality``), its bundles named by absolute path."""
    lines = []
    for line in pipeline.read_text(encoding="utf-8").splitlines():
        if line.startswith(("golden = ", "quality = ")):
            continue
        if line.startswith('manifest = "'):
            line = f'manifest = "{pipeline.parent.resolve()}/' + line[len('manifest = "'):]
        lines.append(line)
    older = scratch / "pipeline-baseline.toml"
    older.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return older


def open_seconds(side: Side) -> float | None:
    """The median ``open_s`` of the ``edge run --json`` answers a side printed."""
    found = []
    for out in side.outputs:
        try:
            found.append(float(json.loads(out)["open_s"]))
        except (ValueError, KeyError, TypeError):
            continue
    return round(statistics.median(found), 3) if found else None


def phases(side: Side) -> dict[str, float] | None:
    """Where a side's wall time went, by its own ``edge run --json`` answers (medians).

    ``open_s`` (admission, workers, gates), ``page_s`` (the request, transforms
    included), ``retire_s`` (the slowest worker's verified retirement: they retire at
    once) and ``outside_s``: the rest of the process's wall time — interpreter start,
    imports, the file and input checks, the plan, the output and the exit.
    """
    rows: dict[str, list[float]] = {"open_s": [], "page_s": [], "retire_s": [],
                                    "outside_s": []}
    for seconds, out in zip(side.samples, side.outputs, strict=True):
        try:
            answer = json.loads(out)
            opened = float(answer["open_s"])
            page = float(answer["latency_p50_ms"]["total"]) / 1e3
            retire = max(float(v["retire"]["elapsed_s"]) for v in answer["closed"].values())
        except (ValueError, KeyError, TypeError):
            continue
        rows["open_s"].append(opened)
        rows["page_s"].append(page)
        rows["retire_s"].append(retire)
        rows["outside_s"].append(seconds - opened - page)
    if not rows["open_s"]:
        return None
    return {name: round(statistics.median(values), 3) for name, values in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-edge", default=os.environ.get("EDGE_BENCH_BASELINE_EDGE"),
                        help="the edge command of an older checkout (open_s before)")
    parser.add_argument("--baseline-pipeline", default=None,
                        help="with --baseline-edge: the older checkout's own built page"
                             " pipeline.toml (default: this tree's, its new keys left out)")
    parser.add_argument("--cli-only", action="store_true",
                        help="measure edge probe, edge plugins and import onnxruntime only")
    args = parser.parse_args()
    rounds = int(os.environ.get("EDGE_BENCH_ROUNDS", "5"))
    cli_rounds = int(os.environ.get("EDGE_BENCH_CLI_ROUNDS", "15"))
    page = Path(os.environ.get("EDGE_BENCH_PAGE", OCR / "page.png"))
    pipeline = OCR / "pipeline.toml"
    if not args.cli_only and (not pipeline.is_file() or not page.is_file()):
        raise SystemExit(f"{pipeline} or {page} is missing: run `make demo` first")
    ensure_bytecode()
    edge = shutil.which("edge", path=os.path.dirname(sys.executable)) or "edge"
    python = sys.executable

    # -- the command line ---------------------------------------------------------------
    ort = Side("import_onnxruntime", lambda: wall([python, "-c", "import onnxruntime"]))
    probe = Side("edge_probe", lambda: wall([edge, "probe", "--json"]))
    # the QNN probe's interpreter answer is kept per boot and installed stack: a user's
    # first edge probe after a boot or an install asks it, as this side does every time
    uncached = Side("edge_probe_uncached", lambda: wall(
        [edge, "probe", "--json"], {**os.environ, "EDGE_PROBE_CACHE": "off"}))
    plugins = Side("edge_plugins", lambda: wall([edge, "plugins", "--json"]))
    python_only = Side("python_startup", lambda: wall([python, "-c", "pass"]))
    alternate([ort, probe, uncached, plugins, python_only], cli_rounds)
    cli_ratios = {
        "edge_probe_over_import_onnxruntime": round(probe.median / ort.median, 3),
        "edge_plugins_over_import_onnxruntime": round(plugins.median / ort.median, 3),
        "edge_probe_uncached_over_import_onnxruntime": round(uncached.median / ort.median, 3),
    }
    if args.cli_only:
        medians = {side.name: side.median for side in [ort, probe, uncached, plugins, python_only]}
        for name, value in medians.items():
            print(f"{name:30s} p50 {value * 1e3:8.1f} ms")
        print(json.dumps({"benchmark": "startup", "cli_rounds": cli_rounds, **cli_ratios,
                          "p50_ms": {name: round(value * 1e3, 1)
                                     for name, value in medians.items()},
                          "machine": host_identity()}))
        return

    # -- the first answer on a page -------------------------------------------------------
    with tempfile.TemporaryDirectory(prefix="edge-startup-") as scratch:
        stored_dir = Path(scratch) / "stored"
        run = [edge, "run", str(pipeline), "--input", str(page), "--json"]
        wall(run, cache_env(stored_dir))  # stores the page pipeline's load gates
        fresh = iter(range(1 << 30))

        def first_ever() -> tuple[float, str]:
            empty = Path(scratch) / f"empty-{next(fresh)}"
            result = wall(run, cache_env(empty))
            shutil.rmtree(empty, ignore_errors=True)
            return result

        sides = [
            Side("rapidocr_first_answer", lambda: wall([python, "-c", RAPIDOCR, str(page)])),
            Side("edge_first_answer_stored", lambda: wall(run, cache_env(stored_dir))),
            Side("edge_first_answer_first_ever", first_ever),
        ]
        before: Side | None = None
        if args.baseline_edge:
            older = baseline_pipeline(Path(args.baseline_pipeline or pipeline), Path(scratch))
            baseline_run = [args.baseline_edge, "run", str(older), "--input", str(page),
                            "--json"]
            before = Side("edge_before_first_answer",
                          lambda: wall(baseline_run, cache_env(Path(scratch) / "before")))
            sides.append(before)
        alternate(sides, rounds)
    rapid, stored, ever = sides[0], sides[1], sides[2]

    medians = {side.name: side.median
               for side in [ort, probe, uncached, plugins, python_only, *sides]}
    for name, value in medians.items():
        print(f"{name:30s} p50 {value * 1e3:8.1f} ms")
    print(json.dumps({
        "benchmark": "startup",
        "rounds": rounds,
        "cli_rounds": cli_rounds,
        "page": page.name,
        "cold_first_answer_over_rapidocr": round(stored.median / rapid.median, 3),
        "cold_first_answer_over_rapidocr_first_ever": round(ever.median / rapid.median, 3),
        **cli_ratios,
        "open_s": {"before": open_seconds(before) if before is not None else None,
                   "after_first_ever": open_seconds(ever),
                   "after_stored": open_seconds(stored)},
        "phases_stored": {"after": phases(stored),
                          "before": phases(before) if before is not None else None},
        # the stored side over the older tree's, round by round (the same load)
        "stored_over_before": (summary([a / b for a, b in zip(stored.samples, before.samples,
                                                               strict=True)])
                               if before is not None else None),
        "p50_ms": {name: round(value * 1e3, 1) for name, value in medians.items()},
        "machine": host_identity(),
        # what the older side is, by its own --version (never a path of this machine)
        "baseline_edge": (subprocess.run([args.baseline_edge, "--version"], capture_output=True,
                                         text=True, check=False).stdout.strip()
                          if args.baseline_edge else None),
    }))


if __name__ == "__main__":
    main()
