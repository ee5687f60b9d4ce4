"""The one-stage ``vllm-cuda`` generate pipeline the generate benchmarks open.

``environment`` finds (or builds) the vLLM CPU environment and the tiny local Llama of
the vllm-cuda tests; ``pipeline_file`` writes a pipeline file serving it on that
environment's interpreter (the ``vllm-cpu`` route) with the benchmark's own engine
options. Used by ``serve_shutdown.py`` and ``token_count.py``.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

VLLM_TESTS = Path(__file__).resolve().parents[1] / "plugins" / "backends" / "vllm_cuda" / "tests"
#: The engine options every generate benchmark uses (the tests' tiny CPU engine).
ENGINE_OPTIONS: dict[str, object] = {"device": "cpu", "dtype": "float32", "max_model_len": 256,
                                     "enforce_eager": True}


def environment(python: str | None, model: str | None) -> tuple[Path, Path]:
    """The vLLM environment's interpreter and a model it loads (built when not given)."""
    sys.path.insert(0, str(VLLM_TESTS))
    from vllm_env import build_tiny_model, ensure_env

    interpreter = Path(python) if python else ensure_env()
    if model:
        return interpreter, Path(model)
    return interpreter, build_tiny_model(interpreter,
                                         Path(tempfile.mkdtemp(prefix="edge-bench-")) / "tiny")


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return f'"{value}"'


def pipeline_file(folder: Path, python: Path, model: Path, options: Mapping[str, object],
                  admission: int | None = None) -> Path:
    """Write ``folder/gen.toml``: pipeline ``gen``, one stage ``gen`` on ``vllm-cuda``.

    ``options`` are added to :data:`ENGINE_OPTIONS` (and override them).
    """
    engine = {"model": str(model), **ENGINE_OPTIONS, **options}
    lines = ['name = "gen"']
    if admission is not None:
        lines.append(f"admission = {admission}")
    lines += ["", "[[stages]]", 'id = "gen"', "", "[stages.backend]", 'name = "vllm-cuda"', "",
              "[stages.backend.options]"]
    lines += [f"{key} = {_toml(value)}" for key, value in engine.items()]
    lines += ["", "[stages.backend.route]", 'name = "vllm-cpu"', f'interpreter = "{python}"', ""]
    path = folder / "gen.toml"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
