"""Faithful simulator of PyTorch's CUDA caching allocator (the native backend).

Rules (from ``c10/cuda/CUDACachingAllocator.cpp`` of PyTorch, tag v2.13.0; checked against
real CUDA snapshots by ``benchmarks/snapshot_fidelity.py``):

* ``round_size``: requests round up to 512 B (optionally to power-of-two divisions).
* Rounded size <= 1 MiB uses the small pool, else the large pool. A new segment has
  ``get_allocation_size`` bytes: <= 1 MiB -> 2 MiB, < 10 MiB -> 20 MiB, else rounded
  up to 2 MiB.
* Best fit: the smallest free block of the same stream with size >= request, lowest
  address on ties (pool ordered by (stream, size, address)); other streams never reuse.
  With ``max_split_size``, small requests never take oversize blocks and big requests
  only take an oversize block smaller than request + ``max_non_split_rounding``.
* ``should_split``: small pool (or expandable segments) if remaining >= 512; large pool
  if request < max_split_size and remaining > 1 MiB. The allocation takes the low
  addresses; ``allocated_bytes`` counts the whole block handed out.
* Free merges with free neighbours of the same segment. Memory only goes back by
  ``empty_cache``, the OOM retry or garbage collection, and only whole free segments.
* Device allocation failure (capacity, or the memory-fraction limit) frees cached
  blocks and retries once (``num_alloc_retries``); failing again raises
  :class:`SimulatedOOM` (``num_ooms``).
* ``garbage_collection_threshold`` (with a memory fraction): before growing past
  threshold x limit, whole large-pool free segments of at least average age are freed.
* Expandable segments live in :mod:`predictor.sim.expandable`.

Handles are simulated device addresses. Addresses of new segments grow monotonically
(the real cudaMalloc may reuse freed addresses; this only affects equal-size ties).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from memgnn.predictor.sim import expandable as allocator_expandable
from memgnn.predictor.sim.blocks import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    SIZE_MAX,
    Block,
    BlockPool,
    MiB,
)

logger = logging.getLogger(__name__)

_BASE_ADDR = 1 << 32


@dataclass(kw_only=True, slots=True)
class AllocatorConfig:
    """Allocator settings (``PYTORCH_CUDA_ALLOC_CONF`` plus the device limit)."""

    capacity_bytes: int | None = None  # device memory usable by the allocator; None = unlimited
    memory_fraction: float | None = None  # set_per_process_memory_fraction
    max_split_size: int | None = None  # bytes; None = unlimited (PyTorch default)
    max_non_split_rounding: int = 20 * MiB
    roundup_power2_divisions: int = 0
    expandable_segments: bool = False
    garbage_collection_threshold: float | None = None

    def __post_init__(self) -> None:
        if self.capacity_bytes is not None and self.capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {self.capacity_bytes}")
        if self.memory_fraction is not None:
            if not 0.0 <= self.memory_fraction <= 1.0:
                raise ValueError(f"memory_fraction must be in [0, 1], got {self.memory_fraction}")
            if self.capacity_bytes is None:
                raise ValueError("memory_fraction needs capacity_bytes")
        # PyTorch rejects max_split_size_mb below the 20 MiB large-segment size.
        if self.max_split_size is not None and self.max_split_size < K_LARGE_BUFFER:
            raise ValueError(f"max_split_size must be >= 20 MiB, got {self.max_split_size}")
        if self.max_non_split_rounding < 0:
            raise ValueError("max_non_split_rounding must be >= 0")
        d = self.roundup_power2_divisions
        if d < 0 or (d & (d - 1)) != 0:
            raise ValueError(f"roundup_power2_divisions must be 0 or a power of 2, got {d}")
        t = self.garbage_collection_threshold
        if t is not None and not 0.0 < t < 1.0:
            raise ValueError(f"garbage_collection_threshold must be in (0, 1), got {t}")

    @property
    def fraction_limit(self) -> int | None:
        """``allowed_memory_maximum``: fraction x capacity, or None without a fraction."""
        if self.memory_fraction is None or self.capacity_bytes is None:
            return None
        return int(self.memory_fraction * self.capacity_bytes)

    def unlimited(self) -> AllocatorConfig:
        """The same settings without a device limit (no capacity, fraction or collection
        threshold): what a step needs where it would not fit. Not ``capacity_bytes=None``,
        which `predictor.sim.simulate.simulate` reads as "the device's usable memory"."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        fields.update(capacity_bytes=1 << 62, memory_fraction=None)
        fields["garbage_collection_threshold"] = None  # needs a fraction
        return AllocatorConfig(**fields)


class SimulatedOOM(torch.OutOfMemoryError):
    """Raised when the simulated allocator runs out of memory (like PyTorch's OOM)."""


@dataclass(kw_only=True, slots=True)
class AllocatorStats:
    allocated_bytes: int
    peak_allocated_bytes: int
    reserved_bytes: int
    peak_reserved_bytes: int
    requested_bytes: int
    peak_requested_bytes: int
    num_alloc_retries: int
    num_ooms: int
    inactive_split_bytes: int
    largest_free_block_bytes: int
    free_reserved_bytes: int
    fragmentation: float  # largest free block / free reserved bytes; 1.0 when nothing is free
    num_segments: int

    @property
    def would_oom(self) -> bool:
        return self.num_ooms > 0


def pool_name(pool: BlockPool) -> str:
    return "small-pool" if pool.small else "large-pool"


def format_size(size: int) -> str:
    """PyTorch's ``format_size``: bytes / KiB / MiB / GiB with two decimals."""
    if size <= 1024:
        return f"{size} bytes"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20)):
        if size <= scale << 10:
            return f"{size / scale:.2f} {unit}"
    return f"{size / (1 << 30):.2f} GiB"


def roundup_power2_next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(size: int, roundup_power2_divisions: int = 0) -> int:
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    d = roundup_power2_divisions
    if d > 1 and size > K_MIN_BLOCK * d:
        return roundup_power2_next_division(size, d)
    return -(-size // K_MIN_BLOCK) * K_MIN_BLOCK


def get_allocation_size(size: int) -> int:
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


class CachingAllocatorSim:
    """One device's ``DeviceCachingAllocator`` without CUDA graphs or cross-stream events."""

    def __init__(self, config: AllocatorConfig | None = None) -> None:
        self.config = cfg = config or AllocatorConfig()
        self._mss = SIZE_MAX if cfg.max_split_size is None else cfg.max_split_size
        self._allowed = cfg.fraction_limit
        self._gc = self._allowed is not None and cfg.garbage_collection_threshold is not None
        self._exp = None
        if cfg.expandable_segments:
            self._exp = allocator_expandable
        self._small, self._large = BlockPool(True), BlockPool(False)
        self._active: dict[int, Block] = {}
        self._segments: dict[int, int] = {}  # base address -> size (non-expandable)
        self._bases: list[int] = []  # sorted keys of _segments (seeding, overlap checks)
        self.exp_segments: list = []
        self._next_addr = _BASE_ADDR
        self.allocated = self.reserved = self.requested = 0
        self.peak_allocated = self.peak_reserved = self.peak_requested = 0
        self.num_alloc_retries = self.num_ooms = 0
        # Called as observer(action, address, size, stream) on every native segment
        # alloc / free ("segment_alloc" / "segment_free") and expandable page map / unmap
        # ("segment_map" / "segment_unmap"); None = no observer.
        self.segment_observer: Callable[[str, int, int, int], None] | None = None
        # Called as hint(size, stream) for a new native segment's address (the driver's
        # choice, e.g. the recorded cudaMalloc result); None or a None answer = the next
        # address above every segment so far. The caller keeps hinted segments disjoint.
        self.segment_address_hint: Callable[[int, int], int | None] | None = None

    # ---- public API -------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes on ``stream``; returns a handle (0 for size 0)."""
        if size < 0:
            raise ValueError(f"negative allocation size {size}")
        if size == 0:
            return 0
        rounded = round_size(size, self.config.roundup_power2_divisions)
        pool = self._small if rounded <= K_SMALL_SIZE else self._large
        block = self._get_free_block(pool, stream, rounded)
        if block is None:
            block = self._alloc_new(pool, stream, rounded)
        return self._alloc_found(block, pool, rounded, size)

    def free(self, handle: int) -> None:
        if handle == 0:
            return  # freeing the null pointer of a zero-byte allocation
        block = self._active.pop(handle, None)
        if block is None:
            raise ValueError(f"free of unknown or already freed handle {handle:#x}")
        block.allocated = False
        self._add_allocated(-block.size, -block.requested)
        self.free_block(block, self._pool_of(block))

    def empty_cache(self) -> None:
        self.release_cached_blocks()

    def reset_peak_stats(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved
        self.peak_requested = self.requested

    def stats(self) -> AllocatorStats:
        free = [*self._small.blocks.values(), *self._large.blocks.values()]
        largest = max((b.size for b in free), default=0)
        free_reserved = self.reserved - self.allocated
        return AllocatorStats(
            allocated_bytes=self.allocated,
            peak_allocated_bytes=self.peak_allocated,
            reserved_bytes=self.reserved,
            peak_reserved_bytes=self.peak_reserved,
            requested_bytes=self.requested,
            peak_requested_bytes=self.peak_requested,
            num_alloc_retries=self.num_alloc_retries,
            num_ooms=self.num_ooms,
            inactive_split_bytes=sum(b.size for b in free if b.seg is None and b.is_split()),
            largest_free_block_bytes=largest,
            free_reserved_bytes=free_reserved,
            fragmentation=largest / free_reserved if free_reserved > 0 else 1.0,
            num_segments=len(self.snapshot()),
        )

    def snapshot(self) -> list[dict]:
        """Segments (expandable: each contiguous mapped range) with their blocks."""
        heads = [self.block_at(a) for a in self._segments]
        for seg in self.exp_segments:
            b: Block | None = self.block_at(seg.base)
            while b is not None:
                if b.mapped and (b.prev is None or not b.prev.mapped):
                    heads.append(b)
                b = b.next
        segs = [self._segment_info(h) for h in heads]
        return sorted(segs, key=lambda s: s["address"])

    # ---- seeding: start from a recorded state (predictor.snapshot) ----------------
    def add_segment(
        self, address: int, size: int, *, stream: int = 0, small: bool | None = None
    ) -> None:
        """Add a whole free segment at ``address``, as if cudaMalloc'd outside this run.

        For starting from a recorded allocator state (segments that existed when recording
        began) and for following a recorded trace's ``segment_alloc``. ``small`` picks the
        pool; by default a 2 MiB segment is small-pool (no large request gets one). Later
        segments the simulator allocates itself are placed above every seeded one.
        """
        if self._exp is not None:
            raise ValueError("add_segment seeds native segments; expandable_segments is on")
        if size <= 0 or size % K_MIN_BLOCK or address <= 0 or address % K_MIN_BLOCK:
            raise ValueError(f"bad segment {size} B at {address:#x} (need multiples of 512)")
        end = address + size
        other = self.overlapping_segment(address, size)
        if other is not None:
            raise ValueError(f"segment at {address:#x} overlaps the one at {other:#x}")
        small = size == K_SMALL_BUFFER if small is None else small
        block = Block(address, size, stream, small)
        self._segments[address] = size
        bisect.insort(self._bases, address)
        (self._small if small else self._large).insert(block)
        self.add_reserved(size)
        self._next_addr = max(self._next_addr, -(-end // K_ROUND_LARGE) * K_ROUND_LARGE)

    def seed_block(self, address: int, size: int, *, requested: int | None = None) -> int:
        """Mark ``[address, address + size)`` of a free block allocated; returns its handle.

        For blocks that were allocated before a recorded trace began. The free pieces
        before and after it stay free in their pool (no rounding or split rule applies:
        the recorded block size is taken as is).
        """
        if size <= 0 or size % K_MIN_BLOCK:
            raise ValueError(f"bad block size {size} (need a positive multiple of 512)")
        free = self._free_block_containing(address)
        if free is None or address + size > free.addr + free.size:
            raise ValueError(f"no free block holds {size} B at {address:#x}")
        pool = self._pool_of(free)
        pool.remove(free)
        if free.addr < address:  # the free piece in front keeps the old head
            block = Block(address, free.addr + free.size - address, free.stream, free.small)
            block.link_after(free)
            free.size = address - free.addr
            pool.insert(free)
        else:
            block = free
        if block.size > size:
            rest = Block(address + size, block.size - size, block.stream, block.small)
            rest.link_after(block)
            block.size = size
            pool.insert(rest)
        block.allocated = True
        block.requested = size if requested is None else requested
        self._active[address] = block
        self._add_allocated(size, block.requested)
        return address

    def malloc_at(self, address: int, size: int, stream: int = 0) -> int:
        """``malloc`` that takes the free block starting at ``address`` (a recorded choice).

        Rounding and ``should_split`` apply as in :meth:`malloc`; only best fit is replaced
        by the given placement. Raises ValueError if no free block of the request's pool and
        stream, large enough, starts there (the recorded choice is impossible here).
        """
        if size <= 0:
            raise ValueError(f"malloc_at needs a positive size, got {size}")
        rounded = round_size(size, self.config.roundup_power2_divisions)
        pool = self._small if rounded <= K_SMALL_SIZE else self._large
        block = pool.blocks.get(address)
        if block is None or block.stream != stream or block.size < rounded or not block.mapped:
            raise ValueError(f"no free {pool_name(pool)} block of >= {rounded} B at {address:#x}")
        pool.remove(block)
        return self._alloc_found(block, pool, rounded, size)

    def release_segment(self, address: int) -> None:
        """cudaFree the whole free segment at ``address`` (a recorded ``segment_free``)."""
        size = self._segments.get(address)
        block = self._small.blocks.get(address) or self._large.blocks.get(address)
        if size is None or block is None or block.size != size:
            raise ValueError(f"no whole free segment at {address:#x}")
        self._release_block(block, self._pool_of(block))

    def segment_bases(self) -> dict[int, int]:
        """Native segments: base address -> size."""
        return dict(self._segments)

    def overlapping_segment(self, address: int, size: int) -> int | None:
        """Base of a native segment overlapping ``[address, address + size)``, or None."""
        bases = self._bases
        k = bisect.bisect_left(bases, address + size) - 1
        if k >= 0 and bases[k] + self._segments[bases[k]] > address:
            return bases[k]
        return None

    def _free_block_containing(self, address: int) -> Block | None:
        base = self.overlapping_segment(address, 1)
        if base is None:
            return None
        b: Block | None = self.block_at(base)
        while b is not None and b.addr + b.size <= address:
            b = b.next
        return None if b is None or b.allocated else b

    # ---- helpers shared with allocator_expandable -------------------------------
    def block_at(self, addr: int) -> Block:
        for d in (
            self._active,
            self._small.blocks,
            self._large.blocks,
            self._small.unmapped,
            self._large.unmapped,
        ):
            if addr in d:
                return d[addr]
        raise KeyError(addr)

    def reserve_address_space(self, size: int) -> int:
        addr = self._next_addr
        self._next_addr += -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
        return addr

    def add_reserved(self, delta: int) -> None:
        self.reserved += delta
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def try_merge(self, dst: Block, src: Block | None, pool: BlockPool) -> int:
        """Merge free neighbour ``src`` into ``dst``; returns the bytes subsumed."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if src.mapped:
            pool.remove(src)
        else:
            self._exp.remove_unmapped(pool, src)
        if dst.prev is src:
            dst.addr, dst.prev = src.addr, src.prev
            if src.prev is not None:
                src.prev.next = dst
        else:
            dst.next = src.next
            if src.next is not None:
                src.next.prev = dst
        dst.size += src.size
        return src.size

    def free_block(self, block: Block, pool: BlockPool) -> None:
        self.try_merge(block, block.prev, pool)
        self.try_merge(block, block.next, pool)
        pool.insert(block)

    def release_cached_blocks(self) -> None:
        """Free every whole free segment (expandable: unmap every free page)."""
        for pool in (self._large, self._small):
            to_unmap = []
            for b in [pool.at(i) for i in range(len(pool.keys))]:
                if b.seg is not None:
                    to_unmap.append(b)
                elif not b.is_split():
                    self._release_block(b, pool)
            for b in to_unmap:
                self._exp.unmap_block(self, pool, b)

    # ---- malloc internals ----------------------------------------------------------
    def _pool_of(self, block: Block) -> BlockPool:
        return self._small if block.small else self._large

    def _add_allocated(self, delta: int, requested: int) -> None:
        self.allocated += delta
        self.requested += requested
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)

    def _get_free_block(self, pool: BlockPool, stream: int, size: int) -> Block | None:
        if self._gc:
            pool.calls += 1
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream, size))
        if i == len(keys) or keys[i][0] != stream:
            return None
        if self._exp is not None:
            i = self._exp.best_fit_index(pool, i, stream)
        found = keys[i][1]
        if size < self._mss and found >= self._mss:
            return None  # do not hand out an oversize block for a small request
        if size >= self._mss and found >= size + self.config.max_non_split_rounding:
            return None
        block = pool.at(i)
        pool.remove(block)
        return block

    def _alloc_new(self, pool: BlockPool, stream: int, size: int) -> Block:
        """The ``malloc`` slow path: gc, device alloc, release-and-retry, OOM."""
        alloc_size = get_allocation_size(size)
        if self._gc:
            self._garbage_collect()
        block = self._alloc_block(pool, stream, size, alloc_size)
        if block is None and self._release_available(pool, stream, size):
            block = self._alloc_block(pool, stream, size, alloc_size)
        if block is None:
            # DeviceCachingAllocator::malloc: release_cached_blocks() always returns true,
            # so every failure (fraction limit included, see alloc_block) is retried once.
            self.release_cached_blocks()
            self.num_alloc_retries += 1
            block = self._alloc_block(pool, stream, size, alloc_size)
        if block is None:
            self.num_ooms += 1
            msg = self._oom_message(alloc_size)
            logger.debug("simulated OOM: %s", msg)
            raise SimulatedOOM(msg)
        return block

    def _alloc_block(
        self, pool: BlockPool, stream: int, size: int, alloc_size: int
    ) -> Block | None:
        # alloc_block: with a memory fraction the limit check fails before any cudaMalloc.
        if self._allowed is not None and self.reserved + alloc_size > self._allowed:
            return None
        if self._exp is not None:
            return self._exp.try_allocate(self, pool, stream, size)
        cap = self.config.capacity_bytes
        if cap is not None and self.reserved + alloc_size > cap:
            return None
        hint = self.segment_address_hint
        addr = None if hint is None else hint(alloc_size, stream)
        if addr is None:
            addr = self.reserve_address_space(alloc_size)
        else:  # later addresses of the simulator's own go above it
            end = -(-(addr + alloc_size) // K_ROUND_LARGE) * K_ROUND_LARGE
            self._next_addr = max(self._next_addr, end)
        block = Block(addr, alloc_size, stream, pool.small)
        self._segments[block.addr] = alloc_size
        bisect.insort(self._bases, block.addr)
        self.add_reserved(alloc_size)
        if self.segment_observer is not None:
            self.segment_observer("segment_alloc", block.addr, alloc_size, stream)
        logger.debug("segment alloc %d B at %#x (stream %d)", alloc_size, block.addr, stream)
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or self._exp is not None:
            return remaining >= K_MIN_BLOCK
        return size < self._mss and remaining > K_SMALL_SIZE

    def _alloc_found(self, block: Block, pool: BlockPool, size: int, orig: int) -> int:
        if self._should_split(block, size):
            rest = Block(block.addr + size, block.size - size, block.stream, block.small, block.seg)
            rest.link_after(block)
            block.size = size
            pool.insert(rest)
        block.allocated = True
        block.requested = orig
        self._active[block.addr] = block
        self._add_allocated(block.size, orig)
        return block.addr

    def _release_block(self, block: Block, pool: BlockPool) -> None:
        pool.remove(block)
        del self._segments[block.addr]
        del self._bases[bisect.bisect_left(self._bases, block.addr)]
        self.add_reserved(-block.size)
        if self.segment_observer is not None:
            self.segment_observer("segment_free", block.addr, block.size, block.stream)
        logger.debug("segment free %d B at %#x", block.size, block.addr)

    def _release_available(self, pool: BlockPool, stream: int, size: int) -> bool:
        """release_available_cached_blocks: free oversize blocks (max_split_size only)."""
        if self._mss == SIZE_MAX:
            return False
        want = max(size, self._mss)
        keys = pool.keys
        i = bisect.bisect_left(keys, (stream, want))
        if i < len(keys) and keys[i][0] == stream:
            return self._release_whole(pool, pool.at(i))
        released = 0
        i -= 1
        while released < want and i >= 0 and keys[i][0] == stream and keys[i][1] >= self._mss:
            block = pool.at(i)
            if not self._release_whole(pool, block):
                break
            released += block.size
            i -= 1
        return released >= want

    def _release_whole(self, pool: BlockPool, block: Block) -> bool:
        if block.seg is not None or block.is_split():
            return False  # cannot cudaFree part of a segment
        self._release_block(block, pool)
        return True

    def _garbage_collect(self) -> None:
        """garbage_collect_cached_blocks: free whole large blocks of >= average age."""
        threshold = int(self.config.garbage_collection_threshold * self._allowed)
        if self.reserved <= threshold:
            return
        target, reclaimed = self.reserved - threshold, 0
        pool = self._large
        cands = [pool.at(i) for i in range(len(pool.keys))]
        cands = [b for b in cands if b.seg is None and not b.is_split()]
        total_age = sum(pool.calls - b.gc_base for b in cands)
        freed = True
        while reclaimed < target and freed and cands:
            avg, freed, keep = total_age / len(cands), False, []
            for b in cands:
                age = pool.calls - b.gc_base
                if age >= avg:
                    freed, reclaimed, total_age = True, reclaimed + b.size, total_age - age
                    self._release_block(b, pool)
                else:
                    keep.append(b)
            cands = keep

    def _oom_message(self, alloc_size: int) -> str:
        cap = self.config.capacity_bytes
        total = "unlimited" if cap is None else format_size(cap)
        free = "unlimited" if cap is None else format_size(max(cap - self.reserved, 0))
        allowed = "" if self._allowed is None else f"{format_size(self._allowed)} allowed; "
        return (
            f"CUDA out of memory (simulated). Tried to allocate {format_size(alloc_size)}. "
            f"GPU 0 has a total capacity of {total} of which {free} is free. {allowed}"
            f"Of the allocated memory {format_size(self.allocated)} is allocated by PyTorch, "
            f"and {format_size(self.reserved - self.allocated)} is reserved by PyTorch but "
            "unallocated."
        )

    def _segment_info(self, head: Block) -> dict:
        blocks, b = [], head
        while b is not None and b.mapped:
            blocks.append(
                {
                    "address": b.addr,
                    "size": b.size,
                    "allocated": b.allocated,
                    "requested_size": b.requested if b.allocated else 0,
                }
            )
            b = b.next
        return {
            "address": head.addr,
            "size": sum(x["size"] for x in blocks),
            "stream": head.stream,
            "pool": "small" if head.small else "large",
            "expandable": head.seg is not None,
            "blocks": blocks,
        }


@dataclass(kw_only=True, slots=True)
class ReplayResult:
    stats: AllocatorStats
    oom: bool
    oom_event_index: int | None
    peak_event_index: int  # first event at which peak reserved was reached (0 if none)


def replay(
    events: Iterable[tuple[str, int, int] | tuple[str, int, int, int]] | Iterable[Sequence],
    config: AllocatorConfig | None = None,
    *,
    stop_on_oom: bool = True,
) -> ReplayResult:
    """Replay ("alloc", key, nbytes[, stream]) / ("free", key, 0[, stream]) events.

    Keys are caller ids of storages. A zero-byte alloc allocates nothing (PyTorch returns
    a null pointer for size 0). On OOM with ``stop_on_oom=False`` the failed alloc is
    skipped (its later free is ignored) and replay continues; ``oom`` is True either way.
    """
    sim = CachingAllocatorSim(config)
    handles: dict[object, int] = {}
    oom_index: int | None = None
    peak_index, peak = 0, 0
    for i, ev in enumerate(events):
        op, key = ev[0], ev[1]
        if op == "alloc":
            if key in handles:
                raise ValueError(f"event {i}: key {key!r} is already allocated")
            try:
                handles[key] = sim.malloc(ev[2], ev[3] if len(ev) > 3 else 0)
            except SimulatedOOM:
                oom_index = i if oom_index is None else oom_index
                if stop_on_oom:
                    break
                handles[key] = 0
        elif op == "free":
            if key not in handles:
                raise ValueError(f"event {i}: free of unknown key {key!r}")
            sim.free(handles.pop(key))
        else:
            raise ValueError(f"event {i}: unknown op {op!r}")
        if sim.peak_reserved > peak:
            peak, peak_index = sim.peak_reserved, i
    return ReplayResult(
        stats=sim.stats(),
        oom=oom_index is not None,
        oom_event_index=oom_index,
        peak_event_index=peak_index,
    )
