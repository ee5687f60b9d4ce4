"""Cost of verifying an artifact bundle: in place vs. staged copy, and the pre-load checks.

Builds a bundle with one graph and a ~100 MB external-data file in a temporary directory,
then times (best of N, warm page cache):

- ``read``: reading the file once (the floor for any hashing);
- ``copyfile``: ``shutil.copyfile`` (the floor for any copy);
- ``verify_in_place``: ``verify_bundle(stage=False)``;
- ``verify_staged``: ``verify_bundle()`` (hash + copy from the same buffer);
- ``ensure_unchanged``: the fingerprint check before load;
- ``ensure_unchanged_rehash_in_place`` / ``_staged``: the same with ``rehash=True``;
- ``cleanup``: removing the staged copy.

With ``--pipeline FILE`` (e.g. ``build/ocr/pipeline.toml`` from ``make demo``), also the
controller's verifications at that pipeline's open, in CPU seconds (``process_time``,
median of alternating blocks of one run each), both with this tree's ``.npz`` reader:

- ``open_per_replica``: ``verify_bundle`` once per replica (what every load did before
  verifications were shared), ``open_shared``: ``verify_once`` per replica inside one
  ``verification_scope`` (what the opener does); the count of full verifications each;
- ``npz_load`` / ``npz_headers``: every example archive of those bundles read with
  ``load_npz`` (every array loaded) against ``npz_headers`` (headers, data streamed).

Last line: one JSON object with every timing in seconds and the sizes.
Usage: ``python benchmarks/artifact_verify.py [--mb 100] [--repeat 3] [--pipeline FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edge_core.artifacts import create_manifest, verification_scope, verify_bundle, verify_once
from edge_core.artifacts.references import load_npz, npz_headers


def _best(repeat: int, action: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def _bundle(root: Path, size: int) -> Path:
    import onnx
    from onnx import TensorProto, helper

    directory = root / "bundle"
    directory.mkdir()
    count = size // 4
    weights = np.random.default_rng(0).random(count, dtype=np.float32)
    (directory / "weights.bin").write_bytes(weights.tobytes())
    tensor = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[count])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(size))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [count])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [count])], [tensor],
    )
    onnx.save_model(helper.make_model(graph), directory / "model.onnx")
    create_manifest(directory)
    return directory


def _replica_dirs(pipeline: Path) -> list[Path]:
    """Each replica's bundle directory, in the pipeline file's order."""
    import tomllib

    config = tomllib.loads(pipeline.read_text())
    return [(pipeline.parent / stage["manifest"]).parent
            for stage in config["stages"] for _ in range(int(stage.get("replicas", 1)))]


def _cpu(action: Callable[[], object]) -> float:
    start = time.process_time()
    action()
    return time.process_time() - start


def open_figures(pipeline: Path, repeat: int) -> dict[str, float | int]:
    """The open's verifications per replica against shared, and the two .npz readers."""
    import statistics

    dirs = _replica_dirs(pipeline)
    counted: dict[str, int] = {"per_replica": 0, "shared": 0}

    def per_replica() -> None:
        handles = [verify_bundle(d) for d in dirs]
        counted["per_replica"] = len(handles)
        for handle in handles:
            handle.cleanup()

    def shared() -> None:
        with verification_scope() as scope:
            handles = [verify_once(d) for d in dirs]
        counted["shared"] = scope.verified
        for handle in handles:
            handle.cleanup()

    archives = sorted({a for d in dirs for a in d.rglob("*.npz")})

    def loads() -> None:
        for archive in archives:
            load_npz(archive, str(archive))

    def headers() -> None:
        for archive in archives:
            npz_headers(archive, str(archive))

    samples: dict[str, list[float]] = {"per_replica": [], "shared": [], "npz_load": [],
                                       "npz_headers": []}
    actions = {"per_replica": per_replica, "shared": shared, "npz_load": loads,
               "npz_headers": headers}
    for action in actions.values():  # warm the page cache and imports, unmeasured
        action()
    for _ in range(max(repeat, 5)):
        for name, action in actions.items():  # alternating blocks of one run each
            samples[name].append(_cpu(action))
    med = {name: statistics.median(values) for name, values in samples.items()}
    return {"open_replicas": len(dirs), "npz_archives": len(archives),
            "open_per_replica_cpu_s": med["per_replica"], "open_shared_cpu_s": med["shared"],
            "open_per_replica_verifications": counted["per_replica"],
            "open_shared_verifications": counted["shared"],
            "open_shared_over_per_replica": med["shared"] / med["per_replica"],
            "npz_load_cpu_s": med["npz_load"], "npz_headers_cpu_s": med["npz_headers"],
            "npz_headers_over_load": med["npz_headers"] / med["npz_load"]}


def main() -> None:
    """Run the measurements and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="external data size in MB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pipeline", type=Path, default=None,
                        help="also measure the verifications at this pipeline's open")
    args = parser.parse_args()
    size = args.mb * 1_000_000
    with tempfile.TemporaryDirectory(prefix="edge-bench-") as scratch:
        root = Path(scratch)
        directory = _bundle(root, size)
        weights = directory / "weights.bin"
        staging = root / "staging"
        staging.mkdir()
        results: dict[str, float | int] = {"bytes": size}

        def read() -> None:
            with open(weights, "rb", buffering=0) as handle:
                while handle.read(1 << 20):
                    pass

        def copy() -> None:
            shutil.copyfile(weights, root / "copy.bin")
            os.unlink(root / "copy.bin")

        def staged() -> None:
            verify_bundle(directory, staging_root=staging).cleanup()

        read()
        results["read_s"] = _best(args.repeat, read)
        results["copyfile_s"] = _best(args.repeat, copy)
        results["verify_in_place_s"] = _best(
            args.repeat, lambda: verify_bundle(directory, stage=False))
        results["verify_staged_s"] = _best(args.repeat, staged)
        in_place = verify_bundle(directory, stage=False)
        with verify_bundle(directory, staging_root=staging) as bundle:
            results["ensure_unchanged_s"] = _best(args.repeat, bundle.ensure_unchanged)
            results["ensure_unchanged_rehash_staged_s"] = _best(
                args.repeat, lambda: bundle.ensure_unchanged(rehash=True))
            results["ensure_unchanged_rehash_in_place_s"] = _best(
                args.repeat, lambda: in_place.ensure_unchanged(rehash=True))
            start = time.perf_counter()
        bundle.cleanup()
        results["cleanup_s"] = time.perf_counter() - start
        if args.pipeline is not None:
            results.update(open_figures(args.pipeline, args.repeat))
        for key, value in results.items():
            if key.endswith("_s") and not key.endswith("cpu_s"):
                print(f"{key:38s} {value * 1000:9.1f} ms  {size / value / 1e6:8.0f} MB/s")
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                          for k, v in results.items()}))


if __name__ == "__main__":
    main()
