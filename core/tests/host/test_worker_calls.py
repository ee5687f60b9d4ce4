"""Requests through a real worker: inline and shared-memory tensors, control ops, streaming."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_contracts.errors import InvalidValue
from edge_contracts.jsonvalues import thaw_json
from edge_contracts.requests import EventKind, Operation, StageRequest
from edge_contracts.shm import own_segment_names, segment_names
from edge_core.host import CallCancelled, RemoteError, TransportCapExceeded

MIB = 1024 * 1024


def request(
    rid: str, op: Operation = Operation.RUN, epoch: int = 0, **params: object
) -> StageRequest:
    return StageRequest(rid, "s0", epoch, 1, op, params=params)


def test_hello_reports_identity_versions_and_features(start):
    client = start()
    assert client.hello["pid"] == client.identity.pid
    assert client.identity.matches(client.hello["start_time"])
    assert abs(client.hello["create_time"] - client.identity.create_time) < 0.05
    assert client.hello["versions"]["echo"] == "1"
    assert "numpy" in client.hello["versions"]
    assert "shm-tensors" in client.features
    assert client.health().ready


def test_small_tensor_round_trips_inline(start):
    client = start()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = client.submit(request("r1"), {"x": x}).result(timeout=10)
    np.testing.assert_array_equal(out["x"], x)
    assert own_segment_names() == []


def test_large_tensor_round_trips_through_shared_memory(start):
    client = start(shm_threshold=64 * 1024)
    x = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    call = client.submit(request("r1", scale=2.0), {"x": x})
    delivery = call.next(timeout=10)
    assert delivery.kind is EventKind.DONE
    assert delivery.retained
    assert not delivery.arrays["x"].flags.writeable
    np.testing.assert_array_equal(delivery.arrays["x"], x * 2)
    assert delivery.event.outputs[0].shape == (512, 1024)
    delivery.release()
    assert not delivery.retained


def test_many_requests_in_flight_are_demultiplexed(start):
    client = start()
    calls = [client.submit(request(f"r{i}", scale=i), {"x": np.full(4, 1.0)}) for i in range(20)]
    for i, call in enumerate(reversed(calls)):
        index = 19 - i
        np.testing.assert_array_equal(call.result(timeout=10)["x"], np.full(4, float(index)))


def test_load_and_warmup_return_the_handler_reports(start):
    client = start()
    assert client.load({"artifact": "model.onnx", "threads": 2})["loaded"]["threads"] == 2
    assert client.warmup({})["placement"] == {"node0": "CPUExecutionProvider"}
    with pytest.raises(RemoteError, match="RuntimeError in worker"):
        client.warmup({"fail": True})
    assert client.ping()["in_flight"] == 0


def test_a_query_is_answered_ahead_of_queued_requests_and_its_errors_keep_the_worker(start):
    client = start()
    client.load({"model": "m"})
    running = client.submit(request("r1", sleep_s=1.0), {"x": np.ones(2)})
    queued = client.submit(request("r2", sleep_s=2.0), {"x": np.ones(2)})
    assert client.calls_in_flight() == 2  # (vLLM's stage counts them for max_concurrency)
    answer = client.query({"count_tokens": {"prompt": "edge"}}, timeout_s=10)
    assert answer == {"asked": {"count_tokens": {"prompt": "edge"}},
                      "loaded": {"model": "m"}}
    # answered between r1 and r2 (the worker reads every waiting frame before running
    # the next request; the query was sent well within r1's second): r2, queued before
    # the query was sent, is still running
    assert client.in_flight("r2")
    with pytest.raises(RemoteError, match=r"RuntimeError in worker.*query failed on purpose"):
        client.query({"fail": True}, timeout_s=10)
    assert running.result(timeout=10)["x"].sum() == 2
    assert queued.result(timeout=10)["x"].sum() == 2
    assert client.health().ready and client.ping()["in_flight"] == 0
    assert client.calls_in_flight() == 0


def test_a_query_to_a_handler_without_one_is_an_error_while_streams_go_on(start):
    client = start("stream")
    streaming = client.submit(request("g1", Operation.GENERATE, tokens=50, delay_s=0.01))
    assert streaming.next(timeout=10).kind is EventKind.TOKEN
    with pytest.raises(RemoteError, match=r"NotImplementedError in worker.*answers no query"):
        client.query({"count_tokens": {"prompt": "edge"}}, timeout_s=10)
    assert [d.kind for d in streaming][-1] is EventKind.DONE  # the stream went on
    # (the worker forgets a streamed call just after sending its DONE: not counted here)
    assert client.health().ready and client.ping()["pid"] == client.identity.pid


def test_handler_error_is_a_typed_remote_error_and_the_worker_stays(start):
    client = start()
    with pytest.raises(RemoteError, match="asked to fail: boom"):
        client.submit(request("r1", **{"raise": "boom"})).result(timeout=10)
    assert client.submit(request("r2"), {"x": np.ones(2)}).result(timeout=10)["x"].sum() == 2


def test_a_declared_request_fault_travels_with_the_error_event(start):
    client = start()
    plain = client.submit(request("r1", **{"raise": "boom"})).next(timeout=10)
    assert plain.kind is EventKind.ERROR and plain.error is not None
    assert plain.error.fault is None  # undeclared: the server's fault
    refused = client.submit(request("r2", refuse="params.size")).next(timeout=10)
    assert refused.kind is EventKind.ERROR and refused.error is not None
    assert refused.error.type == "Refused"
    assert refused.error.fault is not None
    assert refused.error.fault.to_dict() == {"code": "invalid_value", "param": "params.size"}


def test_a_worker_error_s_fields_arrive_as_data_whatever_its_message_says(start):
    """A control call's and a request's RemoteError carry the handler's error's field,
    reason and value exactly as it kept them (``remote_detail``); an error without them
    carries none."""
    client = start()
    with pytest.raises(RemoteError) as control:
        client.warmup({"invalid": "9f" * 32})
    assert control.value.remote_type == "InvalidValue"
    detail = control.value.remote_detail
    assert detail is not None
    assert (detail.field, detail.reason, detail.value) == (
        "warmup.file: a", "reworded: sha256 now", "9f" * 32)
    with pytest.raises(RemoteError) as failed:
        client.submit(request("r1", invalid=-3)).result(timeout=10)
    detail = failed.value.remote_detail
    assert detail is not None
    assert (detail.field, detail.reason, detail.value) == ("inputs.x", "named on purpose", -3)
    event = client.submit(request("r2", invalid=0.5)).next(timeout=10)
    assert event.kind is EventKind.ERROR and event.error is not None
    assert event.error.detail is not None and event.error.detail.value == 0.5
    with pytest.raises(RemoteError) as plain:
        client.warmup({"fail": True})
    assert plain.value.remote_detail is None
    assert client.health().ready


def test_worker_cap_exceeded_is_a_typed_error(start):
    client = start(shm_threshold=1024, shm_max_bytes=1 * MIB)
    with pytest.raises(TransportCapExceeded, match=r"shm\.retained_bytes"):
        client.submit(request("r1", alloc=2 * MIB)).result(timeout=10)
    assert client.health().ready


def test_controller_cap_exceeded_is_a_typed_error_and_acks_free_it(start):
    client = start(shm_threshold=1024, shm_max_buffers=2)
    x = np.zeros(4096, dtype=np.uint8)
    held = [client.submit(request(f"r{i}", sleep_s=0.3), {"x": x}) for i in range(2)]
    with pytest.raises(TransportCapExceeded, match=r"shm\.retained_buffers"):
        client.submit(request("r3"), {"x": x})
    for call in held:
        call.result(timeout=10)
    client.submit(request("r4"), {"x": x}).result(timeout=10)



def test_a_small_done_still_acknowledges_its_shared_memory_inputs(start):
    """Inputs in shared memory, a small inline output: each DONE frees the inputs.

    The worker writes a usual DONE from a kept template (``edge_contracts.worker_kept``);
    a call whose inputs came in segments must still carry their acknowledgements, or the
    controller's producer keeps them and refuses once its buffers are taken (seen as
    429 ``shm.retained_bytes`` from edge serve's page pipeline after 17 pages).
    """
    client = start(shm_threshold=1024, shm_max_buffers=2)
    x = np.zeros(4096, dtype=np.uint8)  # over the threshold: sent in a segment
    for i in range(12):  # many more than the producer's two buffers
        out = client.submit(request(f"r{i}", alloc=16), {"x": x}).result(timeout=10)
        assert out["big"].shape == (16,)


def test_unreleased_outputs_count_against_the_worker_cap(start):
    client = start(shm_threshold=1024, shm_max_buffers=2)
    x = np.zeros(4096, dtype=np.uint8)
    kept = [client.submit(request(f"k{i}"), {"x": x}).next(timeout=10) for i in range(2)]
    with pytest.raises(TransportCapExceeded, match=r"shm\.retained_buffers"):
        client.submit(request("r3"), {"x": x}).result(timeout=10)
    for delivery in kept:
        delivery.release()
    client.submit(request("r4"), {"x": x}).result(timeout=10)


def test_streaming_tokens_arrive_in_order_and_end_done(start):
    client = start("stream")
    call = client.submit(request("g1", Operation.GENERATE, tokens=5))
    events = list(call)
    assert [e.kind for e in events] == [EventKind.TOKEN] * 5 + [EventKind.DONE]
    assert [e.seq for e in events] == list(range(6))
    assert [e.data["text"] for e in events[:5]] == [f"t{i}" for i in range(5)]


def test_cancel_aborts_one_stream_in_place_and_others_finish(start):
    client = start("stream")
    slow = client.submit(request("g1", Operation.GENERATE, tokens=1000, delay_s=0.01))
    other = client.submit(request("g2", Operation.GENERATE, tokens=3, delay_s=0.01))
    assert slow.next(timeout=10).kind is EventKind.TOKEN
    slow.cancel()
    kinds = [d.kind for d in slow]
    assert kinds[-1] is EventKind.CANCELLED
    assert EventKind.TOKEN not in kinds[1:]
    assert [d.kind for d in other][-1] is EventKind.DONE
    assert client.health().ready
    doomed = client.submit(request("g3", Operation.GENERATE, tokens=10**6, delay_s=0.01))
    client.cancel("g3")
    with pytest.raises(CallCancelled, match=r"request\[g3\]: cancelled"):
        doomed.result(timeout=5)


def test_epoch_fence_drops_queued_work_without_output(start):
    client = start()
    running = client.submit(request("r0", sleep_s=0.4), {"x": np.ones(2)})
    queued = [client.submit(request(f"q{i}", epoch=0), {"x": np.ones(2)}) for i in range(3)]
    client.cancel(stage_id="s0", fence_epoch=1)
    for call in [running, *queued]:
        deliveries = list(call)
        assert [d.kind for d in deliveries] == [EventKind.CANCELLED]
    fresh = client.submit(request("n1", epoch=1), {"x": np.ones(2)})
    assert fresh.result(timeout=10)["x"].sum() == 2
    assert client.ping()["in_flight"] == 0


def test_outputs_computed_into_output_buffers_travel_without_a_copy(start):
    client = start("inplace", shm_threshold=64 * 1024, sealed_segments=False)  # named: listed
    x = np.arange(256 * 1024, dtype=np.float32)  # 1 MiB: through shared memory
    for i in range(3):
        call = client.submit(request(f"r{i}"), {"x": x})
        delivery = call.next(timeout=10)
        np.testing.assert_array_equal(delivery.arrays["y"], x * 2)
        assert delivery.arrays["threshold"][0] == 64 * 1024
        # One worker segment holds y, reused every time: the output was never copied
        # into a second segment.
        mine = f"edge_{client._worker_prefix}_"
        worker_segments = [name for name in segment_names() if name.startswith(mine)]
        assert [ref[0] for ref in delivery._refs] == worker_segments
        delivery.release()


def test_output_buffers_a_request_does_not_send_are_taken_back(start):
    client = start("inplace", shm_threshold=64 * 1024)
    x = np.ones(30 * MIB // 4, dtype=np.float32)  # 30 MiB out, plus 20 MiB never sent
    for i in range(4):  # under the 64 MiB cap only if the unsent buffer is taken back
        out = client.submit(request(f"r{i}", unsent=20 * MIB), {"x": x}).result(timeout=30)
        assert out["y"][0] == 2.0
    assert client.health().ready


def test_small_output_buffers_are_private_arrays(start):
    client = start("inplace")  # default threshold 256 KiB
    x = np.arange(16, dtype=np.int32)
    delivery = client.submit(request("small"), {"x": x}).next(timeout=10)
    np.testing.assert_array_equal(delivery.arrays["y"], x * 2)
    assert not delivery.retained


def _mapped_segments(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as maps:
        return {line.split("/dev/shm/")[1].split()[0] for line in maps if "/dev/shm/" in line}


def test_unlinked_segments_reach_the_worker_without_touching_request_params(start):
    # One buffer per producer: the 4 MiB input evicts the pooled 1 MiB segment, and the
    # controller tells the worker so (it then unmaps it) in an ack before the request.
    client = start(shm_threshold=1024, shm_max_buffers=1, sealed_segments=False)
    pid = client.identity.pid
    small = np.ones(MIB, dtype=np.uint8)
    client.submit(request("a", report_params=True), {"x": small}).next(timeout=10).release()
    first = _mapped_segments(pid)
    assert first, "the worker maps the controller's input segment"
    params = {"report_params": True, "gone": ["user-value"], "segments": [1]}
    call = client.submit(request("b", **params), {"x": np.ones(4 * MIB, dtype=np.uint8)})
    with call.next(timeout=10) as done:
        assert thaw_json(done.data["params"]) == params
    assert not first & _mapped_segments(pid)
    params = {"report_params": True, "gone": [["not", "names"]]}
    with client.submit(request("c", **params)).next(timeout=10) as done:
        assert thaw_json(done.data["params"]) == params


NO_WAITS = [math.nan, math.inf, -math.inf, "1"]
"""Timeouts that are no finite number of seconds."""


@pytest.mark.parametrize("timeout", NO_WAITS)
def test_a_wait_for_the_next_event_that_is_no_finite_number_is_refused_and_the_call_goes_on(
    start, timeout,
):
    client = start("stream")
    call = client.submit(request("g1", Operation.GENERATE, tokens=3, delay_s=0.5))
    assert call.next(timeout=10).kind is EventKind.TOKEN  # the first comes at once
    with pytest.raises(InvalidValue) as info:  # the next in 0.5 s: this would wait for it
        call.next(timeout)
    assert info.value.field == "timeout"
    assert not call.ended
    kinds = [call.next(timeout=10).kind for _ in range(3)]  # the call goes on, whole
    assert kinds == [EventKind.TOKEN] * 2 + [EventKind.DONE]
    assert client.health().ready


@pytest.mark.parametrize("timeout_s", [*NO_WAITS, True])
def test_a_control_wait_that_is_no_finite_number_is_refused_before_anything_is_sent(
    start, timeout_s,
):
    client = start("echo")
    for control in (lambda: client.ping(timeout_s=timeout_s),
                    lambda: client.query({"q": 1}, timeout_s=timeout_s)):
        with pytest.raises(InvalidValue) as info:
            control()
        assert info.value.field == "timeout_s"
        assert "finite number of seconds" in str(info.value)
    assert client.outstanding() == 0
    assert client.ping(timeout_s=5.0)["in_flight"] == 0
