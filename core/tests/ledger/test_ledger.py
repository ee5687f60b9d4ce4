"""ResourceLedger: atomic plan admission, precise refusals, generations, quarantine, snapshot."""

from __future__ import annotations

import json
import threading

import pytest

from edge_contracts.devices import RAM_POOL, WSL_QUOTA, vram_pool
from edge_core.errors import ConfigError, ResourceUnavailable
from edge_core.ledger import (
    CapacityUnknown,
    CeilingAboveTotal,
    OwnerAlreadyReserved,
    PoolExhausted,
    ReleaseOutcome,
    ResourceLedger,
    UnknownPool,
)
from edge_core.pools import Pool
from edge_core.topologies import DGPU_ID, synthetic_topology

GiB = 1024**3
VRAM = vram_pool(DGPU_ID)


def _ledger(**ceilings: int) -> ResourceLedger:
    topology = synthetic_topology(igpu=True, dgpu=True, ram_bytes=16 * GiB, vram_bytes=8 * GiB)
    return ResourceLedger.from_topology(
        topology, {k.replace("_", ":"): v for k, v in ceilings.items()}
    )


def test_a_plan_that_fits_is_charged_on_every_pool_it_touches() -> None:
    ledger = _ledger()
    tokens = ledger.reserve_plan(
        {"det": {RAM_POOL: 2 * GiB}, "llm": {VRAM: 6 * GiB, RAM_POOL: 1 * GiB}}
    )
    assert ledger.reserved(RAM_POOL) == 3 * GiB
    assert ledger.reserved(VRAM) == 6 * GiB
    assert tokens["det"].generation == tokens["llm"].generation == 1
    assert dict(tokens["llm"].charges) == {VRAM: 6 * GiB, RAM_POOL: 1 * GiB}


def test_joint_admission_refused_leaves_nothing_charged() -> None:
    ledger = _ledger()
    ledger.reserve("resident", {VRAM: 3 * GiB})
    before = ledger.snapshot()
    with pytest.raises(PoolExhausted) as info:
        ledger.reserve_plan({"det": {RAM_POOL: 1 * GiB}, "llm": {VRAM: 6 * GiB}})
    assert ledger.snapshot() == before
    assert ledger.reserved(RAM_POOL) == 0
    error = info.value
    assert isinstance(error, ResourceUnavailable)
    assert (error.pool, error.requested, error.reserved, error.capacity) == (
        VRAM,
        6 * GiB,
        3 * GiB,
        8 * GiB,
    )
    message = str(error)
    for number in (VRAM, str(6 * GiB), str(3 * GiB), str(8 * GiB)):
        assert number in message
    # A refused plan does not consume generations.
    assert ledger.reserve("det", {RAM_POOL: 1}).generation == 1


def test_a_refusal_names_every_short_pool_with_the_whole_plans_request() -> None:
    ledger = _ledger(machine_ram=4 * GiB)
    with pytest.raises(PoolExhausted) as info:
        ledger.reserve_plan({"a": {RAM_POOL: 3 * GiB}, "b": {RAM_POOL: 2 * GiB, VRAM: 9 * GiB}})
    shortfalls = {s.pool: s for s in info.value.shortfalls}
    assert set(shortfalls) == {RAM_POOL, VRAM}
    assert shortfalls[RAM_POOL].requested == 5 * GiB
    assert shortfalls[RAM_POOL].capacity == 4 * GiB
    assert shortfalls[VRAM].requested == 9 * GiB
    assert info.value.owners == ("a", "b")


def test_a_stale_token_cannot_free_a_newer_reservation_of_the_same_owner() -> None:
    ledger = _ledger()
    old = ledger.reserve("det", {RAM_POOL: 1 * GiB})
    assert ledger.release(old) is ReleaseOutcome.RELEASED
    new = ledger.reserve("det", {RAM_POOL: 2 * GiB})
    assert new.generation == old.generation + 1
    assert ledger.release(old) is ReleaseOutcome.STALE_TOKEN
    assert ledger.reserved(RAM_POOL) == 2 * GiB
    assert ledger.holdings() == (new,)
    assert ledger.release(new) is ReleaseOutcome.RELEASED
    assert ledger.release(new) is ReleaseOutcome.STALE_TOKEN
    assert ledger.is_empty()


def test_a_token_from_another_ledger_frees_nothing() -> None:
    ours, theirs = _ledger(), _ledger()
    mine = ours.reserve("det", {RAM_POOL: 1})
    foreign = theirs.reserve("det", {RAM_POOL: 1})
    assert ours.release(foreign) is ReleaseOutcome.STALE_TOKEN
    assert ours.holdings() == (mine,)


def test_quarantine_keeps_memory_charged_until_retirement_is_verified() -> None:
    ledger = _ledger()
    token = ledger.reserve("llm", {VRAM: 6 * GiB})
    assert ledger.release(token, verified=False, reason="pid 4242 still alive") is (
        ReleaseOutcome.QUARANTINED
    )
    assert ledger.reserved(VRAM) == 6 * GiB
    assert ledger.quarantined() == (token,)
    snap = ledger.snapshot()
    assert snap["pools"][VRAM]["quarantined"] == 6 * GiB
    assert snap["reservations"][0]["state"] == "quarantined"
    assert snap["reservations"][0]["reason"] == "pid 4242 still alive"
    # Quarantined memory still counts against admission.
    with pytest.raises(PoolExhausted):
        ledger.reserve("other", {VRAM: 3 * GiB})
    # The owner may restart under a new generation while the old one is quarantined.
    restarted = ledger.reserve("llm", {VRAM: 2 * GiB})
    assert restarted.generation == 2
    assert ledger.release(token, verified=False) is ReleaseOutcome.QUARANTINED
    assert ledger.release(token, verified=True) is ReleaseOutcome.RELEASED
    assert ledger.reserved(VRAM) == 2 * GiB
    assert ledger.quarantined() == ()


def test_an_owner_cannot_hold_two_active_reservations() -> None:
    ledger = _ledger()
    ledger.reserve("det", {RAM_POOL: 1})
    with pytest.raises(OwnerAlreadyReserved) as info:
        ledger.reserve_plan({"other": {RAM_POOL: 1}, "det": {RAM_POOL: 1}})
    assert "generation 1" in str(info.value)
    assert ledger.reserved(RAM_POOL) == 1


def test_a_ceiling_above_the_observed_total_is_refused() -> None:
    with pytest.raises(CeilingAboveTotal) as info:
        _ledger(machine_ram=17 * GiB)
    assert info.value.path == 'capacities["machine:ram"]'
    assert str(16 * GiB) in info.value.reason
    assert info.value.value == 17 * GiB


def test_a_ceiling_lowers_the_capacity_below_the_total() -> None:
    ledger = _ledger(machine_ram=4 * GiB)
    assert ledger.capacity(RAM_POOL) == 4 * GiB
    with pytest.raises(PoolExhausted):
        ledger.reserve("det", {RAM_POOL: 4 * GiB + 1})
    ledger.reserve("det", {RAM_POOL: 4 * GiB})


def test_an_unknown_pool_is_a_configuration_error_not_unavailability() -> None:
    ledger = _ledger()
    with pytest.raises(UnknownPool) as info:
        ledger.reserve_plan({"det": {RAM_POOL: 1}, "npu": {"machine:vram:nope": 1}})
    assert isinstance(info.value, ConfigError)
    assert not isinstance(info.value, ResourceUnavailable)
    assert info.value.path == 'npu.demands["machine:vram:nope"]'
    assert ledger.is_empty()
    with pytest.raises(UnknownPool):
        ResourceLedger([Pool(RAM_POOL, GiB)], {"machine:vram:x": 1})


def test_an_unknown_pool_names_the_closest_known_one() -> None:
    ledger = ResourceLedger([Pool(RAM_POOL, GiB)])
    with pytest.raises(UnknownPool) as info:
        ledger.reserve("det", {"machine:rma": 1})
    assert info.value.reason == "unknown pool (did you mean 'machine:ram'? known: machine:ram)"
    with pytest.raises(UnknownPool) as far:
        ledger.reserve("det", {"npu:sram": 1})
    assert far.value.reason == "unknown pool (known: machine:ram)"  # nothing close
    with pytest.raises(UnknownPool) as ceiling:
        ResourceLedger([Pool(RAM_POOL, GiB)], {"machine:rma": 1})
    assert "did you mean 'machine:ram'?" in ceiling.value.reason
    assert ledger.is_empty()


@pytest.mark.parametrize("nbytes", [-1, True, 1.5, "1 GiB"])
def test_demands_must_be_non_negative_integers(nbytes: object) -> None:
    ledger = _ledger()
    with pytest.raises(ConfigError) as info:
        ledger.reserve("det", {RAM_POOL: nbytes})  # type: ignore[dict-item]
    assert info.value.path == 'det.demands["machine:ram"]'
    assert ledger.is_empty()


def test_a_wsl_allocation_is_held_to_the_quota_and_to_machine_ram() -> None:
    topology = synthetic_topology(igpu=True, wsl=True, ram_bytes=16 * GiB, wsl_quota_bytes=8 * GiB)
    ledger = ResourceLedger.from_topology(topology)
    token = ledger.reserve("cpu-stage", {WSL_QUOTA: 6 * GiB})
    assert dict(token.demands) == {WSL_QUOTA: 6 * GiB}
    assert dict(token.charges) == {WSL_QUOTA: 6 * GiB, RAM_POOL: 6 * GiB}
    # The quota is the binding limit for WSL allocations...
    with pytest.raises(PoolExhausted) as quota:
        ledger.reserve("more-wsl", {WSL_QUOTA: 3 * GiB})
    assert quota.value.pool == WSL_QUOTA
    # ...and machine RAM for everything together, Windows-side devices included.
    with pytest.raises(PoolExhausted) as ram:
        ledger.reserve("igpu-stage", {RAM_POOL: 11 * GiB})
    assert ram.value.pool == RAM_POOL
    assert ram.value.reserved == 6 * GiB
    ledger.reserve("igpu-stage", {RAM_POOL: 10 * GiB})
    assert ledger.release(token) is ReleaseOutcome.RELEASED
    assert ledger.reserved(RAM_POOL) == 10 * GiB
    assert ledger.reserved(WSL_QUOTA) == 0


def test_a_pool_of_unknown_total_needs_a_declared_ceiling_to_be_charged() -> None:
    pools = [Pool(RAM_POOL, None), Pool(WSL_QUOTA, 8 * GiB, within=RAM_POOL)]
    with pytest.raises(CapacityUnknown) as info:
        ResourceLedger(pools).reserve("det", {WSL_QUOTA: 1})
    assert info.value.path == 'capacities["machine:ram"]'
    ledger = ResourceLedger(pools, {RAM_POOL: 32 * GiB})
    assert ledger.reserve("det", {WSL_QUOTA: GiB}).charges[RAM_POOL] == GiB


def test_the_snapshot_is_json_and_accounts_for_every_byte() -> None:
    ledger = _ledger(machine_ram=8 * GiB)
    ledger.reserve_plan({"det": {RAM_POOL: GiB}, "llm": {VRAM: 2 * GiB}})
    snap = ledger.snapshot()
    assert json.loads(json.dumps(snap)) == snap
    ram = snap["pools"][RAM_POOL]
    assert ram == {
        "total": 16 * GiB,
        "ceiling": 8 * GiB,
        "capacity": 8 * GiB,
        "reserved": GiB,
        "quarantined": 0,
        "free": 7 * GiB,
        "within": None,
        "observed_by": "synthetic",
    }
    assert [(r["owner"], r["generation"], r["state"]) for r in snap["reservations"]] == [
        ("det", 1, "active"),
        ("llm", 1, "active"),
    ]


def test_concurrent_reservations_never_exceed_capacity_and_all_release() -> None:
    ledger = ResourceLedger([Pool(RAM_POOL, 10_000)])
    peak = 0
    lock = threading.Lock()
    refusals = 0

    def worker(index: int) -> None:
        nonlocal peak, refusals
        for round_ in range(200):
            owner = f"w{index}"
            try:
                token = ledger.reserve(owner, {RAM_POOL: 700 + round_ % 300})
            except PoolExhausted:
                with lock:
                    refusals += 1
                continue
            with lock:
                peak = max(peak, ledger.reserved(RAM_POOL))
            assert ledger.release(token) is ReleaseOutcome.RELEASED

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak <= 10_000
    assert ledger.is_empty()
    assert ledger.reserved(RAM_POOL) == 0
