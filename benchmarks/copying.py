"""Large copies: ``np.copyto`` on one thread vs ``edge_contracts.copying.copy_bytes``.

Run: ``.venv/bin/python benchmarks/copying.py``. Both are measured in alternating blocks
in this one run, for sizes around :data:`~edge_contracts.copying.PARALLEL_MIN_BYTES`
(forced on for every size here, to show where sharing a copy starts to pay). The last
line is one JSON object with the p50s and their ratios (shared / single).
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from edge_contracts import copying

MIB = 1024 * 1024


def samples(dst: np.ndarray, src: np.ndarray, shared: bool, n: int) -> list[float]:
    """``n`` timed copies, on one thread or shared between threads."""
    copying.PARALLEL_MIN_BYTES = 1 if shared else 1 << 62
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        copying.copy_bytes(dst, src)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    threads = copying.copy_threads()
    results: dict[str, object] = {"threads": threads}
    for mib in (1, 4, 8, 16, 32, 64):
        src = np.ones(mib * MIB, np.uint8)
        dst = np.empty_like(src)
        single: list[float] = []
        shared: list[float] = []
        reps = 20 if mib >= 16 else 100
        for block in range(6):
            first, second = (single, shared) if block % 2 else (shared, single)
            first.extend(samples(dst, src, first is shared, reps))
            second.extend(samples(dst, src, second is shared, reps))
        one, many = statistics.median(single), statistics.median(shared)
        print(f"{mib:3d} MiB: one thread {one * 1e6:9.1f} us   {threads} threads "
              f"{many * 1e6:9.1f} us   ratio {many / one:5.2f}")
        results[f"{mib}mib"] = {"single_us": one * 1e6, "shared_us": many * 1e6,
                                "ratio": many / one}
    print(json.dumps(results, separators=(",", ":")))


if __name__ == "__main__":
    main()
