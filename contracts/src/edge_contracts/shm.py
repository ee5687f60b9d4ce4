"""Shared-memory segments for large tensors: one producer pool, one consumer cache.

Standard library only, so that a worker in a vendor interpreter can use it. Segments are
POSIX shared-memory objects (``shm_open`` through CPython's ``_posixshmem``) mapped with
:mod:`mmap`; :mod:`multiprocessing.shared_memory` is deliberately not used, because its
resource tracker registers every create *and* attach and would warn about, or unlink,
segments that are still in use by the peer.

Two kinds of segment:
    *named* POSIX segments (below), and — when a producer and its consumer share an
    :class:`~edge_contracts.sealed.FdChannel` — *sealed* memfd segments of the same
    names and layout whose size nobody can change and which vanish with their last
    holder (:mod:`edge_contracts.sealed`; Linux, the worker channel's default).

Naming and permissions:
    Every segment is called ``edge_<prefix>_<random>``. The prefix is fixed per producer
    (the controller hands each worker its own), so that whoever owns the producer's
    lifetime can sweep what a crashed producer left behind (:func:`sweep`). The random
    part comes from ``os.urandom`` (what :mod:`secrets` uses), so a name cannot be guessed.
    Segments are created
    ``O_EXCL`` with mode ``0600``.

Layout:
    The first :data:`HEADER_BYTES` of a segment hold a magic string, the segment's
    current *generation* and its *owner*: the PID and start time since boot (and, for
    display, the creation time) of the process that created it; tensor data starts at
    ``HEADER_BYTES``. Each time the producer hands a segment out it writes a new
    generation there, so a consumer can refuse a stale reference and a stale
    acknowledgement frees nothing.

Leftovers:
    A producer that is killed cannot unlink its segments. Whoever owns its lifetime
    sweeps its prefix (:func:`sweep`); beyond that, :func:`sweep_dead_owners` (run by
    the next edge-core process and by ``edge cleanup``) unlinks every edge segment whose
    owner process is gone — checked by PID *and* start time since boot (which a step of
    the wall clock does not move: :mod:`edge_contracts.owners`), so a segment of a live
    owner, or of an owner whose PID was reused, is never touched. A segment whose owner
    cannot be read (another user's, or not an edge segment) is left alone.

Retention:
    A producer keeps each leased segment until the consumer acknowledges that exact
    ``(segment, generation)``; then the segment goes back to a pool for reuse (its pages
    stay mapped, which is what makes large copies cheap). Leased plus pooled capacity is
    capped per producer (default 64 MiB and 256 buffers); pooled segments are unlinked to
    make room, and a lease that still does not fit raises :class:`ShmCapExceeded`.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass

from edge_contracts._posix_shm import load_posixshmem
from edge_contracts.errors import ContractError
from edge_contracts.hugepages import back_with_huge_pages
from edge_contracts.owners import Owner, owner_alive, owner_identity
from edge_contracts.sealed import FdChannel, create_sealed, open_sealed

_posixshmem = load_posixshmem()

__all__ = [
    "DEFAULT_MAX_BUFFERS",
    "DEFAULT_MAX_BYTES",
    "HEADER_BYTES",
    "NAME_PREFIX",
    "SHM_AVAILABLE",
    "Lease",
    "Segment",
    "SegmentConsumer",
    "SegmentProducer",
    "ShmCapExceeded",
    "ShmError",
    "ShmRefused",
    "new_prefix",
    "own_prefixes",
    "own_segment_names",
    "retained_cap_for",
    "segment_names",
    "segment_owner",
    "sweep",
    "sweep_dead_owners",
]

SHM_AVAILABLE = _posixshmem is not None
"""True when this interpreter can create and map POSIX shared-memory segments."""

NAME_PREFIX = "edge_"
"""Every segment name starts with this; leak checks look for it under ``/dev/shm``."""

HEADER_BYTES = 4096
"""Bytes reserved at the start of a segment for the magic and the generation."""

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
"""Default cap on one producer's leased plus pooled data capacity, in bytes."""

DEFAULT_MAX_BUFFERS = 256
"""Default cap on the number of segments one producer holds."""

_MAGIC = b"EDGESHM1"
_HEADER = struct.Struct("<8sQ")
# At _HEADER.size: creator PID, creation time (epoch, display only), start time since boot
# (0.0 from older writers: their header page stays zero after the creation time).
_OWNER = struct.Struct("<Qdd")
_PAGE = mmap.PAGESIZE
_PREFIX_RE = re.compile(r"^[0-9a-f]{8}$")
_NAME_RE = re.compile(r"^edge_[0-9a-f]{8}_[0-9a-f]{16}$")
_SHM_DIR = "/dev/shm"  # noqa: S108 - where Linux exposes POSIX shared memory


class ShmError(ContractError):
    """A shared-memory operation was refused; the base of this module's errors."""


class ShmCapExceeded(ShmError):
    """A lease would exceed the producer's cap on retained bytes or buffers."""


class ShmRefused(ShmError):
    """A reference names a segment, range or generation that the consumer must not map."""


def new_prefix() -> str:
    """Return a fresh random producer prefix (8 lowercase hex digits).

    The prefix is remembered (:func:`own_prefixes`): leak checks count only segments of
    prefixes their own process handed out.
    """
    prefix = os.urandom(4).hex()  # what secrets.token_hex does, without its imports
    _OWN_PREFIXES.add(prefix)
    return prefix


_OWN_PREFIXES: set[str] = set()


def own_prefixes() -> frozenset[str]:
    """Every prefix this process handed out (:func:`new_prefix`) or produced under."""
    return frozenset(_OWN_PREFIXES)


def _check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise ShmError("shm.prefix", prefix, "must be 8 lowercase hex digits")
    return prefix


def segment_names(prefix: str | None = None) -> list[str]:
    """List existing edge segment names (optionally of one producer prefix) in /dev/shm."""
    try:
        entries = os.listdir(_SHM_DIR)
    except FileNotFoundError:  # pragma: no cover - no /dev/shm on this platform
        return []
    start = NAME_PREFIX if prefix is None else f"{NAME_PREFIX}{_check_prefix(prefix)}_"
    return sorted(name for name in entries if name.startswith(start))


def own_segment_names() -> list[str]:
    """List existing segments of the prefixes this process handed out (:func:`own_prefixes`)."""
    mine = own_prefixes()
    return [name for name in segment_names() if name[len(NAME_PREFIX) :].split("_")[0] in mine]


def sweep(prefix: str) -> list[str]:
    """Unlink every segment of ``prefix`` (a producer that died cannot); return the names."""
    removed = []
    for name in segment_names(prefix):
        if _unlink(name):
            removed.append(name)
    return removed


def segment_owner(name: str) -> Owner | None:
    """The creator recorded in segment ``name``; None if unreadable.

    None also for a segment that is not an edge segment (wrong magic) or predates owner
    records (PID 0).
    """
    if _posixshmem is None or not _NAME_RE.match(name):
        return None
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0o600)
    except OSError:
        return None
    try:
        raw = os.pread(fd, _HEADER.size + _OWNER.size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) < _HEADER.size + _OWNER.size or raw[:8] != _MAGIC:
        return None
    pid, created, start = _OWNER.unpack_from(raw, _HEADER.size)
    return Owner(int(pid), float(start), float(created)) if pid > 0 else None


def sweep_dead_owners(*, dry_run: bool = False) -> list[tuple[str, Owner]]:
    """Unlink every edge segment whose owner process is gone; return ``(name, owner)``.

    With ``dry_run`` nothing is unlinked. Segments of live owners and segments whose
    owner cannot be read are never touched.
    """
    found = []
    for name in segment_names():
        owner = segment_owner(name)
        if owner is None or owner_alive(owner):
            continue
        if dry_run or _unlink(name):
            found.append((name, owner))
    return found


def _pack_owner(mapping: mmap.mmap) -> None:
    owner = owner_identity()
    _OWNER.pack_into(mapping, _HEADER.size, owner.pid, owner.create_time, owner.start_time)


def _unlink(name: str) -> bool:
    if _posixshmem is None:  # pragma: no cover
        return False
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return False
    return True


def retained_cap_for(max_io_bytes: int, max_buffers: int = DEFAULT_MAX_BUFFERS) -> int:
    """The cap on a producer's leased bytes that lets any one frame of ``max_io_bytes`` through.

    A frame's tensors total at most ``max_io_bytes`` (the channel refuses more), each in a
    segment whose capacity is rounded up to whole pages, at most ``max_buffers`` of them:
    with nothing else leased they fit under this cap. Never below
    :data:`DEFAULT_MAX_BYTES`, so a channel for small frames can still hold a few.
    """
    return max(DEFAULT_MAX_BYTES, _round_up(max_io_bytes) + max_buffers * _PAGE)


def _round_up(n: int) -> int:
    return max(_PAGE, -(-n // _PAGE) * _PAGE)


class Segment:
    """One mapped shared-memory segment: a header page followed by data capacity."""

    __slots__ = ("_map", "_view", "capacity", "name", "sealed", "writable")

    def __init__(
        self, name: str, mapping: mmap.mmap, writable: bool, *, sealed: bool = False
    ) -> None:
        self.name = name
        self.writable = writable
        self.sealed = sealed
        self._map = mapping
        self._view = memoryview(mapping)
        if not writable:
            self._view = self._view.toreadonly()
        self.capacity = len(mapping) - HEADER_BYTES

    @classmethod
    def create(cls, name: str, capacity: int, channel: FdChannel | None = None) -> Segment:
        """Create a new segment (``O_EXCL``, mode 0600) with at least ``capacity`` data bytes.

        With ``channel`` it is a sealed memfd instead (:mod:`edge_contracts.sealed`), sent
        to the peer over the channel: nothing appears in ``/dev/shm``.
        """
        if channel is not None:
            try:
                mapping = create_sealed(name, HEADER_BYTES + _round_up(capacity), channel)
            except OSError as exc:  # the channel is full (the peer takes nothing) or gone
                raise ShmCapExceeded("shm.channel", name, f"descriptor not sent ({exc})") from None
            _HEADER.pack_into(mapping, 0, _MAGIC, 0)
            _pack_owner(mapping)
            return cls(name, mapping, writable=True, sealed=True)
        if _posixshmem is None:  # pragma: no cover
            raise ShmError("shm", name, "shared memory is not available in this interpreter")
        size = HEADER_BYTES + _round_up(capacity)
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            os.fchmod(fd, 0o600)  # the umask may only have narrowed it; make it exact
            os.ftruncate(fd, size)
            back_with_huge_pages(fd, size)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mapping = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            _unlink(name)
            raise
        finally:
            os.close(fd)
        _HEADER.pack_into(mapping, 0, _MAGIC, 0)
        _pack_owner(mapping)
        return cls(name, mapping, writable=True)

    @classmethod
    def attach(cls, name: str, channel: FdChannel | None = None) -> Segment:
        """Map an existing segment read-only (the consumer never writes into a peer's memory).

        With ``channel`` only a sealed memfd the peer sent under ``name`` is accepted.
        """
        if channel is not None:
            fd = channel.take(name)
            if fd is None:
                raise ShmRefused("shm.segment", name, "no sealed segment was sent by that name")
            mapping, size, refused = open_sealed(fd)
            if mapping is None:
                raise ShmRefused("shm.segment", name, f"refused: {refused} (size {size})")
            if size <= HEADER_BYTES or _HEADER.unpack_from(mapping, 0)[0] != _MAGIC:
                mapping.close()
                raise ShmRefused("shm.segment", name, "not an edge segment")
            return cls(name, mapping, writable=False, sealed=True)
        if _posixshmem is None:  # pragma: no cover
            raise ShmRefused("shm.segment", name, "shared memory is not available here")
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, mode=0o600)
        except FileNotFoundError:
            raise ShmRefused("shm.segment", name, "no such segment") from None
        try:
            size = os.fstat(fd).st_size
            if size <= HEADER_BYTES:
                raise ShmRefused("shm.segment", name, f"size {size} must exceed {HEADER_BYTES}")
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        magic, _ = _HEADER.unpack_from(mapping, 0)
        if magic != _MAGIC:
            mapping.close()
            raise ShmRefused("shm.segment", name, "header magic is not an edge segment")
        return cls(name, mapping, writable=False)

    @property
    def generation(self) -> int:
        """The generation last written by the producer."""
        return int(_HEADER.unpack_from(self._map, 0)[1])

    def set_generation(self, generation: int) -> None:
        """Stamp a new generation (producer only)."""
        _HEADER.pack_into(self._map, 0, _MAGIC, generation)

    def data(self, offset: int, nbytes: int) -> memoryview:
        """Return the bytes ``[offset, offset + nbytes)`` of the segment (offsets are absolute)."""
        return self._view[offset : offset + nbytes]

    def close(self) -> None:
        """Unmap if no view is still exported; otherwise the mapping dies with its last view."""
        try:
            self._view.release()
            self._map.close()
        except BufferError:
            pass  # a consumer array still references it; unmapped when that array dies


@dataclass(frozen=True, slots=True)
class Lease:
    """A segment handed out by a producer: write into :attr:`view`, send the reference.

    Attributes:
        segment: the segment name.
        generation: the generation stamped for this lease; the ack must repeat it.
        offset: where the data starts in the segment (always :data:`HEADER_BYTES`).
        view: writable bytes ``[offset, offset + nbytes)``.

    """

    segment: str
    generation: int
    offset: int
    view: memoryview


class SegmentProducer:
    """Hands out segments for outgoing tensors and keeps them until acknowledged.

    Thread-safe: a worker's handler may emit from several threads at once.
    """

    def __init__(
        self,
        prefix: str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_buffers: int = DEFAULT_MAX_BUFFERS,
        channel: FdChannel | None = None,
    ) -> None:
        self.prefix = _check_prefix(prefix)
        _OWN_PREFIXES.add(self.prefix)
        self.channel = channel
        """Where sealed segments are sent (None: named POSIX segments)."""
        self.max_bytes = max_bytes
        self.max_buffers = max_buffers
        self._lock = threading.Lock()
        self._leased: dict[str, tuple[Segment, int]] = {}
        self._pool: OrderedDict[str, Segment] = OrderedDict()
        self._held_bytes = 0
        self._generation = 0
        self._gone: list[str] = []
        self._closed = False

    @property
    def retained_bytes(self) -> int:
        """Data capacity of the segments leased and not yet acknowledged."""
        with self._lock:
            return sum(seg.capacity for seg, _ in self._leased.values())

    @property
    def retained_buffers(self) -> int:
        """Number of segments leased and not yet acknowledged."""
        with self._lock:
            return len(self._leased)

    @property
    def held_bytes(self) -> int:
        """Data capacity of every segment held (leased plus pooled)."""
        with self._lock:
            return self._held_bytes

    def lease(self, nbytes: int) -> Lease:
        """Lease a segment with room for ``nbytes``; raise :class:`ShmCapExceeded` if over cap."""
        if nbytes <= 0:
            raise ShmError("shm.nbytes", nbytes, "must be > 0")
        with self._lock:
            if self._closed:
                raise ShmError("shm.producer", self.prefix, "producer is closed")
            segment = self._take_pooled(nbytes)
            if segment is None:
                segment = self._create(nbytes)
            self._generation += 1
            generation = self._generation
            segment.set_generation(generation)
            self._leased[segment.name] = (segment, generation)
        return Lease(segment.name, generation, HEADER_BYTES, segment.data(HEADER_BYTES, nbytes))

    def _take_pooled(self, nbytes: int) -> Segment | None:
        for name, segment in self._pool.items():
            if nbytes <= segment.capacity <= 2 * _round_up(nbytes):
                del self._pool[name]
                return segment
        return None

    def _create(self, nbytes: int) -> Segment:
        capacity = _round_up(nbytes)
        leased_bytes = self._held_bytes - sum(s.capacity for s in self._pool.values())
        if leased_bytes + capacity > self.max_bytes:
            raise ShmCapExceeded(
                "shm.retained_bytes",
                leased_bytes + capacity,
                f"exceeds the per-producer cap of {self.max_bytes} bytes",
            )
        if len(self._leased) + 1 > self.max_buffers:
            raise ShmCapExceeded(
                "shm.retained_buffers",
                len(self._leased) + 1,
                f"exceeds the per-producer cap of {self.max_buffers} buffers",
            )
        while self._pool and (
            self._held_bytes + capacity > self.max_bytes
            or len(self._leased) + len(self._pool) + 1 > self.max_buffers
        ):
            _, evicted = self._pool.popitem(last=False)
            self._drop(evicted)
        name = f"{NAME_PREFIX}{self.prefix}_{os.urandom(8).hex()}"
        segment = Segment.create(name, capacity, self.channel)
        self._held_bytes += segment.capacity
        return segment

    def _drop(self, segment: Segment) -> None:
        self._held_bytes -= segment.capacity
        if not segment.sealed:  # a memfd has no name: it goes with its last holder
            _unlink(segment.name)
        segment.close()
        self._gone.append(segment.name)

    def release(self, segment: str, generation: int, *, unlink: bool = False) -> bool:
        """Take back a segment the consumer acknowledged; a stale generation frees nothing.

        With ``unlink`` the segment is not pooled for reuse but unlinked at once: the
        consumer still holds views of it, which stay valid (its mapping keeps the pages)
        but must never see another tensor's bytes.
        """
        with self._lock:
            entry = self._leased.get(segment)
            if entry is None or entry[1] != generation:
                return False
            del self._leased[segment]
            if self._closed or unlink:
                self._drop(entry[0])
            else:
                self._pool[segment] = entry[0]
            return True

    def renew(self, segment: str, generation: int) -> int | None:
        """Stamp a new generation on a segment leased under ``generation``; return it.

        For a buffer its owner fills and sends again (a controller's input buffer): the
        segment stays leased to it, and references to the old generation become stale
        for the consumer. None when ``segment`` is not leased under ``generation``
        (acknowledged, released, or the producer closed).
        """
        with self._lock:
            entry = self._leased.get(segment)
            if self._closed or entry is None or entry[1] != generation:
                return None
            self._generation += 1
            entry[0].set_generation(self._generation)
            self._leased[segment] = (entry[0], self._generation)
            return self._generation

    def leased_generation(self, segment: str) -> int | None:
        """The generation ``segment`` is leased under; None when it is not leased (or closed).

        For an owner whose :meth:`renew` was cut short (a ``KeyboardInterrupt``) after the
        new generation was stamped, before it learnt it.
        """
        with self._lock:
            entry = self._leased.get(segment)
            return None if self._closed or entry is None else entry[1]

    def take_gone(self) -> list[str]:
        """Return (and forget) the names unlinked since the last call, for the consumer."""
        if not self._gone:  # the usual case, read without the lock: a name appended
            return []  # meanwhile is taken by the next call (announced one frame later)
        with self._lock:
            gone, self._gone = self._gone, []
            return gone

    def gone_names(self) -> list[str]:
        """The names unlinked and not announced yet (a copy; see :meth:`announced`).

        For a sender that may be cut short anywhere (a controller's thread, by a Ctrl-C):
        the names stay here until :meth:`announced` is told they went, so an interrupt
        before that leaves them for the next frame. A name announced twice (two frames
        under way, or a frame written just before an interrupt) is harmless: the consumer
        forgets a name once, and names are never reused (random).
        """
        if not self._gone:  # the usual case, read without the lock (as take_gone)
            return []
        with self._lock:
            return list(self._gone)

    def announced(self, names: list[str]) -> None:
        """Forget ``names`` (from :meth:`gone_names`): a frame that carried them was sent."""
        with self._lock:
            sent = set(names)
            self._gone = [name for name in self._gone if name not in sent]

    def restore_gone(self, names: list[str]) -> None:
        """Put back names taken by :meth:`take_gone` whose frame was never sent."""
        with self._lock:
            if not self._closed:
                self._gone[:0] = names

    def close(self) -> None:
        """Unlink every segment, leased or pooled. Idempotent."""
        with self._lock:
            self._closed = True
            for segment, _ in self._leased.values():
                self._drop(segment)
            for segment in self._pool.values():
                self._drop(segment)
            self._leased.clear()
            self._pool.clear()
            self._gone.clear()


class SegmentConsumer:
    """Maps a peer's segments read-only, validating every reference before any byte is read.

    Mappings are cached (a producer reuses its segments) and bounded; the producer's list
    of unlinked names (:meth:`SegmentProducer.take_gone`) lets the consumer drop them early.
    """

    def __init__(
        self,
        prefix: str,
        *,
        max_mappings: int = DEFAULT_MAX_BUFFERS,
        channel: FdChannel | None = None,
    ) -> None:
        self.prefix = _check_prefix(prefix)
        self.channel = channel
        """Where the peer's sealed segments arrive (None: named segments). Closed with
        the consumer."""
        self.max_mappings = max_mappings
        self._lock = threading.Lock()
        self._maps: OrderedDict[str, Segment] = OrderedDict()

    def view(self, segment: str, offset: int, generation: int, nbytes: int) -> memoryview:
        """Return the read-only bytes a reference names, after checking name, range, generation.

        A name is checked (an edge segment of this consumer's producer) before it is first
        mapped; a name already mapped passed that check then.
        """
        with self._lock:
            mapped = self._maps.get(segment) if type(segment) is str else None
            if mapped is None:
                if not isinstance(segment, str) or not _NAME_RE.match(segment):
                    raise ShmRefused("shm.segment", segment, "is not an edge segment name")
                if not segment.startswith(f"{NAME_PREFIX}{self.prefix}_"):
                    raise ShmRefused("shm.segment", segment,
                                     f"must belong to producer {self.prefix}")
                mapped = Segment.attach(segment, self.channel)
                self._maps[segment] = mapped
                while len(self._maps) > self.max_mappings:
                    self._maps.popitem(last=False)[1].close()
            else:
                self._maps.move_to_end(segment)
        end = HEADER_BYTES + mapped.capacity
        if offset < HEADER_BYTES or nbytes < 0 or offset + nbytes > end:
            raise ShmRefused(
                "shm.offset", offset, f"range of {nbytes} bytes must lie in [{HEADER_BYTES}, {end})"
            )
        current = mapped.generation
        if current != generation:
            raise ShmRefused("shm.generation", generation, f"stale: the segment is at {current}")
        return mapped.data(offset, nbytes)

    def forget(self, names: list[str]) -> None:
        """Drop cached mappings of segments the producer has unlinked."""
        with self._lock:
            for name in names:
                mapped = self._maps.pop(name, None)
                if mapped is not None:
                    mapped.close()
        if self.channel is not None:
            self.channel.discard(names)

    def close(self) -> None:
        """Drop every cached mapping (and close the channel). Idempotent."""
        with self._lock:
            for mapped in self._maps.values():
                mapped.close()
            self._maps.clear()
        if self.channel is not None:
            self.channel.close()
