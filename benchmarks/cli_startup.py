"""`edge plugins` wall time against `python -c "import onnxruntime"`, measured side by side.

Runs the commands interleaved, several rounds, and prints medians. The last line is one JSON
object with `plugins_over_ort_import` (goal: below 0.5). No assertion: the machine is shared
and noisy; read the ratio.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from precompile import ensure_bytecode

ROUNDS = int(os.environ.get("EDGE_BENCH_ROUNDS", "15"))


def wall(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> None:
    ensure_bytecode()
    edge = shutil.which("edge", path=os.path.dirname(sys.executable)) or "edge"
    cases = {
        "python_startup": [sys.executable, "-c", "pass"],
        "edge_plugins": [edge, "plugins", "--json"],
        "import_onnxruntime": [sys.executable, "-c", "import onnxruntime"],
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for cmd in cases.values():  # warm the file cache once
        wall(cmd)
    for _ in range(ROUNDS):
        for name, cmd in cases.items():
            samples[name].append(wall(cmd))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name, value in medians.items():
        print(f"{name:20s} p50 {value * 1e3:7.1f} ms  (n={ROUNDS})")
    print(json.dumps({
        "rounds": ROUNDS,
        "p50_ms": {k: round(v * 1e3, 2) for k, v in medians.items()},
        "plugins_over_ort_import": round(
            medians["edge_plugins"] / medians["import_onnxruntime"], 3
        ),
    }))


if __name__ == "__main__":
    main()
