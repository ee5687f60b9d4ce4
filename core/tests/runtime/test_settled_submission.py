"""A submission sent from an event loop and settled there (``Pipeline.submit``'s ``loop``).

``Pipeline.submit(..., loop=loop)`` sends a one-stage request from the loop itself when
it can go at once; the loop reads the worker's reply and settles it: no request thread
takes part. Each test checks that
the request went that way (no request thread of the pipeline exists) and that its
guarantees hold as on the request threads: it is cancelled alone, its deadline ends it,
a worker's death is its typed error, and nothing stays charged (the admission, the
request's id, the stage's slots; the conftest's leak check counts processes, segments
and descriptors, the ledger is checked here).
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import weakref
from typing import Any

import numpy as np
import pytest

from edge_contracts.errors import InvalidValue
from edge_core.backend import CancelOutcome
from edge_core.errors import DeadlineExceeded, WorkerError
from edge_core.ledger import ResourceLedger
from edge_core.runtime import Pipeline, RequestCancelled, StageState
from edge_core.runtime.pipeline import SEND_NOW_BYTES
from edge_core.runtime.submission import Submission
from edge_core.workerstage import WorkerStage

from .conftest import OpenPipeline, echo_stage

X = {"x": np.ones((2, 2), np.float32)}


def request_threads(pipeline: Pipeline) -> list[str]:
    """The pipeline's request threads alive now (named after it)."""
    prefix = f"edge-{pipeline.config.name}"
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


async def settled(submission: Submission) -> int:
    """Await ``submission`` on this loop; the thread its done callback ran in."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    def callback() -> None:
        ident = threading.get_ident()

        def settle() -> None:
            if not done.done():
                done.set_result(ident)

        loop.call_soon_threadsafe(settle)

    submission.add_done_callback(callback)
    return await asyncio.wait_for(done, 30)


def submit(pipeline: Pipeline, inputs: dict[str, Any] = X, **kwargs: Any) -> Submission:
    """``Pipeline.submit`` settled on the running loop."""
    loop = asyncio.get_running_loop()
    return pipeline.submit(inputs, loop=loop, **kwargs)


def assert_nothing_charged(pipeline: Pipeline, *ids: str) -> None:
    """Admission free, every stage slot free, no request tracked; a request is served."""
    assert pipeline.admission.used == 0
    for stage in pipeline.stages:
        assert stage.outstanding == 0 and stage.slots.used == 0
    for rid in ids:  # the tracker let go of it
        assert pipeline.requests.cancel(rid) is CancelOutcome.ALREADY_FINISHED
    with pipeline.run(X) as result:  # and the pipeline serves on
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)


async def settled_on_the_loop(pipeline: Pipeline, count: int) -> None:
    """``count`` requests one after another, each settled by this loop, no request thread."""
    loop_thread = threading.get_ident()
    for _ in range(count):
        submission = submit(pipeline)
        assert await settled(submission) == loop_thread  # settled by the loop
        with submission.result(0) as result:
            np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
            assert result.placement[0]["stage"] == "a"  # the placement receipt
    assert request_threads(pipeline) == []

def test_a_one_stage_request_is_sent_and_settled_on_the_loop_without_a_request_thread(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(echo_stage("a"), admission=2)
    asyncio.run(settled_on_the_loop(pipeline, 20))
    assert_nothing_charged(pipeline)
    assert ledger.reserved("machine:ram") > 0  # the stage is still loaded


def test_a_reply_read_before_its_callback_is_set_is_settled_on_the_loop(
    open_pipeline: OpenPipeline, ledger: ResourceLedger, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The channel's reader may read the reply before the loop asks to be called at its end.

    On a loaded machine the background reader can read the reply between the send and
    ``on_end``; ``on_end`` then says False (not in flight any more). Such a request was
    handed to a request thread (a thread started for a reply already here: found as a
    suite's failure of the test above); it is settled on the loop now, at once.
    """
    real_on_end = WorkerStage.on_end
    late: list[str] = []

    def on_end_after_the_reply(stage: WorkerStage, request_id: str, callback: Any,
                               loop: Any = None) -> bool:
        deadline = time.monotonic() + 10
        while stage.client.in_flight(request_id) and time.monotonic() < deadline:
            time.sleep(0.001)  # the background reader reads the reply meanwhile
        late.append(request_id)
        return real_on_end(stage, request_id, callback, loop)

    monkeypatch.setattr(WorkerStage, "on_end", on_end_after_the_reply)
    pipeline = open_pipeline(echo_stage("a"), admission=2)
    asyncio.run(settled_on_the_loop(pipeline, 5))
    assert len(late) == 5
    assert ledger.reserved("machine:ram") > 0  # the stage is still loaded
    pipeline.close()
    assert ledger.holdings() == ()


def test_a_loop_serving_request_after_request_watches_the_channel_once_and_closes_clean(
    open_pipeline: OpenPipeline, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The loop keeps watching the worker's channel LINGER_S after its last call ended, so
    # that requests one after another pay the watch (a dup, epoll_ctl both ways, a close,
    # the background reader's hand-over) once, not each; the loop's close ends it (the
    # conftest's leak check counts descriptors).
    pipeline = open_pipeline(echo_stage("a"), admission=2)
    real_dup = os.dup
    dups: list[int] = []

    def counting_dup(fd: int) -> int:
        dups.append(fd)
        return real_dup(fd)

    monkeypatch.setattr(os, "dup", counting_dup)
    before = len(os.listdir("/proc/self/fd"))

    async def main() -> tuple[int, int]:
        running = len(os.listdir("/proc/self/fd"))  # the loop's own descriptors too
        for _ in range(20):
            submission = submit(pipeline)
            await settled(submission)
            submission.result(0).ack()
        return running, len(os.listdir("/proc/self/fd"))

    running, during = asyncio.run(main())
    assert len(dups) == 1
    assert during == running + 1  # the watch's duplicate, while the loop lingers
    assert len(os.listdir("/proc/self/fd")) == before  # closed with the loop
    assert_nothing_charged(pipeline)


def test_replies_that_arrive_together_are_all_read_and_settled_on_the_loop(
    open_pipeline: OpenPipeline,
) -> None:
    # Four calls in flight on one worker at once, whose replies come close together: the
    # loop reads what a wake-up finds (the socket asked once) and is woken again for
    # the rest while the socket holds more; every request settles there.
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"), admission=4)

    async def main() -> None:
        loop_thread = threading.get_ident()
        for _ in range(10):
            submissions = [submit(pipeline, params={"delay_s": 0.01}) for _ in range(4)]
            assert await asyncio.gather(*map(settled, submissions)) == [loop_thread] * 4
            for submission in submissions:
                with submission.result(0) as result:
                    np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
        assert request_threads(pipeline) == []

    asyncio.run(main())
    assert_nothing_charged(pipeline)


def test_inputs_over_the_limit_and_a_full_stage_go_to_a_request_thread_and_settle_alike(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", delay_s=0.3), admission=2)  # one slot
    big = {"x": np.ones((SEND_NOW_BYTES // 4 + 1,), np.float32)}

    async def main() -> None:
        first = submit(pipeline)  # takes the stage's one slot from the loop
        second = submit(pipeline)  # admitted, no stage slot now: a request thread waits
        for submission in (first, second):  # the stage slot goes back at the ack
            await settled(submission)
            submission.result(0).ack()
        large = submit(pipeline, big)
        await settled(large)
        with large.result(0) as result:
            assert result.outputs["x"].shape == big["x"].shape

    asyncio.run(main())
    assert request_threads(pipeline)  # the two that could not go at once went there
    assert_nothing_charged(pipeline)


def test_cancelling_one_settled_request_leaves_the_other_to_finish(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"), admission=2)
    pid = pipeline.stage("a").loaded.describe()["pid"]

    async def main() -> None:
        slow = {"delay_s": 0.5}
        kept = submit(pipeline, params=slow, request_id="kept")
        gone = submit(pipeline, params={"delay_s": 30.0}, request_id="gone")
        await asyncio.sleep(0.1)
        outcome = await asyncio.to_thread(gone.cancel)
        assert outcome is CancelOutcome.CANCELLED_IN_PLACE
        await settled(gone)
        with pytest.raises(RequestCancelled):
            gone.result(0)
        await settled(kept)
        with kept.result(0) as result:
            np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
        assert request_threads(pipeline) == []

    asyncio.run(main())
    stage = pipeline.stage("a")
    assert stage.state is StageState.READY and stage.loaded.describe()["pid"] == pid
    assert_nothing_charged(pipeline, "kept", "gone")


def test_a_settled_requests_deadline_ends_it(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"), admission=2)

    async def main() -> None:
        late = submit(pipeline, params={"delay_s": 30.0}, deadline_s=0.3, request_id="late")
        await settled(late)
        with pytest.raises(DeadlineExceeded):
            late.result(0)
        assert request_threads(pipeline) == []

    asyncio.run(main())
    assert pipeline.stage("a").state is StageState.READY  # preemptible: stopped in place
    assert_nothing_charged(pipeline, "late")


def test_a_workers_death_is_the_settled_requests_error_and_frees_everything(
    open_pipeline: OpenPipeline, ledger: ResourceLedger,
) -> None:
    pipeline = open_pipeline(echo_stage("a"), admission=2)

    async def main() -> None:
        doomed = submit(pipeline, params={"crash": True}, request_id="doomed")
        await settled(doomed)
        with pytest.raises(WorkerError):
            doomed.result(0)
        assert request_threads(pipeline) == []

    asyncio.run(main())
    stage = pipeline.stage("a")
    assert stage.state is not StageState.READY  # the death was seen
    assert pipeline.admission.used == 0 and stage.outstanding == 0
    stage.restart()  # nothing of the dead worker stays charged: it reloads and serves
    assert_nothing_charged(pipeline, "doomed")
    assert ledger.reserved("machine:ram") > 0


def test_two_event_loops_settle_their_own_requests_on_one_worker(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"), admission=4)
    settled_on: dict[str, list[bool]] = {}  # per loop: each request settled on its thread?
    errors: list[BaseException] = []

    def serve(name: str) -> None:  # one event loop in its own thread
        async def main() -> None:
            own = threading.get_ident()
            seen = settled_on.setdefault(name, [])
            for _ in range(10):
                submission = submit(pipeline, params={"delay_s": 0.02})
                seen.append(await settled(submission) == own)
                with submission.result(0) as result:
                    np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=serve, args=(name,)) for name in ("one", "two")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert settled_on == {"one": [True] * 10, "two": [True] * 10}
    assert request_threads(pipeline) == []
    assert_nothing_charged(pipeline)


@pytest.mark.parametrize("backend", ["echo", "echo-preemptible"])
@pytest.mark.parametrize("behind", ["closed", "stopped"])
def test_a_loop_closed_or_stopped_behind_its_request_leaves_it_to_end_without_it(
    open_pipeline: OpenPipeline, ledger: ResourceLedger, backend: str, behind: str,
) -> None:
    # No deadline: nothing but the reply can end the request. The loop that sent it
    # stops (or closes) before the reply is in: another thread reads it and settles it.
    pipeline = open_pipeline(echo_stage("a", backend=backend, delay_s=0.3), admission=2)
    loop = asyncio.new_event_loop()

    async def send() -> Submission:
        return submit(pipeline)

    try:
        submission = loop.run_until_complete(send())
        assert request_threads(pipeline) == []  # sent from the loop, read by it
        if behind == "closed":
            loop.close()
        with submission.result(10.0) as result:
            np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
    finally:
        loop.close()
    assert_nothing_charged(pipeline, submission.request_id)
    assert pipeline.stage("a").state is StageState.READY


class _Counting:
    """Counts what a loop is handed through ``call_soon_threadsafe`` (keeping none of it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, refuse: bool = False) -> None:
        self.handed = 0
        self._call = loop.call_soon_threadsafe
        self._refuse = refuse

    def __call__(self, callback: Any, *args: Any, **kwargs: Any) -> Any:
        self.handed += 1
        if self._refuse:  # as a loop closed between the running check and this call
            raise RuntimeError("Event loop is closed")
        return self._call(callback, *args, **kwargs)


@pytest.mark.parametrize("ended", ["reply read by another thread", "cancelled on the loop",
                                   "loop refuses the callback"])
def test_a_loop_stopped_and_closed_with_its_requests_settle_queued_still_settles_it(
    open_pipeline: OpenPipeline, ledger: ResourceLedger, ended: str,
) -> None:
    # The request's end comes while its loop runs, so its settle is queued on the loop
    # (call_soon_threadsafe from another thread, call_soon on the loop's own); the loop is
    # then stopped in the same batch and closed, which drops what is queued. The request
    # must settle all the same, and give back its admission and its stage slot (and the
    # loop's watch its duplicate descriptor: the leak check counts descriptors).
    pipeline = open_pipeline(echo_stage("a", backend="echo-preemptible"), admission=2)
    stage = pipeline.stage("a")
    held = ledger.holdings()
    loop = asyncio.new_event_loop()
    counting = _Counting(loop, refuse=ended == "loop refuses the callback")
    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    sent: list[Submission] = []
    failed: list[BaseException] = []

    def on_the_loop() -> None:
        try:
            the_last_batch()
        except BaseException as exc:  # raised below, not left to the loop's handler
            failed.append(exc)
        finally:
            loop.stop()  # this batch is the loop's last: what it queued meanwhile never runs

    def the_last_batch() -> None:
        sent.append(pipeline.submit(X, loop=loop, params={"delay_s": 0.05}))
        if ended == "cancelled on the loop":  # ended here: its settle queued by call_soon
            assert sent[0].cancel() is not None
        else:
            # A thread waiting for a call of its own leads the channel's reading: it reads
            # this request's reply too, while the loop is busy here, and hands the loop
            # the watch's stop and the request's settle. Controlled: it reads until both
            # were handed over (the loop cannot read meanwhile, it is running this).
            def lead() -> None:
                ends = time.monotonic() + 20.0
                try:
                    while counting.handed < 2 and time.monotonic() < ends:
                        with stage.submit(X, params={"delay_s": 0.02},
                                          deadline_s=10.0).result():
                            pass
                except BaseException as exc:  # raised by the test, not lost in the thread
                    failed.append(exc)

            reader = threading.Thread(target=lead, name="leads-the-reading")
            reader.start()
            reader.join()
            assert counting.handed == 2

    loop.call_soon(on_the_loop)
    loop.run_forever()
    loop.close()  # drops the queued callbacks
    assert failed == []
    (submission,) = sent
    if ended == "cancelled on the loop":
        with pytest.raises(RequestCancelled):
            submission.result(5.0)
    else:
        with submission.result(5.0) as result:  # settled, not left waiting for good
            np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
    assert_nothing_charged(pipeline, submission.request_id)
    assert ledger.holdings() == held
    assert stage.state is StageState.READY and stage.generation == 1  # the same worker


def test_a_settled_submission_whose_callback_holds_it_is_freed_once_dropped(
    open_pipeline: OpenPipeline,
) -> None:
    """A done callback that holds its submission (as a server's does, to wake its request
    with it) is let go once it has run: the submission, its answer and its result's
    arrays are freed when the caller drops them, without the cyclic garbage collector."""
    pipeline = open_pipeline(echo_stage("a"))

    async def one() -> tuple[weakref.ref[Submission], list[str]]:
        submission = submit(pipeline)
        seen: list[str] = []
        submission.add_done_callback(lambda: seen.append(submission.request_id))
        await settled(submission)
        with submission.result(0) as result:
            np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
        return weakref.ref(submission), seen

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(one())  # (the loop's first turns make what it keeps)
        gc.collect()
        gc.disable()
        try:
            gone, seen = loop.run_until_complete(one())
            assert len(seen) == 1  # the callback ran, once
            assert gone() is None, gc.get_referrers(gone())
        finally:
            gc.enable()
    finally:
        loop.close()
    assert_nothing_charged(pipeline)


@pytest.mark.parametrize("request_id", ["a\nb", "x" * 129], ids=["unprintable", "too-long"])
def test_a_callers_request_id_the_contract_refuses_is_the_requests_error(
    open_pipeline: OpenPipeline, request_id: str,
) -> None:
    """A request id of the caller's is checked as ``StageRequest`` checks one: refused
    (``InvalidValue`` naming ``request.request_id``) before anything is sent, on the
    loop's path, on a request thread and on the stage itself; nothing stays charged."""
    pipeline = open_pipeline(echo_stage("a"))

    async def on_the_loop() -> None:
        submission = submit(pipeline, request_id=request_id)
        await settled(submission)
        with pytest.raises(InvalidValue) as refused:
            submission.result(0)
        assert refused.value.field == "request.request_id"

    asyncio.run(on_the_loop())
    with pytest.raises(InvalidValue) as refused:
        pipeline.submit(X, request_id=request_id).result(10.0)
    assert refused.value.field == "request.request_id"
    stage = pipeline.stage("a")
    with pytest.raises(InvalidValue) as refused:
        stage.submit(X, request_id=request_id)
    assert refused.value.field == "request.request_id"
    assert_nothing_charged(pipeline, request_id)
    with stage.submit(X, request_id="a-caller's-id").result() as result:
        np.testing.assert_array_equal(result.outputs["x"], X["x"] * 2)
