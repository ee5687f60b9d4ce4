"""Named tensors in JSON, and runtime errors as HTTP answers (no server needed)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import numpy as np
import pytest

from edge_contracts.error_details import ErrorDetail, detail_of
from edge_contracts.errors import EventTooLarge, InvalidValue, PayloadTooLarge
from edge_contracts.request_faults import RequestFault
from edge_contracts.shapesets import ShapeRefused
from edge_core.artifacts.errors import BundleChanged
from edge_core.errors import ConfigError, ResourceUnavailable, StageClosed, WorkerLost
from edge_core.host.errors import ProtocolViolation
from edge_core.runtime.errors import (
    RequestCancelled,
    RequestFailed,
    TransformFailed,
    TransformOutputRefused,
    TransformReturnInvalid,
)
from edge_serve.guards import MAX_BODY_MIN_RATE, BodyLimit, StalledBodies
from edge_serve.heads import SlowHeads
from edge_serve.outcomes import HttpRefusal, from_exception
from edge_serve.served import Answer, unencodable
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


def test_a_big_endian_array_is_named_by_its_type_and_sent_little_endian() -> None:
    arrays = {"b": np.arange(3, dtype=">i4"), "f": np.arange(3, dtype=">f8")}
    encoded = encode_tensors(arrays)
    assert [encoded[name]["dtype"] for name in ("b", "f")] == ["int32", "float64"]
    assert base64.b64decode(encoded["b"]["data"]) == np.arange(3, dtype="<i4").tobytes()
    decoded = decode_tensors(json.loads(json.dumps(encoded)), "outputs", max_bytes=1 << 10)
    for name, array in arrays.items():
        np.testing.assert_array_equal(decoded[name], array)


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
    (RequestFailed("r", "ShapeRefused", "inputs.x: wrong shape",
                   request_fault=RequestFault("unsupported_shape", "inputs.x")), 400,
     "inputs.x"),
    (RequestFailed("r", "BucketMismatch", "x: wrong shape"), 500, "request"),
    (RequestFailed("r", "WorkerLost", "gone"), 503, "stage"),
    (ValueError("plain"), 500, "request"),
    (ShapeRefused("inputs.x", [1, 2], "outside every declared shape"), 400, "inputs.x"),
    (TimeoutError("deadline passed"), 504, "deadline_s"),
    (WorkerLost("worker 12 died"), 503, "stage"),
    (RuntimeError("boom"), 500, "request"),
    (TransformFailed("pipelines[p].stages[b].input_transform", "transform m:f",
                     ConfigError("Fanout.items[0]", "must be a mapping of inputs", "ndarray")),
     500, "pipelines[p].stages[b].input_transform"),
    (TransformOutputRefused("pipelines[p].stages[c].input_transform", "c", "transform m:g",
                            RequestFailed("r", "ShapeRefused", "inputs.x: wrong shape",
                                          request_fault=RequestFault("unsupported_shape",
                                                                     "inputs.x"))),
     500, "pipelines[p].stages[c].input_transform"),
    (ProtocolViolation("stages[s].event.error", "the worker sent a malformed event: kind "
                       "error needs an ErrorInfo", None), 500, "stages[s].event.error"),
])
def test_runtime_errors_map_to_their_http_status(error: Exception, status: int,
                                                 field: str) -> None:
    refusal = from_exception(error)
    assert refusal.status == status and refusal.field == field
    assert (refusal.headers.get("Retry-After") == "1") == (status in (429, 503))
    assert (refusal.headers.get("x-should-retry") == "false") == (status in (500, 504))
    assert b"Traceback" not in refusal.body()
    body = json.loads(refusal.body())["error"]
    assert set(body) == {"message", "type", "param", "code", "edge"}
    assert body["edge"]["status"] == status and body["edge"]["field"] == field
    assert body["code"] and body["code"] == body["code"].lower()


def test_a_rewritten_bundle_is_503_bundle_changed_naming_the_manifest_without_retry(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``BundleChanged`` met while a request is answered (a bundle folder read by
    ``finish`` or a transform) was a 500 ``internal_error``: the pipeline cannot serve as
    it was opened, a 503, but no retry cures it (no ``Retry-After``)."""
    changed = BundleChanged("/b/edge-manifest.json", "rewritten since the stage opened "
                            "with manifest sha256 aa; ...; manifest sha256 now", "bb")
    for _ in range(2):
        refusal = from_exception(changed)
        body = json.loads(refusal.body())["error"]
        assert refusal.status == 503 and refusal.outcome == "unavailable"
        assert refusal.headers == {"x-should-retry": "false"}
        assert (body["code"], body["param"], body["message"]) == (
            "bundle_changed", None, str(changed))
        assert body["edge"] == {"status": 503, "kind": "BundleChanged",
                                "field": "/b/edge-manifest.json", "reason": changed.reason}
    assert capsys.readouterr().err.count("/b/edge-manifest.json") == 1  # logged once


def test_a_declared_fault_is_400_with_its_param_and_code_in_the_clients_spelling() -> None:
    failed = RequestFailed("r", "ContextLengthExceeded", "params.prompt_token_ids: too long",
                           traceback="Traceback (most recent call last): ...",
                           request_fault=RequestFault("context_length_exceeded",
                                                      "prompt_token_ids"))
    refusal = from_exception(failed, field="params",
                             rename=lambda name: {"prompt_token_ids": "prompt"}.get(name, name))
    body = json.loads(refusal.body())["error"]
    assert refusal.status == 400
    assert (body["param"], body["code"], body["type"]) == (
        "prompt", "context_length_exceeded", "invalid_request_error")
    assert body["message"] == "params.prompt_token_ids: too long"  # no worker traceback
    assert body["edge"]["kind"] == "ContextLengthExceeded"


def test_an_undeclared_backend_error_is_500_logged_once_with_its_type(
        capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(3):
        refusal = from_exception(RequestFailed("r", "EngineExploded", "the engine is gone"))
        assert refusal.status == 500 and refusal.param is None
        assert refusal.code == "internal_error"
        assert refusal.headers["x-should-retry"] == "false"
    logged = capsys.readouterr().err
    assert logged.count("EngineExploded") == 1 and "500" in logged


def test_a_transforms_malformed_return_is_the_servers_fault_500_not_the_clients_400(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stage's input transform that returns no mapping of input names is the pipeline's
    bug: before, its ``ConfigError`` (a ``ValueError``) was answered 400 ``refused``; then
    500 ``internal_error`` naming the field ``inputs``, as an error the server does not
    know. Now 500 ``transform_return_invalid``, ``edge.field`` the stage's transform."""
    error = TransformReturnInvalid("pipelines[p].stages[b].input_transform",
                                   "transform m:f returned a mapping with a key that is no "
                                   "input name (a str), not int", 1)
    refusal = from_exception(error, field="inputs")
    assert refusal.status == 500 and refusal.param is None
    assert refusal.code == "transform_return_invalid"
    body = json.loads(refusal.body())["error"]
    assert body["message"] == str(error)
    assert body["edge"] == {"status": 500, "kind": "TransformReturnInvalid",
                            "field": "pipelines[p].stages[b].input_transform",
                            "reason": "transform m:f returned a mapping with a key that is "
                                      "no input name (a str), not int"}
    assert capsys.readouterr().err == (f"edge serve: error: {error} (answered 500; logged "
                                       "once per transform)\n")


def test_an_event_too_large_from_any_stage_is_500_naming_the_kind_and_the_events_field(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before, it was answered as any undeclared error: field ``params`` (as if the
    request's parameters were at fault), code ``internal_error``, and the message cut
    at 200 characters."""
    refused = EventTooLarge(
        "event.data", 129627, "the done event's header would be 129627 bytes, over the "
        "channel's max_header_bytes 65536; its data is 129493 bytes as JSON, 128391 of "
        "them in data['choices']: put large values in output tensors")
    sent = RequestFailed("r", "EventTooLarge", str(refused),  # as the worker's ERROR
                         error_detail=detail_of(refused))
    by_error = RequestFailed("r", "EventTooLarge", "event.error: the error event's header "
                             "would be 90000 bytes, over ...: 90000",
                             error_detail=ErrorDetail("event.error", "the error event's "
                                                      "header would be ...", 90000))
    for error, field in ((sent, "event.data"), (refused, "event.data"),
                         (by_error, "event.error")):
        refusal = from_exception(error, field="params")
        body = json.loads(refusal.body())["error"]
        assert refusal.status == 500 and refusal.headers["x-should-retry"] == "false"
        assert (body["type"], body["code"], body["param"]) == (
            "server_error", "event_too_large", None)
        edge = body["edge"]
        assert (edge["kind"], edge["field"]) == ("EventTooLarge", field)
        assert "too large for its worker channel" in edge["reason"]
        assert "max_header_bytes" in edge["reason"]
    whole = json.loads(from_exception(sent, field="params").body())["error"]["message"]
    assert whole == str(refused)  # whole: the sizes and what to do, uncut
    assert whole.endswith("put large values in output tensors: 129627")
    # output tensors over max_io_bytes: the same answer, with a reason of their own
    outputs = RequestFailed("r", "EventTooLarge", "event.outputs: the done event's output "
                            "tensors are 8208 bytes, over the channel's max_io_bytes 4096; "
                            "the largest is outputs['pad'], 8192 bytes: ...: 8208",
                            error_detail=ErrorDetail("event.outputs", "...", 8208))
    refusal = from_exception(outputs, field="params")
    body = json.loads(refusal.body())["error"]
    assert (refusal.status, body["code"], body["edge"]["field"]) == (
        500, "event_too_large", "event.outputs")
    assert body["edge"]["reason"] == (
        "an event of the stage's answer was too large for its worker channel (its output "
        "tensors over the stage's max_io_bytes): the stage's max_io_bytes must be raised "
        "for such answers")
    assert capsys.readouterr().err.count("EventTooLarge") == 1  # logged once, as a 500


def test_an_event_too_large_names_the_field_the_worker_sent_never_one_read_from_its_text(
) -> None:
    """The field is the worker's error's own (``RequestFailed.error_detail``). Before, it
    was read out of the message's first words: a message worded otherwise named the wrong
    field, and one that merely began with ``event.data: `` named that field."""
    reworded = RequestFailed("r", "EventTooLarge", "outputs of 8208 bytes are over the "
                             "channel's max_io_bytes 4096",
                             error_detail=ErrorDetail("event.outputs", "over", 8208))
    misleading = RequestFailed("r", "EventTooLarge", "event.data: a message that begins so",
                               error_detail=ErrorDetail("event.error", "over", 90000))
    unsent = RequestFailed("r", "EventTooLarge", "event.data: no detail was sent")
    foreign = RequestFailed("r", "EventTooLarge", "event.data: ...",
                            error_detail=ErrorDetail("params.size", "over", 1))
    for error, field in ((reworded, "event.outputs"), (misleading, "event.error"),
                         (unsent, "event"), (foreign, "event")):
        body = json.loads(from_exception(error, field="params").body())["error"]
        assert (body["code"], body["edge"]["field"]) == ("event_too_large", field), error


def _part_image(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}


def test_a_chat_maps_its_image_to_prepare_and_its_text_to_the_messages() -> None:
    from edge_serve.chat import read_chat

    png = b"\x89PNG-not-checked-here"
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    chat = read_chat([{"role": "system", "content": "brief"},
                      {"role": "user", "content": [{"type": "text", "text": "read "},
                                                   _part_image(url),
                                                   {"type": "text", "text": "this"}]}],
                     images=True)
    assert chat.messages == [{"role": "system", "content": "brief"},
                             {"role": "user", "content": "read this"}]
    assert chat.image is not None and chat.image.data == png and chat.image.suffix == ".png"
    assert chat.image.field == "messages[1].content[1].image_url"
    only_image = read_chat([{"role": "user", "content": [_part_image(url)]}], images=True)
    assert only_image.messages == [] and only_image.image is not None
    text = read_chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                     images=False)
    assert text.messages == [{"role": "user", "content": "hi"}] and text.image is None


@pytest.mark.parametrize(("messages", "images", "field"), [
    ([{"role": "user", "content": "no image"}], True, "messages"),
    ([{"role": "user", "content": [_part_image("https://example.com/a.png")]}], True,
     "messages[0].content[0].image_url.url"),
    ([{"role": "user", "content": [_part_image("data:image/png;base64,@@@@")]}], True,
     "messages[0].content[0].image_url.url"),
    ([{"role": "user", "content": [_part_image("data:text/plain;base64,AAAA")]}], True,
     "messages[0].content[0].image_url.url"),
    ([{"role": "user", "content": [_part_image("data:image/png;base64,AAAA"),
                                   _part_image("data:image/png;base64,AAAA")]}], True,
     "messages[0].content[1]"),
    ([{"role": "user", "content": [_part_image("data:image/png;base64,AAAA")]}], False,
     "messages[0].content[0]"),
    ([{"role": "user", "content": [{"type": "input_audio"}]}], True, "messages[0].content[0]"),
    ([{"content": "x"}], False, "messages[0]"),
    ([], False, "messages"),
])
def test_what_a_chat_cannot_map_is_400_naming_the_field(
        messages: list[object], images: bool, field: str) -> None:
    from edge_serve.chat import read_chat

    with pytest.raises(HttpRefusal) as caught:
        read_chat(messages, images=images)
    assert caught.value.status == 400 and caught.value.field == field


def test_a_content_length_that_is_no_integer_is_400_naming_the_header() -> None:
    # uvicorn's parser refuses it before the application; the guard holds under any server
    sent: list[dict[str, object]] = []
    reached: list[object] = []

    async def app(scope: object, receive: object, send: object) -> None:
        reached.append(scope)

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/pipelines/p/run",
             "headers": [(b"content-length", b"12\xe9")]}
    asyncio.run(BodyLimit(app, 1024)(scope, receive, send))
    assert not reached
    assert sent[0]["status"] == 400
    body = sent[1]["body"]
    assert isinstance(body, bytes)
    assert json.loads(body)["error"] == {
        "message": "headers.content-length: not an integer: 12\u00e9",
        "type": "invalid_request_error", "param": "headers.content-length",
        "code": "invalid_value",
        "edge": {"status": 400, "kind": "InvalidValue", "field": "headers.content-length",
                 "reason": "not an integer"}}


_CYCLE: list[object] = []
_CYCLE.append(_CYCLE)
_SHARED = [1.5]


@pytest.mark.parametrize(("value", "found"), [
    ({"a": [1.0, float("nan")]}, ("answer.a[1]", "a number JSON cannot carry", "NaN")),
    ({"a b": {"c": -float("inf")}}, ("answer['a b'].c", "a number JSON cannot carry",
                                     "-Infinity")),
    ((1, {"x": float("inf")}), ("answer[1].x", "a number JSON cannot carry", "Infinity")),
    ([np.float32(1.0)], ("answer[0]", "a value of a type JSON cannot carry", "numpy.float32")),
    ({"m": np.zeros(2)}, ("answer.m", "a value of a type JSON cannot carry", "numpy.ndarray")),
    ({(1, 2): 1}, ("answer", "a key JSON cannot carry", "builtins.tuple")),
    ({float("nan"): 1}, ("answer", "a key JSON cannot carry", "NaN")),
    ({"ok": 1, "loop": _CYCLE}, ("answer.loop[0]", "a container that holds itself", None)),
    (["a", "b\ud800"], ("answer[1]", "a string UTF-8 cannot carry (a lone surrogate)",
                        "b\ud800")),
    ({"\udfff": 1}, ("answer", "a key UTF-8 cannot carry (a lone surrogate)", "\udfff")),
])
def test_where_strict_json_cannot_carry_a_finish_answer_is_found_as_the_encoder_refuses_it(
        value: object, found: tuple[str, str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):  # the answer's own encoder
        Answer({"answer": value}, {})
    assert unencodable(value, "answer") == found


def test_a_finish_answer_the_encoder_takes_has_nothing_to_find() -> None:
    value = {"a": [_SHARED, _SHARED], 1: None, None: True, 2.5: "x", "n": 2**80,
             "t": (1, "y"), "s": "\u00e9\U0001f600"}  # the same list twice is no cycle
    Answer({"answer": value}, {})
    assert unencodable(value, "answer") is None


def test_a_stalled_body_is_408_unless_an_answer_began_and_another_cancel_stays_one() -> None:
    """The guard's three ends (the real socket's 408 is in test_serve_hostile): a route
    reading a body that never comes is answered 408 with ``Connection: close``; an answer
    already begun is left incomplete, so the server closes the connection; a cancellation
    that is not the guard's (the server stopping) stays a cancellation. Each leaves no
    request waiting on the guard's timer."""
    scope = {"type": "http", "method": "POST", "path": "/v1/pipelines/p/run",
             "headers": [(b"content-length", b"20")]}

    async def scenario() -> None:
        never = asyncio.Event()
        first = True

        async def receive() -> dict[str, object]:
            nonlocal first
            if first:  # part of the body, then nothing more
                first = False
                return {"type": "http.request", "body": b"0123456789", "more_body": True}
            await never.wait()
            raise AssertionError("unreachable")

        async def reading(scope: object, receive: object, send: object) -> None:
            while True:
                await receive()  # type: ignore[operator]

        async def answering(scope: object, receive: object, send: object) -> None:
            await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                        "headers": []})
            while True:
                await receive()  # type: ignore[operator]

        sent: list[dict[str, object]] = []

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        told: list[str] = []
        guard = BodyLimit(reading, 1024, timeout_s=0.05, on_timeout=told.append)
        await asyncio.wait_for(guard(scope, receive, send), 5.0)
        assert told == ["stalled"]
        assert sent[0]["status"] == 408
        assert (b"connection", b"close") in sent[0]["headers"]  # type: ignore[operator]
        body = sent[1]["body"]
        assert isinstance(body, bytes)
        error = json.loads(body)["error"]
        assert (error["code"], error["edge"]["kind"], error["edge"]["field"]) == (
            "body_timeout", "BodyTimeout", "body")
        assert error["message"].endswith(": 10 bytes received of the 20 its Content-Length "
                                         "declares")
        assert guard.stalls.waiting == 0

        sent.clear()
        first = True
        guard = BodyLimit(answering, 1024, timeout_s=0.05)
        await asyncio.wait_for(guard(scope, receive, send), 5.0)
        assert [m["type"] for m in sent] == ["http.response.start"]  # nothing more
        assert guard.stalls.waiting == 0

        sent.clear()
        first = True
        guard = BodyLimit(reading, 1024, timeout_s=30.0)
        task = asyncio.create_task(guard(scope, receive, send))
        await asyncio.sleep(0.05)
        assert guard.stalls.waiting == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sent == [] and guard.stalls.waiting == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("timeout_s", [0.0, -1.0, float("inf"), float("nan"), 3600.5])
def test_a_body_or_header_timeout_outside_0_to_an_hour_is_refused(timeout_s: float) -> None:
    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("unreachable")

    with pytest.raises(ValueError, match=r"^body_timeout_s: must be a number of seconds > 0 "
                       r"and <= 3600: "):
        BodyLimit(app, 1024, timeout_s=timeout_s)
    with pytest.raises(ValueError, match=r"^header_timeout_s: must be a number of seconds > 0 "
                       r"and <= 3600: "):
        SlowHeads(timeout_s)


def test_a_body_slower_than_the_minimum_rate_is_408_and_one_above_it_is_read_whole() -> None:
    """The rate bound: a body still incomplete ``timeout_s`` after the head and one second
    more for each ``min_rate`` bytes received is cut 408 (``BodyTooSlow``), though each of
    its pieces came well within the stall timeout; a body sent at twice the rate, for
    many times the timeout, is read whole."""
    timeout_s, rate = 0.2, 200
    length = 400

    def trickling(piece: int, every_s: float) -> Callable[[], Awaitable[dict[str, object]]]:
        left = length

        async def receive() -> dict[str, object]:
            nonlocal left
            await asyncio.sleep(every_s)
            left -= piece
            return {"type": "http.request", "body": b"x" * piece, "more_body": left > 0}
        return receive

    scope = {"type": "http", "method": "POST", "path": "/v1/pipelines/p/run",
             "headers": [(b"content-length", str(length).encode())]}

    async def scenario() -> None:
        bodies: list[bytes] = []

        async def reading(scope: object, receive: object, send: object) -> None:
            body = b""
            while True:
                message = await receive()  # type: ignore[operator]
                body += message["body"]
                if not message["more_body"]:
                    break
            bodies.append(body)
            await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                        "headers": []})
            await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

        sent: list[MutableMapping[str, Any]] = []

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        told: list[str] = []
        guard = BodyLimit(reading, 1024, timeout_s=timeout_s, min_rate=rate,
                          on_timeout=told.append)
        # 2 bytes every 20 ms: 100 bytes/s, each piece 10 times within the stall timeout
        started = time.monotonic()
        await asyncio.wait_for(guard(scope, trickling(2, 0.02), send), 10.0)
        took = time.monotonic() - started
        assert told == ["slow"] and bodies == []
        assert sent[0]["status"] == 408
        assert (b"connection", b"close") in sent[0]["headers"]
        body = sent[1]["body"]
        assert isinstance(body, bytes)
        error = json.loads(body)["error"]
        assert (error["code"], error["edge"]["kind"], error["edge"]["field"]) == (
            "body_timeout", "BodyTooSlow", "body")
        assert error["message"].startswith(
            f"body: not complete within {timeout_s:g} s and one second more for each {rate} "
            "bytes received (--body-timeout, --body-min-rate): a client sending too slowly: ")
        assert f"bytes received of the {length} its Content-Length declares in " \
            in error["message"]
        received = int(error["message"].rsplit(": ", 1)[1].split()[0])
        assert 0 < received < length
        # cut once the deadline passed (within a sweep's tick), long before the whole body
        assert timeout_s + received / rate <= took < timeout_s + received / rate + 0.5, took
        assert guard.stalls.waiting == 0

        sent.clear()
        told.clear()
        # 8 bytes every 20 ms: 400 bytes/s, twice the rate, for 5 times the timeout
        started = time.monotonic()
        await asyncio.wait_for(guard(scope, trickling(8, 0.02), send), 10.0)
        assert time.monotonic() - started > 4 * timeout_s
        assert told == [] and bodies == [b"x" * length]
        assert [message.get("status") for message in sent] == [200, None]
        assert guard.stalls.waiting == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("rate", [0, -1, MAX_BODY_MIN_RATE + 1, 1.5, True])
def test_a_body_min_rate_outside_1_to_its_ceiling_is_refused(rate: object) -> None:
    with pytest.raises(ValueError, match=r"^body_min_rate: must be a whole number of bytes a "
                       rf"second from 1 to {MAX_BODY_MIN_RATE}: "):
        StalledBodies(1.0, rate)  # type: ignore[arg-type]
