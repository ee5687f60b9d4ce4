"""The OCR bundles served by the edge runtime on ort-cpu equal the direct reference exactly.

Real worker processes, the real ledger; the pipeline's carry support (``carry:*`` tensors
kept out of the stage calls) is what the transforms rely on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import pipeline as runtime_pipeline
from edge_ocr_example.bundle_layout import PIPELINE, stage_dir
from edge_ocr_example.chain import STAGES
from edge_ocr_example.decode import CHARACTERS_FILE, decode, load_characters
from edge_ocr_example.make_image import DEFAULT_LINES, render_lines
from edge_ocr_example.preprocess import preprocess
from edge_ocr_example.reference import DirectRunner, recognize

MANY_LINES = tuple(f"Line {i}: invoice {1000 + 37 * i} total {i * 7.25:.2f}" for i in range(12))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not hasattr(runtime_pipeline, "CARRY_PREFIX"),
        reason="this edge runtime does not carry transform context (carry:*) between stages",
    ),
]


def test_edge_pipeline_outputs_equal_the_direct_run_and_release_everything(
    ocr_bundles: Path,
) -> None:
    characters = load_characters(stage_dir(ocr_bundles, STAGES[-1]) / CHARACTERS_FILE)
    page = np.ascontiguousarray(render_lines()[::-1, ::-1])  # upside down: all three stages work
    expected_lines, trace = recognize(DirectRunner.from_bundles(ocr_bundles), page, characters)
    ledger = ResourceLedger([Pool(name="machine:ram", total=8 * 1024**3)])
    plugins = load_plugins(env={"EDGE_PLUGINS": "ort-cpu"})
    pipeline = runtime_pipeline.Pipeline.open(
        load_pipeline(ocr_bundles / PIPELINE), plugins, ledger
    )
    try:
        source = preprocess(page)
        for _ in range(3):
            with pipeline.run(source) as result:
                outputs = dict(result.outputs)
            assert sorted(outputs) == sorted(trace.final)
            for name, value in trace.final.items():
                got = outputs[name]
                if isinstance(value, list):  # gathered from a fan-out, in chunk order
                    assert isinstance(got, list) and len(got) == len(value), name
                    pairs = list(zip(got, value, strict=True))
                else:
                    pairs = [(got, value)]
                for mine, theirs in pairs:
                    np.testing.assert_array_equal(mine, theirs, err_msg=name)
                    assert mine.dtype == theirs.dtype
            lines = decode(outputs, source, characters=characters)
            assert [line.text for line in lines] == [line.text for line in expected_lines]
            assert [line.text for line in lines] == list(reversed(DEFAULT_LINES))
        many = render_lines(MANY_LINES, font_size=20)  # more lines than any batch bucket
        wanted, _ = recognize(DirectRunner.from_bundles(ocr_bundles), many, characters)
        with pipeline.run(preprocess(many)) as result:
            got = decode(dict(result.outputs), {}, characters=characters)
        assert [line.text for line in got] == [line.text for line in wanted]
        assert len(got) == len(MANY_LINES) and sum(a == b.text for a, b in
                                                    zip(MANY_LINES, got, strict=True)) >= 10
    finally:
        pipeline.close()
    assert ledger.snapshot()["reservations"] == []
    assert ledger.snapshot()["pools"]["machine:ram"]["reserved"] == 0
