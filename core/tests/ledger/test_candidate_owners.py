"""Two candidates of one stage in the ledger: two owners, both charged only when both fit.

A measured selection or a first-ready start may hold a stage's candidates at once
(docs/placement.md, "The ledger and candidates of one stage"): each is its own owner
(``pipeline/stage`` and ``pipeline/stage~c``), charged like any stage — never beyond a
pool or a ceiling — and one that does not fit is refused with nothing charged, so it
waits, is measured in the other's place, or is skipped.
"""

from __future__ import annotations

import pytest

from edge_core.ledger import OwnerAlreadyReserved, PoolExhausted, ResourceLedger
from edge_core.pools import Pool

MiB = 1024**2


def test_two_candidates_of_a_stage_are_two_owners_charged_only_when_both_fit() -> None:
    ledger = ResourceLedger([Pool(name="machine:ram", total=1024 * MiB)])
    a = ledger.reserve("p/a", {"machine:ram": 256 * MiB})
    first = ledger.reserve("p/b", {"machine:ram": 256 * MiB})
    second = ledger.reserve("p/b~1", {"machine:ram": 256 * MiB})
    assert ledger.reserved("machine:ram") == 768 * MiB
    with pytest.raises(PoolExhausted):  # a third does not fit: nothing of it is charged
        ledger.reserve("p/b~2", {"machine:ram": 512 * MiB})
    assert ledger.reserved("machine:ram") == 768 * MiB
    assert sorted(t.owner for t in ledger.holdings()) == ["p/a", "p/b", "p/b~1"]
    for token in (second, first, a):
        ledger.release(token, verified=True)
    assert ledger.is_empty()


def test_one_candidate_is_never_charged_twice_under_one_owner() -> None:
    ledger = ResourceLedger([Pool(name="machine:ram", total=1024 * MiB)])
    token = ledger.reserve("p/b~1", {"machine:ram": 64 * MiB})
    with pytest.raises(OwnerAlreadyReserved):
        ledger.reserve("p/b~1", {"machine:ram": 64 * MiB})
    ledger.release(token, verified=True)
    assert ledger.is_empty()


def test_a_ceiling_holds_for_the_candidates_together() -> None:
    ledger = ResourceLedger([Pool(name="machine:ram", total=4096 * MiB)],
                            {"machine:ram": 300 * MiB})
    token = ledger.reserve("p/b", {"machine:ram": 200 * MiB})
    with pytest.raises(PoolExhausted):
        ledger.reserve("p/b~1", {"machine:ram": 200 * MiB})
    ledger.release(token, verified=True)
    assert ledger.is_empty()
