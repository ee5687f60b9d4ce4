"""Device descriptors and the names of the memory pools devices draw from.

A pool name is ``namespace:name[:part...]`` where each segment is made of
``[A-Za-z0-9._-]``: ``machine:ram`` (host RAM), ``machine:vram:<physical-id>`` (one
discrete GPU's memory), ``wsl:quota`` (the WSL VM's memory cap) and any other pool a
backend declares. What is not known about a device stays ``unknown``; nothing is
guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from edge_contracts.errors import InvalidValue
from edge_contracts.validation import (
    check_keys,
    parse_enum,
    rebase,
    require_id,
    require_list,
)

__all__ = [
    "MAX_POOLS",
    "RAM_POOL",
    "WSL_QUOTA",
    "DeviceDescriptor",
    "DeviceKind",
    "ExecutionDomain",
    "Integration",
    "validate_physical_id",
    "validate_pool_name",
    "vram_pool",
]

RAM_POOL = "machine:ram"
"""The pool of the machine's host RAM."""

WSL_QUOTA = "wsl:quota"
"""The pool of the WSL virtual machine's memory cap."""

MAX_POOLS = 16
"""Most pools one device may draw from."""

_SEGMENT = r"[A-Za-z0-9._-]+"
_POOL = re.compile(rf"{_SEGMENT}(?::{_SEGMENT})+")
_PHYSICAL_ID = re.compile(rf"{_SEGMENT}(?::{_SEGMENT})*")


class DeviceKind(StrEnum):
    """What kind of processor a device is."""

    CPU = "cpu"
    GPU = "gpu"
    NPU = "npu"


class ExecutionDomain(StrEnum):
    """The operating-system domain a device is driven from."""

    POSIX = "posix"
    WINDOWS = "windows"
    WSL = "wsl"
    UNKNOWN = "unknown"


class Integration(StrEnum):
    """Whether a device shares the host's memory (integrated) or has its own (discrete)."""

    INTEGRATED = "integrated"
    DISCRETE = "discrete"
    UNKNOWN = "unknown"


def validate_pool_name(name: object, field: str = "pool") -> str:
    """Return ``name`` if it is ``segment(:segment)+`` of ``[A-Za-z0-9._-]``, <= 128 chars."""
    text = require_id(name, field)
    if _POOL.fullmatch(text) is None:
        raise InvalidValue(field, name, "must be namespace:name[:part...] of [A-Za-z0-9._-]")
    return text


def validate_physical_id(value: object, field: str = "device.physical_id") -> str:
    """Return ``value`` if it is a physical device id: ``[A-Za-z0-9._:-]``, <= 128 chars."""
    text = require_id(value, field)
    if _PHYSICAL_ID.fullmatch(text) is None:
        raise InvalidValue(field, value, "must be segments of [A-Za-z0-9._-] joined by ':'")
    return text


def vram_pool(physical_id: str) -> str:
    """Return the pool name of the dedicated memory of the device ``physical_id``."""
    return validate_pool_name(
        f"machine:vram:{validate_physical_id(physical_id, 'physical_id')}", "pool"
    )


@dataclass(frozen=True, slots=True)
class DeviceDescriptor:
    """One physical device and the pools it draws memory from.

    Attributes:
        physical_id: stable identity of the physical device (e.g. ``cpu0``,
            ``pci-0000.01.00.0``).
        kind: cpu, gpu or npu.
        name: human-readable name as reported by the system.
        execution_domain: the OS domain driving it.
        integration: integrated, discrete or unknown.
        pools: the memory pools it draws from; non-empty, unique, valid names.
        package: the physical package (socket/SoC) it sits on, when known.
        bandwidth_group: devices sharing a memory bus share this id, when known.
        power_domain: devices sharing a power budget share this id, when known.

    """

    physical_id: str
    kind: DeviceKind
    name: str
    execution_domain: ExecutionDomain
    integration: Integration
    pools: tuple[str, ...]
    package: str | None = None
    bandwidth_group: str | None = None
    power_domain: str | None = None

    def __post_init__(self) -> None:
        validate_physical_id(self.physical_id)
        set_ = object.__setattr__
        set_(self, "kind", parse_enum(DeviceKind, self.kind, "device.kind"))
        require_id(self.name, "device.name")
        set_(
            self,
            "execution_domain",
            parse_enum(ExecutionDomain, self.execution_domain, "device.execution_domain"),
        )
        set_(self, "integration", parse_enum(Integration, self.integration, "device.integration"))
        pools = require_list(self.pools, "device.pools", max_length=MAX_POOLS)
        if not pools:
            raise InvalidValue("device.pools", list(pools), "must name at least one pool")
        checked = tuple(
            validate_pool_name(pool, f"device.pools[{index}]") for index, pool in enumerate(pools)
        )
        if len(set(checked)) != len(checked):
            raise InvalidValue("device.pools", list(checked), "must not repeat a pool")
        set_(self, "pools", checked)
        for name in ("package", "bandwidth_group", "power_domain"):
            value = getattr(self, name)
            if value is not None:
                require_id(value, f"device.{name}")

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form."""
        return {
            "physical_id": self.physical_id,
            "kind": self.kind.value,
            "name": self.name,
            "execution_domain": self.execution_domain.value,
            "integration": self.integration.value,
            "pools": list(self.pools),
            "package": self.package,
            "bandwidth_group": self.bandwidth_group,
            "power_domain": self.power_domain,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "device") -> DeviceDescriptor:
        """Build from the JSON form; the optional identities may be omitted."""
        mapping: Any = check_keys(data, field, _REQUIRED, _OPTIONAL)
        try:
            return cls(**mapping)
        except InvalidValue as exc:
            raise rebase(exc, "device", field) from None


_REQUIRED = frozenset({"physical_id", "kind", "name", "execution_domain", "integration", "pools"})
_OPTIONAL = frozenset({"package", "bandwidth_group", "power_domain"})
