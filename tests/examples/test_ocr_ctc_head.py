"""The page recogniser's CTC head: the same classes, probabilities, texts and scores.

The head (ArgMax and ReduceMax over the classes, appended to the wheel's recogniser by
:mod:`edge_ocr_example.ctc_head`) must give bit for bit what numpy's reductions of the
plain graph's probabilities give, so that the page pipeline reads every page as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from edge_ocr_example.buckets import REC_BEST, REC_CONFIDENCE, REC_OUTPUT
from edge_ocr_example.chain import STAGES
from edge_ocr_example.ctc_head import with_ctc_head
from edge_ocr_example.decode import (
    character_table,
    ctc_best_decode,
    ctc_greedy_decode,
    load_characters,
    recogniser_decode,
)
from edge_ocr_example.errors import OcrError, TensorMismatch
from edge_ocr_example.models import read_graph
from edge_ocr_example.reference import DirectRunner

TABLE = character_table(["a", "b", "c"])  # blank, a, b, c, space


@pytest.fixture(scope="module")
def recogniser(ocr_wheel: Path) -> bytes:
    """The wheel's recogniser graph, as shipped."""
    member = next(stage.graph_member for stage in STAGES if stage.id == "recognize")
    return read_graph(member, wheel=ocr_wheel)


def test_the_head_gives_numpys_reductions_of_the_probabilities_bit_for_bit(
    recogniser: bytes, page_bundles: Path,
) -> None:
    plain = DirectRunner({"recognize": recogniser})
    headed = DirectRunner({"recognize": with_ctc_head(recogniser)})
    assert headed.metadata("recognize", "character") == plain.metadata("recognize", "character")
    characters = load_characters(page_bundles / "recognize" / "characters.txt")
    rng = np.random.default_rng(7)
    rows = [np.load(path)["x"] for path in sorted(
        (page_bundles / "recognize" / "examples").glob("pieces-?.npz"))]
    rows.append(rng.uniform(-1, 1, (2, 3, 48, 320)).astype(np.float32))  # noise: near ties
    for x in rows:
        probabilities = plain("recognize", {"x": x})[REC_OUTPUT]
        outputs = headed("recognize", {"x": x})
        assert sorted(outputs) == [REC_BEST, REC_CONFIDENCE]
        assert outputs[REC_BEST].dtype == np.int64
        assert np.array_equal(outputs[REC_BEST], probabilities.argmax(axis=2))
        assert outputs[REC_CONFIDENCE].dtype == np.float32
        assert np.array_equal(outputs[REC_CONFIDENCE], probabilities.max(axis=2))
        assert recogniser_decode(outputs, characters) == ctc_greedy_decode(probabilities,
                                                                            characters)


def test_the_page_bundles_recogniser_carries_the_head(page_bundles: Path) -> None:
    runner = DirectRunner.from_bundles(page_bundles)
    x = np.load(page_bundles / "recognize" / "examples" / "pieces-0.npz")["x"]
    assert sorted(runner("recognize", {"x": x})) == [REC_BEST, REC_CONFIDENCE]


def test_a_graph_without_the_probabilities_is_refused(recogniser: bytes) -> None:
    with pytest.raises(OcrError, match=r"^recognize\.graph\.outputs: expected 'probs': "
                                       r"\['softmax_11\.tmp_0'\]$"):
        with_ctc_head(recogniser, probabilities="probs")


def test_a_graph_with_a_head_already_is_refused(recogniser: bytes) -> None:
    headed = with_ctc_head(recogniser)
    model = onnx.load_from_string(headed)
    model.graph.output.extend([helper.make_tensor_value_info(REC_OUTPUT, onnx.TensorProto.FLOAT,
                                                             None)])
    with pytest.raises(OcrError, match=r"^recognize\.graph\.outputs: already has a CTC head: "):
        with_ctc_head(model.SerializeToString())


def test_an_opset_whose_reduce_max_takes_axes_as_input_is_refused() -> None:
    node = helper.make_node("Identity", ["x"], [REC_OUTPUT])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 3])],
        [helper.make_tensor_value_info(REC_OUTPUT, onnx.TensorProto.FLOAT, [1, 2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(OcrError, match=r"^recognize\.graph\.opset: expected at most 17: 18$"):
        with_ctc_head(model.SerializeToString())


def test_best_decode_equals_greedy_decode_on_the_same_steps() -> None:
    rng = np.random.default_rng(3)
    probabilities = rng.dirichlet(np.ones(len(TABLE)), size=(4, 9)).astype(np.float32)
    outputs: dict[str, Any] = {REC_BEST: probabilities.argmax(axis=2),
                               REC_CONFIDENCE: probabilities.max(axis=2)}
    assert recogniser_decode(outputs, TABLE) == ctc_greedy_decode(probabilities, TABLE)
    assert recogniser_decode({REC_OUTPUT: probabilities}, TABLE) == ctc_greedy_decode(
        probabilities, TABLE)


def test_best_decode_refuses_unlike_shapes() -> None:
    with pytest.raises(TensorMismatch, match=r"^best: expected N x T classes and N x T "
                                             r"probabilities: \(\(1, 3\), \(1, 2\)\)$"):
        ctc_best_decode(np.zeros((1, 3), np.int64), np.zeros((1, 2), np.float32), TABLE)


def test_best_decode_refuses_a_class_outside_the_table() -> None:
    with pytest.raises(TensorMismatch, match=r"^best: expected classes in \[0, 5\): \(0, 5\)$"):
        ctc_best_decode(np.array([[0, 5]]), np.ones((1, 2), np.float32), TABLE)


def test_recogniser_decode_refuses_best_classes_without_their_probabilities() -> None:
    with pytest.raises(TensorMismatch, match=r"^ctc_confidence: missing beside the best "
                                             r"classes: \['ctc_best'\]$"):
        recogniser_decode({REC_BEST: np.zeros((1, 2), np.int64)}, TABLE)


def test_recogniser_decode_refuses_outputs_with_neither() -> None:
    with pytest.raises(TensorMismatch, match=r"^softmax_11\.tmp_0: recogniser output missing: "
                                             r"\['other'\]$"):
        recogniser_decode({"other": np.zeros(1)}, TABLE)


def test_finish_refuses_best_classes_and_probabilities_of_unlike_calls(
    page_bundles: Path,
) -> None:
    from edge_ocr_example.page_pipeline import finish

    outputs = {"carry:pieces": np.zeros((1, 4), np.int64),
               "carry:quads": np.zeros((1, 4, 2), np.float32),
               "carry:turns": np.zeros(1, np.int64),
               REC_BEST: [np.zeros((1, 2), np.int64)], REC_CONFIDENCE: []}
    with pytest.raises(TensorMismatch, match=r"^outputs\['ctc_best', 'ctc_confidence'\]: "
                                             r"expected as many calls of each: \[1, 0\]$"):
        finish(outputs, {}, {"recognize": page_bundles / "recognize"})


def test_finish_reads_the_heads_outputs_as_it_reads_the_probabilities(
    page_bundles: Path,
) -> None:
    from edge_ocr_example.page_pipeline import finish

    characters = load_characters(page_bundles / "recognize" / "characters.txt")
    rng = np.random.default_rng(5)
    calls = []
    for _ in range(3):  # steps of real characters (some blank, some repeated), confident
        call = np.full((1, 12, len(characters)), 1e-5, np.float32)
        best = rng.choice([0, 0, 41, 42, 43, 97], size=12)
        call[0, np.arange(12), best] = rng.uniform(0.6, 1.0, 12).astype(np.float32)
        calls.append(call)
    carried = {"carry:pieces": np.array([[0, 0, 10, 0], [1, 0, 10, 0], [1, 10, 20, 1]]),
               "carry:quads": np.array([[[0, 0], [9, 0], [9, 5], [0, 5]],
                                        [[0, 9], [19, 9], [19, 14], [0, 14]]], np.float32),
               "carry:turns": np.zeros(2, np.int64)}
    bundles = {"recognize": page_bundles / "recognize"}
    plain = finish({**carried, REC_OUTPUT: calls}, {}, bundles)
    headed = finish({**carried, REC_BEST: [c.argmax(axis=2) for c in calls],
                     REC_CONFIDENCE: [c.max(axis=2) for c in calls]}, {}, bundles)
    assert plain and headed == plain
