"""Hypothesis state machine: the ledger never exceeds a capacity and ends empty.

The machine reserves random plans over nested pools (``wsl:quota`` within ``machine:ram``)
and a discrete GPU's pool, releases, quarantines and replays stale tokens, and checks the
ledger against an independent model after every step.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from edge_contracts.devices import RAM_POOL, WSL_QUOTA, vram_pool
from edge_core.ledger import (
    OwnerAlreadyReserved,
    PoolExhausted,
    ReleaseOutcome,
    ReservationToken,
    ResourceLedger,
)
from edge_core.pools import Pool

VRAM = vram_pool("gpu0")
CAPACITY = {RAM_POOL: 1000, WSL_QUOTA: 600, VRAM: 400}
ENCLOSING = {RAM_POOL: (RAM_POOL,), WSL_QUOTA: (WSL_QUOTA, RAM_POOL), VRAM: (VRAM,)}
OWNERS = ("det", "rec", "cls", "llm")

demands = st.dictionaries(st.sampled_from(sorted(CAPACITY)), st.integers(0, 450), max_size=3)
plans = st.dictionaries(st.sampled_from(OWNERS), demands, min_size=1, max_size=3)


class LedgerMachine(RuleBasedStateMachine):
    """Drive a ledger and a plain model of it side by side."""

    tokens = Bundle("tokens")
    spent = Bundle("spent")

    def __init__(self) -> None:
        super().__init__()
        self.ledger = ResourceLedger(
            [
                Pool(RAM_POOL, 1000),
                Pool(WSL_QUOTA, 600, within=RAM_POOL),
                Pool(VRAM, 400),
            ]
        )
        self.held: dict[tuple[str, int], tuple[ReservationToken, bool]] = {}
        self.generation: dict[str, int] = {}

    def _model_reserved(self) -> dict[str, int]:
        totals = dict.fromkeys(CAPACITY, 0)
        for token, _quarantined in self.held.values():
            for pool, nbytes in token.demands.items():
                for charged in ENCLOSING[pool]:
                    totals[charged] += nbytes
        return totals

    def _active(self, owner: str) -> bool:
        return any(o == owner and not q for (o, _g), (_t, q) in self.held.items())

    @rule(target=tokens, plan=plans)
    def reserve_plan(self, plan: dict[str, dict[str, int]]) -> object:
        before = self._model_reserved()
        request = dict.fromkeys(CAPACITY, 0)
        for owner_demands in plan.values():
            for pool, nbytes in owner_demands.items():
                for charged in ENCLOSING[pool]:
                    request[charged] += nbytes
        conflict = any(self._active(owner) for owner in plan)
        fits = all(before[p] + request[p] <= CAPACITY[p] for p in CAPACITY if request[p])
        try:
            issued = self.ledger.reserve_plan(plan)
        except OwnerAlreadyReserved:
            assert conflict
            return ()
        except PoolExhausted as exc:
            assert not conflict and not fits
            for shortfall in exc.shortfalls:
                assert shortfall.reserved + shortfall.requested > shortfall.capacity
            return ()
        assert not conflict and fits
        for owner, token in issued.items():
            self.generation[owner] = self.generation.get(owner, 0) + 1
            assert token.generation == self.generation[owner]
            self.held[(owner, token.generation)] = (token, False)
        return tuple(issued.values())

    @rule(target=spent, batch=consumes(tokens), verified=st.booleans())
    def release(self, batch: tuple[ReservationToken, ...], verified: bool) -> object:
        for token in batch:
            outcome = self.ledger.release(token, verified=verified)
            if verified:
                assert outcome is ReleaseOutcome.RELEASED
                del self.held[(token.owner, token.generation)]
            else:
                assert outcome is ReleaseOutcome.QUARANTINED
                self.held[(token.owner, token.generation)] = (token, True)
        return batch if verified else ()

    @rule(batch=spent)
    def stale_release_changes_nothing(self, batch: tuple[ReservationToken, ...]) -> None:
        before = self.ledger.snapshot()
        for token in batch:
            assert self.ledger.release(token) is ReleaseOutcome.STALE_TOKEN
            assert self.ledger.release(token, verified=False) is ReleaseOutcome.STALE_TOKEN
        assert self.ledger.snapshot() == before

    @precondition(lambda self: any(q for _t, q in self.held.values()))
    @rule()
    def verify_quarantined(self) -> None:
        for key, (token, quarantined) in list(self.held.items()):
            if quarantined:
                assert self.ledger.release(token) is ReleaseOutcome.RELEASED
                del self.held[key]

    @invariant()
    def never_over_capacity_and_matches_the_model(self) -> None:
        model = self._model_reserved()
        for pool, capacity in CAPACITY.items():
            reserved = self.ledger.reserved(pool)
            assert reserved == model[pool]
            assert reserved <= capacity
        assert {(t.owner, t.generation) for t in self.ledger.holdings()} == set(self.held)

    def teardown(self) -> None:
        for token, _quarantined in list(self.held.values()):
            assert self.ledger.release(token) is ReleaseOutcome.RELEASED
        assert self.ledger.is_empty()
        assert all(self.ledger.reserved(pool) == 0 for pool in CAPACITY)


LedgerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_ledger_state_machine = LedgerMachine.TestCase
