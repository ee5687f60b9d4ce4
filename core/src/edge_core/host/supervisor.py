"""The per-worker supervisor: a small process that anchors a worker's whole tree.

On POSIX every worker is started through a supervisor, run by the controller's own
interpreter on this file (``python -I -S -c SUPERVISOR_MAIN .../supervisor.py ...``:
standard library only, no site-packages, nothing of edge-core imported; see
:data:`SUPERVISOR_MAIN`). It is the session leader the controller starts; it

1. makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux): every
   process of the worker's tree that is orphaned — even one that called ``setsid()`` and
   left the session — is re-parented to the supervisor instead of to init, so it stays a
   descendant of the process the controller started and is found by the next capture;
2. starts the worker (``posix_spawnp``; the worker inherits the socket and the
   environment) and closes its own copy of the socket, so the channel ends when the
   worker does;
3. reaps every child it adopts, and waits for one of three things:

   * the worker exits: every remaining process of the tree is killed (``SIGKILL``) and
     reaped, then the supervisor exits *with the worker's status* (it kills itself with
     the same signal when the worker died of one), so the controller's watchdog reports
     the worker's own death;
   * ``SIGTERM`` (retirement): forwarded to every process of the tree; the supervisor
     stays to adopt and reap until the worker has exited;
   * the controller dies (a ``pidfd`` of the parent becomes readable; polled every
     0.2 s where ``pidfd_open`` is missing): the tree gets ``SIGTERM``, after
     :data:`ORPHAN_GRACE_S` ``SIGKILL``; then the supervisor removes what the dead
     controller left for this worker — the shared-memory segments of the prefixes it was
     given (the controller's and the worker's) and the staged package directory — and
     exits. Nothing of a worker outlives its controller by more than a few seconds.

Limits: without ``prctl`` (not Linux) orphans that leave the session are found only if
a capture saw them before they were orphaned; ``SIGKILL`` of the supervisor itself
re-parents the tree to init (the controller's retirement still kills every process it
has captured, and signals the supervisor last). See docs/host.md.
"""

from __future__ import annotations

import os
import select
import sys
import time

try:  # the C module: ``signal`` wraps it in enums (enum, functools, collections imported)
    import _signal as signal  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - an interpreter without CPython's _signal
    import signal

__all__ = ["EXEC_WAIT_S", "ORPHAN_GRACE_S", "SUPERVISOR_MAIN", "SUPERVISOR_PATH", "TRACKER_GRACE_S",
           "TRACKER_MARK", "Supervisor", "is_tracker", "main", "reaped", "supervisor_argv"]

ORPHAN_GRACE_S = 1.0
"""After the controller died: how long the tree has between ``SIGTERM`` and ``SIGKILL``."""

TRACKER_GRACE_S = 2.0
"""How long a multiprocessing resource tracker is spared once the rest of its tree is gone,
to unlink what the processes it watched left and exit by itself (see :func:`is_tracker`)."""

TRACKER_MARK = b"multiprocessing.resource_tracker"
"""What the command line of Python's multiprocessing resource tracker holds."""

EXEC_WAIT_S = 1.0
"""How long :func:`is_tracker` waits for the command line of a process in its ``exec``."""

SUPERVISOR_PATH = os.path.abspath(__file__)
"""This file: what the controller runs as the supervisor."""

SUPERVISOR_MAIN = (
    "import sys; path = sys.argv.pop(1); sys.path.append(path.rpartition('/')[0]); "
    "from supervisor import main; sys.exit(main())"
)
"""How the supervisor is started: ``python -I -S -c SUPERVISOR_MAIN SUPERVISOR_PATH ARGS``.

It imports this file as the module ``supervisor`` from its directory, put *last* on
``sys.path`` (no standard module is shadowed), rather than running it as a script: a
script is compiled from source at every start, a module is read from its cached
bytecode, and the worker waits for its supervisor's start. The file's path stays on the
command line, where tools that look for supervisors find it."""

_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.2
_SHM_DIR = "/dev/shm"  # noqa: S108 - where Linux exposes POSIX shared memory


def supervisor_argv(
    worker_argv: list[str], *, controller: int, prefixes: list[str], remove: list[str]
) -> list[str]:
    """The command line that runs ``worker_argv`` under a supervisor (controller side).

    ``controller`` is the controller's PID; ``prefixes`` the shared-memory prefixes and
    ``remove`` the directories the supervisor cleans up if the controller dies.
    """
    args = [sys.executable, "-I", "-S", "-c", SUPERVISOR_MAIN, SUPERVISOR_PATH, str(controller)]
    for prefix in prefixes:
        args += ["--prefix", prefix]
    for path in remove:
        args += ["--remove", path]
    return [*args, "--", *worker_argv]


class _Quiet:
    """``contextlib.suppress`` without importing contextlib (start-up time)."""

    def __init__(self, *kinds: type[BaseException]) -> None:
        self.kinds = kinds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, value: object, tb: object) -> bool:
        return isinstance(value, self.kinds)


def _subreaper() -> bool:
    """Make this process a child subreaper; False where that is not possible.

    Calls libc's ``prctl`` through the C module ``_ctypes`` alone: the ``ctypes``
    package around it (``struct``, its type classes, ``CDLL``) costs the supervisor a
    few milliseconds more before it can start the worker, which waits for it. The
    function is declared as ``ctypes.CDLL(None, use_errno=True).prctl`` would be: C
    calling convention, errno kept, an ``int`` returned, the arguments passed as C ints.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import _ctypes

        class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]  # (generic in typeshed only)
            _type_ = "i"

        class _Function(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = _Int

        class _Process:  # what a function pointer is looked up in: the dlopen handle
            _handle = _ctypes.dlopen(None)  # type: ignore[arg-type]

        # (typeshed asks for a CDLL: what is read of it is its _handle)
        prctl = _Function(("prctl", _Process()))  # type: ignore[arg-type]
        return int(prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (ImportError, OSError, AttributeError):  # an interpreter built without _ctypes
        return False


def _descendants() -> list[int]:
    """PIDs of every live descendant of this process (``/proc``, else none known)."""
    found: list[int] = []
    pending = [os.getpid()]
    while pending:
        pid = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
                    children = [int(child) for child in handle.read().split()]
            except OSError:
                continue
            found += children
            pending += children
    return found


def is_tracker(pid: int, wait_s: float = EXEC_WAIT_S) -> bool:
    """True when ``pid`` is a Python multiprocessing resource tracker (``/proc``; else False).

    A worker's ``multiprocessing`` objects of the spawn and forkserver kinds (locks,
    semaphores, shared memory) are named files in ``/dev/shm``, registered with a tracker
    process that ignores ``SIGTERM`` and unlinks every name still registered once the
    processes that use it are gone. Killed together with them, it unlinks nothing, and the
    names stay on the machine; so a tree is killed with its trackers last.

    A tracker is started with ``vfork`` and ``exec``, and its starter goes on (and
    registers names with it) as soon as the ``exec`` has begun, while its command line
    still reads empty for a moment. A live process whose command line is empty is read
    again every millisecond for up to ``wait_s`` (a zombie's stays empty: it is no
    tracker); seen empty, a starting tracker was taken for another process and killed
    before it could unlink anything (once in a suite run on a loaded host).
    """
    until = time.monotonic() + wait_s
    while True:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                line = handle.read()
        except OSError:
            return False
        if line:
            return TRACKER_MARK in line
        if _zombie(pid) or time.monotonic() >= until:
            return False
        time.sleep(0.001)


def _zombie(pid: int) -> bool:
    """True when ``pid`` is a zombie, or gone (``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X")


def _close_inherited() -> None:
    """Close every inheritable descriptor above stderr (what the controller passed on)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 256))
    for fd in fds:
        if fd > 2:
            with _Quiet(OSError):
                if os.get_inheritable(fd):
                    os.close(fd)


def _signal_tree(signum: int) -> None:
    for pid in _descendants():
        with _Quiet(OSError):
            os.kill(pid, signum)


class Supervisor:
    """One worker's supervisor: started by :func:`main`, or forked by a warm pool's zygote.

    Args:
        controller: the controller's PID.
        prefixes: shared-memory prefixes to remove if the controller dies.
        remove: directories to remove if the controller dies.

    """

    def __init__(self, controller: int, prefixes: list[str], remove: list[str]) -> None:
        self.controller = controller
        self.prefixes = prefixes
        self.remove = remove
        self.worker = 0
        self.status: int | None = None
        self.terminating = False
        self.parent_fd: int | None = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)

    def _on_term(self, signum: int, frame: object) -> None:
        self.terminating = True
        with _Quiet(OSError):
            os.write(self.wake_w, b"t")

    def _on_child(self, signum: int, frame: object) -> None:
        with _Quiet(OSError):
            os.write(self.wake_w, b"c")

    def _reap(self) -> None:
        for pid, status in reaped():
            if pid == self.worker:
                self.status = status

    def _controller_gone(self) -> bool:
        if self.parent_fd is not None:
            return bool(select.select([self.parent_fd], [], [], 0)[0])
        return os.getppid() != self.controller

    def _drain_tree(self, until: float) -> None:
        """Kill (``SIGKILL``) and reap every remaining descendant, bounded by ``until``.

        Resource trackers (:func:`is_tracker`) are killed last. A tracker unlinks what the
        processes it watched left registered only once the last of them is gone, and a
        killed process is gone only when its last thread has exited, which for vLLM's
        EngineCore (many threads, a large KV cache) takes a while after its worker's
        ``SIGKILL``. So trackers are spared while anything else of the tree is left, then
        for :data:`TRACKER_GRACE_S` more to clean up and exit by themselves. (A fixed
        grace from the start of the drain, before, could run out before the EngineCore
        went, and a tracker killed first left its names in ``/dev/shm``.)
        """
        others_gone: float | None = None
        while True:
            self._reap()
            left = _descendants()
            now = time.monotonic()
            if not left or now >= until:
                return
            trackers = [pid for pid in left if is_tracker(pid)]
            others = [pid for pid in left if pid not in trackers]
            if others:
                doomed = others
            else:
                others_gone = now if others_gone is None else others_gone
                doomed = trackers if now >= others_gone + TRACKER_GRACE_S else []
            for pid in doomed:
                with _Quiet(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def _clean_after_controller(self) -> None:
        for prefix in self.prefixes:
            start = f"edge_{prefix}_"
            with _Quiet(OSError):
                for name in os.listdir(_SHM_DIR):
                    if name.startswith(start):
                        with _Quiet(OSError):
                            os.unlink(os.path.join(_SHM_DIR, name))
        if self.remove:
            import shutil  # only on this path: it costs start-up time

            for path in self.remove:
                shutil.rmtree(path, ignore_errors=True)

    def prepare(self) -> None:
        """Become a subreaper and install the handlers; before the worker starts."""
        if not _subreaper() and sys.platform.startswith("linux"):
            with _Quiet(OSError):  # said in the worker's log: retirement may miss an orphan
                os.write(2, b"edge supervisor: prctl(PR_SET_CHILD_SUBREAPER) failed: an orphan "
                            b"of the worker that leaves its session is found only if a capture "
                            b"saw it first\n")
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGCHLD, self._on_child)

    def forget(self) -> None:
        """In a worker forked from this supervisor: drop what is the supervisor's alone.

        The handlers go back to their defaults and the wake-up pipe and the controller's
        ``pidfd`` are closed, as in a worker the supervisor had spawned.
        """
        for signum in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        for fd in (self.wake_r, self.wake_w, self.parent_fd):
            if fd is not None:
                with _Quiet(OSError):
                    os.close(fd)

    def run(self, argv: list[str]) -> int:
        """Start ``argv`` as the worker and watch it (see the module docstring)."""
        self.prepare()
        with _Quiet(AttributeError, OSError):
            if os.getppid() == self.controller:
                self.parent_fd = os.pidfd_open(self.controller)
        env = dict(os.environ)
        self.worker = os.posix_spawnp(argv[0], argv, env)
        _close_inherited()  # the worker's end of the channel is the worker's alone
        return self.watch(self.worker)

    def watch(self, worker: int) -> int:
        """Watch the started ``worker`` until it exits or the controller dies; the status."""
        self.worker = worker
        watched = [self.wake_r] + ([self.parent_fd] if self.parent_fd is not None else [])
        forwarded = False
        while True:
            self._reap()
            if self.status is not None:
                self._drain_tree(time.monotonic() + 5.0)
                if self._controller_gone():  # the worker left because its channel ended
                    self._clean_after_controller()
                return self._exit_like_worker()
            if self.terminating and not forwarded:
                _signal_tree(signal.SIGTERM)
                forwarded = True
            if self._controller_gone():
                _signal_tree(signal.SIGTERM)
                end = time.monotonic() + ORPHAN_GRACE_S
                while time.monotonic() < end and _descendants():
                    self._reap()
                    time.sleep(0.01)
                self._drain_tree(time.monotonic() + 5.0)
                self._clean_after_controller()
                return 0
            readable = select.select(watched, [], [], _POLL_S)[0]
            if self.wake_r in readable:
                with _Quiet(OSError):
                    os.read(self.wake_r, 4096)

    def _exit_like_worker(self) -> int:
        assert self.status is not None
        if os.WIFSIGNALED(self.status):
            signum = os.WTERMSIG(self.status)
            with _Quiet(OSError, ValueError):  # SIGKILL has no handler to reset
                signal.signal(signum, signal.SIG_DFL)
            with _Quiet(OSError):
                os.kill(os.getpid(), signum)
                time.sleep(0.1)  # a signal whose default is not to terminate: fall through
            return 128 + signum
        return os.waitstatus_to_exitcode(self.status)


def reaped() -> list[tuple[int, int]]:
    """Reap every child that has exited, without blocking: their (PID, wait status)."""
    found: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        found.append((pid, status))


def main(argv: list[str] | None = None) -> int:
    """Entry: ``supervisor.py CONTROLLER_PID [--prefix P]... [--remove DIR]... -- ARGV``."""
    args = sys.argv[1:] if argv is None else argv
    if "--" not in args or not args or not args[0].isdigit():
        print("usage: supervisor.py CONTROLLER_PID [--prefix P]... [--remove DIR]... -- ARGV",
              file=sys.stderr)
        return 2
    split = args.index("--")
    options, worker = args[1:split], args[split + 1 :]
    prefixes: list[str] = []
    remove: list[str] = []
    for flag, value in zip(options[::2], options[1::2], strict=False):
        (prefixes if flag == "--prefix" else remove).append(value)
    if not worker:
        return 2
    return Supervisor(int(args[0]), prefixes, remove).run(worker)


if __name__ == "__main__":
    sys.exit(main())
