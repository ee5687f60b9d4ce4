"""A :class:`~edge_core.stage.LoadedStage` whose model runs in a worker process.

Most backends follow the same shape — start a worker on the stage's route, send it a
``load`` control call, a ``warmup`` call, then requests — so plugins compose this class
instead of re-writing it. It owns the :class:`~edge_core.host.client.WorkerClient`; the
plugin keeps what is specific to its runtime (the load configuration, how to read the
warm-up report).
"""

from __future__ import annotations

import contextlib
import traceback
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import attrs
import numpy as np
import psutil

from edge_contracts.devices import RAM_POOL
from edge_contracts.protocol import OP_LOAD
from edge_contracts.requests import StageEvent, StageRequest
from edge_core.backend import CancelOutcome
from edge_core.host.bootstrap import start_worker
from edge_core.host.calls import Call, Delivery
from edge_core.host.client import WorkerClient
from edge_core.host.devlock import DeviceLock
from edge_core.host.errors import ProtocolViolation
from edge_core.host.health import Health
from edge_core.host.identity import descendant_processes
from edge_core.host.identity import start_time as identity_start_time
from edge_core.host.retire import RetireOutcome
from edge_core.host.routes import Route
from edge_core.host.worker_logs import open_worker_output
from edge_core.stage import RETIRE_OUTCOME_ATTR, RetainedOutputs, StageContext

if TYPE_CHECKING:  # typing only: edge run imports no asyncio
    import asyncio

__all__ = ["RETIRE_OUTCOME_ATTR", "WorkerStage", "tree_peak_rss"]


def _peak_rss(proc: psutil.Process) -> int:
    """The process's peak resident set (VmHWM on Linux), else its current RSS."""
    try:
        with open(f"/proc/{proc.pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(proc.memory_info().rss)


def tree_peak_rss(pid: int, start_time: float) -> int:
    """Sum of the peak resident memory of a process and its descendants (0 when gone).

    The root is matched by (pid, start time: :func:`edge_core.host.identity.start_time`)
    so that a reused PID is never measured.
    """
    try:
        root = psutil.Process(pid)
        if abs(identity_start_time(root) - start_time) > 0.01:
            return 0
        total = _peak_rss(root)
        for child in descendant_processes(root):
            with contextlib.suppress(psutil.Error):
                total += _peak_rss(child)
        return total
    except psutil.Error:
        return 0


def _anchor(array: Any) -> Any:
    """The last ndarray of an array's base chain: every view of its bytes keeps it alive.

    NumPy collapses a view's base to this array (the one whose base is the buffer the
    bytes came from), so it lives exactly as long as some array still uses them.
    """
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


class _Retention:
    """Gives one delivery's shared memory back to the worker when the runtime releases it.

    Holds weak references to the arrays' anchors, never the arrays: once the runtime
    has dropped its own references, an anchor still alive means somebody still holds a
    view of those bytes.
    """

    __slots__ = ("_anchors", "_delivery")

    def __init__(self, delivery: Delivery, arrays: Mapping[str, Any]) -> None:
        self._delivery = delivery
        self._anchors = [weakref.ref(_anchor(a)) for a in arrays.values()]

    def release(self) -> bool:
        """Acknowledge the segments; unlink (never reuse) them when a view is alive.

        Idempotent, and so when cut short (a ``KeyboardInterrupt``) and called again:
        the anchors are let go once the delivery was released.
        """
        alive = any(anchor() is not None for anchor in self._anchors)
        self._delivery.release(unlink=alive)
        self._anchors = []
        return alive


def _refuse(delivery: Delivery, call: Call, error: BaseException) -> None:
    """Let go of what a malformed event holds before ``error`` (its refusal) rises.

    Its shared memory goes back to the worker, acknowledged once (nothing else holds the
    delivery): reused by the worker, or unlinked when a view of it is still referenced.
    The frames ``error`` passed through (the event's checks, finished) are cleared of
    their locals first, so that the error does not keep views of memory given back. A
    call the event did not end is cancelled: the events the worker still sends for it
    are dropped, their memory acknowledged, and those queued already are taken here and
    released, rather than left for a stream that ended.
    """
    arrays, delivery.arrays = delivery.arrays, {}
    anchors = [weakref.ref(_anchor(a)) for a in arrays.values()]
    del arrays
    chain: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and seen not in chain:  # the error, then what it was raised from
        chain.append(seen)
        traceback.clear_frames(seen.__traceback__)
        seen = seen.__cause__ or seen.__context__
    delivery.release(unlink=any(anchor() is not None for anchor in anchors))
    if delivery.terminal:
        return
    call.cancel()  # its end is queued now (CANCELLED, or the worker's end read already)
    while not call.ended:  # what was queued before: given back, delivered to nobody
        try:
            item = call.take(0.0)
        except Exception:  # the call's error (or, never expected, nothing queued)
            return
        if isinstance(item, Delivery):
            item.arrays = {}  # (its call's record of it keeps no view of memory given back)
            item.release()



def _item(delivery: Delivery, call: Call) -> tuple[StageEvent, Mapping[str, Any]]:
    """The (event, outputs) item of a delivery (not a usual DONE's pair): what is yielded.

    Outputs that are views of the worker's shared memory are handed over as
    :class:`~edge_core.stage.RetainedOutputs` (no copy); others are views of the frame's
    own buffer, private already, as the dict is (nobody else took this delivery).
    """
    try:  # checked here, on first read (a NOP on a well-formed event's way)
        event = delivery.event  # built from the arrays' descriptors
    except ProtocolViolation as error:
        _refuse(delivery, call, error)
        raise
    if not delivery.retained:
        return event, delivery.arrays
    arrays = delivery.arrays
    delivery.arrays = {}
    return event, RetainedOutputs(arrays, _Retention(delivery, arrays).release)


#: A CallEvents' rest once its first delivery is being taken: an exhausted iterator
_TAKEN: Iterator[Any] = iter(())


class CallEvents:
    """The (event, outputs) stream of one call :meth:`WorkerStage.call` sent.

    A first delivery that ends the call (the usual reply, a lone DONE handed over as its
    (event, arrays) pair of views of a private copy of its payload, or any terminal
    event) is returned, with nothing left to close (a generator suspended at its yield
    would be closed by raising ``GeneratorExit`` through it when dropped). A stream that
    goes on past its first event goes on in the generator of
    :meth:`WorkerStage.stream_from`.

    The call is known by its id to its channel (:class:`WorkerClient`) until its terminal
    event is read there: the stage keeps no registry of its own.

    Args:
        stage: The stage that sent the call.
        call: The call.
    """

    __slots__ = ("_call", "_rest", "_stage")

    def __init__(self, stage: WorkerStage, call: Call) -> None:
        self._stage = stage
        self._call = call
        # The rest of the stream: _TAKEN once its first delivery is being taken (a next()
        # then ends the stream), the generator of stream_from when it goes on past it
        self._rest: Iterator[tuple[StageEvent, Mapping[str, Any]]] | None = None

    def __iter__(self) -> CallEvents:
        return self

    def __next__(self) -> tuple[StageEvent, Mapping[str, Any]]:
        rest = self._rest
        if rest is not None:  # (_TAKEN: its first delivery was taken, the stream has ended)
            return next(rest)
        self._rest = _TAKEN  # before the take: an interrupted one is never waited for again
        call = self._call
        delivery = call.take()  # (its end already taken: StopIteration; or its error)
        item = (delivery if delivery.__class__ is tuple  # the usual DONE's pair as it is
                else _item(delivery, call))  # type: ignore[arg-type]  # (a Delivery)
        del delivery  # (a view referenced here would look "still referenced" at release)
        if item[0].terminal:
            return item
        rest = self._rest = self._stage.stream_from(call, item)
        del item
        return next(rest)

    def close(self) -> None:
        """The consumer is done: close the rest of the stream, give back what nothing holds.

        The rest: the generator of a stream that went on past its first event. What
        nothing holds: the worker memory of the deliveries its consumer never took, and of
        one lost as it was taken (a ``KeyboardInterrupt`` after it left the call's queue,
        before anything held it): :meth:`Call.release_held`. Call it only once what the
        consumer holds is released (a result made of the call holds its deliveries' memory).
        """
        rest = self._rest
        if rest is not None and rest is not _TAKEN:
            rest.close()  # type: ignore[attr-defined]  # (the generator of stream_from)
        self._call.release_held()


class WorkerStage:
    """A stage served by one worker process.

    Build with :meth:`start`. Satisfies :class:`edge_core.stage.LoadedStage`.

    Attributes:
        context: The stage context it was loaded with.
        client: The worker client (exposed for plugins that need control calls).
        load_report: The handler's answer to ``load``.
        manifest: Facts about the verified artifact for the execution plan.
    """

    #: How long retirement waits for the handler's own graceful shutdown before SIGTERM
    #: (``None``: the host's default, a share of the retire deadline). An engine that needs
    #: seconds to stop sets its window: it is waited in full, on top of the retire
    #: deadline, which keeps all of its time for SIGTERM, SIGKILL and verification (the
    #: retirement is bounded by ``retire_graceful_s + deadline_s``).
    retire_graceful_s: float | None = None

    #: Controller environment variables this backend's workers need, passed when set
    #: (a name, or a prefix ending in ``*``), on top of the host's allowlist
    #: (:mod:`edge_core.host.environment`); nothing else of the controller's passes.
    worker_env_names: tuple[str, ...] = ()

    #: Modules this backend's worker entry imports that a warm pool's zygote may import
    #: ahead of the fork (:mod:`edge_core.host.warm_pool`): its workers of the
    #: controller's own interpreter then find them imported. A module whose import
    #: leaves a thread running makes the zygote refuse (its key is spawned); the ONNX
    #: Runtime backends name ``onnxruntime``, imported only where its telemetry is off
    #: (:func:`edge_core.host.zygote.pre_imports`).
    worker_preload: tuple[str, ...] = ()

    def __init__(self, context: StageContext, client: WorkerClient,
                 load_report: Mapping[str, Any], manifest: Mapping[str, Any] | None,
                 device_id: str | None) -> None:
        self._context = context
        self.client = client
        self.load_report = dict(load_report)
        self.manifest = dict(manifest or {})
        self.device_id = device_id
        self._peak = 0
        #: The worker's log file, or ``None`` when its output goes to stderr.
        self.log_path: Path | None = None

    @property
    def context(self) -> StageContext:
        """The context the stage was loaded with."""
        return self._context

    @classmethod
    def start(
        cls,
        context: StageContext,
        *,
        default_entry: str,
        load_config: Mapping[str, Any],
        stage_packages: Iterable[str] = (),
        features: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        device_id: str | None = None,
        manifest: Mapping[str, Any] | None = None,
        load_timeout_s: float | None = 600.0,
    ) -> Self:
        """Start the worker on the stage's route, then load under the device lock.

        Args:
            context: The stage context; its ``route`` (a ``RouteConfig``) or, when unset,
                the controller's own interpreter decides where the worker runs.
            default_entry: The plugin's worker factory, used when the route names none.
            load_config: JSON configuration for the handler's ``load``.
            stage_packages: Worker packages to stage for a foreign interpreter.
            features: Protocol features the plugin requires.
            env: Variables the backend sets for its worker; the rest of the worker's
                environment is the allowlist plus :attr:`worker_env_names`.
            device_id: Physical device whose initialisation lock is held while loading.
            manifest: Verified artifact facts for the execution plan.
            load_timeout_s: Bound on the ``load`` control call.

        Raises:
            The host's bootstrap errors, or the handler's load error (the worker is retired
            before the error propagates).
        """
        packages = tuple(stage_packages)
        path = f"stages[{context.stage_id}].backend.route"
        if context.route is not None:
            route: Route = context.route.to_host_route(default_entry, path)
            route = attrs.evolve(route, stage=tuple(dict.fromkeys(route.stage + packages)))
        else:
            route = Route.default(context.backend, default_entry, stage=packages)
        output = open_worker_output(context.stage_id, context.generation)
        # Without a device lock to hold, the load goes out as soon as the worker's hello
        # is verified: the worker loads while this side captures its tree and builds the
        # client (a device's load waits for its lock, taken once the client is built)
        first = None if device_id else (OP_LOAD, load_config)
        try:
            client = start_worker(route, generation=context.generation, features=features,
                                  pass_env=cls.worker_env_names, set_env=env,
                                  preload=cls.worker_preload,
                                  max_io_bytes=context.max_io_bytes,
                                  stdout=output.stdout, stderr=output.stderr,
                                  first_control=first)
        finally:
            output.close()  # the worker holds its own descriptor
        try:
            if first is not None:
                report = client.sent_control_reply(timeout_s=load_timeout_s)
            else:
                with cls._device_lock(device_id):
                    report = client.load(load_config, timeout_s=load_timeout_s)
        except BaseException as error:
            # The runtime settles the stage's reservation with this outcome: released
            # when the worker is verified gone, quarantined otherwise.
            setattr(error, RETIRE_OUTCOME_ATTR, client.retire())
            raise
        stage = cls(context, client, report, manifest, device_id)
        stage.log_path = output.path
        return stage

    @staticmethod
    def _device_lock(device_id: str | None) -> contextlib.AbstractContextManager[Any]:
        return DeviceLock(device_id) if device_id else contextlib.nullcontext()

    def warmup(self, config: Mapping[str, Any] | None = None,
               timeout_s: float | None = 600.0) -> dict[str, Any]:
        """Run the handler's warm-up under the device lock; return its report."""
        with self._device_lock(self.device_id):
            report = self.client.warmup(config or {}, timeout_s=timeout_s)
        self._sample_memory()
        return report

    def query(self, question: Mapping[str, Any], timeout_s: float | None = 30.0) -> dict[str, Any]:
        """Ask the worker's handler a question that takes no slot (its ``query``).

        Answered by the worker between frames, while the stage's requests stream: no
        admission slot, no stage slot (see :meth:`edge_core.host.client.WorkerClient.query`).
        """
        return self.client.query(question, timeout_s=timeout_s)

    def input_buffer(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An input array in the controller's shared memory, sent by reference."""
        return self.client.input_buffer(shape, dtype)

    def owns_input_buffer(self, value: Any) -> bool:
        """True when ``value`` is one of this worker's input buffers."""
        return self.client.owns_input_buffer(value)

    def check_input_buffers(self, inputs: Mapping[str, Any]) -> None:
        """Raise ``InputBufferBusy`` when one of ``inputs`` is a buffer still held."""
        self.client.check_input_buffers(inputs)

    def input_buffer_counts(self) -> dict[str, int]:
        """The worker client's input-buffer counts (``buffers``, ``sent``)."""
        return self.client.input_buffer_counts()

    def call(self, request: StageRequest,
             inputs: Mapping[str, Any]) -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
        """Send the request now; return an iterator of (event, outputs).

        Outputs that came inline are private, read-only arrays. Outputs that came through shared
        memory are read-only views of the worker's segment, yielded as
        :class:`~edge_core.stage.RetainedOutputs`: no copy is made, and the segment goes
        back to the worker when the runtime releases them (at the result's
        acknowledgement). Views still referenced then keep their bytes: the worker is
        told to unlink that segment instead of reusing it.
        """
        return CallEvents(self, self.client.submit(request, inputs))

    def stream_from(self, call: Call, first: tuple[StageEvent, Mapping[str, Any]],
                    ) -> Generator[tuple[StageEvent, Mapping[str, Any]], None, None]:
        """The rest of the stream of a call :meth:`call` sent, from its ``first`` item on.

        For :class:`CallEvents`, once ``first`` (not a terminal event) was taken: yields
        it, then each event the call delivers.
        """
        take = call.take
        # Each item is handed over without this suspended frame keeping a reference (a
        # view held here would look "still referenced" at release time).
        box = [first]
        del first
        while True:
            yield box.pop()
            try:
                delivery = take()
            except StopIteration:  # the terminal event was taken
                return
            # a usual DONE's pair as it is: its event and its arrays, views of a
            # private copy of its payload
            box.append(delivery if isinstance(delivery, tuple) else _item(delivery, call))
            del delivery

    def on_end(self, request_id: str, callback: Callable[[], None],
               loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Call ``callback()`` once every event of a call sent by :meth:`call` is here.

        From the thread that read (or ended) the call, or at once; the iterator
        :meth:`call` returned then yields every event without waiting. With ``loop``
        (called on its thread) that loop reads the worker's channel meanwhile
        (:meth:`WorkerClient.on_end`). False (and no callback) when its channel no longer
        has it in flight (:meth:`WorkerClient.call_in_flight`): its terminal event was read
        already (taken or not: the iterator then yields every event without waiting), or
        it was never sent.
        """
        call = self.client.call_in_flight(request_id)
        if call is None:
            return False
        self.client.on_end(call, callback, loop)
        return True

    def cancel(self, request_id: str, epoch: int, *, preemptible: bool) -> CancelOutcome:
        """Cancel in place (preemptible handlers) or ask the runtime to retire the worker."""
        if not self.client.in_flight(request_id):
            # Finished in the worker (its terminal event may still be queued here): the
            # worker stays; the runtime's fence keeps the result from being delivered.
            return CancelOutcome.ALREADY_FINISHED
        if preemptible:
            self.client.cancel(request_id)
            return CancelOutcome.CANCELLED_IN_PLACE
        return CancelOutcome.RETIRE_REQUIRED

    def on_lost(self, listener: Callable[[BaseException], None]) -> None:
        """Call ``listener(error)`` when the worker dies, stops answering or is retired.

        The runtime uses it to mark the stage failed at once (see
        :mod:`edge_core.runtime.health`), not only when the next call fails.
        """
        self.client.on_lost(listener)

    def health(self) -> Health:
        """The worker client's health (state, reason, exit status, calls in flight)."""
        return self.client.health()

    def retire(self, deadline_s: float = 5.0) -> RetireOutcome:
        """Retire the worker tree (idempotent); bounded by ``retire_graceful_s + deadline_s``."""
        self._sample_memory()
        return self.client.retire(deadline_s, graceful_s=self.retire_graceful_s)

    def _sample_memory(self) -> None:
        identity = self.client.identity
        self._peak = max(self._peak, tree_peak_rss(identity.pid, identity.start_time))

    def observed_memory(self) -> Mapping[str, int]:
        """Peak resident memory of the worker tree, charged to ``machine:ram``."""
        self._sample_memory()
        return {RAM_POOL: self._peak}

    def describe(self) -> Mapping[str, object]:
        """Worker identity, how it started, route, runtime versions, load report, manifest."""
        identity = self.client.identity
        return {
            "generation": self.client.generation,
            "pid": identity.pid,
            "start": self.client.start_path.to_dict(),
            "start_time": identity.start_time,
            "create_time": identity.create_time,
            "route": self.client.route.to_dict(),
            "runtime": dict(self.client.hello.get("versions", {})),
            "load": self.load_report,
            "manifest": self.manifest,
            "health": self.client.health().to_dict(),
            "log": str(self.log_path) if self.log_path is not None else None,
        }
