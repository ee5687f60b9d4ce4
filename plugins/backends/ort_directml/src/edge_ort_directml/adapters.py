"""DirectML adapters as ONNX Runtime lists them, and the memory pool each one draws from.

ORT's Windows device discovery fills an ``OrtHardwareDevice``'s metadata from DXGI and
DXCore: ``LUID`` (decimal, ``HighPart << 32 | LowPart``), ``Description``,
``DxgiAdapterNumber`` (the index DirectML's ``device_id`` option takes),
``DxgiVideoMemory`` (dedicated video memory, ``"<n> MB"``), ``DxgiHighPerformanceIndex`` and
``Discrete`` (``"1"`` / ``"0"``). :meth:`DmlAdapter.from_ep_device` reads exactly those and
leaves what is missing unknown: an adapter whose ``Discrete`` is not reported has unknown
integration, and no pool is guessed for it.

Pools: an integrated GPU shares host memory, so it draws from ``machine:ram``; a discrete
one draws from its own ``machine:vram:<physical-id>``, whose total is the dedicated video
memory DXGI reports. The physical id is ``dxgi-luid-<16 hex digits>``; a LUID is stable
until the next reboot, and the ledger is rebuilt from a fresh probe every time a pipeline
opens.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import attrs

from edge_contracts.devices import (
    RAM_POOL,
    DeviceDescriptor,
    DeviceKind,
    ExecutionDomain,
    Integration,
    vram_pool,
)
from edge_contracts.error_copies import whole_reduction
from edge_ort.epdevices import EpDevice, EpDevicesInvalid

__all__ = [
    "DmlAdapter",
    "LuidInvalid",
    "adapters_from",
    "parse_luid",
    "parse_video_memory",
    "pool_totals",
]

_MIB = 1024 * 1024
_MEMORY = re.compile(r"^\s*(\d+)\s*MB\s*$")
_LUID_MAX = 2**64 - 1


class LuidInvalid(ValueError):
    """A LUID is not decimal or ``0x``-hex digits, or lies outside ``[0, 2**64)``."""

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        super().__init__(f"{field}: {reason}: {value!r}")

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes: ``copy.copy`` keeps the error whole."""
        return whole_reduction(self)


def parse_luid(text: str, field: str = "LUID") -> int:
    """A LUID written in decimal (as ORT reports it) or ``0x`` hexadecimal, as an integer.

    Raises:
        LuidInvalid: naming ``field``, the limit and the value.
    """
    if not isinstance(text, str):
        raise LuidInvalid(field, "must be a string of decimal or 0x-hex digits", text)
    stripped = text.strip().lower()
    try:
        value = int(stripped, 16) if stripped.startswith("0x") else int(stripped, 10)
    except ValueError:
        raise LuidInvalid(field, "must be decimal or 0x-hex digits", text) from None
    if not 0 <= value <= _LUID_MAX:
        raise LuidInvalid(field, "must be in [0, 2**64)", text)
    return value


def parse_video_memory(text: str, field: str = "DxgiVideoMemory") -> int:
    """Bytes from DXGI's dedicated video memory as ORT writes it (``"8042 MB"``, MiB).

    Raises:
        EpDevicesInvalid: when ``text`` is not ``<digits> MB``.
    """
    match = _MEMORY.match(text)
    if match is None:
        raise EpDevicesInvalid(field, "must be '<integer> MB'", text)
    return int(match.group(1)) * _MIB


def _integration(metadata: Mapping[str, str], field: str) -> Integration:
    flag = metadata.get("Discrete")
    if flag is None:
        return Integration.UNKNOWN
    if flag not in ("0", "1"):
        raise EpDevicesInvalid(f"{field}.Discrete", "must be '0' or '1'", flag)
    return Integration.DISCRETE if flag == "1" else Integration.INTEGRATED


def _index(device: EpDevice, field: str) -> int:
    text = device.ep_options.get("device_id", device.metadata.get("DxgiAdapterNumber"))
    if text is None or not text.isdigit():
        raise EpDevicesInvalid(f"{field}.DxgiAdapterNumber",
                               "an adapter needs a non-negative DXGI adapter number", text)
    return int(text)


@attrs.frozen
class DmlAdapter:
    """One DirectX 12 adapter DirectML can run on.

    Attributes:
        index: The DXGI adapter number (DirectML's ``device_id`` provider option).
        luid: The adapter's LUID, when reported.
        description: The adapter's name as DXGI or SetupAPI gives it.
        vendor: The vendor's name.
        vendor_id: PCI vendor id.
        device_id: PCI device id.
        integration: Integrated, discrete, or unknown when ORT did not report it.
        dedicated_bytes: Dedicated video memory, when reported.
    """

    index: int
    luid: int | None
    description: str
    vendor: str
    vendor_id: int
    device_id: int
    integration: Integration
    dedicated_bytes: int | None

    @classmethod
    def from_ep_device(cls, device: EpDevice, field: str = "adapter") -> DmlAdapter:
        """Read one ``get_ep_devices()`` entry of the DirectML provider.

        Raises:
            EpDevicesInvalid: malformed metadata (naming the key and the value).
        """
        metadata = device.metadata
        luid = None
        if "LUID" in metadata:
            try:
                luid = parse_luid(metadata["LUID"], f"{field}.LUID")
            except LuidInvalid as exc:
                raise EpDevicesInvalid(exc.field, exc.reason, exc.value) from None
        dedicated = None
        if "DxgiVideoMemory" in metadata:
            dedicated = parse_video_memory(metadata["DxgiVideoMemory"],
                                           f"{field}.DxgiVideoMemory")
        description = (metadata.get("Description") or device.vendor or "gpu").strip() or "gpu"
        return cls(index=_index(device, field), luid=luid, description=description[:128],
                   vendor=device.vendor, vendor_id=device.vendor_id, device_id=device.device_id,
                   integration=_integration(metadata, field), dedicated_bytes=dedicated)

    @property
    def physical_id(self) -> str:
        """``dxgi-luid-<16 hex>``; ``dxgi-adapter-<n>`` when no LUID was reported."""
        if self.luid is not None:
            return f"dxgi-luid-{self.luid:016x}"
        return f"dxgi-adapter-{self.index}"

    @property
    def pool(self) -> str | None:
        """``machine:ram`` (integrated), ``machine:vram:<id>`` (discrete), ``None`` (unknown)."""
        if self.integration is Integration.INTEGRATED:
            return RAM_POOL
        if self.integration is Integration.DISCRETE:
            return vram_pool(self.physical_id)
        return None

    def descriptor(self, domain: ExecutionDomain) -> DeviceDescriptor:
        """This adapter as a device; unknown integration lists both pools it may draw from."""
        pools = (self.pool,) if self.pool else (RAM_POOL, vram_pool(self.physical_id))
        return DeviceDescriptor(physical_id=self.physical_id, kind=DeviceKind.GPU,
                                name=self.description, execution_domain=domain,
                                integration=self.integration, pools=pools)

    def to_json(self) -> dict[str, object]:
        """JSON-ready facts for probe notes and execution plans."""
        return {"index": self.index, "luid": self.luid, "physical_id": self.physical_id,
                "description": self.description, "vendor": self.vendor,
                "vendor_id": self.vendor_id, "device_id": self.device_id,
                "integration": self.integration.value, "dedicated_bytes": self.dedicated_bytes,
                "pool": self.pool}


def adapters_from(devices: Iterable[EpDevice]) -> tuple[DmlAdapter, ...]:
    """Adapters from the DirectML provider's ``get_ep_devices()`` entries, by index."""
    adapters = [DmlAdapter.from_ep_device(d, f"adapters[{i}]") for i, d in enumerate(devices)]
    return tuple(sorted(adapters, key=lambda a: a.index))


def pool_totals(adapters: Iterable[DmlAdapter]) -> dict[str, int | None]:
    """``machine:vram:<id>`` → dedicated bytes for every discrete adapter."""
    return {a.pool: a.dedicated_bytes for a in adapters
            if a.integration is Integration.DISCRETE and a.pool is not None}
