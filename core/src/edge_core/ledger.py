"""The ResourceLedger: admission of a whole plan against every memory pool, before loading.

Rules:

* **Ceilings are pre-load limits.** A pool's capacity is its declared ceiling, or its
  observed total when none is declared. A ceiling above the observed total is refused
  (:class:`CeilingAboveTotal`); a pool whose total is unknown can be charged only under a
  declared ceiling (:class:`CapacityUnknown`).
* **All or nothing.** :meth:`ResourceLedger.reserve_plan` charges every owner's demands on
  every pool, or nothing; a refusal (:class:`PoolExhausted`) names each pool that is short
  with the plan's request, what is already reserved and the capacity.
* **Nested limits.** A demand on a pool is charged to that pool and to every pool that
  encloses it (``wsl:quota`` within ``machine:ram``): one allocation, two limits.
* **Tokens carry a generation.** Each reservation of an owner gets the next generation;
  releasing a token that is not the one the ledger holds (already released, an older
  generation, another ledger) frees nothing and returns :attr:`ReleaseOutcome.STALE_TOKEN`.
* **Quarantine.** Releasing with ``verified=False`` (the worker's retirement could not be
  verified) keeps the memory charged; only a later verified release frees it, or a
  *heal*: the release names the processes of the worker's tree (each by PID and creation
  time), and :meth:`ResourceLedger.heal` — run by a pipeline's ``restart()`` and
  ``close()``, and as a sweep before every new reservation — releases a quarantined
  reservation once every one of them is verifiably gone, recording how
  (:meth:`ResourceLedger.healed`). A quarantine that names no process is never healed.
* **Unknown pools are configuration errors** (:class:`UnknownPool`), never "unavailable".

Every method is thread-safe; :meth:`ResourceLedger.snapshot` returns a JSON-able view.
"""

from __future__ import annotations

import difflib
import enum
import itertools
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from edge_core.errors import ConfigError, EdgeError, ResourceUnavailable
from edge_core.pools import Pool, Topology, charge_paths

__all__ = [
    "CapacityUnknown",
    "CeilingAboveTotal",
    "HealRecord",
    "OwnerAlreadyReserved",
    "PoolExhausted",
    "ReleaseOutcome",
    "ReservationToken",
    "ResourceLedger",
    "Shortfall",
    "UnknownPool",
    "Witness",
]


class Witness(Protocol):
    """A process recorded with a quarantine: healed once every witness is gone.

    :class:`~edge_core.host.identity.ProcessIdentity` is one (PID plus creation time).
    """

    def is_alive(self) -> bool:
        """Whether this very process still runs."""
        ...


class UnknownPool(ConfigError):
    """A ceiling or demand names a pool that the ledger does not know."""


class CeilingAboveTotal(ConfigError):
    """A declared ceiling exceeds the observed total of its pool."""


class CapacityUnknown(ConfigError):
    """A demand falls on a pool whose total is unknown and that has no declared ceiling."""


class OwnerAlreadyReserved(EdgeError, ValueError):
    """An owner asked for a second reservation while an active one is still held."""

    def __init__(self, owner: str, generation: int) -> None:
        self.owner = owner
        self.generation = generation
        super().__init__(
            f"owner: already holds an active reservation (generation {generation}): {owner!r}"
        )


@attrs.frozen
class Shortfall:
    """One pool that cannot take a plan's request."""

    pool: str
    """Pool name."""
    requested: int
    """Bytes the plan asks of this pool (all owners, nested charges included)."""
    reserved: int
    """Bytes already reserved (quarantined bytes included)."""
    capacity: int
    """The pool's capacity: its ceiling, or its observed total."""


class PoolExhausted(ResourceUnavailable):
    """A plan does not fit; nothing was charged.

    ``pool``, ``requested``, ``reserved`` and ``capacity`` describe the first short pool;
    ``shortfalls`` lists every short pool.
    """

    def __init__(self, shortfalls: Iterable[Shortfall], owners: Iterable[str]) -> None:
        self.shortfalls = tuple(shortfalls)
        self.owners = tuple(owners)
        first = self.shortfalls[0]
        self.pool = first.pool
        self.requested = first.requested
        self.reserved = first.reserved
        self.capacity = first.capacity
        parts = [
            f"{s.pool}: requested {s.requested} bytes exceeds what is free "
            f"(reserved {s.reserved} of capacity {s.capacity}): {s.requested}"
            for s in self.shortfalls
        ]
        super().__init__("; ".join(parts) + f" (plan owners: {', '.join(self.owners)})")


class ReleaseOutcome(enum.StrEnum):
    """What a release did."""

    RELEASED = "released"
    """The reservation is gone and its bytes are free."""
    QUARANTINED = "quarantined"
    """Retirement was not verified; the bytes stay charged until a verified release."""
    STALE_TOKEN = "stale_token"  # noqa: S105 - an outcome name, not a secret
    """The token is not the reservation the ledger holds; nothing changed."""


@attrs.frozen
class ReservationToken:
    """Proof of one owner's reservation, needed to release it."""

    ledger_id: str
    """Identity of the ledger that issued the token."""
    owner: str
    """Who holds the reservation (a stage id)."""
    generation: int
    """Per-owner counter, starting at 1; a newer reservation has a higher generation."""
    demands: Mapping[str, int] = attrs.field(eq=False)
    """Bytes requested per pool, as asked."""
    charges: Mapping[str, int] = attrs.field(eq=False)
    """Bytes charged per pool, enclosing pools included."""
    serial: int
    """Ledger-wide issue number; distinguishes tokens that agree on everything else."""

    def to_json(self) -> dict[str, Any]:
        """Return the JSON-ready form (recorded in execution plans)."""
        return {
            "owner": self.owner,
            "generation": self.generation,
            "demands": dict(self.demands),
            "charges": dict(self.charges),
        }


@attrs.frozen
class HealRecord:
    """How a quarantined reservation was released without a verified retirement."""

    owner: str
    """The reservation's owner."""
    generation: int
    """The reservation's generation."""
    by: str
    """Who re-examined it: ``restart``, ``close``, ``sweep`` or a caller's label."""
    after_s: float
    """Seconds from the quarantine to the release."""
    processes: int
    """How many recorded processes were checked gone (by PID and creation time)."""

    def to_json(self) -> dict[str, Any]:
        """Return the JSON-ready form."""
        return {
            "owner": self.owner,
            "generation": self.generation,
            "by": self.by,
            "after_s": round(self.after_s, 3),
            "processes": self.processes,
        }


@attrs.define
class _Held:
    token: ReservationToken
    quarantined: bool = False
    reason: str | None = None
    witnesses: tuple[Witness, ...] = ()
    since: float = 0.0


class ResourceLedger:
    """Thread-safe book of pool capacities and the reservations charged against them.

    Args:
        pools: the pools with their observed totals and nesting (``within``).
        ceilings: declared pre-load ceilings per pool (``PipelineConfig.ceilings()``).
        ceilings_path: config path reported for ceiling errors.

    Raises:
        UnknownPool: a ceiling names an undeclared pool.
        CeilingAboveTotal: a ceiling exceeds its pool's observed total.
        ConfigError: a ceiling is not a positive integer.

    """

    def __init__(
        self,
        pools: Iterable[Pool],
        ceilings: Mapping[str, int] | None = None,
        *,
        ceilings_path: str = "capacities",
    ) -> None:
        pool_list = tuple(pools)
        self._paths = charge_paths(pool_list)
        self._pools = {pool.name: pool for pool in pool_list}
        self._ceilings: dict[str, int] = {}
        for name, ceiling in (ceilings or {}).items():
            path = f'{ceilings_path}["{name}"]'
            if name not in self._pools:
                raise UnknownPool(path, self._unknown(name), name)
            if isinstance(ceiling, bool) or not isinstance(ceiling, int) or ceiling < 1:
                raise ConfigError(path, "must be a positive number of bytes", ceiling)
            total = self._pools[name].total
            if total is not None and ceiling > total:
                raise CeilingAboveTotal(
                    path, f"ceiling above the observed total of {total} bytes", ceiling
                )
            self._ceilings[name] = ceiling
        self._id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._reserved = dict.fromkeys(self._pools, 0)
        self._held: dict[tuple[str, int], _Held] = {}
        self._generations: dict[str, int] = {}
        self._serials = itertools.count(1)
        self._healed: list[HealRecord] = []

    @classmethod
    def from_topology(
        cls, topology: Topology, ceilings: Mapping[str, int] | None = None
    ) -> ResourceLedger:
        """Build a ledger over the pools of ``topology``."""
        return cls(topology.pools, ceilings)

    @property
    def ledger_id(self) -> str:
        """Identity stamped on every token this ledger issues."""
        return self._id

    def capacity(self, pool: str) -> int | None:
        """Return the capacity of ``pool``: its ceiling, else its total (``None``: unknown)."""
        self.require_pool(pool, "pool")
        return self._ceilings.get(pool, self._pools[pool].total)

    def reserved(self, pool: str) -> int:
        """Return the bytes currently charged to ``pool`` (quarantined bytes included)."""
        self.require_pool(pool, "pool")
        with self._lock:
            return self._reserved[pool]

    def charge_path(self, pool: str) -> tuple[str, ...]:
        """Return the pools one byte demanded of ``pool`` is charged to, innermost first."""
        self.require_pool(pool, "pool")
        return self._paths[pool]

    def reserve(self, owner: str, demands: Mapping[str, int]) -> ReservationToken:
        """Reserve one owner's demands; see :meth:`reserve_plan`."""
        return self.reserve_plan({owner: demands})[owner]

    def reserve_plan(self, plan: Mapping[str, Mapping[str, int]]) -> dict[str, ReservationToken]:
        """Charge every owner's demands on every pool at once, or charge nothing.

        Args:
            plan: owner (stage id) → pool → bytes, each pool's demand including the load peak.

        Returns:
            owner → token, each token carrying that owner's next generation.

        Raises:
            UnknownPool: a demand names a pool the ledger does not know.
            ConfigError: an owner is not a non-empty string, or a demand is not a
                non-negative integer.
            CapacityUnknown: a demand falls on a pool with neither a total nor a ceiling.
            OwnerAlreadyReserved: an owner still holds an active (not quarantined) reservation.
            PoolExhausted: some pool cannot take the plan; every short pool is named.

        """
        self.heal("sweep")
        charges_by_owner: dict[str, dict[str, int]] = {}
        requested: dict[str, int] = {}
        for owner, demands in plan.items():
            if not isinstance(owner, str) or not owner.strip() or not owner.isprintable():
                raise ConfigError("owner", "must be a non-empty printable string (a stage id)",
                                  owner)
            charges: dict[str, int] = {}
            for pool, nbytes in demands.items():
                path = f'{owner}.demands["{pool}"]'
                self.require_pool(pool, path)
                if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                    raise ConfigError(path, "must be a non-negative number of bytes", nbytes)
                for charged in self._paths[pool]:
                    charges[charged] = charges.get(charged, 0) + nbytes
            charges_by_owner[owner] = charges
            for pool, nbytes in charges.items():
                requested[pool] = requested.get(pool, 0) + nbytes
        for pool, nbytes in requested.items():
            if nbytes and self.capacity(pool) is None:
                raise CapacityUnknown(
                    f'capacities["{pool}"]',
                    "pool total is unknown; declare a ceiling to charge it",
                    None,
                )
        with self._lock:
            for owner in plan:
                active = self._active_generation(owner)
                if active is not None:
                    raise OwnerAlreadyReserved(owner, active)
            shortfalls = []
            for pool, nbytes in requested.items():
                capacity = self._ceilings.get(pool, self._pools[pool].total)
                assert capacity is not None or nbytes == 0
                if nbytes and capacity is not None and self._reserved[pool] + nbytes > capacity:
                    shortfalls.append(Shortfall(pool, nbytes, self._reserved[pool], capacity))
            if shortfalls:
                raise PoolExhausted(sorted(shortfalls, key=lambda s: s.pool), list(plan))
            tokens: dict[str, ReservationToken] = {}
            for owner, demands in plan.items():
                generation = self._generations.get(owner, 0) + 1
                self._generations[owner] = generation
                token = ReservationToken(
                    ledger_id=self._id,
                    owner=owner,
                    generation=generation,
                    demands=MappingProxyType(dict(demands)),
                    charges=MappingProxyType(charges_by_owner[owner]),
                    serial=next(self._serials),
                )
                self._held[(owner, generation)] = _Held(token)
                for pool, nbytes in token.charges.items():
                    self._reserved[pool] += nbytes
                tokens[owner] = token
            return tokens

    def release(
        self,
        token: ReservationToken,
        *,
        verified: bool = True,
        reason: str | None = None,
        processes: Iterable[Witness] = (),
    ) -> ReleaseOutcome:
        """Release a reservation once its worker is gone.

        ``verified=True``: the worker tree's retirement was verified (or it never started);
        the bytes are freed. ``verified=False``: retirement could not be verified; the
        reservation is quarantined and stays charged until a verified release of the same
        token, or until :meth:`heal` finds every one of ``processes`` (the worker tree's
        identities, by PID and creation time) gone. A token that is not the reservation
        held (already released, an older generation, another ledger's) changes nothing
        and returns ``STALE_TOKEN``.
        """
        witnesses = tuple(processes)
        with self._lock:
            held = self._held.get((token.owner, token.generation))
            if token.ledger_id != self._id or held is None or held.token.serial != token.serial:
                return ReleaseOutcome.STALE_TOKEN
            if not verified:
                if not held.quarantined:
                    held.since = time.monotonic()
                held.quarantined = True
                held.reason = reason or held.reason or "retirement not verified"
                held.witnesses = witnesses or held.witnesses
                return ReleaseOutcome.QUARANTINED
            self._drop(held)
            return ReleaseOutcome.RELEASED

    def _drop(self, held: _Held) -> None:
        """Free a held reservation (under the lock)."""
        token = held.token
        del self._held[(token.owner, token.generation)]
        for pool, nbytes in token.charges.items():
            self._reserved[pool] -= nbytes

    def heal(self, by: str, *, wait_s: float = 0.0) -> tuple[ReservationToken, ...]:
        """Re-examine every quarantine; release those whose recorded processes are all gone.

        ``by`` says who asked (recorded in :meth:`healed`). With ``wait_s`` the check is
        repeated for up to that long while some quarantine with recorded processes is
        left (processes killed a moment ago may still be exiting). A quarantine recorded
        without processes stays: nothing can show that its tree is gone.

        Returns:
            The tokens released.

        """
        end = time.monotonic() + max(wait_s, 0.0)
        released: list[ReservationToken] = []
        while True:
            with self._lock:
                pending = [h for h in self._held.values() if h.quarantined and h.witnesses]
            if not pending:
                break
            gone = [h for h in pending if not any(w.is_alive() for w in h.witnesses)]
            with self._lock:
                now = time.monotonic()
                for held in gone:
                    current = self._held.get((held.token.owner, held.token.generation))
                    if current is not held or not held.quarantined:
                        continue  # released meanwhile
                    self._drop(held)
                    released.append(held.token)
                    self._healed.append(HealRecord(held.token.owner, held.token.generation,
                                                   by, now - held.since, len(held.witnesses)))
            if len(gone) == len(pending) or time.monotonic() >= end:
                break
            time.sleep(0.02)
        return tuple(released)

    def healed(self) -> tuple[HealRecord, ...]:
        """Return how each quarantine released by :meth:`heal` was released, oldest first."""
        with self._lock:
            return tuple(self._healed)

    def holdings(self) -> tuple[ReservationToken, ...]:
        """Return every reservation still charged (active and quarantined)."""
        with self._lock:
            return tuple(held.token for held in self._held.values())

    def quarantined(self) -> tuple[ReservationToken, ...]:
        """Return the reservations kept charged because retirement was not verified."""
        with self._lock:
            return tuple(held.token for held in self._held.values() if held.quarantined)

    def is_empty(self) -> bool:
        """Return whether nothing at all is charged."""
        with self._lock:
            return not self._held

    def snapshot(self) -> dict[str, Any]:
        """Return a consistent, JSON-able view of pools and reservations."""
        with self._lock:
            quarantined = dict.fromkeys(self._pools, 0)
            for held in self._held.values():
                if held.quarantined:
                    for charged, nbytes in held.token.charges.items():
                        quarantined[charged] += nbytes
            pools: dict[str, dict[str, Any]] = {}
            for name, pool in sorted(self._pools.items()):
                capacity = self._ceilings.get(name, pool.total)
                pools[name] = {
                    "total": pool.total,
                    "ceiling": self._ceilings.get(name),
                    "capacity": capacity,
                    "reserved": self._reserved[name],
                    "quarantined": quarantined[name],
                    "free": None if capacity is None else capacity - self._reserved[name],
                    "within": pool.within,
                    "observed_by": pool.observed_by,
                }
            reservations = [
                {
                    **held.token.to_json(),
                    "state": "quarantined" if held.quarantined else "active",
                    "reason": held.reason,
                }
                for held in sorted(self._held.values(), key=lambda h: h.token.serial)
            ]
            return {
                "ledger_id": self._id,
                "pools": pools,
                "reservations": reservations,
                "healed": [record.to_json() for record in self._healed],
            }

    def _active_generation(self, owner: str) -> int | None:
        for (held_owner, generation), held in self._held.items():
            if held_owner == owner and not held.quarantined:
                return generation
        return None

    def require_pool(self, pool: str, path: str) -> None:
        """Refuse a pool this ledger does not know, at ``path``.

        Raises:
            UnknownPool: ``pool`` is not one of the ledger's pools (the closest one named).

        """
        if pool not in self._pools:
            raise UnknownPool(path, self._unknown(pool), pool)

    def _unknown(self, pool: object) -> str:
        """Why ``pool`` is refused: the closest known pool, and every known one."""
        known = sorted(self._pools)
        close = (difflib.get_close_matches(pool, known, n=1, cutoff=0.6)
                 if isinstance(pool, str) else [])
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"unknown pool ({hint}known: {', '.join(known)})"
