"""The compiled (numba, nopython) replay kernel: the rules of :mod:`predictor.sim.allocator`.

Every function here mirrors one of ``CachingAllocatorSim`` (or of
:mod:`predictor.sim.expandable`) statement for statement, on flat int64 arrays
instead of objects, so the two can be compared event for event:

* ``blk[i, F]``: block ``i``'s field ``F`` (address, size, stream, pool, expandable
  segment or -1, prev/next block or -1, allocated, mapped, requested, gc age base, live);
* ``pool[p, :npool[p]]``: free mapped blocks of pool ``p`` (0 large, 1 small), sorted by
  (stream, size, address); ``umap[p, :numap[p]]``: unmapped blocks by (stream, address);
* ``seg[s, F]``: expandable segment ``s`` (base, size, page, live);
* ``st[F]``: the counters (allocated, reserved, peaks, retries, OOMs, address cursor, ...);
* ``cfg[F]``: the configuration (-1 = unlimited).

Dead block slots form a free list through their ``next`` field. A kernel that runs out
of block slots raises MemoryError and the caller runs it again with more room.

All compiled code lives in this one module on purpose: numba's on-disk cache
(``cache=True``) checks only the source file of the function it loads, so a kernel that
called into another module would keep running stale machine code after an edit there.
"""

from __future__ import annotations

import numpy as np
from memgnn.predictor.sim.replay.events import OP_ALLOC, OP_EMPTY_CACHE, OP_FREE, OP_MARK
from numba import njit

__all__ = ["run_events", "release_cached_blocks", "N_BLOCK_FIELDS", "N_STATS", "N_CFG"]

# block fields
ADDR, SIZE, STREAM, SMALL, SEG, PREV, NEXT, ALLOC, MAPPED, REQ, GCB, LIVE = range(12)
N_BLOCK_FIELDS = 12
# segment fields (expandable)
S_BASE, S_SIZE, S_PAGE, S_LIVE = range(4)
# counters
(
    ALLOCATED,
    RESERVED,
    REQUESTED,
    PEAK_A,
    PEAK_R,
    PEAK_Q,
    RETRIES,
    OOMS,
    NEXT_ADDR,
    NSEG,
    CALLS_LARGE,
    CALLS_SMALL,
    FREE_HEAD,
    NBLK,
    NEXPSEG,
    MAX_A,
    MAX_R,
    OOM_SIZE,
    OOM_ALLOCATED,
    OOM_RESERVED,
    PEAK_EVENT,
    OOM_EVENT,
) = range(22)
N_STATS = 22
# config
C_CAP, C_ALLOWED, C_MSS, C_MNSR, C_DIV, C_EXP, C_GC = range(7)
N_CFG = 7

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_LARGE_BUFFER = 20 << 20
K_ROUND_LARGE = 2 << 20
UNLIMITED_VA = 1 << 40


@njit(cache=True, inline="always")
def _round_size(size, d):
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    if d > 1 and size > K_MIN_BLOCK * d:
        if size & (size - 1) == 0:
            return size
        bl = 0
        while (size >> bl) > 1:
            bl += 1
        floor = 1 << bl
        dl = 0
        while (d >> dl) > 1:
            dl += 1
        step = floor >> dl
        if step == 0:
            return floor << 1
        low = size & ~(step - 1)
        return size if low == size else low + step
    return -(-size // K_MIN_BLOCK) * K_MIN_BLOCK


@njit(cache=True, inline="always")
def _allocation_size(size):
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


# ---- blocks and sorted pools ----------------------------------------------------------
# The state is a tuple s = (blk, st, pool, npool, umap, numap, seg, cfg, gc_fraction).


@njit(cache=True)
def _new_block(s, addr, size, stream, small, sg, mapped):
    blk, st = s[0], s[1]
    i = st[FREE_HEAD]
    if i >= 0:
        st[FREE_HEAD] = blk[i, NEXT]
    else:
        i = st[NBLK]
        if i >= blk.shape[0]:
            raise MemoryError("replay core: out of block slots")
        st[NBLK] = i + 1
    blk[i, ADDR], blk[i, SIZE], blk[i, STREAM], blk[i, SMALL] = addr, size, stream, small
    blk[i, SEG], blk[i, PREV], blk[i, NEXT], blk[i, ALLOC] = sg, -1, -1, 0
    blk[i, MAPPED], blk[i, REQ], blk[i, GCB], blk[i, LIVE] = mapped, 0, 0, 1
    return i


@njit(cache=True)
def _drop_block(s, i):
    blk, st = s[0], s[1]
    blk[i, LIVE] = 0
    blk[i, NEXT] = st[FREE_HEAD]
    st[FREE_HEAD] = i


@njit(cache=True)
def _link_after(blk, b, before):
    nxt = blk[before, NEXT]
    blk[b, PREV], blk[b, NEXT] = before, nxt
    if nxt >= 0:
        blk[nxt, PREV] = b
    blk[before, NEXT] = b


@njit(cache=True)
def _is_split(blk, b):
    return blk[b, PREV] >= 0 or blk[b, NEXT] >= 0


@njit(cache=True)
def _lower(s, p, stream, size, addr):
    """bisect_left in pool p by (stream, size, addr)."""
    blk, pool = s[0], s[2]
    lo, hi = 0, s[3][p]
    while lo < hi:
        mid = (lo + hi) >> 1
        b = pool[p, mid]
        t, z = blk[b, STREAM], blk[b, SIZE]
        if t < stream or (t == stream and (z < size or (z == size and blk[b, ADDR] < addr))):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _ulower(s, p, stream, addr):
    """bisect_left in the unmapped list of pool p by (stream, addr)."""
    blk, umap = s[0], s[4]
    lo, hi = 0, s[5][p]
    while lo < hi:
        mid = (lo + hi) >> 1
        b = umap[p, mid]
        t = blk[b, STREAM]
        if t < stream or (t == stream and blk[b, ADDR] < addr):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _insert_at(arr, counts, p, pos, b):
    n = counts[p]
    for j in range(n, pos, -1):
        arr[p, j] = arr[p, j - 1]
    arr[p, pos] = b
    counts[p] = n + 1


@njit(cache=True)
def _remove_at(arr, counts, p, pos):
    n = counts[p] - 1
    for j in range(pos, n):
        arr[p, j] = arr[p, j + 1]
    counts[p] = n


@njit(cache=True)
def _pool_insert(s, p, b):
    blk = s[0]
    blk[b, GCB] = s[1][CALLS_LARGE + p]
    _insert_at(s[2], s[3], p, _lower(s, p, blk[b, STREAM], blk[b, SIZE], blk[b, ADDR]), b)


@njit(cache=True)
def _pool_remove(s, p, b):
    blk = s[0]
    _remove_at(s[2], s[3], p, _lower(s, p, blk[b, STREAM], blk[b, SIZE], blk[b, ADDR]))


@njit(cache=True)
def _umap_insert(s, p, b):
    blk = s[0]
    _insert_at(s[4], s[5], p, _ulower(s, p, blk[b, STREAM], blk[b, ADDR]), b)


@njit(cache=True)
def _umap_remove(s, p, b):
    blk = s[0]
    _remove_at(s[4], s[5], p, _ulower(s, p, blk[b, STREAM], blk[b, ADDR]))


@njit(cache=True)
def _reserve_address_space(st, size):
    addr = st[NEXT_ADDR]
    st[NEXT_ADDR] += -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
    return addr


@njit(cache=True)
def _add_reserved(st, delta):
    st[RESERVED] += delta
    if st[RESERVED] > st[PEAK_R]:
        st[PEAK_R] = st[RESERVED]
    if st[RESERVED] > st[MAX_R]:
        st[MAX_R] = st[RESERVED]


@njit(cache=True)
def _add_allocated(st, delta, requested):
    st[ALLOCATED] += delta
    st[REQUESTED] += requested
    if st[ALLOCATED] > st[PEAK_A]:
        st[PEAK_A] = st[ALLOCATED]
    if st[ALLOCATED] > st[MAX_A]:
        st[MAX_A] = st[ALLOCATED]
    if st[REQUESTED] > st[PEAK_Q]:
        st[PEAK_Q] = st[REQUESTED]


@njit(cache=True)
def _try_merge(s, p, dst, src):
    """try_merge: merge free neighbour src into dst; returns the bytes subsumed."""
    blk = s[0]
    if src < 0 or blk[src, ALLOC] != 0 or blk[src, MAPPED] != blk[dst, MAPPED]:
        return 0
    if blk[src, MAPPED]:
        _pool_remove(s, p, src)
    else:
        _umap_remove(s, p, src)
    if blk[dst, PREV] == src:
        blk[dst, ADDR], blk[dst, PREV] = blk[src, ADDR], blk[src, PREV]
        if blk[src, PREV] >= 0:
            blk[blk[src, PREV], NEXT] = dst
    else:
        blk[dst, NEXT] = blk[src, NEXT]
        if blk[src, NEXT] >= 0:
            blk[blk[src, NEXT], PREV] = dst
    size = blk[src, SIZE]
    blk[dst, SIZE] += size
    _drop_block(s, src)
    return size


@njit(cache=True)
def _free_block(s, p, b):
    blk = s[0]
    _try_merge(s, p, b, blk[b, PREV])
    _try_merge(s, p, b, blk[b, NEXT])
    _pool_insert(s, p, b)


@njit(cache=True)
def _release_block(s, p, b):
    _pool_remove(s, p, b)
    st = s[1]
    st[NSEG] -= 1
    _add_reserved(st, -s[0][b, SIZE])
    _drop_block(s, b)


# ---- expandable segments (predictor.sim.expandable) -------------------------------
@njit(cache=True)
def _expandable_size(blk, b):
    nxt = blk[b, NEXT]
    return blk[b, SIZE] + (blk[nxt, SIZE] if nxt >= 0 and blk[nxt, MAPPED] == 0 else 0)


@njit(cache=True)
def _best_fit_index(s, p, i, stream):
    blk, pool, n = s[0], s[2], s[3][p]
    b = pool[p, i]
    while blk[b, SEG] >= 0 and i + 1 < n and blk[pool[p, i + 1], STREAM] == stream:
        nxt = pool[p, i + 1]
        if _expandable_size(blk, nxt) >= _expandable_size(blk, b):
            break
        i, b = i + 1, nxt
    return i


@njit(cache=True)
def _has_room(blk, b, size):
    total = 0
    while total < size and b >= 0 and blk[b, ALLOC] == 0:
        total += blk[b, SIZE]
        b = blk[b, NEXT]
    return total >= size


@njit(cache=True)
def _new_segment(s, p, stream):
    st, seg, cfg = s[1], s[6], s[7]
    page = K_SMALL_BUFFER if p == 1 else K_LARGE_BUFFER
    cap = cfg[C_CAP]
    va = UNLIMITED_VA if cap < 0 else cap + cap // 8
    va = max(1, -(-va // page)) * page
    k = st[NEXPSEG]
    if k >= seg.shape[0]:
        raise MemoryError("replay core: out of expandable segment slots")
    st[NEXPSEG] = k + 1
    seg[k, S_BASE] = _reserve_address_space(st, va)
    seg[k, S_SIZE], seg[k, S_PAGE], seg[k, S_LIVE] = va, page, 1
    b = _new_block(s, seg[k, S_BASE], va, stream, p, k, 0)
    _umap_insert(s, p, b)
    return b


@njit(cache=True)
def _release_segment(s, p, b):
    _umap_remove(s, p, b)
    s[6][s[0][b, SEG], S_LIVE] = 0
    _drop_block(s, b)


@njit(cache=True)
def _find(s, p, stream, size):
    blk, umap = s[0], s[4]
    lo = _ulower(s, p, stream, -1)
    hi = _ulower(s, p, stream + 1, -1)
    for j in range(lo, hi):
        c = umap[p, j]
        prev = blk[c, PREV]
        if prev >= 0 and blk[prev, ALLOC] == 0:
            c = prev
        if _has_room(blk, c, size):
            return c
    c = _new_segment(s, p, stream)
    if not _has_room(blk, c, size):
        _release_segment(s, p, c)
        return -1
    return c


@njit(cache=True)
def _map(s, p, b, size):
    blk, st, cfg = s[0], s[1], s[7]
    page = s[6][blk[b, SEG], S_PAGE]
    mapped = -(-size // page) * page
    if cfg[C_CAP] >= 0 and st[RESERVED] + mapped > cfg[C_CAP]:
        return False
    _umap_remove(s, p, b)
    blk[b, MAPPED] = 1
    if mapped < blk[b, SIZE]:
        rest = _new_block(
            s, blk[b, ADDR] + mapped, blk[b, SIZE] - mapped, blk[b, STREAM], p, blk[b, SEG], 0
        )
        _link_after(blk, rest, b)
        _umap_insert(s, p, rest)
        blk[b, SIZE] = mapped
    _try_merge(s, p, b, blk[b, PREV])
    _try_merge(s, p, b, blk[b, NEXT])
    _pool_insert(s, p, b)
    _add_reserved(st, mapped)
    return True


@njit(cache=True)
def _try_allocate(s, p, stream, size):
    blk = s[0]
    c = _find(s, p, stream, size)
    if c < 0:
        return -1
    if blk[c, MAPPED] == 0 and not _map(s, p, c, min(blk[c, SIZE], size)):
        return -1
    while blk[c, SIZE] < size:
        nxt = blk[c, NEXT]
        if not _map(s, p, nxt, min(size - blk[c, SIZE], blk[nxt, SIZE])):
            return -1
        c = nxt
    _pool_remove(s, p, c)
    return c


@njit(cache=True)
def _unmap_block(s, p, b):
    blk, seg = s[0], s[6]
    k = blk[b, SEG]
    base, page = seg[k, S_BASE], seg[k, S_PAGE]
    addr, size = blk[b, ADDR], blk[b, SIZE]
    begin = base + -(-(addr - base) // page) * page
    end = base + (addr + size - base) // page * page
    if begin >= end:
        return
    _pool_remove(s, p, b)
    if begin > addr:
        before = _new_block(s, addr, begin - addr, blk[b, STREAM], p, k, 1)
        if blk[b, PREV] >= 0:
            _link_after(blk, before, blk[b, PREV])
        else:
            blk[before, PREV], blk[before, NEXT], blk[b, PREV] = -1, b, before
        _pool_insert(s, p, before)
    if end < addr + size:
        after = _new_block(s, end, addr + size - end, blk[b, STREAM], p, k, 1)
        _link_after(blk, after, b)
        _pool_insert(s, p, after)
    blk[b, ADDR], blk[b, SIZE], blk[b, MAPPED] = begin, end - begin, 0
    _try_merge(s, p, b, blk[b, PREV])
    _try_merge(s, p, b, blk[b, NEXT])
    _umap_insert(s, p, b)
    _add_reserved(s[1], -(end - begin))
    if not _is_split(blk, b):
        _release_segment(s, p, b)


# ---- CachingAllocatorSim ----------------------------------------------------------------
@njit(cache=True)
def release_cached_blocks(s):
    blk, pool, npool = s[0], s[2], s[3]
    for p in (0, 1):
        snap = pool[p, : npool[p]].copy()
        to_unmap = np.empty(len(snap), dtype=np.int64)
        nu = 0
        for b in snap:
            if blk[b, SEG] >= 0:
                to_unmap[nu] = b
                nu += 1
            elif not _is_split(blk, b):
                _release_block(s, p, b)
        for j in range(nu):
            _unmap_block(s, p, to_unmap[j])


@njit(cache=True)
def _get_free_block(s, p, stream, size):
    blk, st, pool, cfg = s[0], s[1], s[2], s[7]
    if cfg[C_GC]:
        st[CALLS_LARGE + p] += 1
    i = _lower(s, p, stream, size, -1)
    if i == s[3][p] or blk[pool[p, i], STREAM] != stream:
        return -1
    if cfg[C_EXP]:
        i = _best_fit_index(s, p, i, stream)
    found = blk[pool[p, i], SIZE]
    mss = cfg[C_MSS]
    if mss >= 0:
        if size < mss and found >= mss:
            return -1
        if size >= mss and found >= size + cfg[C_MNSR]:
            return -1
    b = pool[p, i]
    _pool_remove(s, p, b)
    return b


@njit(cache=True)
def _alloc_block(s, p, stream, size, alloc_size):
    st, cfg = s[1], s[7]
    if cfg[C_ALLOWED] >= 0 and st[RESERVED] + alloc_size > cfg[C_ALLOWED]:
        return -1
    if cfg[C_EXP]:
        return _try_allocate(s, p, stream, size)
    if cfg[C_CAP] >= 0 and st[RESERVED] + alloc_size > cfg[C_CAP]:
        return -1
    b = _new_block(s, _reserve_address_space(st, alloc_size), alloc_size, stream, p, -1, 1)
    st[NSEG] += 1
    _add_reserved(st, alloc_size)
    return b


@njit(cache=True)
def _release_whole(s, p, b):
    if s[0][b, SEG] >= 0 or _is_split(s[0], b):
        return False
    _release_block(s, p, b)
    return True


@njit(cache=True)
def _release_available(s, p, stream, size):
    blk, pool, mss = s[0], s[2], s[7][C_MSS]
    if mss < 0:
        return False
    want = max(size, mss)
    i = _lower(s, p, stream, want, -1)
    if i < s[3][p] and blk[pool[p, i], STREAM] == stream:
        return _release_whole(s, p, pool[p, i])
    released = 0
    i -= 1
    while released < want and i >= 0:
        b = pool[p, i]
        if blk[b, STREAM] != stream or blk[b, SIZE] < mss:
            break
        size_b = blk[b, SIZE]
        if not _release_whole(s, p, b):
            break
        released += size_b
        i -= 1
    return released >= want


@njit(cache=True)
def _garbage_collect(s):
    blk, st, pool, cfg = s[0], s[1], s[2], s[7]
    threshold = np.int64(s[8] * cfg[C_ALLOWED])
    if st[RESERVED] <= threshold:
        return
    target, reclaimed = st[RESERVED] - threshold, 0
    calls = st[CALLS_LARGE]
    n = s[3][0]
    cands = np.empty(n, dtype=np.int64)
    nc = 0
    total_age = 0
    for j in range(n):
        b = pool[0, j]
        if blk[b, SEG] < 0 and not _is_split(blk, b):
            cands[nc] = b
            nc += 1
            total_age += calls - blk[b, GCB]
    freed = True
    while reclaimed < target and freed and nc > 0:
        avg = total_age / nc
        freed = False
        keep = 0
        for j in range(nc):
            b = cands[j]
            age = calls - blk[b, GCB]
            if age >= avg:
                freed = True
                reclaimed += blk[b, SIZE]
                total_age -= age
                _release_block(s, 0, b)
            else:
                cands[keep] = b
                keep += 1
        nc = keep


@njit(cache=True)
def _alloc_new(s, p, stream, size):
    st, cfg = s[1], s[7]
    alloc_size = _allocation_size(size)
    if cfg[C_GC]:
        _garbage_collect(s)
    b = _alloc_block(s, p, stream, size, alloc_size)
    if b < 0 and _release_available(s, p, stream, size):
        b = _alloc_block(s, p, stream, size, alloc_size)
    if b < 0:
        release_cached_blocks(s)
        st[RETRIES] += 1
        b = _alloc_block(s, p, stream, size, alloc_size)
    if b < 0:
        if st[OOMS] == 0:
            st[OOM_SIZE] = alloc_size
            st[OOM_ALLOCATED], st[OOM_RESERVED] = st[ALLOCATED], st[RESERVED]
        st[OOMS] += 1
    return b


@njit(cache=True)
def _should_split(s, b, size):
    blk, cfg = s[0], s[7]
    remaining = blk[b, SIZE] - size
    if blk[b, SMALL] or cfg[C_EXP]:
        return remaining >= K_MIN_BLOCK
    mss = cfg[C_MSS]
    return (mss < 0 or size < mss) and remaining > K_SMALL_SIZE


@njit(cache=True)
def malloc(s, size, stream):
    """Block index of a new allocation of size > 0 bytes; -1 on a simulated OOM."""
    blk = s[0]
    rounded = _round_size(size, s[7][C_DIV])
    p = 1 if rounded <= K_SMALL_SIZE else 0
    b = _get_free_block(s, p, stream, rounded)
    if b < 0:
        b = _alloc_new(s, p, stream, rounded)
        if b < 0:
            return -1
    if _should_split(s, b, rounded):
        rest = _new_block(
            s, blk[b, ADDR] + rounded, blk[b, SIZE] - rounded, blk[b, STREAM], p, blk[b, SEG], 1
        )
        _link_after(blk, rest, b)
        blk[b, SIZE] = rounded
        _pool_insert(s, p, rest)
    blk[b, ALLOC] = 1
    blk[b, REQ] = size
    _add_allocated(s[1], blk[b, SIZE], size)
    return b


@njit(cache=True)
def free(s, b):
    blk = s[0]
    blk[b, ALLOC] = 0
    _add_allocated(s[1], -blk[b, SIZE], -blk[b, REQ])
    _free_block(s, blk[b, SMALL], b)


OK, ERR_DOUBLE_ALLOC, ERR_UNKNOWN_FREE, ERR_BAD_OP = range(4)
NOT_HELD, NULL = -2, -1  # handle states besides a block index


@njit(cache=True)
def largest_free_block(s):
    """Largest free mapped block: the last of each stream's run in each sorted pool."""
    blk, pool, npool = s[0], s[2], s[3]
    best = 0
    for p in (0, 1):
        j = npool[p] - 1
        while j >= 0:
            b = pool[p, j]
            if blk[b, SIZE] > best:
                best = blk[b, SIZE]
            j = _lower(s, p, blk[b, STREAM], -1, -1) - 1
    return best


@njit(cache=True)
def run_events(s, ops, keys, nbytes, streams, handles, stop_on_oom, record, rec, marks, frag):
    """Replay events; returns (status, event index of a bad event or -1).

    handles[key]: block index, NULL (zero bytes or skipped OOM) or NOT_HELD.
    rec[:, i] (when record): allocated, reserved, segments after event i.
    marks[:, m]: peak allocated / reserved between mark m and the next mark.
    frag[0]: largest free block / free reserved at the first event reaching the peak.
    """
    st = s[1]
    cur = -1
    best_reserved = -1
    peak = 0
    for i in range(len(ops)):
        op = ops[i]
        k = keys[i]
        if op == OP_ALLOC:
            if handles[k] != NOT_HELD:
                return ERR_DOUBLE_ALLOC, i
            size = nbytes[i]
            if size == 0:
                handles[k] = NULL
            else:
                b = malloc(s, size, streams[i])
                if b < 0:
                    if st[OOM_EVENT] < 0:
                        st[OOM_EVENT] = i
                    if stop_on_oom:
                        break
                    handles[k] = NULL
                else:
                    handles[k] = b
            if handles[k] != NULL or size == 0:
                if st[RESERVED] > best_reserved:
                    best_reserved = st[RESERVED]
                    free_reserved = st[RESERVED] - st[ALLOCATED]
                    if free_reserved > 0:
                        frag[0] = largest_free_block(s) / free_reserved
                    else:
                        frag[0] = 1.0
        elif op == OP_FREE:
            h = handles[k]
            if h == NOT_HELD:
                return ERR_UNKNOWN_FREE, i
            handles[k] = NOT_HELD
            if h >= 0:
                free(s, h)
        elif op == OP_MARK:
            if cur >= 0:
                marks[0, cur], marks[1, cur] = st[PEAK_A], st[PEAK_R]
            st[PEAK_A], st[PEAK_R], st[PEAK_Q] = st[ALLOCATED], st[RESERVED], st[REQUESTED]
            cur = k
        elif op == OP_EMPTY_CACHE:
            release_cached_blocks(s)
        else:
            return ERR_BAD_OP, i
        if st[MAX_R] > peak:
            peak = st[MAX_R]
            st[PEAK_EVENT] = i
        if record:
            rec[0, i], rec[1, i], rec[2, i] = st[ALLOCATED], st[RESERVED], st[NSEG]
    if cur >= 0:
        marks[0, cur], marks[1, cur] = st[PEAK_A], st[PEAK_R]
    return OK, -1
