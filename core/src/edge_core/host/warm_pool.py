"""The warm worker pool: a zygote per worker environment that forks supervised workers.

A worker spawned afresh pays for an interpreter's start and for importing the worker's
code and numpy before it can say hello. Where the route's
interpreter is the controller's own (``sys.executable``, not foreign) on Linux with
``os.pidfd_open`` and workers are supervised, :func:`zygote_for` gives the start a
zygote (:mod:`edge_core.host.zygote`): an interpreter of that environment, started once
with those imports done, that forks a supervisor per start, which forks the worker. The
tree is the one a spawned worker has, one level down: controller → zygote → supervisor
(a session leader and subreaper, watching the controller) → worker; the worker's hello
and identity are verified as a spawned one's are (its PID must be the supervisor's
child), and its exit status reaches the controller through the zygote
(:class:`~edge_core.host.pooled_process.PooledProcess`).

A zygote is kept per controller process and per key: the interpreter and the worker's
whole environment (:func:`~edge_core.host.environment.worker_environment`: what a forked
worker has is the zygote's environment, so a start whose environment differs is never
served by another key's zygote), with the resource limits and ignored signals it
inherits (:func:`inherited`). At most :data:`MAX_ZYGOTES` serve per controller; a
start of another key closes the least recently used one. A zygote that cannot start,
died or refused a start is replaced at the next start; a key whose zygote could not
start (or was left with threads by its imports: see :mod:`edge_core.host.zygote`) is
spawned from then on; every
start says which way it went and why (:class:`~edge_core.host.start_path.StartPath`, a
client's ``start_path``).

A zygote may be started ahead of its first start (:func:`start_early`, as a pipeline
opens: :mod:`edge_core.runtime.early_zygotes`): its process imports while the controller
goes on, and its first fork waits for its ``ready``; one no start was given is ended by
:func:`end_unused`.

``EDGE_WARM_POOL=0`` in the controller's environment turns the pool off (every worker is
spawned). The zygotes end with the controller: closed at its exit (after its workers are
retired), and each watches the controller's ``pidfd`` and ends when it dies; the workers
a zygote forked do not depend on it (their supervisors watch the controller).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from edge_core.host.exit_cleanup import retire_all
from edge_core.host.pooled_process import PooledProcess
from edge_core.host.zygote import MAX_MESSAGE, ZYGOTE_MAIN

__all__ = [
    "MAX_ZYGOTES",
    "POOL_ENV",
    "READY_TIMEOUT_S",
    "Zygote",
    "ZygoteUnavailable",
    "close_pool",
    "end_unused",
    "inherited",
    "pool_descriptors",
    "pool_key",
    "pool_processes",
    "start_early",
    "zygote_for",
]

POOL_ENV = "EDGE_WARM_POOL"
"""``0`` turns the warm pool off in this controller (read at each start)."""

MAX_ZYGOTES = 4
"""Most zygotes one controller keeps serving (one per key); a new key closes the least
recently used one (which exits once what it forked has exited)."""

READY_TIMEOUT_S = 30.0
"""How long a new zygote may take to import and say it is ready, and a fork to answer."""

_EDGE_ROOT = str(Path(__file__).resolve().parents[2])  # where ``edge_core`` is found


# the interpreter, the worker environment, and what else a process inherits at its start
_Key = tuple[str, frozenset[tuple[str, str]], tuple[object, ...], tuple[str, ...]]

_LIMITS = tuple(getattr(resource, name) for name in (
    "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CORE",
    "RLIMIT_MEMLOCK", "RLIMIT_FSIZE", "RLIMIT_CPU") if hasattr(resource, name))


def inherited() -> tuple[object, ...]:
    """What a process inherits from the controller besides its environment, as it is now.

    The resource limits and the set of ignored signals: a forked worker has the zygote's,
    fixed at the zygote's start, so they are part of its key (a controller that changed
    one gets a zygote of the new ones). The working directory and the umask are sent
    with each start instead (they change more often).
    """
    ignored = ""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"SigIgn:"):
                    ignored = line.split()[1].decode()
    except (OSError, IndexError):
        pass
    return (*(resource.getrlimit(limit) for limit in _LIMITS), ignored)


def pool_key(interpreter: str, env: Mapping[str, str], preload: tuple[str, ...] = ()) -> _Key:
    """The key of a start's zygote: its interpreter, environment, :func:`inherited`, preloads.

    ``preload``: the modules its zygote imports besides its own
    (``WorkerStage.worker_preload``; :func:`~edge_core.host.zygote.pre_imports`).

    Where the environment's ``PYTHONPATH`` has a relative or empty entry, the working
    directory too: an interpreter resolves those against its directory at its start, so a
    zygote started elsewhere would import from another place than a spawned worker.
    """
    python_path = env.get("PYTHONPATH", "")
    relative = bool(python_path) and any(
        not os.path.isabs(entry) for entry in python_path.split(os.pathsep))
    return (interpreter, frozenset(env.items()),
            inherited() + ((_cwd(),) if relative else ()), preload)


class ZygoteUnavailable(Exception):
    """The zygote could not serve this start (the reason is the message)."""


class Zygote:
    """The controller's handle on one zygote process (one key).

    Args:
        interpreter: the interpreter it runs (the controller's own).
        env: the worker environment it runs with (the key's).
        outputs: where its stdout and stderr go: those of the start that needs it (what
            its interpreter's start prints, a ``sitecustomize`` say, goes where that
            start's spawned worker would have printed it; ``None``: the controller's
            stderr, and inherited).
        timeout_s: bound on its start and on each answer.
        wait: wait for its ``ready`` here; ``False``: its process is started and its
            ``ready`` is read by its first :meth:`fork` (it imports meanwhile).
        hold_output: ``outputs`` are not known yet (a zygote started ahead): what it
            prints as it starts is held in two unnamed files and written to its first
            fork's stdout and stderr once that fork has read its ``ready`` (or found it
            never came), where its start would have printed it.
        preload: modules it imports besides its own (part of its key; see
            :func:`~edge_core.host.zygote.pre_imports`).

    Raises:
        ZygoteUnavailable: it did not start and say it is ready (with ``wait``).

    """

    def __init__(self, interpreter: str, env: Mapping[str, str],
                 outputs: tuple[Any, Any] = (None, None),
                 timeout_s: float = READY_TIMEOUT_S, *, wait: bool = True,
                 hold_output: bool = False, preload: tuple[str, ...] = ()) -> None:
        self.key: _Key = pool_key(interpreter, env, preload)
        self._lock = threading.Lock()
        self._timeout_s = timeout_s
        self._held: tuple[IO[bytes], IO[bytes]] | None = None
        if hold_output:  # held for its life: closed by _drop_held (its close or end)
            out = tempfile.TemporaryFile()  # noqa: SIM115
            try:
                err = tempfile.TemporaryFile()  # noqa: SIM115
            except BaseException:
                out.close()
                raise
            self._held = (out, err)
            outputs = (out.fileno(), err.fileno())
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._popen = subprocess.Popen(
                [interpreter, "-c", ZYGOTE_MAIN, _EDGE_ROOT, str(os.getpid()),
                 str(theirs.fileno()), *([",".join(preload)] if preload else [])],
                pass_fds=(theirs.fileno(),),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=2 if outputs[0] is None else outputs[0],  # never the controller's stdout
                stderr=outputs[1],
                start_new_session=True,
            )
        except BaseException:
            self._sock.close()
            self._drop_held()
            raise
        finally:
            theirs.close()
        self.pid = self._popen.pid
        self.broken: str | None = None
        self.unready: str | None = None  # why it never said it was ready (its key spawns)
        self.handed = 0  # how many starts were given this zygote (by zygote_for)
        self._serial = 0
        self._ready = False
        if wait:
            try:
                self._await_ready()
            except BaseException:
                self.end()
                raise

    def _await_ready(self) -> None:
        """Read its ``ready`` (once); ZygoteUnavailable, and :attr:`unready` set, if not."""
        if self._ready:
            return
        try:
            answer, fds = self._answer()
        except ZygoteUnavailable as exc:
            self.unready = str(exc)
            raise
        for fd in fds:
            os.close(fd)
        if answer.get("ready") is not True:
            self.unready = f"zygote: {answer.get('refused', answer)}"
            raise ZygoteUnavailable(self.unready)
        self._ready = True

    def _answer(self) -> tuple[dict[str, object], list[int]]:
        fds: list[int] = []
        try:
            try:
                self._sock.settimeout(self._timeout_s)  # closed by another thread: EBADF
                data, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, 4)
            except TimeoutError:
                raise ZygoteUnavailable(f"zygote {self.pid}: no answer within "
                                        f"{self._timeout_s} s") from None
            except OSError as exc:
                raise ZygoteUnavailable(f"zygote {self.pid}: {exc}") from None
            if not data:
                raise ZygoteUnavailable(f"zygote {self.pid}: gone")
            try:
                answer = json.loads(data)
            except ValueError:
                answer = None
            if not isinstance(answer, dict):
                raise ZygoteUnavailable(f"zygote {self.pid}: unreadable answer")
        except BaseException:
            # the descriptors received are this frame's alone until it returns (a Ctrl-C
            # as they came, too); the worker of an answer lost so reads its channel's end
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        return answer, fds

    def fork(
        self, *, prefixes: list[str], remove: list[str],
        channel: int, segments: int | None, stdout: int, stderr: int,
    ) -> tuple[PooledProcess, int]:
        """Have the zygote fork a supervised worker; the supervisor and the fork count.

        The forked supervisor takes the controller's working directory and umask as they
        are now (a spawned worker's are the controller's at its spawn).

        Raises:
            ZygoteUnavailable: the zygote is gone, refused or did not answer. The zygote
                then serves no more starts: it may have forked for this request (a
                supervisor it could not report, holding the passed descriptors), so the
                caller must not hand those descriptors to another start.

        """
        names = ["channel", "stdout", "stderr"] + ([] if segments is None else ["segments"])
        fds = [channel, stdout, stderr] + ([] if segments is None else [segments])
        with self._lock:
            if self.broken is not None:
                raise ZygoteUnavailable(self.broken)
            self._serial += 1
            request = {"serial": self._serial, "prefixes": prefixes, "remove": remove,
                       "fds": names, "cwd": _cwd(), "umask": _umask()}
            answer: dict[str, object] = {}
            received: list[int] = []
            try:
                try:
                    self._await_ready()  # a zygote started ahead of its first start
                finally:
                    self._pass_held(stdout, stderr)
                socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
                answer, received = self._answer()
                pid = answer.get("pid")
                if answer.get("serial") != self._serial or type(pid) is not int or len(
                        received) != 2:
                    raise ZygoteUnavailable(
                        f"zygote {self.pid}: refused: {answer.get('refused', answer)}")
                process = PooledProcess(pid, received[0], received[1])
            except BaseException as exc:
                # Whatever came in the way (a refusal, no answer in time, the socket gone,
                # a Ctrl-C as the request went or as its answer was read), this zygote's
                # answers can no longer be matched to starts: it serves no more. Closing
                # its socket also has it end a supervisor whose answer it cannot deliver;
                # one it did answer with is ended here, through its pidfd.
                self._break(f"zygote {self.pid}: {exc}"
                            if isinstance(exc, ZygoteUnavailable | OSError)
                            else f"zygote {self.pid}: start interrupted")
                if len(received) == 2 and type(answer.get("pid")) is int:
                    _end_forked(received[1])
                for fd in received:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                if isinstance(exc, OSError):
                    raise ZygoteUnavailable(self.broken or "") from None
                raise
        forks = answer.get("forks")
        return process, forks if type(forks) is int else 0

    def never_ready(self) -> str | None:
        """Why this zygote refused to serve, where it did; or None.

        :attr:`unready` once a start read a refusal (or no ``ready`` in time); else, where
        its process ended before its answer was read (a zygote started ahead), the
        refusal waiting unread in its socket. None for one that is or may be ready, and
        for one that ended otherwise (killed, or given up by an interrupted start): its
        key's next start starts a new zygote.
        """
        if self.unready is not None or self._ready or self._popen.poll() is None:
            return self.unready
        try:
            data = self._sock.recv(MAX_MESSAGE, socket.MSG_DONTWAIT)
            answer = json.loads(data) if data else None
        except (OSError, ValueError):
            answer = None
        refused = answer.get("refused") if isinstance(answer, dict) else None
        if refused:
            self.unready = f"zygote: {refused}"
        return self.unready

    def _pass_held(self, stdout: int, stderr: int) -> None:
        """Write what a zygote started ahead printed to its first fork's outputs (once)."""
        held, self._held = self._held, None
        if held is None:
            return
        for source, target in zip(held, (stdout, stderr), strict=True):
            with source, contextlib.suppress(OSError, ValueError):
                source.seek(0)
                while chunk := source.read(65536):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(target, view):]

    def _drop_held(self) -> None:
        """Close the held output of a zygote no fork was given (idempotent)."""
        held, self._held = self._held, None
        for source in held or ():
            source.close()

    def _break(self, reason: str) -> None:
        """Record why this zygote serves no more starts, and close it."""
        if self.broken is None:
            self.broken = reason
        self.close()

    def alive(self) -> bool:
        """True while the zygote runs and serves starts."""
        return self.broken is None and self._popen.poll() is None

    def ended(self) -> bool:
        """True once the zygote process has exited (and is reaped)."""
        return self._popen.poll() is not None

    def close(self) -> None:
        """Serve no more starts; idempotent.

        The zygote stays until every supervisor it forked is reaped and its status
        reported, then exits (see :mod:`edge_core.host.zygote`).
        """
        self.broken = self.broken or "closed"
        self._sock.close()
        self._drop_held()  # no fork will be given what it printed

    def end(self, timeout_s: float = 2.0) -> None:
        """Close it and wait for its exit; killed after ``timeout_s``.

        One whose ``ready`` was never read has forked nothing but, maybe, the throw-away
        fork of its start (which exits at once): it is killed at once.
        """
        self.close()
        if not self._ready:
            with contextlib.suppress(OSError):
                self._popen.kill()
        try:
            self._popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()
        finally:
            self._drop_held()

    def descriptors(self) -> frozenset[int]:
        """The controller's descriptors this zygote holds (its control socket)."""
        fd = self._sock.fileno()
        return frozenset() if fd < 0 else frozenset({fd})


def _umask() -> int | None:
    """This process's umask from ``/proc/self/status`` (None where unreadable).

    Never read by setting it: ``os.umask`` is the process's, and another thread creating
    a file at that moment would get the wrong mask.
    """
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cwd() -> str | None:
    """The working directory, None when it was removed."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _end_forked(pidfd: int) -> None:
    """End a supervisor whose start was interrupted: ``SIGTERM`` reaches its whole tree.

    Sent through its ``pidfd``: never to a later process of the same PID.
    """
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)


_lock = threading.Lock()
_zygotes: dict[_Key, Zygote] = {}
_closed: list[Zygote] = []  # closed, still reporting the statuses of what they forked
_used: dict[_Key, int] = {}  # the start count when each key was last used
_starts = 0
_refused: dict[_Key, str] = {}  # keys whose zygote could not start: spawned
_owner = os.getpid()
_registered = False


def _fresh_lock() -> None:
    """In a forked child: a lock no other thread of the parent can be holding."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock)


def _own() -> None:
    """Start afresh in a forked controller (the parent's zygotes are not its children)."""
    global _owner
    if _owner != os.getpid():
        _zygotes.clear()
        _closed.clear()
        _used.clear()
        _refused.clear()
        _owner = os.getpid()


def _retire(key: _Key) -> None:
    """Take the key's zygote out of service (under ``_lock``); it drains and exits."""
    zygote = _zygotes.pop(key)
    zygote.close()
    _closed.append(zygote)
    _used.pop(key, None)


def _unpooled(interpreter: str, *, foreign: bool, supervised: bool) -> str | None:
    """Why a start of this interpreter is spawned whatever its key; None: it may be forked."""
    if os.environ.get(POOL_ENV, "1") == "0":
        return f"{POOL_ENV}=0"
    if foreign or interpreter != sys.executable:
        return "the route's interpreter is not the controller's own"
    if not supervised or not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        return "not a supervised start on Linux with pidfd_open"
    return None


def zygote_for(
    interpreter: str, env: Mapping[str, str], *, foreign: bool, supervised: bool,
    outputs: tuple[Any, Any], preload: tuple[str, ...] = (),
) -> tuple[Zygote | None, str | None]:
    """The zygote to fork this start from, or None and the reason it is spawned.

    ``outputs`` are the start's stdout and stderr targets: descriptors (or ``None``, the
    defaults) can be passed to a forked worker; ``subprocess`` pipes cannot. A key whose
    zygote could not start (or was left with threads by its imports) is spawned from
    then on. A zygote started ahead (:func:`start_early`) and not ready yet is returned
    as it is: its first fork waits for its ``ready``.
    """
    global _registered, _starts
    reason = _unpooled(interpreter, foreign=foreign, supervised=supervised)
    if reason is not None:
        return None, reason
    for output in outputs:
        if output is not None and not (type(output) is int and output >= 0) and not hasattr(
                output, "fileno"):
            return None, f"output {output!r} cannot be passed to a forked worker"
    key = pool_key(interpreter, env, preload)
    with _lock:
        _own()
        refused = _refused.get(key)
        if refused is not None:
            return None, f"warm pool: {refused}"
        _closed[:] = [zygote for zygote in _closed if not zygote.ended()]
        _starts += 1
        zygote = _zygotes.get(key)
        if zygote is not None and zygote.alive():
            _used[key] = _starts
            zygote.handed += 1
            return zygote, None
        if zygote is not None:
            unready = zygote.never_ready()  # (reads its socket: before it is closed)
            _retire(key)
            if unready is not None:  # it never got ready: as one that cannot start
                _refused[key] = unready
                return None, f"warm pool: {unready}"
        while _zygotes and len(_zygotes) >= MAX_ZYGOTES:  # the least recently used make room
            _retire(min(_zygotes, key=lambda known: _used.get(known, 0)))
        try:
            zygote = Zygote(interpreter, env, outputs, preload=preload)
        except ZygoteUnavailable as exc:
            _refused[key] = str(exc)
            return None, f"warm pool: {exc}"
        _zygotes[key] = zygote
        _used[key] = _starts
        zygote.handed += 1
        if not _registered:
            atexit.register(close_pool)
            _registered = True
        return zygote, None


def start_early(interpreter: str, env: Mapping[str, str], *, foreign: bool,
                supervised: bool, preload: tuple[str, ...] = ()) -> Zygote | None:
    """Start the zygote of a start expected soon, without waiting for it; None if none.

    For the key a later start will have (:func:`pool_key` of ``interpreter`` and ``env``):
    its process is started and imports while the caller goes on; the first start of that
    key (:func:`zygote_for`) forks from it, waiting for its ``ready`` only if it is not
    ready yet. Nothing is started where that start would be spawned (the pool off,
    another interpreter, a key whose zygote could not start), where the key has a zygote
    already, or where :data:`MAX_ZYGOTES` serve (an expected start never closes one).
    Its output (what its interpreter's start prints) is held until its first fork and
    written to that start's stdout and stderr (``Zygote``'s ``hold_output``).
    The caller gives it back with :func:`end_unused` (a start that never came, an open
    that failed): returned only when this call started it.
    """
    global _registered
    if _unpooled(interpreter, foreign=foreign, supervised=supervised) is not None:
        return None
    key = pool_key(interpreter, env, preload)
    with _lock:
        _own()
        if key in _refused:
            return None
        known = _zygotes.get(key)
        if known is not None and known.alive():
            return None
        if known is not None:
            unready = known.never_ready()  # (reads its socket: before it is closed)
            _retire(key)
            if unready is not None:  # its key is spawned from now on, as zygote_for does
                _refused[key] = unready
                return None
        if sum(zygote.alive() for zygote in _zygotes.values()) >= MAX_ZYGOTES:
            return None
        try:
            zygote = Zygote(interpreter, env, wait=False, hold_output=True, preload=preload)
        except OSError:  # the interpreter could not be started: its start says so
            return None
        _zygotes[key] = zygote
        _used[key] = _starts
        if not _registered:
            atexit.register(close_pool)
            _registered = True
        return zygote


def end_unused(zygotes: Iterable[Zygote]) -> None:
    """End those of ``zygotes`` (from :func:`start_early`) that no start was given."""
    unused = []
    with _lock:
        for zygote in zygotes:
            if zygote.handed == 0 and _zygotes.get(zygote.key) is zygote:
                _retire(zygote.key)  # no start can be given it from now on; close_pool
                unused.append(zygote)  # still ends it if this loop is interrupted
    for zygote in unused:
        zygote.end()


def close_pool() -> None:
    """End this controller's zygotes (at exit: after its workers are retired)."""
    retire_all()
    with _lock:
        zygotes = [*_zygotes.values(), *_closed] if _owner == os.getpid() else []
        _zygotes.clear()
        _closed.clear()
    for zygote in zygotes:
        zygote.end()


def pool_processes() -> frozenset[int]:
    """PIDs of this controller's zygotes (long-lived: no worker's leftovers)."""
    with _lock:
        if _owner != os.getpid():
            return frozenset()
        return frozenset(z.pid for z in [*_zygotes.values(), *_closed] if not z.ended())


def pool_descriptors() -> frozenset[int]:
    """The controller's descriptors its zygotes hold (their control sockets)."""
    with _lock:
        if _owner != os.getpid():
            return frozenset()
        return frozenset().union(*(z.descriptors() for z in _zygotes.values()))

