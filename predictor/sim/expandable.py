"""Expandable segments (``expandable_segments:True``) for :mod:`predictor.sim.allocator`.

Rules (``find_expandable_block``, ``map_block``, ``try_allocate_expandable_block`` and
``unmap_block`` in ``c10/cuda/CUDACachingAllocator.cpp`` of PyTorch, tag v2.13.0):

* One virtual address range per (stream, pool), 1 1/8 of the device capacity, grown by
  mapping physical pages of 2 MiB (small pool) / 20 MiB (large pool). Reserved bytes are
  the mapped pages; there is no ``get_allocation_size`` rounding.
* A request that no free block fits maps pages at the lowest address with enough
  free + unmapped room, merging with the free block just before it.
* Blocks split whenever the remainder is >= 512 B.
* ``empty_cache`` / the OOM retry unmap every whole free page; a segment whose whole range
  is unmapped is released.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from memgnn.predictor.sim.blocks import K_LARGE_BUFFER, K_SMALL_BUFFER, Block, BlockPool

if TYPE_CHECKING:
    from memgnn.predictor.sim.allocator import CachingAllocatorSim

_UNLIMITED_VA = 1 << 40  # address space per segment when the capacity is unlimited


class ExpandableSegment:
    __slots__ = ("base", "size", "page", "stream", "small")

    def __init__(self, base: int, size: int, page: int, stream: int, small: bool) -> None:
        self.base, self.size, self.page, self.stream, self.small = base, size, page, stream, small


def insert_unmapped(pool: BlockPool, b: Block) -> None:
    bisect.insort(pool.ukeys, (b.stream, b.addr))
    pool.unmapped[b.addr] = b


def remove_unmapped(pool: BlockPool, b: Block) -> None:
    del pool.ukeys[bisect.bisect_left(pool.ukeys, (b.stream, b.addr))]
    del pool.unmapped[b.addr]


def _expandable_size(b: Block) -> int:
    nxt = b.next
    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


def best_fit_index(pool: BlockPool, i: int, stream: int) -> int:
    """get_free_block: an expandable block counts with the unmapped room after it."""
    keys, b = pool.keys, pool.at(i)
    while b.seg is not None and i + 1 < len(keys) and keys[i + 1][0] == stream:
        nxt = pool.at(i + 1)
        if _expandable_size(nxt) >= _expandable_size(b):
            break
        i, b = i + 1, nxt
    return i


def _is_free(b: Block | None) -> bool:
    return b is not None and not b.allocated


def _has_room(b: Block | None, size: int) -> bool:
    total = 0
    while total < size and b is not None and not b.allocated:
        total += b.size
        b = b.next
    return total >= size


def _new_segment(sim: CachingAllocatorSim, pool: BlockPool, stream: int) -> Block:
    page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
    cap = sim.config.capacity_bytes
    va = _UNLIMITED_VA if cap is None else cap + cap // 8
    va = max(1, -(-va // page)) * page
    seg = ExpandableSegment(sim.reserve_address_space(va), va, page, stream, pool.small)
    sim.exp_segments.append(seg)
    block = Block(seg.base, va, stream, pool.small, seg, mapped=False)
    insert_unmapped(pool, block)
    return block


def _release_segment(sim: CachingAllocatorSim, pool: BlockPool, b: Block) -> None:
    remove_unmapped(pool, b)
    sim.exp_segments.remove(b.seg)


def _find(sim: CachingAllocatorSim, pool: BlockPool, stream: int, size: int) -> Block | None:
    """find_expandable_block: lowest address (free prefix + unmapped) with room."""
    lo = bisect.bisect_left(pool.ukeys, (stream,))
    hi = bisect.bisect_left(pool.ukeys, (stream + 1,))
    for _, addr in pool.ukeys[lo:hi]:
        c = pool.unmapped[addr]
        if _is_free(c.prev):
            c = c.prev
        if _has_room(c, size):
            return c
    c = _new_segment(sim, pool, stream)
    if not _has_room(c, size):  # larger than the whole address range: cannot succeed
        _release_segment(sim, pool, c)
        return None
    return c


def _map(sim: CachingAllocatorSim, pool: BlockPool, b: Block, size: int) -> bool:
    """map_block: back ``size`` bytes (whole pages) of unmapped ``b``; False on OOM."""
    page = b.seg.page
    mapped = -(-size // page) * page
    cap = sim.config.capacity_bytes
    if cap is not None and sim.reserved + mapped > cap:
        return False  # cuMemCreate fails; pages created in this call are released
    remove_unmapped(pool, b)
    b.mapped = True
    if sim.segment_observer is not None:  # what the trace records as segment_map
        sim.segment_observer("segment_map", b.addr, mapped, b.stream)
    if mapped < b.size:
        rest = Block(b.addr + mapped, b.size - mapped, b.stream, b.small, b.seg, mapped=False)
        rest.link_after(b)
        insert_unmapped(pool, rest)
        b.size = mapped
    sim.try_merge(b, b.prev, pool)
    sim.try_merge(b, b.next, pool)
    pool.insert(b)
    sim.add_reserved(mapped)
    return True


def try_allocate(sim: CachingAllocatorSim, pool: BlockPool, stream: int, size: int) -> Block | None:
    """try_allocate_expandable_block: map pages until a free block of ``size`` exists."""
    c = _find(sim, pool, stream, size)
    if c is None:
        return None
    if not c.mapped and not _map(sim, pool, c, min(c.size, size)):
        return None
    while c.size < size:
        nxt = c.next  # invariant: free -> unmapped
        if not _map(sim, pool, nxt, min(size - c.size, nxt.size)):
            return None
        c = nxt  # nxt absorbed c when mapped
    pool.remove(c)
    return c


def unmap_block(sim: CachingAllocatorSim, pool: BlockPool, b: Block) -> None:
    """unmap_block: unmap the whole pages of free block ``b``; release an empty segment."""
    seg = b.seg
    begin = seg.base + -(-(b.addr - seg.base) // seg.page) * seg.page
    end = seg.base + (b.addr + b.size - seg.base) // seg.page * seg.page
    if begin >= end:
        return
    pool.remove(b)
    if begin > b.addr:
        before = Block(b.addr, begin - b.addr, b.stream, b.small, seg)
        if b.prev is not None:
            before.link_after(b.prev)
        else:
            before.prev, before.next, b.prev = None, b, before
        pool.insert(before)
    if end < b.addr + b.size:
        after = Block(end, b.addr + b.size - end, b.stream, b.small, seg)
        after.link_after(b)
        pool.insert(after)
    b.addr, b.size, b.mapped = begin, end - begin, False
    if sim.segment_observer is not None:  # what the trace records as segment_unmap
        sim.segment_observer("segment_unmap", begin, end - begin, b.stream)
    sim.try_merge(b, b.prev, pool)
    sim.try_merge(b, b.next, pool)
    insert_unmapped(pool, b)
    sim.add_reserved(-(end - begin))
    if not b.is_split():
        _release_segment(sim, pool, b)
