"""What a backend declares about itself, and what its probe reports.

A plugin answers :func:`edge_core.hookspecs.edge_backends` with one
:class:`BackendInfo` per backend it owns. The runtime's behaviour (cancel in place or
retire the worker, how many calls may be in flight) follows from this declaration,
never from the backend's name.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping

import attrs

from edge_contracts.devices import DeviceDescriptor

__all__ = ["BackendInfo", "CancelOutcome", "ProbeReport", "StageKind"]

_BACKEND_NAME = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")


class StageKind(str, enum.Enum):
    """The kinds of stage a backend can serve."""

    #: One stateless call on a fixed input bucket (an ONNX graph, say).
    GRAPH = "graph"
    #: Streaming, stateful inside the worker (autoregressive generation).
    GENERATE = "generate"


class CancelOutcome(str, enum.Enum):
    """What :func:`edge_core.hookspecs.edge_cancel` did with a request."""

    #: The request was stopped inside the worker; the worker stays (preemptible backends).
    CANCELLED_IN_PLACE = "cancelled-in-place"
    #: The request cannot be stopped in place; the runtime must retire the worker.
    RETIRE_REQUIRED = "retire-required"
    #: The request had already finished; nothing was running.
    ALREADY_FINISHED = "already-finished"
    #: The backend never started the request (queued, or between two stages): it was
    #: dropped before it ran. Hook contract 1.1; a 1.0 plugin never answers it.
    NOT_STARTED = "not-started"


def _check_name(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not _BACKEND_NAME.match(value):
        raise ValueError(
            f"{attribute.name}: not a backend name (lowercase words joined by '-'): {value!r}"
        )


def _check_kinds(
    _: object, attribute: attrs.Attribute[frozenset[StageKind]], value: object
) -> None:
    if not value:
        raise ValueError(f"{attribute.name}: a backend serves at least one stage kind: {value!r}")


def _to_strings(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise ValueError(f"expected a collection of strings: {value!r}")
    return tuple(str(v) for v in value)


def _to_optional_strings(value: object) -> tuple[str, ...] | None:
    return None if value is None else _to_strings(value)


def _to_params(value: object) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise ValueError(f"params: expected a collection of parameter names, or None: "
                         f"{value!r}")
    for name in value:
        if not isinstance(name, str) or not name:
            raise ValueError(f"params: a parameter name is a non-empty string: {name!r}")
    return frozenset(value)


def _to_devices(value: object) -> tuple[DeviceDescriptor, ...]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"devices: expected a list of DeviceDescriptor: {value!r}")
    return tuple(value)


def _to_kinds(value: object) -> frozenset[StageKind]:
    if isinstance(value, (str, StageKind)):
        value = [value]
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise ValueError(f"kinds: expected a collection of stage kinds: {value!r}")
    return frozenset(StageKind(v) for v in value)


@attrs.frozen
class BackendInfo:
    """A backend's self-description, returned by ``edge_backends``.

    Attributes:
        name: The backend name stages use (``ort-cpu``, ``qnn``, ``vllm-cuda`` ...).
        kinds: Stage kinds served (``graph``, ``generate``).
        preemptible: Whether a *running* call can be cancelled inside the worker. A
            non-preemptible backend's worker is retired when a running call is cancelled.
        max_concurrency: Upper bound on calls in flight per loaded stage that the backend
            supports (1 for a plain ONNX Runtime session; many for a batching engine).
        providers: Execution providers or device targets this backend can place work on,
            spelled as the runtime itself spells them (e.g. ``CPUExecutionProvider``).
        description: One line for ``edge plugins`` and ``edge probe``.
        env_names: Variables of the controller's environment that reach the backend's
            workers and change what its runtime does (``VLLM_*``, ``CUDA_*``: a name, or
            a prefix ending in ``*``). Their values are part of a stored placement
            decision's key (:mod:`edge_core.selection.key`), so changing one re-measures.
        needs_bundle: Whether every stage of this backend names an artifact bundle
            (``manifest``): a stage without one is refused when its pipeline file is
            checked (:mod:`edge_core.preflight`), before any worker starts.
        params: The names of the request parameters a stage of this backend reads (a
            request's ``params`` reach its pipeline's final stage): a front end refuses a
            request whose parameters name any other (``edge serve``: 400 naming it), so a
            misspelt parameter is not silently ignored. An empty set: the stage reads
            none (an ONNX graph). None (the default): not declared, and a front end
            passes every name on (the stage may still refuse it itself).
        worker_preload: Declared where the backend's workers start on the controller's
            own interpreter (where a stage's route sets none) with the host's worker
            environment (the allowlist, ``env_names``, the heap variables and the
            route's ``env``; no values of its own): the modules its stage class names in
            ``WorkerStage.worker_preload``. ``Pipeline.open`` then starts the warm pool's
            zygote of that key as it begins (:mod:`edge_core.runtime.early_zygotes`).
            None (the default): not declared; a stage's first start starts its zygote.

    """

    name: str = attrs.field(validator=_check_name)
    kinds: frozenset[StageKind] = attrs.field(converter=_to_kinds, validator=_check_kinds)
    preemptible: bool = False
    max_concurrency: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    providers: tuple[str, ...] = attrs.field(default=(), converter=_to_strings)
    description: str = ""
    env_names: tuple[str, ...] = attrs.field(default=(), converter=_to_strings)
    needs_bundle: bool = False
    params: frozenset[str] | None = attrs.field(default=None, converter=_to_params)
    worker_preload: tuple[str, ...] | None = attrs.field(default=None,
                                                         converter=_to_optional_strings)

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dictionary of this declaration."""
        return {
            "name": self.name,
            "kinds": sorted(k.value for k in self.kinds),
            "preemptible": self.preemptible,
            "max_concurrency": self.max_concurrency,
            "providers": list(self.providers),
            "description": self.description,
            "env_names": list(self.env_names),
            "needs_bundle": self.needs_bundle,
            "params": None if self.params is None else sorted(self.params),
            "worker_preload": (None if self.worker_preload is None
                               else list(self.worker_preload)),
        }


@attrs.frozen
class ProbeReport:
    """A backend's answer to ``edge_probe``: is it usable here, on which devices, and why not.

    Attributes:
        backend: The backend name this report is about.
        available: True only when a stage could be loaded on this machine right now.
        reason: Why the backend is unavailable (required when ``available`` is false).
        devices: Devices the backend can place work on, as the runtime reports them.
        runtime: Versions of the runtime pieces seen (``{"onnxruntime": "1.31.1"}``).
        notes: Extra observations worth showing a user (e.g. conflicting distributions).
        limitation: For an available backend that runs here only in a reduced form, what
            that form is, in a few words a user reads first (``edge probe`` shows it in
            place of a bare "available"): ``"HTP simulator: no Qualcomm NPU here"``,
            ``"CPU only: no GPU found"``. ``None`` when it runs as its name promises.
        pool_totals: Totals of the device pools the backend observed, by pool name.

    """

    backend: str = attrs.field(validator=_check_name)
    available: bool
    reason: str | None = None
    devices: tuple[DeviceDescriptor, ...] = attrs.field(default=(), converter=_to_devices)
    runtime: Mapping[str, str] = attrs.field(factory=dict)
    notes: tuple[str, ...] = attrs.field(default=(), converter=_to_strings)
    pool_totals: Mapping[str, int | None] = attrs.field(factory=dict)
    limitation: str | None = None

    def __attrs_post_init__(self) -> None:
        if not self.available and not self.reason:
            raise ValueError(
                f"reason: an unavailable backend must say why: {self.reason!r} "
                f"(backend {self.backend!r})"
            )

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dictionary of this report."""
        return {
            "backend": self.backend,
            "available": self.available,
            "reason": self.reason,
            "devices": [d.to_dict() for d in self.devices],
            "runtime": dict(self.runtime),
            "notes": list(self.notes),
            "pool_totals": dict(self.pool_totals),
            "limitation": self.limitation,
        }
