"""ResourceLedger.reserve refuses an owner that is not a stage id, charging nothing."""

from __future__ import annotations

from typing import Any

import pytest

from edge_contracts.devices import RAM_POOL
from edge_core.errors import ConfigError
from edge_core.ledger import ResourceLedger
from edge_core.topologies import synthetic_topology

GiB = 1024**3


@pytest.mark.parametrize("owner", ["", "   ", None, 5, b"det", "det\n"])
def test_reserve_refuses_an_owner_that_is_not_a_non_empty_string(owner: Any) -> None:
    topology = synthetic_topology(igpu=False, dgpu=False, ram_bytes=16 * GiB)
    ledger = ResourceLedger.from_topology(topology, {})
    before = ledger.snapshot()
    with pytest.raises(ConfigError, match=r"^owner: must be a non-empty printable string"):
        ledger.reserve(owner, {RAM_POOL: GiB})
    with pytest.raises(ConfigError, match=r"^owner:"):
        ledger.reserve_plan({"det": {RAM_POOL: GiB}, owner: {RAM_POOL: GiB}})
    assert ledger.snapshot() == before
    assert ledger.reserved(RAM_POOL) == 0
