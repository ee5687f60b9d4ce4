"""Memory pools, device topologies and what the host itself can observe about them.

A *pool* is a physical memory limit that allocations are charged against: host RAM
(``machine:ram``), one discrete GPU's memory (``machine:vram:<physical-id>``), the WSL
virtual machine's memory cap (``wsl:quota``), or any pool a backend declares. A pool may lie
*within* another: every byte allocated in the WSL VM also occupies host RAM, so
``wsl:quota`` lies within ``machine:ram``, and one allocation there is checked against two
limits. That nesting is the only way one allocation charges two pools; a demand is never
declared twice.

A :class:`Topology` ties devices (``edge_contracts.devices.DeviceDescriptor``) to the pools
they draw from. What is not known stays unknown: a pool's total may be ``None``, and
relationships between devices (:meth:`Topology.shares_memory`, :meth:`Topology.related`)
answer ``None`` rather than guess.

:func:`probe_host` is the cheap, import-light observation that ``edge probe`` reports: the
host's execution domain and its RAM pool with the total psutil sees.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs
import psutil

from edge_contracts.devices import (
    RAM_POOL,
    WSL_QUOTA,
    DeviceDescriptor,
    DeviceKind,
    ExecutionDomain,
    Integration,
    validate_pool_name,
)
from edge_contracts.errors import ContractError
from edge_core.errors import EdgeError

__all__ = [
    "HostProbe",
    "Pool",
    "Topology",
    "TopologyInvalid",
    "charge_paths",
    "detect_execution_domain",
    "host_cpu",
    "observe_host_pools",
    "probe_host",
]


class TopologyInvalid(EdgeError, ValueError):
    """A pool or topology is inconsistent (unknown enclosing pool, cycle, undeclared pool)."""

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        super().__init__(f"{field}: {reason}: {value!r}")


def _check_pool_name(_instance: object, _attribute: attrs.Attribute[str], value: str) -> None:
    try:
        validate_pool_name(value, "pool.name")
    except ContractError as exc:
        raise TopologyInvalid("pool.name", exc.reason, value) from None


def _check_total(_instance: object, _attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TopologyInvalid("pool.total", "must be a non-negative integer or None", value)


@attrs.frozen
class Pool:
    """One memory pool and what is known about its size.

    ``within`` names the enclosing pool: every byte charged to this pool is charged to the
    enclosing one too (``wsl:quota`` within ``machine:ram``).
    """

    name: str = attrs.field(validator=_check_pool_name)
    """Pool name (``machine:ram``, ``machine:vram:<physical-id>``, ``wsl:quota``, ...)."""
    total: int | None = attrs.field(default=None, validator=_check_total)
    """Observed total in bytes; ``None`` when it cannot be observed."""
    within: str | None = None
    """Enclosing pool whose limit also applies to every allocation here, if any."""
    observed_by: str = "declared"
    """Where ``total`` came from: ``psutil``, ``synthetic``, a plugin's name, ``declared``."""

    def to_json(self) -> dict[str, Any]:
        """Return the JSON-ready form."""
        return {
            "name": self.name,
            "total": self.total,
            "within": self.within,
            "observed_by": self.observed_by,
        }


def charge_paths(pools: Iterable[Pool]) -> dict[str, tuple[str, ...]]:
    """Map each pool to itself followed by every pool enclosing it, innermost first.

    Raises:
        TopologyInvalid: a pool is declared twice, encloses an undeclared pool, or pools
            enclose each other in a cycle.

    """
    by_name: dict[str, Pool] = {}
    for index, pool in enumerate(pools):
        if pool.name in by_name:
            raise TopologyInvalid(f"pools[{index}].name", "duplicate pool", pool.name)
        by_name[pool.name] = pool
    paths: dict[str, tuple[str, ...]] = {}
    for index, pool in enumerate(by_name.values()):
        path = [pool.name]
        current = pool.within
        while current is not None:
            if current not in by_name:
                raise TopologyInvalid(
                    f"pools[{index}].within", "names a pool that is not declared", current
                )
            if current in path:
                raise TopologyInvalid(
                    f"pools[{index}].within", "pools enclose each other in a cycle", path
                )
            path.append(current)
            current = by_name[current].within
        paths[pool.name] = tuple(path)
    return paths


def _pool_tuple(value: Iterable[Pool]) -> tuple[Pool, ...]:
    return tuple(value)


def _device_tuple(value: Iterable[DeviceDescriptor]) -> tuple[DeviceDescriptor, ...]:
    return tuple(value)


@attrs.frozen
class Topology:
    """Devices, the pools they draw from, and the execution domain of the controller."""

    domain: ExecutionDomain
    """Execution domain of the controller process (posix, wsl, windows)."""
    devices: tuple[DeviceDescriptor, ...] = attrs.field(converter=_device_tuple)
    """Every known device."""
    pools: tuple[Pool, ...] = attrs.field(converter=_pool_tuple)
    """Every known pool; each device's pools must be among them."""
    _paths: Mapping[str, tuple[str, ...]] = attrs.field(
        init=False, repr=False, eq=False, hash=False, factory=dict
    )

    def __attrs_post_init__(self) -> None:
        paths = charge_paths(self.pools)
        ids: set[str] = set()
        for index, device in enumerate(self.devices):
            if device.physical_id in ids:
                raise TopologyInvalid(
                    f"devices[{index}].physical_id", "duplicate device", device.physical_id
                )
            ids.add(device.physical_id)
            for pool_name in device.pools:
                if pool_name not in paths:
                    raise TopologyInvalid(
                        f"devices[{index}].pools", "draws from an undeclared pool", pool_name
                    )
        object.__setattr__(self, "_paths", paths)

    def pool(self, name: str) -> Pool:
        """Return the pool called ``name``; ``KeyError`` when it is not declared."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    def device(self, physical_id: str) -> DeviceDescriptor:
        """Return the device with ``physical_id``; ``KeyError`` when it is not known."""
        for device in self.devices:
            if device.physical_id == physical_id:
                return device
        raise KeyError(physical_id)

    def charge_path(self, pool_name: str) -> tuple[str, ...]:
        """Return ``pool_name`` followed by every pool enclosing it, innermost first.

        One byte allocated in ``pool_name`` is charged to each pool of the path.
        """
        return self._paths[pool_name]

    def devices_drawing_from(self, pool_name: str) -> tuple[DeviceDescriptor, ...]:
        """Return the devices that draw from ``pool_name`` directly or via an enclosed pool."""
        return tuple(
            device
            for device in self.devices
            if any(pool_name in self.charge_path(own) for own in device.pools)
        )

    def shares_memory(self, first: str, second: str) -> bool | None:
        """Whether two devices draw from a common pool; ``None`` when that is not known.

        A shared pool proves sharing. Without one, the answer is ``False`` only when both
        devices' integration is known; otherwise the relationship stays unknown.
        """
        a, b = self.device(first), self.device(second)
        reach_a = {name for own in a.pools for name in self.charge_path(own)}
        reach_b = {name for own in b.pools for name in self.charge_path(own)}
        if reach_a & reach_b:
            return True
        if Integration.UNKNOWN in (a.integration, b.integration):
            return None
        return False

    def related(
        self, first: str, second: str, by: Literal["package", "bandwidth_group", "power_domain"]
    ) -> bool | None:
        """Whether two devices share a package, bandwidth group or power domain.

        ``None`` when either device does not know its own value: unknown stays unknown.
        """
        left = getattr(self.device(first), by)
        right = getattr(self.device(second), by)
        if left is None or right is None:
            return None
        return bool(left == right)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON-ready form used by ``edge probe --json`` and execution plans."""
        return {
            "domain": self.domain.value,
            "devices": [device.to_dict() for device in self.devices],
            "pools": [pool.to_json() for pool in self.pools],
        }


def detect_execution_domain(
    *,
    platform_name: str | None = None,
    kernel_release: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ExecutionDomain:
    """Return the execution domain of this process: ``windows``, ``wsl`` or ``posix``.

    WSL is recognised by the variables it sets in every process (``WSL_DISTRO_NAME``,
    ``WSL_INTEROP``) or by its kernel release (``...-microsoft-standard-WSL2``). The
    arguments default to this process's ``sys.platform``, kernel release and environment;
    tests pass them to check each rule.
    """
    name = sys.platform if platform_name is None else platform_name
    if name in ("win32", "cygwin"):
        return ExecutionDomain.WINDOWS
    if not name.startswith("linux"):
        return ExecutionDomain.POSIX
    env = os.environ if environ is None else environ
    release = platform.release() if kernel_release is None else kernel_release
    if "WSL_DISTRO_NAME" in env or "WSL_INTEROP" in env or "microsoft" in release.lower():
        return ExecutionDomain.WSL
    return ExecutionDomain.POSIX


def observe_host_pools(
    domain: ExecutionDomain | None = None, *, ram_total: int | None = None
) -> tuple[Pool, ...]:
    """Return the pools the host can observe, with totals from psutil.

    On a POSIX or Windows host: ``machine:ram`` with the physical memory total. Inside
    WSL, psutil sees the VM, so its total is the ``wsl:quota`` pool, which lies within
    ``machine:ram``; the host's RAM cannot be seen from inside the VM and stays unknown.
    ``ram_total`` overrides the psutil reading (tests).
    """
    current = detect_execution_domain() if domain is None else domain
    total = psutil.virtual_memory().total if ram_total is None else ram_total
    source = "psutil" if ram_total is None else "declared"
    if current is ExecutionDomain.WSL:
        return (
            Pool(RAM_POOL, None, observed_by="unobservable from WSL"),
            Pool(WSL_QUOTA, total, within=RAM_POOL, observed_by=source),
        )
    return (Pool(RAM_POOL, total, observed_by=source),)


def _processor() -> str:
    """``platform.processor()`` without a child process where that is all it would run.

    On Linux it runs ``uname -p`` (a process started on every probe of a CPU backend,
    so on every open), whose answer on the common distributions is
    ``platform.machine()``'s or ``unknown`` (then ``""``; a few give the CPU's model
    name); ``""`` is returned there instead: the caller's fallback names the machine.
    """
    if platform.system() == "Linux":  # os.uname(), no child process
        return ""
    return platform.processor()


def host_cpu(domain: ExecutionDomain | None = None) -> DeviceDescriptor:
    """Describe this host's CPU as a device drawing from the host-visible RAM pool."""
    current = detect_execution_domain() if domain is None else domain
    name = (_processor() or platform.machine() or "cpu").strip() or "cpu"
    return DeviceDescriptor(
        physical_id="cpu0",
        kind=DeviceKind.CPU,
        name=name[:128],
        execution_domain=current,
        integration=Integration.INTEGRATED,
        pools=(WSL_QUOTA if current is ExecutionDomain.WSL else RAM_POOL,),
    )


@attrs.frozen
class HostProbe:
    """What the controller observes about its own host, without importing any runtime."""

    domain: ExecutionDomain
    """Execution domain of the controller."""
    pools: tuple[Pool, ...] = attrs.field(converter=_pool_tuple)
    """Pools with observed totals."""
    cpu: DeviceDescriptor
    """The host CPU."""
    logical_cpus: int | None
    """Logical CPU count, when known."""

    def topology(self, extra_devices: Iterable[DeviceDescriptor] = ()) -> Topology:
        """Return the host topology, optionally with devices that plugins probed."""
        return Topology(self.domain, (self.cpu, *extra_devices), self.pools)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON-ready form for ``edge probe --json``."""
        return {
            "domain": self.domain.value,
            "logical_cpus": self.logical_cpus,
            "cpu": self.cpu.to_dict(),
            "pools": [pool.to_json() for pool in self.pools],
        }


def probe_host() -> HostProbe:
    """Observe the host: execution domain, RAM pool(s) with psutil totals, and its CPU."""
    domain = detect_execution_domain()
    return HostProbe(
        domain=domain,
        pools=observe_host_pools(domain),
        cpu=host_cpu(domain),
        logical_cpus=psutil.cpu_count(logical=True),
    )
