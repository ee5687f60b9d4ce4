"""What an ``ort-directml`` stage reserves, per pool, on the adapter it runs on.

An integrated GPU's allocations are host memory: everything is charged to ``machine:ram``.
A discrete GPU holds the weights in its own memory: the graph's bytes go to
``machine:vram:<id>`` and the worker's host side to ``machine:ram``. The factors are
estimates, not measurements — no DirectML device exists where this was written; declared
demands replace them, and must then name the adapter's pool.
"""

from __future__ import annotations

from edge_contracts.devices import RAM_POOL
from edge_core.stage import StageContext
from edge_ort.options import BASE_RAM_BYTES
from edge_ort.vendor import StageRefused
from edge_ort_directml.adapters import DmlAdapter

__all__ = ["DEVICE_CONTEXT_BYTES", "bundle_bytes", "dml_demands"]

_MIB = 1024 * 1024
#: A Direct3D 12 device, DirectML's command queues and its upload heaps (estimate).
DEVICE_CONTEXT_BYTES = 256 * _MIB
#: Weights resident on the adapter plus DirectML's intermediate buffers (estimate).
DEVICE_FACTOR = 2
#: The host copy while loading plus ORT's CPU-side session (estimate).
HOST_FACTOR = 2


def bundle_bytes(stage: StageContext) -> int:
    """Bytes of every file in the stage's bundle (0 without one)."""
    if stage.manifest_dir is None or not stage.manifest_dir.is_dir():
        return 0
    return sum(p.stat().st_size for p in stage.manifest_dir.rglob("*") if p.is_file())


def dml_demands(stage: StageContext, adapter: DmlAdapter) -> dict[str, int]:
    """Pool → bytes for ``stage`` on ``adapter``.

    Raises:
        StageRefused: declared demands that leave out the adapter's pool, or an adapter
            whose pool is unknown.
    """
    pool = adapter.pool
    if pool is None:
        raise StageRefused(f"stages[{stage.stage_id}].backend.options.integration",
                           f"adapter {adapter.index} has no known pool", "auto")
    if stage.declared_demands:
        declared = dict(stage.declared_demands)
        if pool not in declared:
            raise StageRefused(f"stages[{stage.stage_id}].resources.demands",
                               f"adapter {adapter.index} ({adapter.description}) draws from "
                               f"{pool}; declared demands must name it", declared)
        return declared
    size = bundle_bytes(stage)
    if pool == RAM_POOL:
        return {RAM_POOL: BASE_RAM_BYTES + (HOST_FACTOR + DEVICE_FACTOR) * size
                + DEVICE_CONTEXT_BYTES}
    return {RAM_POOL: BASE_RAM_BYTES + HOST_FACTOR * size,
            pool: DEVICE_FACTOR * size + DEVICE_CONTEXT_BYTES}
