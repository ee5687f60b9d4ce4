"""Settling a stage's reservation after its worker is retired: release, or quarantine.

Split from :mod:`edge_core.runtime.pipeline`: a reservation is released when the worker's
retirement is verified, and quarantined (with the identities of the worker's tree, which
``ledger.heal()`` re-checks) when it is not.
"""

from __future__ import annotations

from typing import Any

from edge_core.ledger import ReservationToken, ResourceLedger

__all__ = ["Unverified", "settle"]


class Unverified:
    """The outcome recorded when retirement itself raised: nothing is verified gone."""

    verified = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def to_dict(self) -> dict[str, object]:
        """Plain form for the close summary."""
        return {"verified": False, "reason": self.reason}


def settle(ledger: ResourceLedger, token: ReservationToken | None, outcome: Any) -> str:
    """Release a reservation after retirement; quarantine it when retirement is unverified."""
    if token is None:
        return "none"
    verified = bool(getattr(outcome, "verified", outcome is None))
    reason = getattr(outcome, "reason", None)
    # the identities of the worker's tree, re-checked by ledger.heal() if quarantined
    tree = [p for p in getattr(outcome, "tree", ()) if callable(getattr(p, "is_alive", None))]
    return ledger.release(token, verified=verified, reason=reason, processes=tree).value
