"""Named tensors in JSON, and runtime errors as HTTP answers (no server needed)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from edge_contracts.errors import InvalidValue, PayloadTooLarge
from edge_core.errors import ResourceUnavailable, StageClosed, WorkerLost
from edge_core.runtime.errors import RequestCancelled, RequestFailed
from edge_serve.outcomes import HttpRefusal, from_exception
from edge_serve.tensors import decode_tensors, encode_tensors


def test_tensors_round_trip_every_numpy_dtype() -> None:
    arrays = {dt: (np.arange(6) % 2).astype(dt).reshape(2, 3)
              for dt in ("bool", "int8", "uint16", "int32", "int64", "float16", "float32",
                         "float64", "uint64")}
    decoded = decode_tensors(encode_tensors(arrays), "inputs", max_bytes=1 << 20)
    for name, array in arrays.items():
        assert decoded[name].dtype == array.dtype and decoded[name].shape == array.shape
        np.testing.assert_array_equal(decoded[name], array)
    empty = decode_tensors(encode_tensors({"e": np.zeros((0, 4), np.float32)}), "inputs",
                           max_bytes=16)
    assert empty["e"].shape == (0, 4)


def test_a_tensor_over_the_limit_is_413_before_its_data_is_decoded() -> None:
    spec = {"dtype": "float32", "shape": [1024, 1024], "data": "not even base64"}
    with pytest.raises(HttpRefusal) as caught:
        decode_tensors({"x": spec}, "inputs", max_bytes=1 << 20)
    assert caught.value.status == 413 and caught.value.field == "inputs['x'].shape"
    ok = {"dtype": "uint8", "shape": [3], "data": base64.b64encode(b"abc").decode()}
    with pytest.raises(HttpRefusal, match=r"inputs\['b'\]\.shape"):  # the total counts
        decode_tensors({"a": ok, "b": ok}, "inputs", max_bytes=5)


@pytest.mark.parametrize(("spec", "field"), [
    ("x", "inputs['x']"),
    ({"dtype": "bfloat16", "shape": [1], "data": "AAA="}, "inputs['x'].dtype"),
    ({"dtype": "float32", "shape": [1] * 33, "data": ""}, "inputs['x'].shape"),
    ({"dtype": "float32", "shape": [True], "data": ""}, "inputs['x'].shape"),
    ({"dtype": "float32", "shape": [1], "data": 5}, "inputs['x'].data"),
    ({"dtype": "float32", "shape": [1], "data": "AAAAAAA="}, "inputs['x'].data"),
    ({"dtype": "float32", "shape": [1], "data": "AAAAA", "extra": 1}, "inputs['x'].extra"),
])
def test_malformed_tensors_are_400_naming_the_field(spec: object, field: str) -> None:
    with pytest.raises(HttpRefusal) as caught:
        decode_tensors({"x": spec}, "inputs", max_bytes=1 << 20)
    assert caught.value.status == 400 and caught.value.field == field


@pytest.mark.parametrize(("error", "status", "field"), [
    (ResourceUnavailable("pipelines[p].admission: all 1 slot(s) taken: 1"), 429, "admission"),
    (StageClosed("stages[s]: needs-restart"), 503, "stage"),
    (RequestCancelled("request 'r': cancelled"), 503, "request"),
    (PayloadTooLarge("inputs[0].nbytes", 10, "must be <= 4"), 413, "inputs[0].nbytes"),
    (InvalidValue("inputs[0].shape", [1], "must match the bucket"), 400, "inputs[0].shape"),
    (RequestFailed("r", "BucketMismatch", "x: wrong shape"), 400, "request"),
    (RequestFailed("r", "WorkerLost", "gone"), 500, "request"),
    (ValueError("plain"), 400, "request"),
    (TimeoutError("deadline passed"), 504, "deadline_s"),
    (WorkerLost("worker 12 died"), 503, "stage"),
    (RuntimeError("boom"), 500, "request"),
])
def test_runtime_errors_map_to_their_http_status(error: Exception, status: int,
                                                 field: str) -> None:
    refusal = from_exception(error)
    assert refusal.status == status and refusal.field == field
    assert (refusal.headers.get("Retry-After") == "1") == (status in (429, 503))
    assert b"Traceback" not in refusal.body()
