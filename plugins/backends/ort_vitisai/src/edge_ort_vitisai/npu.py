"""The Ryzen AI NPU as ONNX Runtime lists it, and the pool it draws from.

ORT's VitisAI factory pairs ``VitisAIExecutionProvider`` with AMD (vendor ``0x1022``)
hardware devices of type NPU, once its library is registered. The NPU has no memory of
its own: the buffers VitisAI allocates, its compiled model and the CPU share of a split
graph are all host memory, so the device draws from ``machine:ram``. Its integration is
what ORT's ``Discrete`` metadata says, and unknown when ORT says nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from edge_contracts.devices import (
    RAM_POOL,
    DeviceDescriptor,
    DeviceKind,
    ExecutionDomain,
    Integration,
)
from edge_ort.epdevices import EpDevice, EpLibrary

__all__ = ["VITISAI_LIBRARY", "npu_descriptor", "npu_descriptors", "npu_physical_id"]

#: The provider library inside a VitisAI build of ``onnxruntime``, registered before listing.
VITISAI_LIBRARY = EpLibrary(name="VitisAIExecutionProvider", stem="onnxruntime_providers_vitisai")


def npu_physical_id(device: EpDevice) -> str:
    """``npu-luid-<16 hex>`` when ORT reports a LUID, else ``npu-<vendor>-<device>`` ids."""
    luid = device.metadata.get("LUID", "")
    if luid.isdigit() and int(luid) < 2**64:
        return f"npu-luid-{int(luid):016x}"
    return f"npu-{device.vendor_id:04x}-{device.device_id:04x}"


def npu_descriptor(device: EpDevice, domain: ExecutionDomain) -> DeviceDescriptor:
    """One listed NPU as a device drawing from ``machine:ram``."""
    flag = device.metadata.get("Discrete")
    integration = {"0": Integration.INTEGRATED, "1": Integration.DISCRETE}.get(
        flag or "", Integration.UNKNOWN)
    name = (device.metadata.get("Description") or device.vendor or "npu").strip() or "npu"
    return DeviceDescriptor(physical_id=npu_physical_id(device), kind=DeviceKind.NPU,
                            name=name[:128], execution_domain=domain,
                            integration=integration, pools=(RAM_POOL,))


def npu_descriptors(devices: Iterable[EpDevice],
                    domain: ExecutionDomain) -> tuple[DeviceDescriptor, ...]:
    """Every listed NPU, once each."""
    seen: dict[str, DeviceDescriptor] = {}
    for device in devices:
        descriptor = npu_descriptor(device, domain)
        seen.setdefault(descriptor.physical_id, descriptor)
    return tuple(seen.values())
