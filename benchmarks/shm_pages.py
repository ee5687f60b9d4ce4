"""What shared memory itself costs a large zero-copy call on this host, outside any worker.

``large_overhead_memcpy_ratio_zero_copy`` (``benchmarks/ort_call.py``) compares a
64 MiB ``Relu`` called through a pipeline, its input in an input buffer and its output
written in place into the worker's segment, with the same ``session.run`` on private
memory. Part of the difference is not a copy and not edge-core: it is the memory. This
benchmark runs the same graph in one process, through an ``IOBinding`` (no copy either
way), in alternating blocks, with input and output in:

* ``anon``: private NumPy arrays (NumPy asks for transparent huge pages on large
  allocations, which the kernel grants when ``transparent_hugepage/enabled`` allows);
* ``shm``: sealed-memfd style shared mappings, the input mapped read-only as the worker
  maps a caller's buffer and the output in a writable mapping (shared memory gets huge
  pages only when ``transparent_hugepage/shmem_enabled`` allows; otherwise 4 KiB pages,
  16 384 of them per 64 MiB, and as many TLB entries to walk);
* ``shm_huge``: the same mappings of files whose pages were first collapsed into huge
  folios (:func:`edge_contracts.hugepages.back_with_huge_pages`, what a new segment
  gets), which the kernel grants whatever ``shmem_enabled`` says.

How many 2 MiB physical frames each input and output lies in is printed as
``frames_2mib`` (``None`` where this process may not read physical frame numbers: they
are shown to root only).

The last line is one JSON object: p50s, ``shm_over_anon_ms`` (the difference) and the
same divided by a 64 MiB ``np.copyto`` (``shm_over_anon_memcpy_ratio``: the part of the
zero-copy ratio that the pages alone account for), the same two for ``shm_huge``, with
the host's THP settings.

Run: ``.venv/bin/python benchmarks/shm_pages.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edge_contracts.hugepages import back_with_huge_pages

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ort_call import MIB, frames_2mib, make_bundle
from transport_timing import interleaved_all, p50

ELEMENTS = 16 * MIB  # float32: 64 MiB
HUGE_DONE: list[bool] = []  # whether each huge mapping's file was collapsed


def _thp(name: str) -> str:
    try:
        text = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text()
    except OSError:
        return "unknown"
    chosen = [word for word in text.split() if word.startswith("[")]
    return chosen[0].strip("[]") if chosen else text.strip()


def _shared(writable: bool, fill: np.ndarray | None = None, *, huge: bool = False,
            ) -> np.ndarray:
    """A 64 MiB float32 array in a memfd mapping (read-only view when not ``writable``).

    With ``huge`` the file's pages are collapsed into huge folios first (when the kernel
    allows: ``huge_pages`` in the result says whether it did).
    """
    fd = os.memfd_create("edge-bench-pages")
    try:
        os.ftruncate(fd, ELEMENTS * 4)
        if huge:
            HUGE_DONE.append(back_with_huge_pages(fd, ELEMENTS * 4))
        writer = mmap.mmap(fd, ELEMENTS * 4)
        np.frombuffer(writer, np.float32)[...] = 0 if fill is None else fill
        if writable:
            return np.frombuffer(writer, np.float32)
        reader = mmap.mmap(fd, ELEMENTS * 4, prot=mmap.PROT_READ)
        return np.frombuffer(reader, np.float32)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds = 10 if args.quick else 40
    with tempfile.TemporaryDirectory() as tmp:
        bundle = make_bundle(Path(tmp), "big", [ELEMENTS])
        session = ort.InferenceSession(str(bundle / "model.onnx"),
                                       providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal(ELEMENTS).astype(np.float32)
    anon_out = np.zeros_like(x)
    shm_in, shm_out = _shared(False, x), _shared(True)
    huge_in, huge_out = _shared(False, x, huge=True), _shared(True, huge=True)

    def runs(inp: np.ndarray, out: np.ndarray):  # type: ignore[no-untyped-def]
        def run(n: int) -> list[float]:
            samples = []
            for _ in range(n + 1):
                start = time.perf_counter()
                binding = session.io_binding()
                binding.bind_cpu_input("x", inp)
                binding.bind_output("y", "cpu", 0, np.float32, [ELEMENTS], out.ctypes.data)
                session.run_with_iobinding(binding)
                samples.append(time.perf_counter() - start)
            return samples[1:]
        return run

    src, dst = np.ones(ELEMENTS, np.float32), np.empty(ELEMENTS, np.float32)

    def copies(n: int) -> list[float]:
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            np.copyto(dst, src)
            samples.append(time.perf_counter() - start)
        return samples

    anon, shm, huge, memcpy = interleaved_all(
        [runs(x, anon_out), runs(shm_in, shm_out), runs(huge_in, huge_out), copies],
        rounds, 10 if not args.quick else 5)
    np.testing.assert_array_equal(anon_out, shm_out)  # the same work was done
    np.testing.assert_array_equal(anon_out, huge_out)
    difference = (p50(shm) - p50(anon)) * 1e3
    huge_difference = (p50(huge) - p50(anon)) * 1e3
    result = {
        "anon_ms": round(p50(anon) * 1e3, 3),
        "shm_ms": round(p50(shm) * 1e3, 3),
        "shm_over_anon_ms": round(difference, 3),
        "memcpy_64mib_ms": round(p50(memcpy) * 1e3, 3),
        "shm_over_anon_memcpy_ratio": round(difference / (p50(memcpy) * 1e3), 3),
        "shm_huge_ms": round(p50(huge) * 1e3, 3),
        "shm_huge_over_anon_ms": round(huge_difference, 3),
        "shm_huge_over_anon_memcpy_ratio": round(huge_difference / (p50(memcpy) * 1e3), 3),
        "huge_pages": all(HUGE_DONE),
        "frames_2mib": {name: [frames_2mib(inp), frames_2mib(out)] for name, (inp, out) in {
            "anon": (x, anon_out), "shm": (shm_in, shm_out),
            "shm_huge": (huge_in, huge_out)}.items()},
        "thp_enabled": _thp("enabled"),
        "thp_shmem_enabled": _thp("shmem_enabled"),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
