"""Synthetic device topologies: the machine shapes edge-core must admit correctly.

Each builder returns a :class:`~edge_core.pools.Topology` for a machine that may not be the
one running the tests, so admission rules can be checked for every shape:

* integrated devices (CPU, iGPU, NPU on one SoC) all draw from ``machine:ram``;
* a discrete GPU draws from its own ``machine:vram:<physical-id>`` pool;
* with ``wsl=True`` the controller and its CPU workers live in WSL 2: the CPU draws from
  ``wsl:quota``, which lies within ``machine:ram``, so one allocation is held to both
  limits; Windows-side devices (iGPU, NPU through their Windows drivers) draw from
  ``machine:ram`` directly;
* what a synthetic machine would not report (the discrete GPU's package, bandwidth group
  and power domain) is left ``None`` so relationships with it stay unknown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from edge_contracts.devices import (
    RAM_POOL,
    WSL_QUOTA,
    DeviceDescriptor,
    DeviceKind,
    ExecutionDomain,
    Integration,
    vram_pool,
)
from edge_core.pools import Pool, Topology

__all__ = [
    "DGPU_ID",
    "SYNTHETIC_TOPOLOGIES",
    "synthetic_topology",
]

GiB = 1024**3
DGPU_ID = "pci-0000.01.00.0"
"""Physical id of the synthetic discrete GPU; its pool is ``machine:vram:pci-0000.01.00.0``."""

_SOC = "soc0"
_SOC_MEMORY = "soc0-lpddr"


def synthetic_topology(
    *,
    igpu: bool = False,
    npu: bool = False,
    dgpu: bool = False,
    wsl: bool = False,
    ram_bytes: int = 32 * GiB,
    vram_bytes: int = 8 * GiB,
    wsl_quota_bytes: int = 16 * GiB,
) -> Topology:
    """Build a machine with a CPU and any of an integrated GPU, an NPU and a discrete GPU.

    Args:
        igpu: add an integrated GPU on the CPU's SoC (shares ``machine:ram``).
        npu: add an integrated NPU on the CPU's SoC (shares ``machine:ram``).
        dgpu: add a discrete GPU with its own ``machine:vram:<id>`` pool.
        wsl: the controller runs in WSL 2; the CPU draws from ``wsl:quota``.
        ram_bytes: total of ``machine:ram``.
        vram_bytes: total of the discrete GPU's pool.
        wsl_quota_bytes: total of ``wsl:quota`` (only with ``wsl``).

    """
    domain = ExecutionDomain.WSL if wsl else ExecutionDomain.POSIX
    device_domain = ExecutionDomain.WINDOWS if wsl else ExecutionDomain.POSIX
    pools = [Pool(RAM_POOL, ram_bytes, observed_by="synthetic")]
    if wsl:
        pools.append(Pool(WSL_QUOTA, wsl_quota_bytes, within=RAM_POOL, observed_by="synthetic"))
    devices = [
        DeviceDescriptor(
            physical_id="cpu0",
            kind=DeviceKind.CPU,
            name="Synthetic SoC CPU",
            execution_domain=domain,
            integration=Integration.INTEGRATED,
            pools=(WSL_QUOTA if wsl else RAM_POOL,),
            package=_SOC,
            bandwidth_group=_SOC_MEMORY,
            power_domain=_SOC,
        )
    ]
    if igpu:
        devices.append(_integrated("igpu0", DeviceKind.GPU, "Synthetic iGPU", device_domain))
    if npu:
        devices.append(_integrated("npu0", DeviceKind.NPU, "Synthetic NPU", device_domain))
    if dgpu:
        pool = vram_pool(DGPU_ID)
        pools.append(Pool(pool, vram_bytes, observed_by="synthetic"))
        devices.append(
            DeviceDescriptor(
                physical_id=DGPU_ID,
                kind=DeviceKind.GPU,
                name="Synthetic discrete GPU",
                execution_domain=device_domain,
                integration=Integration.DISCRETE,
                pools=(pool,),
            )
        )
    return Topology(domain, devices, pools)


def _integrated(
    physical_id: str, kind: DeviceKind, name: str, domain: ExecutionDomain
) -> DeviceDescriptor:
    return DeviceDescriptor(
        physical_id=physical_id,
        kind=kind,
        name=name,
        execution_domain=domain,
        integration=Integration.INTEGRATED,
        pools=(RAM_POOL,),
        package=_SOC,
        bandwidth_group=_SOC_MEMORY,
        power_domain=_SOC,
    )


def _builder(igpu: bool, npu: bool, dgpu: bool) -> Callable[[], Topology]:
    def build() -> Topology:
        return synthetic_topology(igpu=igpu, npu=npu, dgpu=dgpu)

    return build


SYNTHETIC_TOPOLOGIES: Mapping[str, Callable[[], Topology]] = MappingProxyType(
    {
        "cpu": _builder(False, False, False),
        "cpu+igpu": _builder(True, False, False),
        "cpu+npu": _builder(False, True, False),
        "cpu+igpu+npu": _builder(True, True, False),
        "cpu+dgpu": _builder(False, False, True),
        "cpu+igpu+dgpu": _builder(True, False, True),
        "cpu+npu+dgpu": _builder(False, True, True),
        "cpu+igpu+npu+dgpu": _builder(True, True, True),
    }
)
"""Every machine shape by name: CPU only, CPU+iGPU, CPU+NPU and CPU+iGPU+NPU, each also with
a discrete GPU."""
