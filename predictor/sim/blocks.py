"""The caching allocator's building blocks: its size constants, a block of a segment and the
pool of free blocks, shared by the native rules (`predictor.sim.allocator`) and expandable
segments (`predictor.sim.expandable`), so neither module imports the other for them.
Constants as in c10/cuda/CUDACachingAllocator.cpp."""

from __future__ import annotations

import bisect

MiB = 1 << 20
K_MIN_BLOCK = 512
K_SMALL_SIZE = MiB
K_SMALL_BUFFER = 2 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_LARGE_BUFFER = 20 * MiB
K_ROUND_LARGE = 2 * MiB
SIZE_MAX = (1 << 64) - 1  # max_split_size when unset, as in the source


class Block:
    """A piece of a segment; ``seg`` is the ExpandableSegment or None."""

    __slots__ = (
        "addr",
        "size",
        "stream",
        "small",
        "seg",
        "prev",
        "next",
        "allocated",
        "mapped",
        "requested",
        "gc_base",
    )

    def __init__(
        self, addr: int, size: int, stream: int, small: bool, seg=None, mapped: bool = True
    ) -> None:
        self.addr, self.size, self.stream, self.small = addr, size, stream, small
        self.seg, self.mapped = seg, mapped
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.requested = 0
        self.gc_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def link_after(self, before: Block) -> None:
        """Insert self right after ``before`` in the segment's block list."""
        self.prev, self.next = before, before.next
        if before.next is not None:
            before.next.prev = self
        before.next = self


class BlockPool:
    """Free blocks sorted by (stream, size, addr); unmapped ones by (stream, addr)."""

    __slots__ = ("small", "keys", "blocks", "calls", "ukeys", "unmapped")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[int, Block] = {}
        self.calls = 0  # get_free_blocks_call_count (only counted with gc enabled)
        self.ukeys: list[tuple[int, int]] = []
        self.unmapped: dict[int, Block] = {}

    def insert(self, b: Block) -> None:
        b.gc_base = self.calls
        bisect.insort(self.keys, (b.stream, b.size, b.addr))
        self.blocks[b.addr] = b

    def remove(self, b: Block) -> None:
        del self.keys[bisect.bisect_left(self.keys, (b.stream, b.size, b.addr))]
        del self.blocks[b.addr]

    def at(self, i: int) -> Block:
        return self.blocks[self.keys[i][2]]
