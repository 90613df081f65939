"""Node values (an engine bitmask and a run id in one int) and the LRU order of the runs.

A run is the blocks one store wrote: every block of a BlockStored takes the store's tick as its
run id, kept when an engine later drops out of the block.  The LRU stamp lives per run, not per
block: ``last[run]`` is the tick of the latest match that reached any block of the run (absent:
the run's own tick).  A match therefore renews the runs it touches in O(runs), not O(blocks) (a
32k-token prompt is 2,048 blocks but typically one or two runs), and eviction takes the runs with
the oldest stamps, whole.  The index follows the engines' own BlockRemoved events, which drop
single blocks; this LRU only bounds the router's memory when events are lost or the cap is low.
"""

from __future__ import annotations

from collections import Counter

# value = engine_mask << SEQ_BITS | run.  With up to 16 engines the value stays under 2**60, a
# 32-byte int; the blocks of one run with the same holders share one value object.
SEQ_BITS = 44
SEQ_MASK = (1 << SEQ_BITS) - 1

Last = dict[int, int]  # run -> tick of its latest match


def renew(last: Last, held: list[int], stamp: int) -> None:
    """Stamp the runs of the matched blocks, given one value per run of equal values."""
    for value in held:
        last[value & SEQ_MASK] = stamp


def evict_oldest(nodes: dict[int, int], keep: int, last: Last) -> int:
    """Drop the runs with the oldest stamps until at most ``keep`` blocks remain; returns blocks
    dropped.  Whole stamps go together (a stamp is one store or match), so slightly more than
    needed may go.  Forgets the stamps of runs no longer present."""
    excess = len(nodes) - keep
    if excess <= 0:
        return 0
    sizes = Counter(map(SEQ_MASK.__and__, nodes.values()))  # run -> blocks, counted in C
    by_stamp: dict[int, int] = {}
    for run, blocks in sizes.items():
        stamp = last.get(run, run)
        by_stamp[stamp] = by_stamp.get(stamp, 0) + blocks
    dropped, cut = 0, 0
    for cut in sorted(by_stamp):
        dropped += by_stamp[cut]
        if dropped >= excess:
            break
    doomed_runs = {run for run in sizes if last.get(run, run) <= cut}
    doomed = [key for key, value in nodes.items() if value & SEQ_MASK in doomed_runs]
    for key in doomed:
        del nodes[key]
    for run in doomed_runs:
        last.pop(run, None)
    forget_absent(last, set(sizes) - doomed_runs)
    return len(doomed)


def forget_absent(last: Last, present: set[int]) -> None:
    """Drop the stamps of runs no longer in the index (all their blocks removed)."""
    for run in [run for run in last if run not in present]:
        del last[run]


def present_runs(nodes: dict[int, int]) -> set[int]:
    return set(map(SEQ_MASK.__and__, nodes.values()))


def renumber(nodes: dict[int, int], last: Last) -> int:
    """Compact run ids and stamps (one timeline) to 1..n keeping their order; returns the newest.
    Only needed after 2**44 stores and matches."""
    runs = present_runs(nodes)
    forget_absent(last, runs)
    ticks = sorted(runs | set(last.values()))
    rank = {tick: i for i, tick in enumerate(ticks, start=1)}
    renewed: dict[int, int] = {}
    for key, value in nodes.items():
        new = renewed.get(value)
        if new is None:
            new = renewed[value] = (value >> SEQ_BITS << SEQ_BITS) | rank[value & SEQ_MASK]
        nodes[key] = new
    stamps = {rank[run]: rank[stamp] for run, stamp in last.items()}
    last.clear()
    last.update(stamps)
    return len(ticks)
