"""Starting a worker: private channel, boot configuration, hello verification.

:func:`start_worker` creates a ``socketpair`` (private to the two processes: no address,
no listener; the fastest local channel measured, see docs/host.md), starts the route's
interpreter on :data:`WORKER_MAIN` — on POSIX under its supervisor
(:mod:`edge_core.host.supervisor`), a subreaping session leader, so that its whole tree
can be found and taken down later — with an environment built from an allowlist
(:mod:`edge_core.host.environment`), and hands it an unguessable token plus its boot
configuration as the first frame on the private channel (never in its environment,
where ``/proc/<pid>/environ`` would show it for the worker's whole life). The worker's
first frame must be a hello carrying that token, protocol version, features, its PID and
process creation time (checked against what psutil says about the process we started)
and its runtime versions. Any mismatch, or no hello within the timeout, refuses the
worker with :class:`~edge_core.host.errors.BootstrapRefused` after retiring it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import psutil

from edge_contracts.errors import ContractError, StreamClosed
from edge_contracts.headers import FrameHeader, Limits
from edge_contracts.protocol import FEATURE_SHM_TENSORS, KNOWN_FEATURES
from edge_contracts.sealed import SEALS_AVAILABLE, FdChannel
from edge_contracts.shm import (
    DEFAULT_MAX_BUFFERS,
    SHM_AVAILABLE,
    SegmentConsumer,
    SegmentProducer,
    new_prefix,
    retained_cap_for,
    sweep,
)
from edge_contracts.waiting import MAX_SPIN_US, readable
from edge_contracts.wire import Frame, encode_frame, read_frame, write_frame
from edge_contracts.worker_protocol import BootConfig, boot_frame
from edge_contracts.worker_transport import DEFAULT_SHM_THRESHOLD
from edge_core.host.client import FIRST_CONTROL_ID, WorkerClient
from edge_core.host.environment import check_env_names, worker_environment
from edge_core.host.errors import BootstrapRefused, RouteRefused
from edge_core.host.exit_cleanup import track
from edge_core.host.hello import verify_hello
from edge_core.host.identity import ProcessIdentity
from edge_core.host.leftovers import sweep_once
from edge_core.host.pooled_process import PooledProcess
from edge_core.host.retire import ProcessTree
from edge_core.host.routes import Route, controller_domain
from edge_core.host.spinning import worker_spin_us
from edge_core.host.staging import stage_packages
from edge_core.host.start_path import FORKED, SPAWNED, StartPath
from edge_core.host.started_process import SpawnedProcess, StartedProcess
from edge_core.host.started_workers import note_started
from edge_core.host.supervisor import supervisor_argv
from edge_core.host.warm_pool import ZygoteUnavailable, zygote_for
from edge_core.host.zygote import SEGMENTS_FD

SUPERVISED = os.name == "posix" and bool(sys.executable)
"""Whether workers start under a supervisor (:mod:`edge_core.host.supervisor`): on POSIX,
run by the controller's own interpreter (an embedded one without ``sys.executable`` starts
workers directly)."""

__all__ = ["DEFAULT_HELLO_TIMEOUT_S", "DEFAULT_MAX_IO_BYTES", "start_worker"]

DEFAULT_HELLO_TIMEOUT_S = 30.0
"""How long a new worker may take to import its entry and say hello."""

DEFAULT_MAX_IO_BYTES = 1 << 30
"""Default cap on the tensor bytes of one frame (a route may lower or raise it)."""

_SHM = frozenset({FEATURE_SHM_TENSORS})
_STDERR_FD = 2  # a worker writes nothing to the controller's stdout


def _supported() -> frozenset[str]:
    return KNOWN_FEATURES if SHM_AVAILABLE else KNOWN_FEATURES - _SHM


WORKER_MAIN = (
    "import sys; getattr(sys.flags, 'safe_path', 0) or sys.path.pop(0); "
    "import gc; gc.disable(); from edge_contracts.worker import main; sys.exit(main())"
)
"""How a worker is started: ``python -c WORKER_MAIN FD``. The same as ``python -m
edge_contracts.worker FD`` without ``runpy`` and without running the module twice (as
``__main__`` and again as itself), work that every worker's start-up would otherwise
pay. Its first statement drops ``sys.path[0]`` (the working directory, for ``-c``) before
anything is imported, so a module in the directory ``edge run`` was started from is
never imported by a worker; ``-I`` would also drop the ``PYTHONPATH`` routes rely on,
and ``-P`` does not exist before Python 3.11. It then turns the cyclic garbage collector
off (``gc`` is built in: nothing is imported from a path) until the worker has said
hello: the imports of the worker, its entry and its runtime make many objects and
almost no garbage, and the collector would scan them again and again; the worker
freezes them and turns it on again once its hello is sent
(:func:`edge_contracts.worker.serve`)."""


def start_worker(
    route: Route,
    *,
    generation: int,
    features: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    pass_env: Iterable[str] = (),
    set_env: Mapping[str, str] | None = None,
    hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S,
    shm_threshold: int = DEFAULT_SHM_THRESHOLD,
    shm_max_bytes: int | None = None,
    shm_max_buffers: int = DEFAULT_MAX_BUFFERS,
    max_io_bytes: int = DEFAULT_MAX_IO_BYTES,
    spin_us: int | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    sealed_segments: bool = True,
    first_control: tuple[str, Mapping[str, Any]] | None = None,
    preload: Iterable[str] = (),
) -> WorkerClient:
    """Start the route's worker, verify its hello and return a ready client.

    Args:
        route: interpreter, entry and domain of the worker.
        generation: worker generation, stamped on every frame both ways.
        features: protocol features the controller requires of this worker.
        env: the environment the worker's is selected from (default: the
            controller's); only allowlisted names pass (see
            :mod:`edge_core.host.environment`), and ``PYTHONPATH`` is built, for a
            foreign interpreter from the private staging directory only.
        pass_env: further names (or ``PREFIX*``) the backend's workers need from ``env``.
        set_env: variables the backend sets for its worker (the route's ``env`` wins).
        hello_timeout_s: bound on start-up until the hello.
        shm_threshold: tensors of at least this many bytes go through shared memory
            (both ways), when both sides support it.
        shm_max_bytes: per-producer cap on retained shared memory (each side). Default
            (None): room for one frame of ``max_io_bytes``
            (:func:`~edge_contracts.shm.retained_cap_for`), at least
            :data:`~edge_contracts.shm.DEFAULT_MAX_BYTES`: a request or result the
            channel accepts can always be sent once the frames before it are
            acknowledged.
        shm_max_buffers: per-producer cap on retained segments (each side).
        max_io_bytes: cap on the tensor bytes of one frame, both ways.
        spin_us: how long either end polls without sleeping for the next frame before it
            blocks (adaptive: only while recent waits were shorter; 0 disables): a fixed
            budget on both ends. Default (None): :data:`~edge_contracts.waiting.SPIN_ENV`
            on both ends when set; else both budgets are decided by measurement (the
            controller's by :mod:`edge_core.host.spinning`, the worker's by its own
            waits within the cap that module tells it, :mod:`edge_contracts.worker_spin`:
            0 where the processes share too few cores or waking is cheap; the waits,
            measured all the channel's life, say which).
        stdout: where the worker's stdout goes (default: the controller's stderr, so
            that the controller's stdout carries only its own output).
        stderr: where the worker's stderr goes (default: inherited).
        sealed_segments: where the interpreters can (Linux), shared-memory tensors
            travel in sealed memfd segments passed over a second socketpair
            (:mod:`edge_contracts.sealed`): nothing in ``/dev/shm``, and neither side can
            shrink memory the other has mapped. ``False``: named POSIX segments.
        first_control: a control op and its meta (the load) sent as soon as the hello
            is verified, before the client is built: the worker works on it while the
            controller captures its tree and builds the client. Its reply is the
            client's :meth:`~edge_core.host.client.WorkerClient.sent_control_reply`.
        preload: modules the worker's entry imports that its zygote may import ahead
            (``WorkerStage.worker_preload``; part of the zygote's key).

    Raises:
        RouteRefused: the route's domain cannot be started from here.
        BootstrapRefused: no hello in time, wrong token, version, features or identity.

    """
    sweep_once()  # what dead edge-core processes left behind (once per process)
    required = frozenset(features)
    if route.os_domain != controller_domain():
        raise RouteRefused(
            "route.os_domain",
            f"cannot start from {controller_domain().value}",
            route.os_domain.value,
        )
    supported = _supported()
    unknown = sorted(required - supported)
    if unknown:
        raise BootstrapRefused("features", "not supported by this controller", unknown)
    spin = worker_spin_us() if spin_us is None else spin_us
    if type(spin) is not int or not 0 <= spin <= MAX_SPIN_US:
        raise BootstrapRefused("spin_us", f"must be an integer in 0..{MAX_SPIN_US}", spin)
    if shm_max_bytes is None:
        shm_max_bytes = retained_cap_for(max_io_bytes, shm_max_buffers)
    token = secrets.token_hex(32)
    worker_prefix, own_prefix = new_prefix(), new_prefix()
    declared = check_env_names(pass_env, "pass_env")
    staged = stage_packages(route.stage) if route.foreign else None
    worker_env = worker_environment(
        os.environ if env is None else env,
        declared=declared,
        values=set_env,
        route_env=dict(route.env),
        python_path=([str(staged)] if staged is not None else []) + list(route.python_path),
        inherit_python_path=not route.foreign,
    )
    zygote, spawn_reason = zygote_for(route.interpreter, worker_env, foreign=route.foreign,
                                      supervised=SUPERVISED, outputs=(stdout, stderr),
                                      preload=tuple(preload))
    use_seals = sealed_segments and SEALS_AVAILABLE and SHM_AVAILABLE
    fds = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if use_seals else None
    boot = BootConfig(
        token=token,
        entry=route.entry,
        generation=generation,
        shm_prefix=worker_prefix,
        peer_prefix=own_prefix,
        shm_threshold=shm_threshold,
        shm_max_bytes=shm_max_bytes,
        shm_max_buffers=shm_max_buffers,
        max_io_bytes=max_io_bytes,
        features=tuple(sorted(supported)),
        spin_us=spin,
        shm_fds=0 if fds is None else fds[1].fileno(),
    )
    limits = Limits(max_io_bytes=max_io_bytes, supported_features=supported)
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    argv = _spawn_argv(route, child.fileno(), worker_prefix, own_prefix, staged)
    path = StartPath(SPAWNED, reason=spawn_reason)
    popen: StartedProcess | None = None
    pooled: PooledProcess | None = None  # the forked start's (its boot frame goes after)
    try:
        if zygote is not None:
            try:
                pooled, forks = zygote.fork(
                    prefixes=[worker_prefix, own_prefix],
                    remove=[],  # a route of the controller's interpreter stages nothing
                    channel=child.fileno(),
                    segments=None if fds is None else fds[1].fileno(),
                    stdout=_descriptor(stdout),
                    stderr=_descriptor(stderr),
                )
                popen = pooled
                path = StartPath(FORKED, zygote=zygote.pid, forks=forks)
                # the worker's descriptors are placed where the zygote puts them
                boot = replace(boot, shm_fds=0 if fds is None else SEGMENTS_FD)
            except ZygoteUnavailable as exc:
                path = StartPath(SPAWNED, reason=f"warm pool: {exc}")
                # The zygote may have forked with these ends before it failed: a worker of
                # that fork would share the spawned one's channel. The spawn gets ends of
                # its own; the old ones close here, so such a worker reads its channel's
                # end and exits.
                parent.close()
                child.close()
                if fds is not None:
                    fds[0].close()
                    fds[1].close()
                parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                if use_seals:
                    fds = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                boot = replace(boot, shm_fds=0 if fds is None else fds[1].fileno())
                argv = _spawn_argv(route, child.fileno(), worker_prefix, own_prefix, staged)
        if popen is None:
            # The boot configuration (and its token) waits in the private channel for the
            # worker's first read: never in its environment or command line.
            write_frame(parent.sendmsg, encode_frame(boot_frame(boot), []))
            popen = SpawnedProcess(
                argv,
                pass_fds=(child.fileno(),) + (() if fds is None else (fds[1].fileno(),)),
                env=worker_env,
                stdin=subprocess.DEVNULL,
                stdout=_STDERR_FD if stdout is None else stdout,  # never the controller's stdout
                stderr=stderr,
                start_new_session=True,
            )
    except BaseException:
        parent.close()
        if fds is not None:
            fds[0].close()
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
        raise
    finally:
        child.close()
        if fds is not None:
            fds[1].close()
    tree = ProcessTree(ProcessIdentity.of(popen.pid), popen)
    channel: FdChannel | None = None
    producer: SegmentProducer | None = None
    consumer: SegmentConsumer | None = None
    client: WorkerClient | None = None
    try:
        if pooled is not None:
            if pooled.exited():  # the identity just taken may be another process's
                raise BootstrapRefused("supervisor", "exited before its identity was taken",
                                       pooled.pid)
            write_frame(parent.sendmsg, encode_frame(boot_frame(boot), []))
        hello = _await_hello(parent, popen, limits, hello_timeout_s)
        tree.adopt(_main_identity(tree, hello.header.meta.get("pid")))
        in_use = verify_hello(hello, token, tree.main, required, supported)
        if first_control is not None:
            op, meta = first_control
            header = FrameHeader(op, FIRST_CONTROL_ID, "", 0, generation, meta=meta)
            write_frame(parent.sendmsg, encode_frame(header, []))
        tree.capture()
        use_shm = (FEATURE_SHM_TENSORS in in_use
                   and hello.header.meta.get("shm_prefix") == worker_prefix)
        if fds is not None:
            if use_shm and hello.header.meta.get("sealed_segments") is True:
                channel = FdChannel(fds[0].detach())
            else:
                fds[0].close()
        if use_shm:
            producer = SegmentProducer(
                own_prefix, max_bytes=shm_max_bytes, max_buffers=shm_max_buffers, channel=channel
            )
            consumer = SegmentConsumer(worker_prefix, channel=channel)
        client = WorkerClient(
            route=route,
            generation=generation,
            sock=parent,
            # From now on, only the features both ends negotiated (a bfloat16 tensor from a
            # worker that did not offer bfloat16 is refused before its payload).
            limits=Limits(max_io_bytes=max_io_bytes, supported_features=in_use),
            tree=tree,
            popen=popen,
            hello=hello.header.meta,
            features=in_use,
            producer=producer,
            consumer=consumer,
            worker_prefix=worker_prefix,
            threshold=shm_threshold,
            staged=staged,
            spin_us=None if spin_us is None else spin,
            sent_control=None if first_control is None else first_control[0],
            start_path=path,
        )
        track(client)  # retired at interpreter exit if nobody closes it
        note_started(client)  # and by a failed edge_load that started it (binding)
    except BaseException:
        # Whatever failed (a refused hello, no thread for the client, a Ctrl-C), the worker
        # started (and maybe loading) is retired here: nobody else knows of it yet.
        if client is not None:
            client.retire(5.0)
        else:
            tree.retire(5.0)
            parent.close()
            if fds is not None:
                fds[0].close()  # a no-op once detached into the channel
            for owned in (producer, consumer, channel):
                if owned is not None:
                    owned.close()
            sweep(worker_prefix)
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)
            for stream in (popen.stdout, popen.stderr):
                if stream is not None:
                    stream.close()
        raise
    return client


def _descriptor(output: int | IO[Any] | None) -> int:
    """The descriptor a forked worker's stream goes to (default: the controller's stderr)."""
    if output is None:
        return _STDERR_FD
    return output if isinstance(output, int) else output.fileno()


def _spawn_argv(route: Route, channel: int, worker_prefix: str, own_prefix: str,
                staged: Path | None) -> list[str]:
    """The command line of a spawned worker on ``channel`` (under its supervisor)."""
    argv = [route.interpreter, "-c", WORKER_MAIN, str(channel)]
    if SUPERVISED:
        argv = supervisor_argv(
            argv,
            controller=os.getpid(),
            prefixes=[worker_prefix, own_prefix],
            remove=[] if staged is None else [str(staged)],
        )
    return argv


def _main_identity(tree: ProcessTree, pid: object) -> ProcessIdentity:
    """The worker's identity: the hello's PID when it is the supervisor's child.

    Anything else gives the root, which the hello check then refuses unless the worker
    was started without a supervisor.
    """
    if SUPERVISED and type(pid) is int and pid != tree.root.pid:
        try:
            proc = psutil.Process(pid)
            if proc.ppid() == tree.root.pid:
                return ProcessIdentity.of_process(proc)
        except psutil.Error:
            pass
    return tree.root


def _await_hello(
    sock: socket.socket, popen: StartedProcess, limits: Limits, timeout_s: float
) -> Frame:
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BootstrapRefused("hello", f"not received within {timeout_s} s", popen.pid)
        if readable(sock.fileno(), min(remaining, 0.05)):
            break
        if popen.poll() is not None:
            raise BootstrapRefused("hello", "worker exited before its hello", popen.returncode)
    sock.settimeout(max(deadline - time.monotonic(), 0.1))
    try:
        return read_frame(sock.recv_into, limits)
    except StreamClosed:
        raise BootstrapRefused("hello", "channel closed before the hello", popen.pid) from None
    except ConnectionError as exc:  # the worker died with the boot frame unread: a reset
        raise BootstrapRefused("hello", f"channel reset before the hello ({exc})",
                               popen.pid) from None
    except ContractError as exc:
        raise BootstrapRefused(
            "hello", f"refused frame: {exc.field}: {exc.reason}", exc.value
        ) from None
    except TimeoutError:
        raise BootstrapRefused("hello", f"incomplete within {timeout_s} s", popen.pid) from None
    finally:
        sock.settimeout(None)
