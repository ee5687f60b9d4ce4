"""Fixtures of the vllm-cuda tests: the leak check, the vLLM CPU environment, a tiny model."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from edge_core.testing.leaks import no_leaks as _no_leaks

sys.path.insert(0, str(Path(__file__).parent))

from vllm_env import build_tiny_model, ensure_env, route_env_table

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


BuildOnce = Callable[[str, Callable[[Path], None]], Path]


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter of the cached vLLM CPU environment (built on first use; a caller
    in another process, an xdist worker of this run or not, waits for that build:
    :func:`vllm_env.ensure_env` locks)."""
    return ensure_env()


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path, shared_build: BuildOnce) -> Path:
    """A tiny Llama (random weights, locally trained tokenizer) vLLM can load, built once
    per run (shared by the run's xdist workers)."""
    return shared_build("tiny-llama", lambda folder: build_tiny_model(vllm_python, folder))


PipelineFile = Callable[..., Path]


@pytest.fixture(scope="session")
def pipeline_file(vllm_python: Path, tiny_model: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> PipelineFile:
    """Write a one-stage vllm-cuda pipeline file on the vLLM environment's route."""
    folder = tmp_path_factory.mktemp("pipelines")

    def write(name: str = "gen", *, device: str = "cpu", extra: str = "",
              resources: str = "", max_model_len: int = 256, max_num_seqs: int = 8) -> Path:
        text = f'''
name = "{name}"
admission = 8

[[stages]]
id = "gen"

[stages.backend]
name = "vllm-cuda"

[stages.backend.options]
model = "{tiny_model}"
device = "{device}"
dtype = "float32"
max_model_len = {max_model_len}
enforce_eager = true
max_num_seqs = {max_num_seqs}
{extra}

[stages.backend.route]
name = "vllm-cpu"
interpreter = "{vllm_python}"
{resources}
{route_env_table()}'''
        path = folder / f"{name}.toml"
        path.write_text(text)
        return path

    return write
