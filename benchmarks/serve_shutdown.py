"""Where a generate stage's close goes: vLLM's EngineCore, the worker, the rest of the tree.

Opens a one-stage ``vllm-cuda`` pipeline on the CPU engine (the tiny local Llama of the
vllm-cuda tests unless ``--model`` names another), answers one request, then closes it
while a thread watches every process of the stage's tree (5 ms polls) and records when
each is gone, counted from the start of the close: vLLM's ``EngineCore`` process, the
worker (the vLLM environment's interpreter that runs the handler), and the last of the
tree (the supervisor, vLLM's resource tracker). Each run alternates with an anchor: the
same close of a one-stage ``echo`` pipeline (a plain worker), so that the machine's drift
falls on both.

Each run prints one JSON line; the last line is the summary, with medians:
``close_s`` (the whole close), ``engine_core_s`` (vLLM's part: it SIGTERMs the core,
waits up to ``engine_stop_s`` for its own teardown and kills it after that; a killed core
is gone once its memory is given back), ``worker_after_core_s`` (the worker's own exit
once the core is gone; negative when the worker left while a killed core was still being
reaped), ``tree_after_worker_s`` (the supervisor and the resource tracker), the retire
escalation seen, the stage's ``engine_stop_s``, the bound docs/serve.md states (18 s
with the default) and the anchor's ``close_s``.

``--engine-stop-s 1`` measures the window of before (the core killed mid-teardown on
every close); ``--engine-stop-s 5`` vLLM's own default window.

Run: ``.venv/bin/python benchmarks/serve_shutdown.py [--runs N] [--engine-stop-s S]
[--python PY --model DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from edge_core.runtime.pipeline_files import open_pipeline
from edge_vllm_cuda.options import DEFAULT_ENGINE_STOP_S
from edge_vllm_cuda.stage import RETIRE_MARGIN_S

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_generate import environment, pipeline_file

# The anchor runs the echo test backend (hidden from users unless asked for).
os.environ["EDGE_TEST_BACKENDS"] = "1"

#: The retire deadline after the worker's window (StageRuntime's default).
RETIRE_DEADLINE_S = 5.0
#: The stage's default ``engine_stop_s`` (``--engine-stop-s`` sets another).
ENGINE_STOP_S = DEFAULT_ENGINE_STOP_S


def _pipelines(folder: Path, python: Path, model: Path,
               engine_stop_s: float) -> tuple[Path, Path]:
    generate = pipeline_file(folder, python, model,
                             {"max_num_seqs": 4, "engine_stop_s": engine_stop_s})
    echo = folder / "echo.toml"
    echo.write_text('name = "echo"\n\n[[stages]]\nid = "echo"\n\n[stages.backend]\n'
                    'name = "echo"\n')
    return generate, echo


def _role(proc: psutil.Process) -> str:
    try:
        line = " ".join(proc.cmdline())
        name = proc.name()
    except psutil.Error:
        return "gone"
    if "EngineCore" in name or "EngineCore" in line:
        return "engine_core"
    if "supervisor" in line:
        return "supervisor"
    if "resource_tracker" in line:
        return "resource_tracker"
    return "worker"


def _close_watched(path: Path, request: dict[str, Any] | None) -> dict[str, Any]:
    """Open, answer one request, close while watching the tree; the timings."""
    import numpy as np

    pipeline = open_pipeline(str(path))
    inputs = {} if request is not None else {"x": np.ones((2, 2), np.float32)}
    with pipeline.run(inputs, params=request):
        pass
    tree = {proc.pid: (_role(proc), proc) for proc in psutil.Process().children(recursive=True)}
    gone: dict[str, float] = {}
    stop = threading.Event()
    started = time.monotonic()

    def watch() -> None:
        while not stop.is_set():
            for pid, (role, proc) in tree.items():
                key = f"{role}:{pid}"
                if key in gone:
                    continue
                try:
                    alive = proc.status() != psutil.STATUS_ZOMBIE
                except psutil.NoSuchProcess:
                    alive = False
                if not alive:
                    gone[key] = time.monotonic() - started
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    summary = pipeline.close()
    close_s = time.monotonic() - started
    time.sleep(0.05)
    stop.set()
    watcher.join()
    (stage,) = summary.values()
    by_role: dict[str, float] = {}
    for key, seconds in gone.items():
        role = key.split(":", 1)[0]
        by_role[role] = max(by_role.get(role, 0.0), seconds)
    return {"close_s": round(close_s, 3), "retire_s": stage["retire"]["elapsed_s"],
            "escalation": stage["retire"]["escalation"],
            "gone_s": {role: round(s, 3) for role, s in sorted(by_role.items())}}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print one JSON line per run and the summary last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--engine-stop-s", type=float, default=ENGINE_STOP_S,
                        help="the stage's engine_stop_s (vLLM's own default: 5)")
    parser.add_argument("--python", help="a vLLM environment's interpreter")
    parser.add_argument("--model", help="a model directory that environment loads")
    args = parser.parse_args(argv)
    python, model = environment(args.python, args.model)
    folder = Path(tempfile.mkdtemp(prefix="edge-bench-shutdown-"))
    generate, echo = _pipelines(folder, python, model, args.engine_stop_s)
    runs, anchors = [], []
    for index in range(args.runs):
        run = _close_watched(generate, {"prompt": "edge", "max_tokens": 4, "temperature": 0.0})
        anchor = _close_watched(echo, None)
        gone = run["gone_s"]
        core = gone.get("engine_core")
        worker = gone.get("worker")
        run["engine_core_s"] = core
        run["worker_after_core_s"] = (round(worker - core, 3)
                                      if core is not None and worker is not None else None)
        run["tree_after_worker_s"] = (round(max(gone.values()) - worker, 3)
                                      if worker is not None else None)
        print(json.dumps({"run": index, "generate": run, "anchor_close_s": anchor["close_s"]}),
              flush=True)
        runs.append(run)
        anchors.append(anchor["close_s"])

    def median(key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return round(statistics.median(values), 3) if values else None

    print(json.dumps({
        "benchmark": "serve_shutdown", "runs": len(runs), "close_s": median("close_s"),
        "engine_core_s": median("engine_core_s"),
        "worker_after_core_s": median("worker_after_core_s"),
        "tree_after_worker_s": median("tree_after_worker_s"),
        "escalations": sorted({r["escalation"] for r in runs}),
        "engine_stop_s": args.engine_stop_s,
        "bound_s": round(args.engine_stop_s + RETIRE_MARGIN_S + RETIRE_DEADLINE_S, 3),
        "anchor_close_s": round(statistics.median(anchors), 3),
        "machine_load_1m": round(psutil.getloadavg()[0], 2)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
