"""Calls in flight (``WorkerClient._calls``): whoever takes a call out ends it, once.

A usual reply's reader takes its call out without the client's lock; everything else
that changes the registry holds the lock (docs at ``WorkerClient._calls``). These tests
force the interleavings that matter on a real worker process, pausing a thread with a
trace hook at a chosen line (nothing in the code is changed for them).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import edge_core.host.client as client_module
from edge_core.host import WorkerClient
from edge_core.host.calls import Call, CallCancelled

from .conftest import request

X = np.arange(4, dtype=np.float32)
SOURCE = Path(client_module.__file__).read_text(encoding="utf-8").splitlines()


def _warm(client: WorkerClient) -> None:
    """Usual replies of the kind used below are kept (read without the frame reader).

    Ids of one character, as the tests' (a template is kept per id length).
    """
    for rid in "abc":
        client.submit(request(rid), {"x": X}).result(timeout=10)
        client.submit(request(rid.upper(), sleep_s=0.05), {"x": X}).result(timeout=10)


def _paused_in(function: str, text: str, paused: threading.Event, go: threading.Event,
               *, inside: str = "") -> Callable[..., Any]:
    """A tracer pausing once in ``function`` at the first line whose source has ``text``.

    ``inside``: the function that runs ``function`` (a comprehension's, say).
    """
    def local(frame: Any, event: str, arg: Any) -> Any:
        if (event == "line" and not paused.is_set()
                and text in SOURCE[frame.f_lineno - 1]):
            paused.set()
            go.wait(10)
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if code.co_filename != client_module.__file__ or code.co_name != function:
            return None
        outer = frame.f_back.f_code.co_name if frame.f_back is not None else ""
        return local if not inside or outer == inside else None
    return tracer


def _run_traced(tracer: Callable[..., Any], action: Callable[[], Any]) -> threading.Thread:
    def run() -> None:
        sys.settrace(tracer)
        try:
            action()
        finally:
            sys.settrace(None)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_cancel_never_takes_out_a_newer_call_of_a_reused_id(start):
    """cancel(X) copies the registry; X's usual reply ends A; B is submitted as X; cancel goes on.

    With B registered without the lock, the cancel's pop took B out (B was not the call it
    had seen, so B was not ended either): B's reply and the worker's CANCELLED were dropped
    as unknown and B waited for good. B now registers once the cancel is done, and ends.
    """
    client = start()
    _warm(client)
    a = client.submit(request("X", sleep_s=0.05), {"x": X})
    paused, go = threading.Event(), threading.Event()
    # paused at its loop's first test: the copy is made, A in it, the lock held
    canceller = _run_traced(_paused_in("cancel", "if (call.request_id == request_id",
                                       paused, go), lambda: client.cancel("X"))
    assert paused.wait(10)
    assert a.result(timeout=10)["x"].tolist() == X.tolist()  # A's reply: the usual path
    submitted: list[Any] = []
    submitter = threading.Thread(target=lambda: submitted.append(
        client.submit(request("X", sleep_s=0.3), {"x": X + 100})), daemon=True)
    submitter.start()
    submitter.join(0.5)
    go.set()
    canceller.join(10)
    submitter.join(10)
    assert not canceller.is_alive() and len(submitted) == 1
    try:  # B ends: its answer, or the cancel's (sent after B's request went out)
        outputs = submitted[0].result(timeout=10)
        assert outputs["x"].tolist() == (X + 100).tolist()
    except CallCancelled:
        pass
    assert client.outstanding() == 0


def test_a_call_whose_usual_reply_was_read_as_the_worker_was_lost_ends_once(start, monkeypatch):
    """A lost worker's calls are taken out by a pop: one a usual reply's reader took is not failed.

    Before, the registry was copied and then cleared; a reply read between the two was
    delivered and the call then failed as well (a second end queued behind its DONE).
    """
    client = start()
    _warm(client)
    failed: list[str] = []
    real_fail = Call.fail

    def fail(call: Call, error: BaseException) -> None:
        failed.append(call.request_id)
        real_fail(call, error)

    monkeypatch.setattr(Call, "fail", fail)
    a = client.submit(request("X", sleep_s=0.05), {"x": X})
    paused, go = threading.Event(), threading.Event()
    lost = _run_traced(_paused_in("_lost", "calls = [call for call in map(pop", paused, go),
                       lambda: client.unresponsive("a test's verdict"))
    assert paused.wait(10)  # the worker is marked lost; its calls not yet taken out
    assert a.result(timeout=10)["x"].tolist() == X.tolist()  # read, taken out, ended
    go.set()
    lost.join(10)
    assert not lost.is_alive()
    assert "X" not in failed, "the call was ended a second time"
