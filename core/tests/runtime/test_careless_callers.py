"""The in-process API used carelessly: what a caller abandons or gets wrong is given back.

Real echo workers. Each test checks that nothing stays charged afterwards: the
pipeline's admission, the stage's in-flight slots (and, through the autouse leak
check, processes and shared-memory segments).
"""

from __future__ import annotations

import numpy as np

from edge_core.runtime import Pipeline

from .conftest import OpenPipeline, echo_stage

X = np.ones((2, 2), np.float32)


def _charged(pipeline: Pipeline) -> tuple[int, int]:
    """(admission slots taken, requests the stage still holds)."""
    stage = pipeline.stage("s")
    return pipeline.admission.used, stage.outstanding


def test_a_stream_closed_half_way_gives_back_its_stage_slot(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible", stream_chunks=20,
                                        chunk_rate_hz=50), admission=2)
    for _ in range(3):  # each closed after its first token (explicitly, or abandoned)
        stream = pipeline.stream({"x": X})
        next(stream)
        stream.close()
    abandoned = pipeline.stream({"x": X})
    next(abandoned)
    del abandoned  # never closed: the generator's finalizer closes it
    assert _charged(pipeline) == (0, 0)
    assert pipeline.health()["stages"]["s"]["state"] == "ready"
    with pipeline.run({"x": X}, params={"stream_chunks": 0}) as result:  # still serves
        assert result.outputs["x"].shape == (2, 2)
    assert _charged(pipeline) == (0, 0)
