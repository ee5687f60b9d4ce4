"""A vllm-cuda pipeline opened for a test and closed after it, its close checked."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edge_core.runtime.pipeline import Pipeline
from edge_core.runtime.pipeline_files import open_pipeline


@contextmanager
def opened(path: Path) -> Iterator[Pipeline]:
    """The pipeline of ``path`` (its one stage named ``gen``), open for the ``with`` block.

    On leaving, it is closed: its worker's retirement must be verified and its ledger
    left empty.
    """
    pipeline = open_pipeline(path)
    try:
        yield pipeline
    finally:
        summary = pipeline.close()
        assert summary["gen"]["retire"]["verified"] is True
        assert pipeline.ledger.is_empty()
