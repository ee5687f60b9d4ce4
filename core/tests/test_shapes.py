"""Shape sets: matching, refusals that name input, shape and set, bucket choice and padding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edge_contracts.errors import InvalidValue
from edge_contracts.shapesets import ShapeRefused, ShapeSet
from edge_core.shapes import declared_shapes, fit

REC = ShapeSet.from_json([
    {"name": f"b{b}_w{w}", "inputs": {"x": {"dtype": "float32", "dims": [b, 3, 48, w]}}}
    for b in (1, 4, 8) for w in (320, 640)
] + [{"name": "wide", "inputs": {"x": {"dtype": "float32", "dims": [1, 3, 48, [641, 2048]]}}}])


def test_static_buckets_match_exactly_and_ranges_inclusively() -> None:
    assert REC.match({"x": ("float32", (4, 3, 48, 640))}).name == "b4_w640"
    assert REC.match({"x": ("float32", (1, 3, 48, 2048))}).name == "wide"
    assert REC.match({"x": ("float32", (1, 3, 48, 641))}).name == "wide"
    with pytest.raises(ShapeRefused) as info:
        REC.match({"x": ("float32", (2, 3, 48, 640))})
    assert info.value.field == "inputs.x"
    assert info.value.input == "x"
    assert info.value.shape == "float32[2, 3, 48, 640]"
    assert "b4_w640{x: float32[4,3,48,640]}" in info.value.served
    assert "wide{x: float32[1,3,48,641..2048]}" in str(info.value)
    assert "outside every declared shape" in str(info.value)


def test_a_dtype_no_entry_serves_is_named_as_the_reason() -> None:
    with pytest.raises(ShapeRefused) as info:
        REC.match({"x": ("float16", (4, 3, 48, 640))})  # a served shape, another dtype
    assert info.value.field == "inputs.x" and info.value.shape == "float16[4, 3, 48, 640]"
    assert "dtype float16 is not served (only float32)" in str(info.value)
    with pytest.raises(ShapeRefused, match="dtype int8 is not served"):
        fit({"x": np.ones((1, 3, 48, 320), np.int8)}, REC)


def test_fit_picks_the_smallest_bucket_and_pads_with_the_models_padding() -> None:
    crops = np.ones((3, 3, 48, 500), np.float32)
    fitted = fit({"x": crops}, REC)
    assert fitted.entry.name == "b4_w640"
    assert fitted.inputs["x"].shape == (4, 3, 48, 640)
    assert fitted.shapes == {"x": (3, 3, 48, 500)}
    assert fitted.inputs["x"][:3, :, :, :500].min() == 1.0
    assert fitted.inputs["x"][3].max() == 0.0 and fitted.inputs["x"][:, :, :, 500:].max() == 0.0

    def edge(_name: str, array: np.ndarray, target: tuple[int, ...]) -> np.ndarray:
        widths = [(0, t - s) for s, t in zip(array.shape, target, strict=True)]
        return np.pad(array, widths, mode="edge")

    padded = fit({"x": crops * 0.5}, REC, pad=edge).inputs["x"]
    assert padded.min() == 0.5  # the model's padding, not zeros


def test_fit_into_a_range_keeps_the_size_and_refuses_undeclared_axes() -> None:
    wide = fit({"x": np.ones((1, 3, 48, 1000), np.float32)}, REC)
    assert wide.entry.name == "wide" and wide.inputs["x"].shape == (1, 3, 48, 1000)
    with pytest.raises(ShapeRefused, match="axis 0 would need padding to 4"):
        fit({"x": np.ones((3, 3, 48, 320), np.float32)}, REC, axes={"x": (3,)})
    with pytest.raises(ShapeRefused, match="fits in no entry"):
        fit({"x": np.ones((9, 3, 48, 320), np.float32)}, REC)
    with pytest.raises(ShapeRefused, match="input names differ"):
        fit({"y": np.ones((1, 3, 48, 320), np.float32)}, REC)


def test_malformed_entries_are_refused_naming_the_field() -> None:
    bad: list[tuple[Any, str]] = [
        ([], r"shapes: a shape set needs at least one entry"),
        ([{"name": "a", "inputs": {"x": {"dtype": "float32", "dims": [[5, 2]]}}}],
         r"shapes\[0\]\.inputs\.x\.dims\[0\]: must be a size"),
        ([{"name": "a", "inputs": {"x": {"dtype": "float32", "dims": [1]}}}] * 2,
         r"entry names must be unique"),
    ]
    for data, message in bad:
        with pytest.raises(InvalidValue, match=message):
            ShapeSet.from_json(data)


def test_declared_shapes_need_listed_examples_inside_their_entry() -> None:
    specs = {"a.npz": {"x": ("float32", (2, 3))}, "b.npz": {"x": ("float32", (4, 3))}}
    files = {"a.npz": "0" * 64, "b.npz": "0" * 64}

    def arrays(member: str, _field: str) -> dict[str, Any]:
        return specs[member]

    entry = {"name": "n2", "inputs": {"x": {"dtype": "float32", "dims": [2, 3]}}}
    found = declared_shapes({"shapes": [{**entry, "examples": [{"example_inputs": "a.npz"}]}]},
                            None, None, arrays, files)
    assert found is not None
    assert [(c.entry, c.point, c.expected_outputs) for c in found[1]] == [("n2", "static", None)]
    with pytest.raises(InvalidValue, match=r"examples\[0\]\.example_inputs: outside its entry"):
        declared_shapes({"shapes": [{**entry, "examples": [{"example_inputs": "b.npz"}]}]},
                        None, None, arrays, files)
    with pytest.raises(InvalidValue, match=r"must be a key of files"):
        declared_shapes({"shapes": [{**entry, "examples": [{"example_inputs": "c.npz"}]}]},
                        None, None, arrays, files)
    with pytest.raises(InvalidValue, match=r"every entry needs its example inputs"):
        declared_shapes({"shapes": [entry]}, None, None, arrays, files)


def test_a_range_with_a_step_accepts_only_its_multiples_and_fit_rounds_up() -> None:
    page = ShapeSet.from_json([{"name": "page", "inputs": {"x": {
        "dtype": "float32", "dims": [1, 3, [320, 1280, 32], [320, 1280, 32]]}}}])
    assert page.match({"x": ("float32", (1, 3, 352, 1280))}).name == "page"
    with pytest.raises(ShapeRefused, match=r"page\{x: float32\[1,3,320\.\.1280/32,"):
        page.match({"x": ("float32", (1, 3, 333, 640))})
    fitted = fit({"x": np.ones((1, 3, 333, 100), np.float32)}, page)
    assert fitted.inputs["x"].shape == (1, 3, 352, 320)
    assert page.to_json()[0]["inputs"]["x"]["dims"][2] == [320, 1280, 32]
    with pytest.raises(InvalidValue, match=r"multiple of the step"):
        ShapeSet.from_json([{"name": "p", "inputs": {"x": {"dtype": "float32",
                                                           "dims": [[320, 1000, 32]]}}}])


def test_a_shape_matched_once_is_answered_per_set_and_refusals_are_never_kept() -> None:
    specs = {"x": ("float32", (8, 3, 48, 320))}
    assert REC.match(specs).name == "b8_w320"
    assert REC.match(dict(specs)).name == "b8_w320"  # the kept answer
    only_wide = ShapeSet.from_json([{"name": "any", "inputs": {"x": {
        "dtype": "float32", "dims": [[1, 8], 3, 48, [32, 2048]]}}}])
    assert only_wide.match(specs).name == "any"  # another set: its own answer
    assert REC.match({"x": ("float32", [8, 3, 48, 320])}).name == "b8_w320"  # a list shape
    for _ in range(2):  # refused each time, never remembered as a match
        with pytest.raises(ShapeRefused):
            REC.match({"x": ("float32", (3, 3, 48, 320))})
