"""Two checkouts' hot paths compared in alternating process pairs of one sitting.

Run: ``.venv/bin/python benchmarks/trees.py --old DIR [--new DIR] [--pairs N]``. ``DIR``
is a checkout of this repository with its own ``.venv`` (``make setup`` made it); the new
side defaults to this checkout. Each pair runs ``benchmarks/ort_call.py --quick`` and
``benchmarks/transport.py --quick`` once in each tree, each with its own interpreter,
the order swapped every pair, so both trees see the same load on this shared machine.

Per pair and figure it takes new / old of:

- ``ort_call`` raw: ``edge_tiny_us`` (a tiny ONNX Runtime call through a stage);
- ``transport`` raw: ``edge_echo_p50_us`` (a float32[4] echo through a worker);
- each of those over its own run's ``multiprocessing.Pipe`` figure (``mp_pipe_us``,
  ``mp_pipe_p50_us``): the anchor taken in the same process, which cancels the machine's
  drift between the two runs of a pair.

The last line printed is one JSON object with, per figure, the median paired ratio and
its 95 % bootstrap interval (``ratio``, ``ci95``) and the raw samples. A hot path that
did not slow down has an interval whose upper bound is at most 1.05.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIGURES = {
    "ort_call": ("ort_call.py", "edge_tiny_us", "mp_pipe_us"),
    "transport": ("transport.py", "edge_echo_p50_us", "mp_pipe_p50_us"),
}


def run_once(tree: Path, script: str) -> dict[str, float]:
    """One benchmark in ``tree`` with that tree's interpreter: its last JSON line."""
    done = subprocess.run([str(tree / ".venv" / "bin" / "python"),
                           str(tree / "benchmarks" / script), "--quick"],
                          cwd=tree, capture_output=True, text=True, timeout=900, check=True)
    line = done.stdout.strip().splitlines()[-1]
    parsed: dict[str, float] = json.loads(line)
    return parsed


def interval(ratios: list[float], draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A 95 % percentile-bootstrap interval of the median of ``ratios``."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def summary(ratios: list[float]) -> dict[str, object]:
    """Median, interval and samples of one figure's paired ratios."""
    low, high = interval(ratios)
    return {"ratio": round(statistics.median(ratios), 4),
            "ci95": [round(low, 4), round(high, 4)],
            "pairs": [round(r, 4) for r in ratios]}


def main() -> None:
    """Alternate the two trees pair by pair and print the paired ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--old", type=Path, required=True, help="the checkout compared against")
    parser.add_argument("--new", type=Path, default=HERE.parent, help="default: this checkout")
    parser.add_argument("--pairs", type=int, default=6, help="process pairs (at least 5)")
    parser.add_argument("--figure", action="append", choices=sorted(FIGURES),
                        help="measure only this figure (repeatable; default: all)")
    args = parser.parse_args()
    if args.pairs < 5:
        parser.error(f"--pairs must be at least 5, got {args.pairs}")
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    for side, tree in trees.items():
        if not (tree / ".venv" / "bin" / "python").exists():
            parser.error(f"--{side} {tree}: no .venv/bin/python there (run make setup in it)")
    ratios: dict[str, list[float]] = {}
    for pair in range(args.pairs):
        order = ["old", "new"] if pair % 2 == 0 else ["new", "old"]
        for name in args.figure or sorted(FIGURES):
            script, raw, anchor = FIGURES[name]
            found = {side: run_once(trees[side], script) for side in order}
            ratios.setdefault(f"{name}_raw", []).append(found["new"][raw] / found["old"][raw])
            ratios.setdefault(f"{name}_over_anchor", []).append(
                (found["new"][raw] / found["new"][anchor])
                / (found["old"][raw] / found["old"][anchor]))
            print(f"pair {pair + 1}/{args.pairs} {name}: old {found['old'][raw]:.1f} us, "
                  f"new {found['new'][raw]:.1f} us", file=sys.stderr, flush=True)
    print(json.dumps({"pairs": args.pairs, "old": str(trees["old"].name),
                      **{key: summary(values) for key, values in ratios.items()}}))


if __name__ == "__main__":
    main()
