"""Worker entries for the host tests: real handlers, some of them deliberately misbehaving.

This module runs inside worker processes (any interpreter): it imports only the
standard library, edge_contracts and numpy.
"""

from __future__ import annotations

import contextlib
import gc
import linecache
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from edge_contracts.errors import InvalidValue
from edge_contracts.headers import FrameHeader, TensorSpec
from edge_contracts.wire import encode_frame, write_frame
from edge_contracts.worker import BaseHandler, Call
from edge_contracts.worker_heartbeat import Heartbeat
from edge_contracts.worker_protocol import hello_meta

GC_AT_IMPORT = gc.isenabled()
"""Whether the cyclic garbage collector was on while the worker imported its entry."""


class Refused(ValueError):
    """A request refused as its own fault, declared the way a backend declares one."""

    request_fault = "invalid_value"

    def __init__(self, field: str) -> None:
        self.field = field
        super().__init__(f"{field}: refused on purpose")


class Echo(BaseHandler):
    """A graph-style handler: returns its inputs; params may ask it to sleep or scale.

    ``started`` names a file created as the call begins (the serve loop has read every
    frame already waiting); ``hold_s`` then holds the call until the worker's channel has
    bytes to read (the controller's next frame, sent once that file exists), at most that
    many seconds: the worker's wait for its next frame finds one there, however late the
    controller runs.
    """

    def __init__(self) -> None:
        self.loaded: dict[str, Any] = {}

    def versions(self) -> Mapping[str, str]:
        import numpy

        return {"numpy": numpy.__version__, "echo": "1"}

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        self.loaded = dict(config)
        import importlib.util

        import edge_contracts

        return {
            "loaded": dict(config),
            "pid": os.getpid(),
            "executable": sys.executable,
            "prefix": sys.prefix,
            "edge_contracts": edge_contracts.__file__,
            "has_edge_core": importlib.util.find_spec("edge_core") is not None,
            "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("edge_core", "psutil")),
            "gc": {"at_import": GC_AT_IMPORT, "enabled": gc.isenabled(),
                   "frozen": gc.get_freeze_count()},
        }

    def warmup(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        if config.get("fail"):
            raise RuntimeError("warm-up failed on purpose")
        if config.get("invalid") is not None:
            raise InvalidValue("warmup.file: a", config["invalid"], "reworded: sha256 now")
        return {"placement": {"node0": "CPUExecutionProvider"}}

    def query(self, question: Mapping[str, Any]) -> Mapping[str, Any]:
        if question.get("fail"):
            raise RuntimeError("query failed on purpose")
        return {"asked": dict(question), "loaded": self.loaded}

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        sleep_s = call.params.get("sleep_s", 0)
        if sleep_s:
            time.sleep(sleep_s)
        started = call.params.get("started")
        if started:
            with open(started, "x"):
                pass
        hold_s = call.params.get("hold_s", 0)
        if hold_s:  # the channel is the FD of ``python -c WORKER_MAIN FD``
            channel = select.poll()
            channel.register(int(sys.argv[1]), select.POLLIN)
            channel.poll(round(1000 * hold_s))
        if call.params.get("raise"):
            raise ValueError(f"asked to fail: {call.params['raise']}")
        if call.params.get("refuse"):
            raise Refused(str(call.params["refuse"]))
        if call.params.get("invalid") is not None:
            raise InvalidValue("inputs.x", call.params["invalid"], "named on purpose")
        nbytes = call.params.get("alloc")
        if nbytes:
            import numpy as np

            return {"big": np.ones(nbytes, dtype=np.uint8)}
        scale = call.params.get("scale")
        if scale is not None:
            return {name: array * scale for name, array in call.inputs.items()}
        if call.params.get("report_params"):
            call.done({}, data={"params": call.params})
            return None
        return dict(call.inputs)


_WAKE = Heartbeat.wake.__code__
_WAKE_LINES: dict[tuple[str, int], bool] = {}


def _in_wake(frame: Any) -> bool:
    """Whether ``frame`` runs inside the worker heartbeat's ``wake`` (its own frame too)."""
    while frame is not None:
        if frame.f_code is _WAKE:
            return True
        frame = frame.f_back
    return False


def _calls_wake(frame: Any) -> bool:
    """Whether the line ``frame`` runs is a call of a ``wake`` (the serve loop's call site)."""
    key = (frame.f_code.co_filename, frame.f_lineno)
    found = _WAKE_LINES.get(key)
    if found is None:  # (an instruction without a line has f_lineno None)
        found = _WAKE_LINES[key] = (key[1] is not None
                                    and ".wake()" in linecache.getline(*key))
    return found


class CountingEcho(BaseHandler):
    """Returns its inputs; counts the serve loop's Python work between two queries.

    ``query({"count": "calls"})`` or ``{"count": "bytecodes"}`` starts counting, on the
    loop thread (where queries run), Python function calls (``sys.setprofile``) or
    bytecode instructions (``sys.settrace`` opcode events, in the frames already running
    below the query too: the serve loop's own); ``query({"count": "stop"})``
    stops and answers ``{"total": N, "top": [[name, count], ...], "wakes": W,
    "wake_total": M}``. The work inside the worker heartbeat's ``wake`` is not in
    ``total``: it runs once per heartbeat period at most, not per request (it is skipped
    while a wake is pending), so its share grows with the time the requests took;
    ``wakes`` counts those calls and ``wake_total`` their work (in bytecodes, with the
    lines that call it: the call site's share, which the loop's own frame runs).
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.wakes = 0
        self.wake_total = 0

    def _note(self, frame: Any) -> None:
        key = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
        self.counts[key] = self.counts.get(key, 0) + 1

    def query(self, question: Mapping[str, Any]) -> Mapping[str, Any]:
        mode = question.get("count")
        if mode == "stop":
            sys.setprofile(None)
            sys.settrace(None)
            top = sorted(self.counts.items(), key=lambda item: -item[1])[:20]
            return {"total": sum(self.counts.values()), "top": [list(item) for item in top],
                    "wakes": self.wakes, "wake_total": self.wake_total}
        self.counts = {}
        self.wakes = self.wake_total = 0
        if mode == "calls":
            def count(frame: Any, event: str, arg: Any) -> None:
                if event == "call":
                    if _in_wake(frame):
                        self.wakes += frame.f_code is _WAKE
                        self.wake_total += 1
                    else:
                        self._note(frame)
            sys.setprofile(count)
        elif mode == "bytecodes":
            def in_wake(frame: Any, event: str, arg: Any) -> Any:
                if event == "opcode":
                    self.wake_total += 1
                return in_wake

            def trace(frame: Any, event: str, arg: Any) -> Any:
                if event == "call":
                    frame.f_trace_opcodes = True
                    if _in_wake(frame):
                        self.wakes += frame.f_code is _WAKE
                        return in_wake
                    return trace
                if event == "opcode":
                    if _calls_wake(frame):
                        self.wake_total += 1
                    else:
                        self._note(frame)
                return trace
            sys.settrace(trace)
            # The frames already running (the serve loop's own, below this query) are
            # traced too: settrace alone sees only frames entered after it, and the
            # loop's per-request work in its running frame would go uncounted.
            outer = sys._getframe(1)
            while outer is not None:
                outer.f_trace = trace
                outer.f_trace_opcodes = True
                outer = outer.f_back
        return {}

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        return call.inputs


class CountingInPlace(CountingEcho):
    """:class:`CountingEcho` answering as a zero-copy stage does: ``y`` written in place.

    ``x`` (an input buffer sent by reference) is copied into an output buffer of this
    worker's (:meth:`Call.output_buffer`: one of its segments when large enough), which
    is returned as the output: the DONE event carries it as a shared-memory entry.
    """

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        x = call.inputs["x"]
        out = call.output_buffer(x.shape, x.dtype)
        out[...] = x
        return {"y": out}


class Stream(BaseHandler):
    """A streaming handler: its own engine thread emits tokens; cancel aborts in place."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: list[Call] = []
        self._aborted: set[str] = set()
        self._closing = False
        self.cancelled: list[str] = []
        self._engine = threading.Thread(target=self._run, daemon=True)
        self._engine.start()

    def required_features(self) -> frozenset[str]:
        return frozenset({"stream-events"})

    def versions(self) -> Mapping[str, str]:
        return {"stream-engine": "0.1"}

    def submit(self, call: Call) -> None:
        with self._wake:
            self._queue.append(call)
            self._wake.notify()

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._aborted.add(request_id)
            self.cancelled.append(request_id)

    def _run(self) -> None:
        active: dict[str, tuple[Call, int]] = {}
        while True:
            with self._wake:
                while not self._queue and not active and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
                for call in self._queue:
                    active[call.request_id] = (call, 0)
                self._queue.clear()
                aborted, self._aborted = self._aborted, set()
            for request_id in aborted:
                active.pop(request_id, None)
            for request_id, (call, produced) in list(active.items()):
                total = int(call.params.get("tokens", 3))
                if produced < total:
                    call.token({"text": f"t{produced}", "index": produced})
                    active[request_id] = (call, produced + 1)
                else:
                    call.done(data={"tokens": total, "aborted_so_far": len(self.cancelled)})
                    del active[request_id]
            if active:  # the first active call's pace (an empty ``active`` sleeps not)
                time.sleep(float(next(iter(active.values()))[0].params.get("delay_s", 0.0)))

    def close(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._engine.join(timeout=2)


class Stubborn(Echo):
    """Ignores SIGTERM and hangs on shutdown; starts a grandchild that ignores SIGTERM too
    and forks a great-grandchild."""

    def __init__(self) -> None:
        super().__init__()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code = (
            "import os, signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "if os.fork() == 0:\n"
            "    time.sleep(120)\n"
            "time.sleep(120)\n"
        )
        self.child = subprocess.Popen([sys.executable, "-c", code])

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        return {"grandchild": self.child.pid}

    def close(self) -> None:
        time.sleep(120)  # never leaves by itself: only SIGKILL ends this tree


class SlowClose(Echo):
    """Takes 2 s to shut down (an engine tearing down), then leaves by itself."""

    def close(self) -> None:
        time.sleep(2.0)


def slow_close() -> BaseHandler:
    return SlowClose()


class AtExit(Echo):
    """At load, registers an ``atexit`` handler that writes ``config["marker"]`` after 1 s."""

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        import atexit

        marker = str(config["marker"])

        def write() -> None:
            time.sleep(1.0)  # a slow interpreter teardown
            with open(marker, "w", encoding="ascii") as out:
                out.write("atexit ran")

        atexit.register(write)
        return {"pid": os.getpid()}


class ExitAtOnce(AtExit):
    """The same, declaring ``exit_after_close``: the process ends without its teardown."""

    exit_after_close = True


def at_exit() -> BaseHandler:
    return AtExit()


def exit_at_once() -> BaseHandler:
    return ExitAtOnce()


class SessionChild(Echo):
    """Starts, while it is built, a child in a session of its own (not the worker's)."""

    def __init__(self) -> None:
        super().__init__()
        self.child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
        )


def session_child() -> BaseHandler:
    """Factory of :class:`SessionChild`."""
    return SessionChild()


def _forge(header: FrameHeader) -> None:
    fd = int(sys.argv[-1])
    write_frame(lambda views: os.writev(fd, views), encode_frame(header, []))
    time.sleep(60)


def wrong_token() -> BaseHandler:
    """Says hello with a token that is not the one it was given, then hangs."""
    meta = hello_meta(
        "0" * 64, required=frozenset(), offered=frozenset(), versions={}, shm_prefix=None
    )
    _forge(FrameHeader("hello", "", "", 0, 1, meta=meta))
    raise SystemExit(0)


def wrong_version() -> BaseHandler:
    """Sends a hello frame of protocol version 2, then hangs."""
    meta = hello_meta("x", required=frozenset(), offered=frozenset(), versions={}, shm_prefix=None)
    _forge(FrameHeader("hello", "", "", 0, 1, meta=meta, version=2))
    raise SystemExit(0)


def hello_error_not_object() -> BaseHandler:
    """Says hello with the right token but ``error: 5``, then hangs."""
    boot = sys._getframe(1).f_locals["boot"]  # the serve loop that called this factory
    meta = hello_meta(
        boot.token, required=frozenset(), offered=frozenset(), versions={}, shm_prefix=None
    )
    meta["error"] = 5
    _forge(FrameHeader("hello", "", "", 0, boot.generation, meta=meta))
    raise SystemExit(0)


def wrong_start_time() -> BaseHandler:
    """Says hello with the right token but a start time 100 s off its own, then hangs."""
    boot = sys._getframe(1).f_locals["boot"]  # the serve loop that called this factory
    meta = hello_meta(
        boot.token, required=frozenset(), offered=frozenset(), versions={}, shm_prefix=None
    )
    meta["start_time"] = float(meta["start_time"]) + 100.0
    _forge(FrameHeader("hello", "", "", 0, boot.generation, meta=meta))
    raise SystemExit(0)


def broken_factory() -> BaseHandler:
    """A factory that fails: the hello reports the error."""
    raise RuntimeError("cannot build the handler")


class Garbage(Echo):
    """On a request, writes bytes that are not a frame onto the channel."""

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        os.write(int(sys.argv[-1]), b"\x00GARBAGE-NOT-A-FRAME" * 8)
        time.sleep(60)
        return None


class BadKind(Echo):
    """On a request, answers with a well-framed event whose ``kind`` is no event kind."""

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        meta = {"seq": 0, "kind": "bogus", "data": {}, "error": None, "created_ns": 0}
        header = FrameHeader("event", call.request_id, call.stage_id, call.epoch, 1, meta=meta)
        fd = int(sys.argv[-1])
        write_frame(lambda views: os.writev(fd, views), encode_frame(header, []))
        time.sleep(60)
        return None


def bad_kind() -> BaseHandler:
    return BadKind()


class OversizeEvent(Echo):
    """On a request, writes the prefix and header of a DONE whose output is ``alloc`` bytes.

    As a worker that does not keep to the channel's ``max_io_bytes`` would (the serve loop
    refuses such an event itself): the frame is written without going through
    :meth:`Call.emit`, and its payload never follows.
    """

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        nbytes = int(call.params["alloc"])
        meta = {"seq": 0, "kind": "done", "data": {}, "error": None, "created_ns": 0}
        header = FrameHeader("event", call.request_id, call.stage_id, call.epoch, 1,
                             tensors=(TensorSpec("big", "uint8", (nbytes,), nbytes),),
                             meta=meta)
        fd = int(sys.argv[-1])
        head = encode_frame(header, [memoryview(bytes(nbytes))])[0]
        write_frame(lambda views: os.writev(fd, views), [head])
        time.sleep(60)
        return None


def oversize_event() -> BaseHandler:
    return OversizeEvent()


class InPlace(Echo):
    """Computes ``2 * x`` straight into an output buffer; also allocates one it never sends."""

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        import numpy as np

        x = call.inputs["x"]
        unsent = int(call.params.get("unsent", 0))
        if unsent:
            call.output_buffer((unsent,), np.uint8)  # taken back when the request ends
        out = call.output_buffer(x.shape, x.dtype)
        np.multiply(x, 2, out=out)
        return {"y": out, "threshold": np.array([call.zero_copy_bytes or -1])}


class LateBuffers(BaseHandler):
    """Works on its own thread: takes an output buffer before or after a pause, then ends."""

    def submit(self, call: Call) -> None:
        threading.Thread(target=self._work, args=(call,), daemon=True).start()

    def _work(self, call: Call) -> None:
        import numpy as np

        nbytes = int(call.params["nbytes"])
        early = call.params.get("when") == "before"
        out = call.output_buffer((nbytes,), np.uint8) if early else None
        time.sleep(float(call.params.get("pause_s", 0.3)))
        if out is None:
            out = call.output_buffer((nbytes,), np.uint8)
        out[:] = 7  # still writing after the request may have been cancelled
        call.done({"y": out})


def echo() -> BaseHandler:
    return Echo()


def counting_echo() -> BaseHandler:
    return CountingEcho()


def counting_in_place() -> BaseHandler:
    return CountingInPlace()


def late_buffers() -> BaseHandler:
    return LateBuffers()


class Replies(Echo):
    """Echoes; ``params["script"]`` makes it write reply frames of its own as well.

    The frames are DONE events (or of another kind) with the echoed outputs, encoded by
    the same code as the serve loop's (:func:`edge_contracts.call_frames.encode_call_frame`
    with the event block), written straight onto the channel:

    * ``done_and_heartbeat``: the call's DONE followed by a heartbeat, in one write;
    * ``stranger_first``: a DONE for another id of the same length first, then (after
      50 ms, so that it is received alone) the call's own DONE, written by the loop;
    * ``output_first``: an OUTPUT event with the outputs first, then (50 ms later) the
      loop's DONE;
    * ``bad_id``: a DONE whose id (of the same length) has a control character;
    * ``earlier_epoch_first``: a DONE of the call's own id but of the epoch before its
      own first, then (50 ms later) the loop's DONE.
    """

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        script = call.params.get("script")
        outputs = super().submit(call)
        if not script:
            return outputs
        assert outputs is not None
        fd = int(sys.argv[-1])
        if script == "done_and_heartbeat":
            beat = encode_frame(FrameHeader("heartbeat", "", "", 0, call.generation), [])
            os.write(fd, _reply(call, call.request_id, outputs) + b"".join(map(bytes, beat)))
            return None  # answered here
        if script == "stranger_first":
            os.write(fd, _reply(call, call.request_id[:-1] + "~", outputs))
            time.sleep(0.05)  # read on its own (the controller waits on the socket)
        elif script == "output_first":
            os.write(fd, _reply(call, call.request_id, outputs, kind="output"))
            time.sleep(0.05)
        elif script == "earlier_epoch_first":
            os.write(fd, _reply(call, call.request_id, outputs, epoch=call.epoch - 1))
            time.sleep(0.05)
        elif script == "bad_id":
            os.write(fd, _reply(call, call.request_id[:-1] + "\x01", outputs))
            time.sleep(60)
            return None
        return outputs


def _reply(call: Call, request_id: str, outputs: Mapping[str, Any], kind: str = "done",
           epoch: int | None = None) -> bytes:
    """The bytes of an event frame of ``call`` as the serve loop encodes one."""
    import numpy as np

    from edge_contracts.binary_header import event_block
    from edge_contracts.call_frames import encode_call_frame
    from edge_contracts.protocol import FEATURE_EVENT_FIELDS, OP_EVENT
    from edge_contracts.tensors import dtype_of

    arrays = [np.ascontiguousarray(array) for array in outputs.values()]
    specs = tuple(TensorSpec.inline(name, dtype_of(array), array.shape, array.nbytes)
                  for name, array in zip(outputs, arrays, strict=True))
    parts = encode_call_frame(
        OP_EVENT, request_id, call.stage_id, call.epoch if epoch is None else epoch,
        call.generation, specs,
        [memoryview(array).cast("B") for array in arrays], frozenset({FEATURE_EVENT_FIELDS}),
        event_meta=b"", event_block=event_block(0, kind, time.time_ns()), keep=False)
    return b"".join(bytes(part) for part in parts)


def replies() -> BaseHandler:
    return Replies()


def inplace() -> BaseHandler:
    return InPlace()


def stream() -> BaseHandler:
    return Stream()


def stubborn() -> BaseHandler:
    return Stubborn()


def garbage() -> BaseHandler:
    return Garbage()


ESCAPE = (
    "import os, signal, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "        print(os.getpid(), flush=True)\n"
    "        while True:\n"
    "            time.sleep(1)\n"
    "    os._exit(0)\n"
    "os.wait()\n"
)
"""A child that double-forks: its grandchild leaves the session, ignores SIGTERM, stays."""


class Escaper(Echo):
    """``load`` starts a process that escapes the worker's session (double fork + setsid).

    The intermediate processes exit at once, so the escaped process is an orphan in a
    session of its own; ``load`` returns its PID. With ``ignore_term`` the worker itself
    ignores SIGTERM too and hangs in ``close`` (it never leaves by itself).
    """

    stuck = False

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        if config.get("ignore_term"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.stuck = True
        child = subprocess.Popen([sys.executable, "-c", ESCAPE], stdout=subprocess.PIPE)
        assert child.stdout is not None
        escaped = int(child.stdout.readline())
        child.stdout.close()
        child.wait()
        return {"escaped": escaped}

    def close(self) -> None:
        while self.stuck:
            time.sleep(1)


def escaper() -> BaseHandler:
    return Escaper()


def _hold_semaphore(names: Any) -> None:
    """A multiprocessing child: make a named semaphore (registered with the worker's
    resource tracker), say its name, and hold it until killed."""
    import multiprocessing

    lock = multiprocessing.get_context("spawn").Lock()
    names.put(lock._semlock.name)  # type: ignore[attr-defined]
    while True:
        time.sleep(1)


class SemaphoreHolder(Echo):
    """``load`` starts a spawn-context multiprocessing child holding a named semaphore.

    Returns the semaphore's name and the child's PID. The name lives in ``/dev/shm``
    until the worker's resource tracker unlinks it (the child is killed, never cleans
    up). With ``ignore_term`` the worker ignores SIGTERM and hangs in ``close``.
    """

    stuck = False

    def load(self, config: Mapping[str, Any]) -> Mapping[str, Any]:
        import multiprocessing

        if config.get("ignore_term"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.stuck = True
        context = multiprocessing.get_context("spawn")
        names = context.SimpleQueue()
        self.child = context.Process(target=_hold_semaphore, args=(names,), daemon=False)
        self.child.start()
        return {"semaphore": names.get(), "child": self.child.pid}

    def close(self) -> None:
        while self.stuck:
            time.sleep(1)


def semaphore_holder() -> BaseHandler:
    return SemaphoreHolder()


class Shrinker(BaseHandler):
    """Computes into an output buffer, then (``shrink``) tries to shrink that segment.

    Hostile on purpose: the controller may still have the segment mapped from an earlier
    request (segments are pooled and reused), and reading a mapped page of a shrunk file
    kills the reader with SIGBUS. A sealed segment refuses the shrink (EPERM), which this
    handler reports as its error.
    """

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        import numpy as np

        out = call.output_buffer((1 << 20,), np.uint8)
        out[:] = 7
        if call.params.get("shrink"):
            _, lease = call._allocated[id(out)]
            fd = _segment_fd(lease.segment)
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)
        return {"y": out}


def _segment_fd(name: str) -> int:
    """A read-write descriptor of this process's segment ``name`` (named or memfd)."""
    if os.path.exists(f"/dev/shm/{name}"):
        return os.open(f"/dev/shm/{name}", os.O_RDWR)
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{entry}").startswith(f"/memfd:{name}"):
                return os.open(f"/proc/self/fd/{entry}", os.O_RDWR)
    raise FileNotFoundError(name)


def shrinker() -> BaseHandler:
    return Shrinker()


class BigEvents(BaseHandler):
    """Answers with an event as large as its params ask, to test the header limit.

    ``pad``: how many characters of ``"x"`` its event's ``data["text"]`` holds; ``on``:
    which event carries them: ``"done"`` (the terminal DONE), ``"token"`` (the second of
    three streamed tokens, then a small DONE), ``"error"`` (an exception whose message is
    ``pad`` times ``"é"``, six bytes each once escaped in JSON) or ``"set"`` (a DONE whose
    data is not JSON). ``outputs``: that many bytes of an output buffer sent with the
    event. What each emit returned is kept by request id: ``query({"returns": rid})``.
    """

    def __init__(self) -> None:
        self.returns: dict[str, list[bool]] = {}

    def query(self, question: Mapping[str, Any]) -> Mapping[str, Any]:
        return {"returns": self.returns.get(str(question.get("returns")), [])}

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        import numpy as np

        pad = int(call.params.get("pad", 0))
        on = call.params.get("on", "done")
        nbytes = int(call.params.get("outputs", 0))
        outputs: dict[str, Any] = {}
        if nbytes:
            outputs["y"] = call.output_buffer((nbytes,), np.uint8)
            outputs["y"][:] = 3
        returns = self.returns.setdefault(call.request_id, [])
        if on == "error":
            raise ValueError("é" * pad)
        if on == "set":
            returns.append(call.done(outputs, data={"bad": {1, 2}}))
        elif on == "token":
            returns.append(call.token({"text": "t0"}))
            returns.append(call.token({"text": "x" * pad}))
            returns.append(call.token({"text": "t2"}))
            returns.append(call.done(outputs, data={"tokens": 3}))
        else:
            returns.append(call.done(outputs, data={"text": "x" * pad}))
        return None


def big_events() -> BaseHandler:
    return BigEvents()


class BigOutputs(BaseHandler):
    """Answers with output tensors as large as its params ask, to test ``max_io_bytes``.

    ``sizes``: one ``uint8`` output per entry, ``o0``, ``o1``, ... of that many bytes, each
    filled with its index plus one; ``buffers``: computed in :meth:`Call.output_buffer`
    (shared memory at the threshold, sent in place) instead of private arrays; ``on``:
    which event carries them, ``"done"`` (the terminal DONE) or ``"output"`` (a streamed
    OUTPUT, then a second OUTPUT and a DONE, both small). What each emit returned is kept
    by request id: ``query({"returns": rid})``.
    """

    def __init__(self) -> None:
        self.returns: dict[str, list[bool]] = {}

    def query(self, question: Mapping[str, Any]) -> Mapping[str, Any]:
        return {"returns": self.returns.get(str(question.get("returns")), [])}

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        import numpy as np

        outputs: dict[str, Any] = {}
        for index, size in enumerate(call.params.get("sizes", [])):
            if call.params.get("buffers"):
                outputs[f"o{index}"] = call.output_buffer((int(size),), np.uint8)
                outputs[f"o{index}"][:] = index + 1
            else:
                outputs[f"o{index}"] = np.full(int(size), index + 1, dtype=np.uint8)
        returns = self.returns.setdefault(call.request_id, [])
        if call.params.get("on") == "output":
            returns.append(call.output(outputs))
            returns.append(call.output({"small": np.zeros(4, np.uint8)}))
            returns.append(call.done(data={"outputs": 3}))
        else:
            returns.append(call.done(outputs))
        return None


def big_outputs() -> BaseHandler:
    return BigOutputs()
