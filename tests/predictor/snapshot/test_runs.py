"""The measures replay passes share: largest free block, fragmentation, recorded OOMs."""

from memgnn.predictor.sim.allocator import AllocatorConfig, CachingAllocatorSim, MiB
from memgnn.predictor.snapshot.runs import fragmentation, largest_free, recorded_oom


def test_largest_free_block_over_several_streams():
    sim = CachingAllocatorSim()
    a = sim.malloc(2 * MiB, stream=0)  # a 20 MiB segment: 18 MiB free after it
    sim.malloc(30 * MiB, stream=1)  # a 30 MiB segment: nothing free
    b = sim.malloc(3 * MiB, stream=1)  # a 20 MiB segment on stream 1: 17 MiB free
    sim.free(a)
    assert largest_free(sim) == 20 * MiB  # stream 0's whole segment
    sim.free(b)
    assert largest_free(sim) == 20 * MiB
    frac, largest, free = fragmentation(sim)
    assert (largest, free) == (20 * MiB, 40 * MiB) and frac == 0.5


def _oom(size, device_free):
    return {"action": "oom", "size": size, "device_free": device_free, "stream": 0}


def test_recorded_oom_native_agrees_when_no_block_fits_and_the_segment_does_not():
    sim = CachingAllocatorSim()
    sim.malloc(8 * MiB)  # a 20 MiB segment, 12 MiB free
    o = recorded_oom(7, _oom(30 * MiB, 10 * MiB), sim)
    assert o["new_memory_bytes"] == 30 * MiB and o["simulator_agrees"] is True
    assert o["simulated_reserved_bytes"] == 20 * MiB and o["largest_free_block_bytes"] == 12 * MiB
    # 12 MiB fits the cached free block: the simulator would not have failed
    assert recorded_oom(7, _oom(12 * MiB, 0), sim)["simulator_agrees"] is False
    # a 16 MiB segment fits in 25 MiB free: no OOM by the rules
    assert recorded_oom(7, _oom(16 * MiB, 25 * MiB), sim)["simulator_agrees"] is False
    # no device_free recorded (memgnn's older exports): undecided
    old = {"action": "oom", "addr": 0, "size": 30 * MiB, "stream": 0}
    assert recorded_oom(7, old, sim)["simulator_agrees"] is None


def test_recorded_oom_expandable_counts_pages_and_the_free_tail():
    sim = CachingAllocatorSim(AllocatorConfig(expandable_segments=True))
    sim.malloc(15 * MiB)  # one 20 MiB page: 5 MiB free at its tail
    o = recorded_oom(3, _oom(30 * MiB, 20 * MiB), sim)
    # at least ceil(25 / 20) pages, at most ceil(30 / 20): 40 MiB either way > 20 MiB
    assert o["new_memory_bytes"] == 40 * MiB and o["simulator_agrees"] is True
    o = recorded_oom(3, _oom(24 * MiB, 20 * MiB), sim)
    # 24 - 5 = 19 MiB: one page if the free tail borders the unmapped rest, else two
    assert o["new_memory_bytes"] == [20 * MiB, 40 * MiB] and o["simulator_agrees"] is None
