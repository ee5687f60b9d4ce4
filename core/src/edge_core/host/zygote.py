"""The warm pool's zygote: an interpreter with a worker's imports done, forking supervisors.

Runs in its own process, started by the controller (:mod:`edge_core.host.warm_pool`) as
``python -c ZYGOTE_MAIN ROOT CONTROLLER FD`` with the environment a spawned worker of the
same key would get. At its start it checks that its parent is the controller and opens a
``pidfd`` of it, imports what every worker imports (:data:`PRE_IMPORTS`; ONNX Runtime too where its
telemetry is off, :func:`pre_imports`) and says
``ready`` on its control socket (FD, a ``SOCK_SEQPACKET`` end shared with the controller
alone). Then, one request at a time, each a JSON object with the worker's channel, its
sealed-segment channel (when used) and its stdout/stderr passed along as descriptors
(``SCM_RIGHTS``; no pickle):

1. checks that it is still one thread (:func:`threads`): a fork copies only the thread
   that forks, and a library whose threads were running (a thread pool made at import)
   would be broken in the child. Its imports are checked so at its start: a library
   that stops its threads at a fork (OpenBLAS, which numpy loads, registers
   ``pthread_atfork`` handlers) is given one throw-away fork to do so, and a zygote left
   with more than one thread refuses to serve (the controller spawns instead). The
   route's entry is *not* imported here but by the worker after the fork (importing
   ``edge_ort.worker`` once numpy is imported takes a few milliseconds): what an entry's
   import does (its output, its threads, what it reads) happens in the worker, as in a
   spawned one;
2. forks a supervisor: a session leader (``setsid``) that keeps only the passed
   descriptors (stdout/stderr on 1/2, ``/dev/null`` on 0, the channel on
   :data:`CHANNEL_FD`, the segment channel on :data:`SEGMENTS_FD`) and the controller's
   ``pidfd``, runs :class:`~edge_core.host.supervisor.Supervisor` (subreaper, watching the
   *controller*, cleaning up after it) and forks the worker, which runs
   :func:`edge_contracts.worker.main` on :data:`CHANNEL_FD`. Both return to this
   module's :func:`main` before they run; the worker leaves through the interpreter's
   usual exit, as a spawned one does, the supervisor (and the zygote itself) through
   ``os._exit`` once its standard streams are flushed: they have nothing to finalize,
   and a forked interpreter's finalization (numpy's teardown) made every retirement and
   the controller's exit wait tens of milliseconds longer;
3. answers with the supervisor's PID and the request's serial, passing the read end of a
   status pipe and a ``pidfd`` of the supervisor (opened before it can be reaped); when
   it reaps the supervisor it writes the exit status there (``subprocess``'s form) and
   closes it. An answer it cannot deliver (the controller gave the start up and closed
   the socket) ends that supervisor with ``SIGTERM``, which reaches its worker.

The forked supervisor takes the controller's working directory and umask sent with the
request (a spawned worker has the controller's at its spawn); resource limits and
ignored signals are part of the pool's key (:mod:`edge_core.host.warm_pool`).

When the controller closes the control socket (or it refused a start) it serves no more
starts, and ends once every supervisor it forked is reaped and its status reported; it
ends at once when the controller dies (the supervisors it forked go on: they watch the
controller, not the zygote). It runs no thread of its own, and the
cyclic garbage collector stays off (as in a worker before its hello, which turns it on).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import re
import select
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence

from edge_core.host.supervisor import Supervisor, reaped

__all__ = ["CHANNEL_FD", "GAVE_UP", "MAX_MESSAGE", "PRE_IMPORTS", "SEGMENTS_FD", "TELEMETRY_OFF",
           "ZYGOTE_MAIN", "main", "pre_imports", "threads"]

CHANNEL_FD = 3
"""The worker's channel descriptor in a forked worker (its argument, as in ``-c ... FD``)."""

SEGMENTS_FD = 4
"""The sealed-segment channel's descriptor in a forked worker (its boot's ``shm_fds``)."""

ZYGOTE_MAIN = (
    "import sys; getattr(sys.flags, 'safe_path', 0) or sys.path.pop(0); "
    "import gc; gc.disable(); sys.path.append(sys.argv.pop(1)); "
    "from edge_core.host.zygote import main; sys.exit(main())"
)
"""How the zygote is started: ``python -c ZYGOTE_MAIN ROOT CONTROLLER FD``. As a worker's
:data:`~edge_core.host.bootstrap.WORKER_MAIN`: the working directory is dropped from
``sys.path`` and the collector is off; ``ROOT`` (the directory ``edge_core`` was
imported from in the controller) is put *last* on ``sys.path``, where the worker's
``PYTHONPATH`` and site-packages are searched first."""

PRE_IMPORTS = ("edge_contracts.worker", "numpy")
"""What the zygote imports at its start: the worker's code, and numpy, which it imports at
its first tensor (every worker has one soon)."""

TELEMETRY_OFF = "ORT_DISABLE_TELEMETRY"
"""``1`` in the zygote's (the worker's) environment: ONNX Runtime's telemetry is off, and
a zygote asked to preload ``onnxruntime`` imports it (:func:`pre_imports`)."""

_ORT = "onnxruntime"
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def pre_imports(environ: Mapping[str, str], preload: Sequence[str] = ()) -> tuple[str, ...]:
    """What a zygote of this environment imports, given the backend's ``preload``.

    :data:`PRE_IMPORTS`, then each of ``preload`` (``WorkerStage.worker_preload``), but
    ``onnxruntime`` only where :data:`TELEMETRY_OFF` is ``1``.

    ONNX Runtime's official builds start a telemetry uploader as ``onnxruntime`` is
    imported (the 1DS SDK's worker thread: it sleeps on a timed condition wait and wakes
    to run its tasks, storage and HTTPS uploads, under its own mutexes). A forked child
    would inherit whatever of those it held at the fork, with no thread to release them
    or run the queue that each event the child's ONNX Runtime logs goes to: never forked
    so (a zygote left with it refuses to serve). ``ORT_DISABLE_TELEMETRY=1`` before the
    import creates no uploader (ONNX Runtime's ``docs/Privacy.md``): the import then
    starts no thread of its own (OpenBLAS's, loaded with numpy, are stopped by the
    throw-away fork as before), and the worker's own import of its entry finds
    ``onnxruntime`` imported. The thread check before every fork still holds.
    """
    telemetry_off = environ.get(TELEMETRY_OFF) == "1"
    return PRE_IMPORTS + tuple(module for module in preload
                               if module not in PRE_IMPORTS
                               and (module != _ORT or telemetry_off))

def _flush() -> None:
    """Flush this process's stdout and stderr.

    Before a fork (a child would write again what they buffered) and before an exit
    through ``os._exit``.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


MAX_MESSAGE = 65536
"""The largest request or answer on the control socket."""

Task = Callable[[], "int | Task"]

_ABOVE = 10  # where passed descriptors wait while 0..4 are placed


def threads() -> int:
    """How many threads this process runs (``/proc/self/task``; 1 where unreadable)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _settled_threads() -> int:
    """Threads left after one throw-away fork (see the module docstring, step 2)."""
    count = threads()
    if count > 1:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        count = threads()
    return count


def _send(sock: socket.socket, message: dict[str, object], fds: list[int] | None = None) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], fds or [])


class _Zygote:
    def __init__(self, controller: int, sock: socket.socket, controller_fd: int) -> None:
        self.controller = controller
        self.sock = sock
        self.controller_fd = controller_fd
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.statuses: dict[int, int] = {}  # supervisor pid -> write end of its status pipe
        self.forks = 0

    def _on_child(self, signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"c")

    def _reap(self) -> None:
        for pid, status in reaped():
            fd = self.statuses.pop(pid, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.write(fd, b"%d\n" % os.waitstatus_to_exitcode(status))
                os.close(fd)

    def serve(self) -> int | Task:
        signal.signal(signal.SIGCHLD, self._on_child)
        control = self.sock.fileno()
        watched = [control, self.wake_r, self.controller_fd]
        while True:
            self._reap()
            if control not in watched and not self.statuses:
                return 0  # closed, and every supervisor it forked is reaped and reported
            ready = select.select(watched, [], [])[0]
            if self.controller_fd in ready:
                return 0
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
            if control in ready:
                try:
                    data, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 8)
                except OSError:
                    data, fds = b"", []
                outcome = self._start(data, fds) if data else 0
                if outcome == 0 or outcome == 1:  # closed by the controller, or refusing
                    watched.remove(control)  # no more starts; it stays to report statuses
                elif outcome is not None:
                    return outcome  # in a forked supervisor

    def _start(self, data: bytes, fds: list[int]) -> int | Task | None:
        """Serve one request; a task in the forked child, 1 when this zygote must end."""
        try:
            request = json.loads(data)
            names = list(request["fds"])
            prefixes = [str(p) for p in request["prefixes"]]
            remove = [str(p) for p in request["remove"]]
            passed = dict(zip(names, fds, strict=True))
            serial = request["serial"]
            place = _Place(request.get("cwd"), request.get("umask"))
        except (ValueError, KeyError, TypeError) as exc:
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                _send(self.sock, {"refused": f"request: {exc}"})
            return None
        count = threads()
        if count > 1:  # nothing started one since the check at its start: never fork so
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                _send(self.sock, {"refused": f"threads: {count} running: forking is unsafe",
                                  "serial": serial})
            return 1
        status_r, status_w = os.pipe()
        _flush()
        pid = os.fork()
        if pid == 0:
            os.close(status_r)
            os.close(status_w)
            return lambda: self._supervise(passed, prefixes, remove, place)
        self.forks += 1
        self.statuses[pid] = status_w
        pidfd = os.pidfd_open(pid)
        for fd in fds:
            os.close(fd)
        try:
            _send(self.sock, {"pid": pid, "forks": self.forks, "serial": serial},
                  [status_r, pidfd])
        except OSError:
            # The controller closed the socket (it gave this start up: no answer in time,
            # an interrupt) or is gone: nobody will use this supervisor. SIGTERM reaches
            # its worker too (the supervisor forwards it); it is reaped as any other.
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)  # not reaped yet: still this child's PID
        os.close(status_r)
        os.close(pidfd)
        return None

    def _supervise(self, passed: dict[str, int], prefixes: list[str],
                   remove: list[str], place: _Place) -> int | Task:
        """The forked supervisor: keep what is its own, fork the worker, watch it."""
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        self.sock.detach()  # closed below by number: the object must not close it again
        keep = {self.controller_fd, *passed.values()}
        _close_all_but(keep)
        # above every number placed below, then onto their places
        moved = {name: fcntl.fcntl(fd, fcntl.F_DUPFD, _ABOVE) for name, fd in passed.items()}
        controller_fd = fcntl.fcntl(self.controller_fd, fcntl.F_DUPFD, _ABOVE)
        for fd in keep:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        if null != 0:
            os.dup2(null, 0)
            os.close(null)
        os.dup2(moved.pop("stdout"), 1)
        os.dup2(moved.pop("stderr"), 2)
        os.dup2(moved.pop("channel"), CHANNEL_FD)
        placed = [CHANNEL_FD]
        if "segments" in moved:
            os.dup2(moved.pop("segments"), SEGMENTS_FD)
            placed.append(SEGMENTS_FD)
        _close_all_but({0, 1, 2, *placed, controller_fd})
        place.enter()  # after stdout and stderr are the start's: a failure is said there
        supervisor = Supervisor(self.controller, prefixes, remove)
        supervisor.parent_fd = controller_fd
        supervisor.prepare()
        _flush()
        worker = os.fork()
        if worker == 0:
            supervisor.forget()
            return _run_worker
        for fd in placed:  # the channel ends when the worker does
            with contextlib.suppress(OSError):
                os.close(fd)
        return supervisor.watch(worker)


class _Place:
    """The controller's working directory and umask at a start (a spawned worker's)."""

    def __init__(self, cwd: object, umask: object) -> None:
        self.cwd = cwd if type(cwd) is str else None
        self.umask = umask if type(umask) is int and 0 <= umask <= 0o777 else None

    def enter(self) -> None:
        """Take them on (a directory that is gone leaves the zygote's, and says so)."""
        if self.umask is not None:
            os.umask(self.umask)
        if self.cwd is not None:
            try:
                os.chdir(self.cwd)
            except OSError as exc:
                print(f"edge zygote: working directory {self.cwd!r}: {exc}", file=sys.stderr)


def _close_all_but(keep: set[int]) -> None:
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 256))
    for fd in fds:
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


GAVE_UP = ("edge worker: a worker forked by the warm pool whose start its controller gave "
           "up (its channel closed before the boot frame: the fork was not answered in time "
           "and the start spawned instead, or the start was refused or interrupted); exiting")
"""What a forked worker whose start was given up says (on the start's stderr) as it exits."""


def _given_up() -> bool:
    """True when the channel ended before its first byte: the controller gave this start up.

    A fork the controller could not wait for (no answer in time, an interrupt) has its
    channel's end closed there, unsent; the start was spawned on other channels.
    """
    channel = socket.socket(fileno=CHANNEL_FD)
    try:
        return channel.recv(1, socket.MSG_PEEK) == b""  # waits as the boot's read would
    except OSError:
        return False  # the worker's own read says what it is
    finally:
        channel.detach()


def _run_worker() -> int:
    """The forked worker: what ``python -c WORKER_MAIN 3`` runs after its imports."""
    if _given_up():
        print(GAVE_UP, file=sys.stderr)
        return 0
    sys.argv[:] = ["-c", str(CHANNEL_FD)]
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # a fork copies the generator's state: a fresh seed, as spawned
        numpy_random.seed()
    from edge_contracts.worker import main as worker_main

    return worker_main([str(CHANNEL_FD)])


def main(argv: list[str] | None = None) -> int:
    """Entry: ``zygote CONTROLLER FD [PRELOAD]`` (after ``ZYGOTE_MAIN`` took ``ROOT``).

    ``PRELOAD``: module names, comma-separated (:func:`pre_imports`). Returns the status.
    """
    args = sys.argv[1:] if argv is None else argv
    preload = args[2].split(",") if len(args) == 3 else []
    if (len(args) not in (2, 3) or not all(arg.isdigit() for arg in args[:2])
            or not all(_MODULE.fullmatch(name) for name in preload)):
        print("usage: zygote CONTROLLER FD [MODULE,...]", file=sys.stderr)
        return 2
    controller, fd = int(args[0]), int(args[1])
    sock = socket.socket(fileno=fd)
    os.set_inheritable(fd, False)
    if os.getppid() != controller:
        print(f"edge zygote: parent {os.getppid()} is not the controller {controller}",
              file=sys.stderr)
        return 2
    controller_fd = os.pidfd_open(controller)
    for module in pre_imports(os.environ, preload):
        with contextlib.suppress(ImportError):  # numpy missing: the worker does without
            importlib.import_module(module)
    count = _settled_threads()
    try:
        if count > 1:
            _send(sock, {"refused": f"threads: {count} running after the worker's imports"})
            return 1
        _flush()  # what its start printed, written once (a fork copies a buffer unflushed)
        _send(sock, {"ready": True, "pid": os.getpid()})
    except OSError:  # the controller gave it up before it was ready (started ahead of need)
        return 0
    result: int | Task = _Zygote(controller, sock, controller_fd).serve
    while callable(result):
        if result is _run_worker:
            return _run_worker()  # the worker leaves through the interpreter's usual exit
        result = result()
    # The zygote, or a forked supervisor, whose worker has exited: nothing of theirs needs
    # the interpreter's finalization (numpy's and every pre-imported module's teardown,
    # tens of milliseconds that a retirement and the controller's exit wait for)
    _flush()
    os._exit(result)
