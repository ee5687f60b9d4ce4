"""ONNX Runtime's CPU arena in an ort-cpu worker: what it keeps, and what the options say.

The graph is ``y = relu(x + x)`` with a symbolic batch; its shape set serves 1 to 2 000 000
rows of 3 (24 MB at the top), so one large request leaves a large working set behind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.artifacts import create_manifest
from edge_core.config import load_pipeline, structure_config
from edge_core.errors import ConfigError
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_ort.bundles import write_add_relu_graph
from edge_ort.options import OrtOptions

no_leaks = pytest.fixture(autouse=True)(_no_leaks)
GiB = 1024**3
MiB = 1024**2
ROWS = 2_000_000


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("arena") / "b"
    directory.mkdir()
    write_add_relu_graph(directory, shape=("n", 3))
    examples = []
    for rows in (1, 4):
        x = np.linspace(-1, 1, rows * 3, dtype=np.float32).reshape(rows, 3)
        np.savez(directory / f"n{rows}.npz", x=x)
        np.savez(directory / f"n{rows}.expected.npz", y=np.maximum(x + x, 0))
        examples.append({"example_inputs": f"n{rows}.npz",
                         "expected_outputs": f"n{rows}.expected.npz"})
    np.savez(directory / "nmax.npz", x=np.ones((ROWS, 3), np.float32))
    examples.append({"example_inputs": "nmax.npz"})
    shapes = [{"name": "rows", "inputs": {"x": {"dtype": "float32", "dims": [[1, ROWS], 3]}},
               "examples": [examples[0], examples[2], examples[1]]}]
    create_manifest(directory, component="add-relu", example_inputs="n1.npz",
                    expected_outputs="n1.expected.npz", exporter="onnx.helper",
                    validation={"shapes": shapes})
    return directory


def _open(plugins: PluginSet, bundle: Path, options: dict[str, Any]) -> Pipeline:
    config = load_pipeline({"name": "p", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu", "options": options},
         "manifest": str(bundle), "max_io_bytes": "64 MiB"}]})
    ledger = ResourceLedger([Pool(name="machine:ram", total=8 * GiB)])
    return Pipeline.open(config, plugins, ledger)


def _anonymous(pid: int) -> int:
    """The worker's anonymous memory (heap and arena; not shared-memory segments)."""
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
        for line in rollup:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Anonymous line")


def _after_a_large_request(plugins: PluginSet, bundle: Path, options: dict[str, Any],
                           until_below: int | None = None) -> tuple[int, dict[str, Any]]:
    """The worker's anonymous memory after a large request then a small one (polled for
    up to 20 s while it stays at or above ``until_below``), and its memory settings."""
    with _open(plugins, bundle, options) as pipeline:
        x = np.full((ROWS, 3), -0.5, np.float32)
        with pipeline.run({"x": x}) as result:
            assert float(result.outputs["y"].max()) == 0.0
        with pipeline.run({"x": x[:4]}) as result:  # a small one after it
            np.testing.assert_array_equal(result.outputs["y"], np.zeros((4, 3)))
        stage = pipeline.execution_plan()["stages"][0]
        pid = int(stage["worker"]["pid"])
        found = _anonymous(pid)
        deadline = time.monotonic() + 20
        while until_below is not None and found >= until_below and time.monotonic() < deadline:
            time.sleep(0.25)
            found = _anonymous(pid)
        return found, stage["worker"]["load"]["memory"]


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="Linux /proc only")
def test_the_arena_gives_a_large_requests_working_set_back_at_rest_or_after_every_call(
    plugins: PluginSet, bundle: Path,
) -> None:
    kept, never = _after_a_large_request(plugins, bundle, {"arena_shrinkage": "never"})
    every, each = _after_a_large_request(plugins, bundle, {"arena_shrinkage": "every-call"})
    plain, off = _after_a_large_request(plugins, bundle, {"cpu_mem_arena": False},
                                        until_below=kept - 16 * MiB)
    rested, rest = _after_a_large_request(plugins, bundle, {},  # the defaults
                                          until_below=kept - 16 * MiB)
    assert never == {"heap": never["heap"], "cpu_mem_arena": True,
                     "arena_extend_strategy": "next_power_of_two", "arena_shrinkage": "never"}
    assert rest["arena_shrinkage"] == "at-rest" and rest["heap"]["policy"] == "rest"
    assert each["arena_shrinkage"] == "every-call"
    assert off["cpu_mem_arena"] is False and off["arena_shrinkage"] == "never"
    # x + x at 2 000 000 x 3 is 24 MB: an arena never shrunk keeps it (and more); shrunk
    # after every call, at rest, or without the arena (the heap trimmed at rest), it goes
    assert kept - every > 16 * MiB, (kept, every)
    assert kept - rested > 16 * MiB, (kept, rested)
    assert kept - plain > 16 * MiB, (kept, plain)


def test_an_extend_strategy_without_the_arena_is_refused_naming_the_option() -> None:
    path = "stages[0].backend.options"
    with pytest.raises(ConfigError, match=r"arena_extend_strategy: needs cpu_mem_arena = true"):
        structure_config({"cpu_mem_arena": False, "arena_extend_strategy": "same_as_requested"},
                         OrtOptions, path=path)
    with pytest.raises(ConfigError, match=r"backend.options.arena_extend_strategy"):
        structure_config({"arena_extend_strategy": "doubling"}, OrtOptions, path=path)
    default = structure_config({}, OrtOptions, path=path)
    assert default.cpu_mem_arena is True
    assert default.arena_shrinkage == "at-rest"
    plain = structure_config({"cpu_mem_arena": False}, OrtOptions, path=path)
    assert plain.arena_shrinkage == "at-rest"  # ignored without the arena; not an error
    with pytest.raises(ConfigError, match=r"backend.options.arena_shrinkage"):
        structure_config({"arena_shrinkage": True}, OrtOptions, path=path)


def test_an_arena_option_refused_at_open_charges_nothing_and_starts_no_worker(
    plugins: PluginSet, bundle: Path, tmp_path: Path,
) -> None:
    """The refusal through the real open path and the command line: the ledger holds no
    reservation, and this test's processes and segments are gone (``no_leaks``)."""
    ledger = ResourceLedger([Pool(name="machine:ram", total=8 * GiB)])
    bad = {"cpu_mem_arena": False, "arena_extend_strategy": "same_as_requested"}
    config = load_pipeline({"name": "p", "stages": [
        {"id": "s", "backend": {"name": "ort-cpu", "options": bad}, "manifest": str(bundle)}]})
    field = "stages[0].backend.options.arena_extend_strategy"
    with pytest.raises(ConfigError, match=re.escape(f"{field}: needs cpu_mem_arena = true")):
        Pipeline.open(config, plugins, ledger)
    snapshot = ledger.snapshot()
    assert snapshot["reservations"] == []
    assert all(pool["reserved"] == 0 for pool in snapshot["pools"].values())
    with pytest.raises(ConfigError, match=r"backend.options.arena_shrinkage"):
        Pipeline.open(load_pipeline({"name": "p", "stages": [
            {"id": "s", "backend": {"name": "ort-cpu",
                                    "options": {"arena_shrinkage": "sometimes"}},
             "manifest": str(bundle)}]}), plugins, ledger)
    assert ledger.snapshot()["reservations"] == []
    (tmp_path / "p.toml").write_text(
        f'name = "p"\n\n[[stages]]\nid = "s"\nmanifest = "{bundle}"\n\n'
        '[stages.backend]\nname = "ort-cpu"\n\n[stages.backend.options]\n'
        'cpu_mem_arena = false\narena_extend_strategy = "same_as_requested"\n')
    done = subprocess.run([str(Path(sys.executable).with_name("edge")), "run",
                           str(tmp_path / "p.toml"), "--json"], capture_output=True,
                          text=True, timeout=300, check=False,
                          env={**os.environ, "EDGE_PLUGINS": "ort-cpu"})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert field in done.stdout + done.stderr and "Traceback" not in done.stderr
