"""ONNX Runtime's CPU arena in an ort-cpu worker: what it keeps, and what the options say.

The graph is ``y = relu(x + x)`` with a symbolic batch; its shape set serves 1 to 2 000 000
rows of 3 (24 MB at the top), so one large request leaves a large working set behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core.artifacts import create_manifest
from edge_core.config import load_pipeline, structure_config
from edge_core.errors import ConfigError
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
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
def plugins() -> PluginSet:
    return load_plugins(env={"EDGE_PLUGINS": "ort-cpu"})


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


def _after_a_large_request(plugins: PluginSet, bundle: Path,
                           options: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    with _open(plugins, bundle, options) as pipeline:
        x = np.full((ROWS, 3), -0.5, np.float32)
        with pipeline.run({"x": x}) as result:
            assert float(result.outputs["y"].max()) == 0.0
        with pipeline.run({"x": x[:4]}) as result:  # a small one after it
            np.testing.assert_array_equal(result.outputs["y"], np.zeros((4, 3)))
        stage = pipeline.execution_plan()["stages"][0]
        return _anonymous(int(stage["worker"]["pid"])), stage["worker"]["load"]["memory"]


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="Linux /proc only")
def test_without_the_arena_a_large_request_leaves_nothing_behind_with_it_the_arena_keeps_it(
    plugins: PluginSet, bundle: Path,
) -> None:
    kept, arena = _after_a_large_request(plugins, bundle, {"cpu_mem_arena": True})
    freed, plain = _after_a_large_request(plugins, bundle, {"cpu_mem_arena": False})
    shrunk, shrink = _after_a_large_request(plugins, bundle, {"cpu_mem_arena": True,
                                                              "arena_shrinkage": True})
    assert arena["cpu_mem_arena"] is True and arena["arena_shrinkage"] is False
    assert plain["cpu_mem_arena"] is False and plain["heap"]["policy"] == "lean"
    assert shrink["arena_shrinkage"] is True
    # x + x at 2 000 000 x 3 is 24 MB: the arena keeps it (and more), the others do not
    assert kept - freed > 16 * MiB, (kept, freed)
    assert kept - shrunk > 16 * MiB, (kept, shrunk)


def test_arena_settings_without_the_arena_are_refused_naming_the_option() -> None:
    path = "stages[0].backend.options"
    for option, value in (("arena_shrinkage", True),
                          ("arena_extend_strategy", "same_as_requested")):
        with pytest.raises(ConfigError, match=f"{option}: needs cpu_mem_arena = true"):
            structure_config({"cpu_mem_arena": False, option: value}, OrtOptions, path=path)
    with pytest.raises(ConfigError, match=r"backend.options.arena_extend_strategy"):
        structure_config({"cpu_mem_arena": True, "arena_extend_strategy": "doubling"},
                         OrtOptions, path=path)
    chosen = structure_config({"cpu_mem_arena": True, "arena_shrinkage": True}, OrtOptions,
                              path=path)
    assert chosen.arena_shrinkage is True
