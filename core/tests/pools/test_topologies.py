"""The synthetic machine shapes: which devices share which pools, and what stays unknown."""

from __future__ import annotations

import json

import pytest

from edge_contracts.devices import (
    RAM_POOL,
    WSL_QUOTA,
    DeviceDescriptor,
    DeviceKind,
    ExecutionDomain,
    Integration,
    vram_pool,
)
from edge_core.pools import Pool, Topology, TopologyInvalid
from edge_core.topologies import DGPU_ID, SYNTHETIC_TOPOLOGIES, synthetic_topology

SHAPES = sorted(SYNTHETIC_TOPOLOGIES)


def test_all_eight_shapes_exist() -> None:
    assert set(SHAPES) == {
        "cpu",
        "cpu+igpu",
        "cpu+npu",
        "cpu+igpu+npu",
        "cpu+dgpu",
        "cpu+igpu+dgpu",
        "cpu+npu+dgpu",
        "cpu+igpu+npu+dgpu",
    }


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_has_exactly_the_devices_its_name_lists(shape: str) -> None:
    topology = SYNTHETIC_TOPOLOGIES[shape]()
    kinds = sorted(
        ("dgpu" if d.integration is Integration.DISCRETE else d.kind.value.replace("gpu", "igpu"))
        for d in topology.devices
    )
    assert kinds == sorted(shape.split("+"))


@pytest.mark.parametrize("shape", SHAPES)
def test_integrated_devices_share_machine_ram(shape: str) -> None:
    topology = SYNTHETIC_TOPOLOGIES[shape]()
    integrated = [d for d in topology.devices if d.integration is Integration.INTEGRATED]
    assert all(d.pools == (RAM_POOL,) for d in integrated)
    for device in integrated:
        assert topology.shares_memory("cpu0", device.physical_id) is True
        assert topology.related("cpu0", device.physical_id, "package") is True


@pytest.mark.parametrize("shape", [s for s in SHAPES if "dgpu" in s])
def test_a_discrete_gpu_has_its_own_vram_pool_and_shares_nothing(shape: str) -> None:
    topology = SYNTHETIC_TOPOLOGIES[shape]()
    dgpu = topology.device(DGPU_ID)
    assert dgpu.pools == (vram_pool(DGPU_ID),)
    assert topology.pool(vram_pool(DGPU_ID)).total == 8 * 1024**3
    assert topology.charge_path(vram_pool(DGPU_ID)) == (vram_pool(DGPU_ID),)
    assert topology.devices_drawing_from(vram_pool(DGPU_ID)) == (dgpu,)
    assert topology.shares_memory("cpu0", DGPU_ID) is False
    assert DGPU_ID not in {d.physical_id for d in topology.devices_drawing_from(RAM_POOL)}


@pytest.mark.parametrize("shape", [s for s in SHAPES if "dgpu" in s])
def test_what_the_discrete_gpu_does_not_report_stays_unknown(shape: str) -> None:
    topology = SYNTHETIC_TOPOLOGIES[shape]()
    for relation in ("package", "bandwidth_group", "power_domain"):
        assert topology.related("cpu0", DGPU_ID, relation) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_serialises_to_json(shape: str) -> None:
    data = SYNTHETIC_TOPOLOGIES[shape]().to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["domain"] == "posix"


def test_under_wsl_the_cpu_draws_from_the_quota_within_machine_ram() -> None:
    topology = synthetic_topology(igpu=True, dgpu=True, wsl=True)
    assert topology.domain is ExecutionDomain.WSL
    assert topology.device("cpu0").pools == (WSL_QUOTA,)
    assert topology.charge_path(WSL_QUOTA) == (WSL_QUOTA, RAM_POOL)
    assert topology.charge_path(RAM_POOL) == (RAM_POOL,)
    # The Windows-side iGPU and the WSL CPU hit the same physical RAM.
    assert topology.shares_memory("cpu0", "igpu0") is True
    assert topology.device("igpu0").execution_domain is ExecutionDomain.WINDOWS
    assert {d.physical_id for d in topology.devices_drawing_from(RAM_POOL)} == {"cpu0", "igpu0"}


def _device(physical_id: str, pools: tuple[str, ...], integration: Integration) -> DeviceDescriptor:
    return DeviceDescriptor(
        physical_id=physical_id,
        kind=DeviceKind.GPU,
        name=physical_id,
        execution_domain=ExecutionDomain.POSIX,
        integration=integration,
        pools=pools,
    )


def test_memory_sharing_of_devices_with_unknown_integration_stays_unknown() -> None:
    topology = Topology(
        ExecutionDomain.POSIX,
        [
            _device("a", ("vendor:mem-a",), Integration.UNKNOWN),
            _device("b", ("vendor:mem-b",), Integration.DISCRETE),
        ],
        [Pool("vendor:mem-a", None), Pool("vendor:mem-b", 1)],
    )
    assert topology.shares_memory("a", "b") is None
    assert topology.pool("vendor:mem-a").total is None


@pytest.mark.parametrize(
    ("devices", "pools", "field", "reason"),
    [
        ([], [Pool(RAM_POOL, 1), Pool(RAM_POOL, 2)], "pools[1].name", "duplicate pool"),
        ([], [Pool(WSL_QUOTA, 1, within=RAM_POOL)], "pools[0].within", "not declared"),
        (
            [],
            [Pool("a:x", 1, within="a:y"), Pool("a:y", 1, within="a:x")],
            "pools[0].within",
            "cycle",
        ),
        (
            [_device("g", ("vendor:mem",), Integration.DISCRETE)],
            [Pool(RAM_POOL, 1)],
            "devices[0].pools",
            "undeclared pool",
        ),
        (
            [
                _device("g", (RAM_POOL,), Integration.INTEGRATED),
                _device("g", (RAM_POOL,), Integration.INTEGRATED),
            ],
            [Pool(RAM_POOL, 1)],
            "devices[1].physical_id",
            "duplicate device",
        ),
    ],
)
def test_inconsistent_topologies_are_refused(
    devices: list[DeviceDescriptor], pools: list[Pool], field: str, reason: str
) -> None:
    with pytest.raises(TopologyInvalid) as info:
        Topology(ExecutionDomain.POSIX, devices, pools)
    assert info.value.field == field
    assert reason in info.value.reason


@pytest.mark.parametrize(
    ("name", "total", "field"),
    [("ram", 1, "pool.name"), (RAM_POOL, -1, "pool.total"), (RAM_POOL, True, "pool.total")],
)
def test_invalid_pools_are_refused(name: str, total: object, field: str) -> None:
    with pytest.raises(TopologyInvalid) as info:
        Pool(name, total)  # type: ignore[arg-type]
    assert info.value.field == field
