"""The TOML examples in docs/config.md load as documented."""

from __future__ import annotations

import re
from pathlib import Path

from edge_core.config import load_pipeline, load_pyproject_pipeline

DOC = Path(__file__).resolve().parents[3] / "docs" / "config.md"


def _toml_blocks() -> list[str]:
    return re.findall(r"```toml\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_the_complete_pipeline_example_loads(tmp_path: Path) -> None:
    example = next(block for block in _toml_blocks() if block.startswith('name = "ocr"'))
    path = tmp_path / "pipeline.toml"
    path.write_text(example, encoding="utf-8")
    config = load_pipeline(path)
    assert [stage.id for stage in config.stages] == ["det", "rec"]
    assert config.ceilings() == {"machine:ram": 4 * 1024**3}


def test_the_pyproject_example_loads(tmp_path: Path) -> None:
    example = next(block for block in _toml_blocks() if block.startswith("[tool.edge]"))
    path = tmp_path / "pyproject.toml"
    path.write_text(example, encoding="utf-8")
    config = load_pyproject_pipeline(path, "ocr")
    assert config.plugins == ("myapp.edgeplugin",)
    assert dict(config.stages[0].backend.options) == {"intra_op_threads": 1}


def test_the_served_ocr_example_loads_with_replicas(tmp_path: Path) -> None:
    example = next(b for b in _toml_blocks() if b.startswith('name = "ocr-served"'))
    path = tmp_path / "pipeline.toml"
    path.write_text(example, encoding="utf-8")
    config = load_pipeline(path)
    assert config.admission == 4
    assert [stage.replicas for stage in config.stages] == [1, 1, 2]
    assert config.to_json()["stages"][2]["replicas"] == 2
