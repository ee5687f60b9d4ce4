"""Whether a vendor build of ONNX Runtime is usable in a route's interpreter, and where.

A vendor ORT backend (DirectML, VitisAI) needs three things, checked in this order:

1. the route's execution domain is the one the vendor build runs in (Windows);
2. the route's interpreter has the vendor distribution (``onnxruntime-directml`` ...), asked
   in a subprocess, never in the controller
   (:func:`edge_ort.distributions.installed_distributions`);
3. ORT in that interpreter lists the provider and ``get_ep_devices()`` pairs it with at least
   one device of the right kind (:func:`edge_ort.epdevices.query_ep_devices`).

:func:`assess` turns these observations into a :class:`VendorProbe` — pure, so recorded
listings can be judged exactly as live ones are; :func:`probe_vendor` makes the
observations. Every failed check becomes one precise sentence of the probe's reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from edge_contracts.devices import ExecutionDomain
from edge_core.errors import BackendUnavailable
from edge_ort.distributions import conflict_note, installed_distributions
from edge_ort.epdevices import EpDevice, EpDevices, EpLibrary, query_ep_devices

__all__ = [
    "RouteUnavailable",
    "StageRefused",
    "VendorBackend",
    "VendorProbe",
    "assess",
    "check_stage_target",
    "clear_probe_cache",
    "probe_vendor",
    "recorded_prober",
    "route_interpreter",
    "with_default_route",
]


class RouteUnavailable(BackendUnavailable):
    """The stage's route cannot run the vendor provider; refused before any worker starts."""

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        super().__init__(f"{field}: {reason}: {value!r}")


class StageRefused(BackendUnavailable):
    """A stage's settings contradict what the backend or its devices can do."""

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        super().__init__(f"{field}: {reason}: {value!r}")


@attrs.frozen
class VendorBackend:
    """What a vendor ORT backend requires of the interpreter it runs in.

    Attributes:
        backend: The backend name (``ort-directml``).
        provider: The execution provider, spelled as ONNX Runtime lists it.
        distribution: The PyPI distribution that provides it (``onnxruntime-directml``).
        device_type: The ``OrtHardwareDeviceType`` the provider must be paired with.
        interpreter_env: Environment variable naming the vendor interpreter that probes
            and routeless stages use (default: the controller's own interpreter).
        domain: The execution domain the vendor build runs in.
        libraries: EP libraries inside ``onnxruntime`` to register before listing devices.
        probe_env_names: Names (or ``PREFIX*``) the probe subprocesses take from the
            controller's environment besides the probe allowlist
            (:mod:`edge_core.host.probe_process`); nothing else of it reaches them.
    """

    backend: str
    provider: str
    distribution: str
    device_type: str
    interpreter_env: str
    domain: ExecutionDomain = ExecutionDomain.WINDOWS
    libraries: tuple[EpLibrary, ...] = ()
    probe_env_names: tuple[str, ...] = ()

    def default_interpreter(self, env: Mapping[str, str] | None = None) -> str:
        """The interpreter named by :attr:`interpreter_env`, else the controller's."""
        env = os.environ if env is None else env
        return env.get(self.interpreter_env) or sys.executable


@attrs.frozen
class VendorProbe:
    """The three checks' observations for one interpreter, and what failed.

    Attributes:
        backend: The requirement judged.
        interpreter: The interpreter asked.
        domain: The route's execution domain.
        distributions: ORT distributions installed there (name → version), ``None`` when
            the interpreter could not be asked.
        listing: What ORT listed there; ``None`` when earlier checks failed.
        problems: One sentence per failed check, in check order.
        notes: Observations that do not make the backend unavailable.
    """

    backend: VendorBackend
    interpreter: str
    domain: ExecutionDomain
    distributions: Mapping[str, str] | None
    listing: EpDevices | None
    problems: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def available(self) -> bool:
        """True when every check passed."""
        return not self.problems

    @property
    def reason(self) -> str | None:
        """The failed checks joined, or ``None`` when available."""
        return "; ".join(self.problems) if self.problems else None

    def devices(self) -> tuple[EpDevice, ...]:
        """The devices ORT pairs with the provider (empty unless listed)."""
        if self.listing is None:
            return ()
        return self.listing.for_provider(self.backend.provider, self.backend.device_type)

    def runtime(self) -> dict[str, str]:
        """Versions for the probe report: distributions plus the listed ORT version."""
        found = dict(self.distributions or {})
        if self.listing is not None and self.listing.onnxruntime:
            found["onnxruntime (imported)"] = self.listing.onnxruntime
        return found


def _listing_problems(backend: VendorBackend, listing: EpDevices) -> list[str]:
    where = listing.interpreter
    if listing.error:
        return [f"ONNX Runtime in {where} could not list devices: {listing.error}"]
    version = f"onnxruntime {listing.onnxruntime}"
    if backend.provider not in listing.available_providers:
        return [f"{version} in {where} does not list {backend.provider} (it lists: "
                f"{list(listing.available_providers)})"]
    if listing.devices is None:
        return [f"{version} in {where} has no get_ep_devices(), so no "
                f"{backend.device_type} can be listed (ONNX Runtime >= 1.22 has it)"]
    if not listing.for_provider(backend.provider, backend.device_type):
        seen = [d.label() for d in listing.devices]
        failed = [f"{r.name}: {r.error}" for r in listing.libraries if r.error]
        return [f"get_ep_devices() in {where} pairs no {backend.device_type} with "
                f"{backend.provider} (it reports: {seen})"
                + (f"; library registration: {failed}" if failed else "")]
    return []


def assess(backend: VendorBackend, interpreter: str, domain: ExecutionDomain,
           distributions: Mapping[str, str] | None, listing: EpDevices | None,
           distribution_error: str | None = None) -> VendorProbe:
    """Judge observations of one interpreter against ``backend``'s requirements.

    Args:
        backend: The requirement.
        interpreter: The interpreter observed.
        domain: The route's execution domain.
        distributions: ORT distributions found there, or ``None`` when asking failed.
        listing: The device listing, or ``None`` when it was not made.
        distribution_error: Why the distributions could not be asked, if so.
    """
    problems: list[str] = []
    notes: list[str] = []
    if domain is not backend.domain:
        problems.append(f"{backend.backend} runs only in the {backend.domain.value} execution "
                        f"domain ({backend.distribution} has {backend.domain.value} wheels "
                        f"only): the route's domain is {domain.value}")
    if distributions is None:
        problems.append(f"cannot ask {interpreter} for its onnxruntime distributions: "
                        f"{distribution_error or 'unknown error'}")
    elif backend.distribution not in distributions:
        found = ", ".join(f"{n} {v}" for n, v in sorted(distributions.items())) or "none"
        problems.append(f"{backend.distribution} is not installed in {interpreter} "
                        f"(onnxruntime distributions there: {found})")
    else:
        note = conflict_note(dict(distributions), interpreter)
        if note:
            notes.append(note)
    if listing is not None:
        problems.extend(_listing_problems(backend, listing))
    elif problems:
        problems.append(f"no {backend.device_type} was listed: get_ep_devices() is asked only "
                        "once the checks above pass")
    return VendorProbe(backend=backend, interpreter=interpreter, domain=domain,
                       distributions=distributions, listing=listing,
                       problems=tuple(problems), notes=tuple(notes))


_CACHE: dict[tuple[Any, ...], VendorProbe] = {}
_CACHE_LOCK = threading.Lock()


def clear_probe_cache() -> None:
    """Forget every cached :func:`probe_vendor` answer."""
    with _CACHE_LOCK:
        _CACHE.clear()


def probe_vendor(backend: VendorBackend, interpreter: str | None = None,
                 domain: ExecutionDomain | None = None, *, refresh: bool = False,
                 timeout_s: float = 9.0) -> VendorProbe:
    """Observe ``interpreter`` (default: the backend's) and :func:`assess` it.

    ``timeout_s`` bounds both subprocesses together (half each), inside the runtime's
    10 s bound on a probe hook, so a hanging interpreter yields a reason, not a timeout.
    Answers are cached per (backend, interpreter, domain) for the controller's lifetime —
    devices and installed distributions do not change under a running pipeline;
    ``refresh`` asks again (loading does).
    """
    from edge_core.host.routes import controller_domain

    interpreter = interpreter or backend.default_interpreter()
    domain = domain or controller_domain()
    key = (backend, interpreter, domain)
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
    if cached is not None and not refresh:
        return cached
    distributions: dict[str, str] | None = None
    error = None
    try:
        distributions = installed_distributions(interpreter, timeout_s=timeout_s / 2,
                                                env_names=backend.probe_env_names)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    listing = None
    if domain is backend.domain and distributions and backend.distribution in distributions:
        listing = query_ep_devices(interpreter, backend.libraries, timeout_s=timeout_s / 2,
                                   env_names=backend.probe_env_names)
    probe = assess(backend, interpreter, domain, distributions, listing, error)
    with _CACHE_LOCK:
        _CACHE[key] = probe
    return probe


def route_interpreter(stage: Any, backend: VendorBackend) -> tuple[str, ExecutionDomain]:
    """The interpreter and domain a stage's worker would run in.

    The stage's own route when it has one, else the backend's default interpreter in the
    controller's domain.
    """
    from edge_core.host.routes import controller_domain

    route = getattr(stage, "route", None)
    if route is not None:
        domain = ExecutionDomain(route.os_domain) if route.os_domain else controller_domain()
        return str(route.interpreter), domain
    return backend.default_interpreter(), controller_domain()


def recorded_prober(
    backend: VendorBackend, interpreter: str, domain: ExecutionDomain,
    distributions: Mapping[str, str], listing: EpDevices,
) -> Callable[[str | None, ExecutionDomain | None, bool], VendorProbe]:
    """A prober judging recorded observations exactly as a live probe judges live ones.

    For a vendor plugin's ``prober`` argument (tests, offline qualification). Every
    interpreter it is asked about is reported as ``interpreter`` on ``domain``.
    """

    def prober(asked: str | None, _domain: ExecutionDomain | None,
               _refresh: bool) -> VendorProbe:
        return assess(backend, asked or interpreter, domain, distributions, listing)

    return prober


def check_stage_target(stage: Any, provider: str) -> None:
    """Refuse a stage whose placement names a provider other than the backend's.

    Raises:
        StageRefused: at ``stages[<id>].placement.target``.
    """
    target = stage.placement.target
    if target is not None and target != provider:
        raise StageRefused(f"stages[{stage.stage_id}].placement.target",
                           f"backend {stage.backend!r} places work on {provider} only", target)


def with_default_route(stage: Any, backend: VendorBackend) -> Any:
    """The stage with a route to the backend's vendor interpreter, when it has none.

    Only when :attr:`VendorBackend.interpreter_env` names an interpreter: the worker then
    runs where the probe looked.
    """
    interpreter = os.environ.get(backend.interpreter_env)
    if stage.route is not None or not interpreter:
        return stage
    from edge_core.config import RouteConfig

    return attrs.evolve(stage, route=RouteConfig(name=backend.backend, interpreter=interpreter))
