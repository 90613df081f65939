"""PrefixIndex against a naive model recomputed from scratch, plus focused unit tests."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radix import Match, PrefixIndex, namespace_for, split_event_extra_keys
from radix.stamps import SEQ_BITS, evict_oldest, renumber

# ---- the naive model: paths of token tuples, engine sets, a touch counter; no hashing ----

Path = tuple[object, ...]  # (block_size, namespace, block_0, block_1, ...)


@dataclass
class Model:
    cap: int
    sizes: dict[str, int]
    nodes: dict[Path, set[str]] = field(default_factory=dict)
    seq: dict[Path, int] = field(default_factory=dict)  # the tick of the store that wrote it
    last: dict[int, int] = field(default_factory=dict)  # store tick -> latest match reaching it
    clock: int = 0
    emap: dict[str, dict[object, Path]] = field(default_factory=dict)
    opt: dict[tuple[str, Path], float] = field(default_factory=dict)

    @property
    def low_water(self) -> int:
        return self.cap - max(1, self.cap // 8)

    def drop(self, engine: str, path: Path) -> None:
        holders = self.nodes.get(path)
        if holders is not None:
            holders.discard(engine)
            if not holders:
                del self.nodes[path], self.seq[path]

    def stamp(self, paths: list[Path]) -> None:
        # One store is one tick of the clock: its blocks are one run, sharing the stamp.
        if paths:
            self.clock += 1
            for path in paths:
                self.seq[path] = self.clock

    def touch(self, paths: list[Path]) -> None:
        # One match is one tick: it renews every run it reaches, whole (radix/stamps.py).
        if paths:
            self.clock += 1
            for path in paths:
                self.last[self.seq[path]] = self.clock

    def recency(self, path: Path) -> int:
        return self.last.get(self.seq[path], self.seq[path])

    def stored(self, engine: str, hashes: list[object], parent: object,
               blocks: list[tuple[int, ...]], namespace: object) -> None:
        if not hashes:
            return
        if parent is None:
            base: Path = (self.sizes[engine], namespace)
        elif parent in self.emap[engine]:
            base = self.emap[engine][parent]
        else:
            return
        paths = [base + tuple(blocks[: i + 1]) for i in range(len(blocks))]
        # A hash the event gives to another block first releases its old block; then the event's
        # blocks are held (so an old block the same event names again stays held).
        for h, path in zip(hashes, paths, strict=True):
            old = self.emap[engine].get(h)
            if old is not None and old != path:
                self.drop(engine, old)
        for h, path in zip(hashes, paths, strict=True):
            self.emap[engine][h] = path
            self.nodes.setdefault(path, set()).add(engine)
            self.opt.pop((engine, path), None)
        self.stamp(paths)
        if len(self.nodes) > self.cap:
            excess = len(self.nodes) - self.low_water
            # Whole stamps are evicted together.
            cut = sorted(map(self.recency, self.seq))[excess - 1]
            for path in [p for p in self.seq if self.recency(p) <= cut]:
                del self.nodes[path], self.seq[path]

    def removed(self, engine: str, hashes: list[object]) -> None:
        for h in hashes:
            path = self.emap[engine].pop(h, None)
            if path is not None:
                self.drop(engine, path)
                self.opt.pop((engine, path), None)

    def cleared(self, engine: str) -> None:
        """AllBlocksCleared: what the engine announced goes; what was routed there stays."""
        for path in self.emap[engine].values():
            self.drop(engine, path)
        self.emap[engine].clear()

    def engine_removed(self, engine: str) -> None:
        self.cleared(engine)
        self.opt = {k: v for k, v in self.opt.items() if k[0] != engine}

    def routed(self, engine: str, tokens: list[int], namespace: object, now: float,
               ttl: float) -> None:
        for path in self.paths(tokens, self.sizes[engine], namespace):
            if engine in self.nodes.get(path, ()):
                continue
            key = (engine, path)
            self.opt[key] = max(self.opt.get(key, float("-inf")), now + ttl)

    @staticmethod
    def paths(tokens: list[int], size: int, namespace: object) -> list[Path]:
        blocks = [tuple(tokens[i : i + size]) for i in range(0, len(tokens) - size + 1, size)]
        return [(size, namespace, *blocks[: i + 1]) for i in range(len(blocks))]

    def match(self, tokens: list[int], namespace: object, now: float) -> dict[str, Match]:
        out = {}
        for engine, size in self.sizes.items():
            paths = self.paths(tokens, size, namespace)
            held = [engine in self.nodes.get(p, ()) for p in paths]
            maybe = [h or self.opt.get((engine, p), float("-inf")) > now
                     for h, p in zip(held, paths, strict=True)]
            c = held.index(False) if False in held else len(held)
            o = maybe.index(False) if False in maybe else len(maybe)
            out[engine] = Match(c * size, o * size)
        for size in sorted(set(self.sizes.values())):
            same = [e for e, s in self.sizes.items() if s == size]
            deepest = max(out[e].confirmed_tokens // size for e in same)
            self.touch(self.paths(tokens, size, namespace)[:deepest])
        return out


# ---- the state machine ----

SIZES = {"a": 2, "b": 2, "c": 4}
NAMESPACES = [namespace_for(None, None), namespace_for("lora-x", None), namespace_for(None, "s1")]
# A few prompts sharing prefixes (so operations keep meeting the same blocks), then any prompt.
POOL = [[0, 1] * 6, [0, 1] * 4 + [1] * 4, [0, 1, 0, 1, 1, 0, 0, 0], [1] * 10, [0, 1] * 3]
prompts = st.sampled_from(POOL) | st.sampled_from(POOL) | st.lists(st.integers(0, 1), max_size=14)
engines = st.sampled_from(sorted(SIZES))
namespaces = st.sampled_from(NAMESPACES)


class IndexVersusModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index = PrefixIndex(max_blocks=12)
        self.model = Model(cap=12, sizes={})
        self.now = 0.0
        self.epoch = dict.fromkeys(SIZES, 0)
        for name in SIZES:
            self.add(name)

    def add(self, name: str) -> None:
        self.index.add_engine(name, SIZES[name])
        self.model.sizes[name] = SIZES[name]
        self.model.emap[name] = {}

    def engine_hash(self, engine: str, path: Path) -> object:
        # What vLLM publishes: a function of the chain (and of a restart); "c" publishes bytes.
        value = hash((engine, self.epoch[engine], path)) & (2**64 - 1)
        return value.to_bytes(8, "big") if engine == "c" else value

    @rule(engine=engines, tokens=prompts, ns=namespaces, start=st.integers(0, 6),
          count=st.integers(0, 7), collide=st.none() | st.integers(0, 3))
    def stored(self, engine: str, tokens: list[int], ns: object, start: int, count: int,
               collide: int | None) -> None:
        if engine not in self.model.sizes:
            return
        size = SIZES[engine]
        all_paths = Model.paths(tokens, size, ns)
        start = min(start, len(all_paths))
        paths = all_paths[start : start + count]
        hashes = [self.engine_hash(engine, p) for p in paths]
        if collide is not None and hashes:
            hashes[-1] = collide  # a clash / a reused hash must not leave a stale bit behind
        parent = self.engine_hash(engine, all_paths[start - 1]) if start > 0 else None
        blocks = [p[-1] for p in paths]
        token_ids = [t for b in blocks for t in b]  # type: ignore[attr-defined]
        self.index.apply_stored(engine, hashes, parent, token_ids, ns, self.now)
        self.model.stored(engine, hashes, parent, blocks, ns)  # type: ignore[arg-type]

    @rule(engine=engines, tokens=prompts, ns=namespaces, upto=st.integers(1, 7))
    def request_ran(self, engine: str, tokens: list[int], ns: object, upto: int) -> None:
        """What vLLM announces after running a prompt: the blocks it lacked, under their parent."""
        if engine not in self.model.sizes:
            return
        paths = Model.paths(tokens, SIZES[engine], ns)[:upto]
        have = 0
        while have < len(paths) and self.engine_hash(engine, paths[have]) in self.model.emap[
                engine]:
            have += 1
        new = paths[have:]
        hashes = [self.engine_hash(engine, p) for p in new]
        parent = self.engine_hash(engine, paths[have - 1]) if have else None
        blocks = [p[-1] for p in new]
        token_ids = [t for b in blocks for t in b]  # type: ignore[attr-defined]
        self.index.apply_stored(engine, hashes, parent, token_ids, ns, self.now)
        self.model.stored(engine, hashes, parent, blocks, ns)  # type: ignore[arg-type]

    @rule(engine=engines, tokens=prompts, ns=namespaces, ttl=st.sampled_from([0.5, 5.0]))
    def routed_then_ran(self, engine: str, tokens: list[int], ns: object, ttl: float) -> None:
        """The usual life of a request: optimistic blocks first, then the engine's events."""
        self.routed(engine, tokens, ns, ttl)
        self.request_ran(engine, tokens, ns, 7)

    @rule(engine=engines, tokens=prompts, ns=namespaces, data=st.data())
    def rehashed(self, engine: str, tokens: list[int], ns: object, data: st.DataObject) -> None:
        """An engine announces a hash it used before for another block (a restart without a
        reset, a clash): the old block must not stay attributed to it."""
        if engine not in self.model.sizes or not self.model.emap[engine]:
            return
        paths = Model.paths(tokens, SIZES[engine], ns)
        if not paths:
            return
        h = data.draw(st.sampled_from(sorted(self.model.emap[engine], key=repr)))
        token_ids = list(paths[0][-1])  # type: ignore[call-overload]
        self.index.apply_stored(engine, [h], None, token_ids, ns, self.now)
        self.model.stored(engine, [h], None, [paths[0][-1]], ns)  # type: ignore[list-item]

    @rule(engine=engines, data=st.data())
    def removed(self, engine: str, data: st.DataObject) -> None:
        if engine not in self.model.sizes:
            return
        known = sorted(self.model.emap[engine], key=repr)
        hashes = data.draw(st.lists(st.sampled_from(known + [12345]), max_size=3))
        self.index.apply_removed(engine, hashes)
        self.model.removed(engine, hashes)

    @rule(engine=engines)
    def cleared(self, engine: str) -> None:
        if engine in self.model.sizes:
            self.index.apply_cleared(engine)
            self.model.cleared(engine)

    @rule(engine=engines, tokens=prompts, ns=namespaces, ttl=st.sampled_from([0.5, 2.0, 5.0]))
    def routed(self, engine: str, tokens: list[int], ns: object, ttl: float) -> None:
        if engine in self.model.sizes:
            self.index.note_routed(engine, tokens, ns, self.now, ttl)
            self.model.routed(engine, tokens, ns, self.now, ttl)

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(engine=engines)
    def engine_removed_and_back(self, engine: str) -> None:
        if engine not in self.model.sizes:
            return
        self.index.remove_engine(engine)
        self.model.engine_removed(engine)
        del self.model.sizes[engine], self.model.emap[engine]
        self.epoch[engine] += 1  # a restarted engine publishes new hashes

    @precondition(lambda self: len(self.model.sizes) < len(SIZES))
    @rule(engine=engines)
    def engine_added(self, engine: str) -> None:
        if engine not in self.model.sizes:
            self.add(engine)

    @rule(tokens=prompts, ns=namespaces)
    def match(self, tokens: list[int], ns: object) -> None:
        assert self.index.match(tokens, ns, self.now) == self.model.match(tokens, ns, self.now)

    @rule(engine=engines, tokens=prompts, ns=namespaces, ttl=st.sampled_from([0.5, 5.0]))
    def decided(self, engine: str, tokens: list[int], ns: object, ttl: float) -> None:
        """The router's path: one PromptKeys for the match and the note (the match may have
        hashed only the blocks before its first miss; the note needs them all)."""
        prompt = self.index.prepare(tokens, ns)
        assert self.index.match_keys(prompt, self.now) == self.model.match(tokens, ns, self.now)
        if engine in self.model.sizes:
            self.index.note_routed_keys(engine, prompt, self.now, ttl)
            self.model.routed(engine, tokens, ns, self.now, ttl)
        assert self.index.match_keys(prompt, self.now) == self.model.match(tokens, ns, self.now)

    @invariant()
    def same_blocks(self) -> None:
        assert len(self.index) == len(self.model.nodes) <= self.index.max_blocks
        for engine in self.model.sizes:
            assert self.index.engine_blocks(engine) == len(self.model.emap[engine])


IndexVersusModel.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_index_equals_naive_model = IndexVersusModel.TestCase


# ---- focused unit tests ----

T = list(range(100, 164))  # 64 distinct tokens
U = list(range(300, 364))  # 64 others


def _index(*engines: tuple[str, int], cap: int = 1000) -> PrefixIndex:
    index = PrefixIndex(max_blocks=cap)
    for name, size in engines:
        index.add_engine(name, size)
    return index


def test_unknown_parent_creates_nothing() -> None:
    index = _index(("e", 4))
    assert index.apply_stored("e", [2, 3], 1, T[4:12], None, 0.0) == 0
    assert index.match(T, None, 0.0)["e"] == Match(0, 0)
    assert index.stats.unknown_parent_events == 1 and len(index) == 0


def test_children_continue_the_parent_chain_and_its_namespace() -> None:
    index = _index(("e", 4))
    salted = namespace_for(None, "salt")
    index.apply_stored("e", [1], None, T[:4], salted, 0.0)
    # The continuation event's namespace argument is irrelevant: the parent's chain carries it.
    index.apply_stored("e", [2], 1, T[4:8], namespace_for(None, None), 0.0)
    assert index.match(T, salted, 0.0)["e"].confirmed_tokens == 8
    assert index.match(T, namespace_for(None, None), 0.0)["e"].confirmed_tokens == 0
    assert index.match(T, namespace_for("lora", "salt"), 0.0)["e"].confirmed_tokens == 0


def test_engines_with_different_block_sizes_match_in_one_call() -> None:
    index = _index(("gpu", 16), ("cpu", 128), ("idle", 16))
    index.apply_stored("gpu", [1, 2, 3], None, T[:48], None, 0.0)
    index.apply_stored("cpu", ["x"], None, list(range(128)), None, 0.0)  # type: ignore[list-item]
    prompt = list(range(128)) + [0] * 10
    assert index.match(T, None, 0.0) == {
        "gpu": Match(48, 48), "cpu": Match(0, 0), "idle": Match(0, 0)}
    assert index.match(prompt, None, 0.0)["cpu"] == Match(128, 128)


def test_only_the_full_attention_group_and_device_medium_count() -> None:
    index = _index(("e", 4))
    index.apply_stored("e", [1, 2], None, T[:8], None, 0.0, group_idx=1,
                       kind="sliding_window", medium="GPU")
    index.apply_stored("e", [1, 2], None, T[:8], None, 0.0, group_idx=0, kind="mamba")
    index.apply_stored("e", [1, 2], None, T[:8], None, 0.0, group_idx=0,
                       kind="full_attention", medium="CPU")
    assert index.match(T, None, 0.0)["e"].confirmed_tokens == 0
    index.apply_stored("e", [1, 2], None, T[:8], None, 0.0, group_idx=0,
                       kind="full_attention", medium="GPU")
    assert index.match(T, None, 0.0)["e"].confirmed_tokens == 8
    # The sliding-window group reuses the same block hashes: its removal must not touch group 0.
    index.apply_removed("e", [2], group_idx=1, medium="GPU")
    index.apply_removed("e", [2], group_idx=0, medium="CPU")
    assert index.match(T, None, 0.0)["e"].confirmed_tokens == 8
    index.apply_removed("e", [2], group_idx=0, medium="GPU")
    assert index.match(T, None, 0.0)["e"].confirmed_tokens == 4


def test_extra_keys_isolate_multimodal_blocks() -> None:
    index = _index(("e", 4))
    salt, residual = split_event_extra_keys(
        "lora", [["lora", ["mm-1", 0], "salt"], ["lora", ["mm-1", 4]], ["lora"]])
    assert salt == "salt" and residual == [(("mm-1", 0),), (("mm-1", 4),), None]
    index.apply_stored("e", [1, 2, 3], None, T[:12], namespace_for("lora", salt), 0.0,
                       extra_keys=residual)
    # A text-only prompt with the same token ids is not the same KV: no match.
    assert index.match(T, namespace_for("lora", "salt"), 0.0)["e"].confirmed_tokens == 0
    assert split_event_extra_keys(None, [["s"], None]) == ("s", None)


def test_optimistic_burst_lands_before_events_then_confirms() -> None:
    index = _index(("a", 4), ("b", 4))
    assert index.note_routed("a", T[:10], None, now=0.0, ttl=2.0) == 2
    assert index.match(T, None, 1.0) == {"a": Match(0, 8), "b": Match(0, 0)}
    index.apply_stored("a", [1], None, T[:4], None, 1.5)  # confirms block 0 only
    assert index.match(T, None, 1.9)["a"] == Match(4, 8)
    assert index.match(T, None, 2.0)["a"] == Match(4, 4)  # block 1's entry expired
    index.note_routed("b", T[:8], None, now=3.0, ttl=2.0)
    index.apply_removed("b", [99])  # unknown hash: nothing
    assert index.match(T, None, 3.0)["b"] == Match(0, 8)
    index.apply_cleared("b")
    assert index.match(T, None, 3.0)["b"] == Match(0, 8)
    assert index.match(T, None, 5.0)["b"] == Match(0, 0)  # expired


def test_a_clear_drops_what_the_engine_announced_not_what_was_routed_there() -> None:
    """An engine publishes AllBlocksCleared with its next step's events, after the requests
    routed there since the reset were noted: those will store their blocks when they run."""
    index = _index(("a", 4))
    index.apply_stored("a", [1, 2], None, T[:8], None, 0.0)
    index.note_routed("a", U[:8], None, now=1.0, ttl=10.0)  # routed after the engine's reset
    index.apply_cleared("a")  # ... whose event comes now
    assert index.match(T, None, 1.0)["a"] == Match(0, 0)  # announced blocks: gone
    assert index.match(U, None, 1.0)["a"] == Match(0, 8)  # the routed prompt: still predicted
    index.remove_engine("a")  # an engine that leaves takes its predictions with it
    index.add_engine("a", block_size=4)
    assert index.match(U, None, 1.0)["a"] == Match(0, 0)


def test_a_forgotten_route_drops_only_that_engines_predictions() -> None:
    """A request its engine refused leaves no prediction there; what the engine announced and
    other engines' predictions stay."""
    index = _index(("a", 4), ("b", 4))
    index.note_routed("a", T[:12], None, now=0.0, ttl=10.0)
    index.note_routed("b", T[:12], None, now=0.0, ttl=10.0)
    index.apply_stored("a", [1], None, T[:4], None, 0.0)
    index.forget_routed("a", T[:12], None)
    assert index.match(T, None, 1.0) == {"a": Match(4, 4), "b": Match(0, 12)}
    index.forget_routed("gone", T[:12], None)  # an engine that left meanwhile: nothing


def test_a_reused_hash_releases_its_old_block_unless_the_event_names_it_again() -> None:
    index = _index(("e", 4))
    index.apply_stored("e", [7], None, T[:4], None, 0.0)
    # Hash 7 now names block 1; block 0 is named again (hash 5) in the same event: still held.
    index.apply_stored("e", [5, 7], None, T[:8], None, 0.0)
    assert index.match(T, None, 0.0)["e"].confirmed_tokens == 8 and len(index) == 2
    # Hash 5 goes to another chain: block 0 is no longer the engine's, nor block 1 reachable.
    index.apply_stored("e", [5], None, T[20:24], None, 0.0)
    assert index.match(T, None, 0.0)["e"].confirmed_tokens == 0
    assert index.engine_blocks("e") == 2 and len(index) == 2


def test_removal_drops_an_optimistic_entry_on_an_evicted_block() -> None:
    index = _index(("e", 4), cap=2)  # evicts down to 1
    for h, start in ((1, 0), (2, 8), (3, 16)):
        index.apply_stored("e", [h], None, T[start : start + 4], None, 0.0)
    assert len(index) == 1  # block 1 (T[:4]) was evicted; the engine still names it hash 1
    index.note_routed("e", T[:8], None, now=1.0, ttl=10.0)
    assert index.match(T, None, 1.0)["e"] == Match(0, 8)
    index.apply_removed("e", [1])
    assert index.match(T, None, 1.0)["e"] == Match(0, 0)


def test_lru_evicts_least_recently_matched() -> None:
    index = _index(("e", 4), cap=8)  # evicts down to 7
    index.apply_stored("e", [1, 2, 3, 4], None, T[:16], None, 0.0)
    index.apply_stored("e", [5, 6, 7, 8], None, T[32:48], None, 0.0)
    assert index.match(T[:16], None, 0.0)["e"].confirmed_tokens == 16  # renews the first chain
    index.apply_stored("e", [9], None, T[48:52], None, 0.0)
    # One event's blocks share a stamp and leave together: the unmatched chain goes whole.
    assert len(index) == 5 and index.stats.evicted_blocks == 4
    assert index.match(T[:16], None, 0.0)["e"].confirmed_tokens == 16
    assert index.match(T[32:48], None, 0.0)["e"].confirmed_tokens == 0
    assert index.match(T[48:52], None, 0.0)["e"].confirmed_tokens == 4
    # Its hashes are still known, so the engine's later children still chain (no false match:
    # the walk from block 0 stops at the evicted blocks).
    index.apply_stored("e", [10], 8, T[48:52], None, 0.0)
    assert index.match(T[32:52], None, 0.0)["e"].confirmed_tokens == 0


def test_remove_engine_frees_its_bit_for_a_new_engine() -> None:
    index = _index(("a", 4), ("b", 4))
    index.apply_stored("a", [1, 2], None, T[:8], None, 0.0)
    index.remove_engine("a")
    index.add_engine("c", 4)
    assert index.match(T, None, 0.0) == {"b": Match(0, 0), "c": Match(0, 0)}
    assert len(index) == 0


def test_block_size_conflicts_and_bad_input() -> None:
    index = _index(("e", 4))
    with pytest.raises(ValueError, match="remove_engine"):
        index.add_engine("e", 16)
    with pytest.raises(ValueError):
        PrefixIndex(0)
    with pytest.raises(KeyError):
        index.apply_stored("nope", [1], None, T[:4], None, 0.0)
    assert index.apply_stored("e", [1], None, T[:16], None, 0.0, block_size=16) == 0
    assert index.apply_stored("e", [1, 2], None, T[:7], None, 0.0) == 0  # ragged
    assert index.apply_stored("e", [1], None, [-1, 0, 0, 0], None, 0.0) == 0
    assert index.stats.skipped_events == 3 and len(index) == 0


def test_stamp_overflow_renumbers_and_keeps_the_lru_order() -> None:
    # Runs 900 (renewed at 950), 5 and 77 (renewed at 60, before 77 was even stored: a stale
    # stamp older than the run, kept as given), and a stamp of a run no longer present.
    nodes = {10: (0b01 << SEQ_BITS) | 900, 11: (0b01 << SEQ_BITS) | 900,
             12: (0b10 << SEQ_BITS) | 5, 13: (0b11 << SEQ_BITS) | 77}
    last = {900: 950, 77: 60, 3: 999}
    assert renumber(nodes, last) == 5  # ticks 5, 60, 77, 900, 950
    assert nodes == {10: (0b01 << SEQ_BITS) | 4, 11: (0b01 << SEQ_BITS) | 4,
                     12: (0b10 << SEQ_BITS) | 1, 13: (0b11 << SEQ_BITS) | 3}
    assert last == {4: 5, 3: 2}
    assert nodes[10] is nodes[11]  # blocks that shared a value still share one
    # Oldest first: run 3 (stamp 2), then run 1 (stamp 1 is older still): both go for 2 blocks.
    assert evict_oldest(nodes, keep=2, last=last) == 2 and set(nodes) == {10, 11}
    assert last == {4: 5}
    assert evict_oldest(nodes, keep=2, last=last) == 0


def test_a_match_renews_the_whole_runs_it_reaches() -> None:
    index = _index(("e", 4), cap=12)  # evicts down to 11
    index.apply_stored("e", [1, 2, 3, 4], None, T[:16], None, 0.0)  # run A
    index.apply_stored("e", [5, 6, 7, 8], None, T[32:48], None, 0.0)  # run B
    index.apply_stored("e", [9, 10, 11, 12], None, T[16:32], None, 0.0)  # run C
    assert index.match(T[:4], None, 0.0)["e"].confirmed_tokens == 4  # one block of run A
    index.apply_stored("e", [13], None, T[48:52], None, 0.0)
    # Run B is the least recently used; run A was renewed whole by a match of its first block.
    assert index.stats.evicted_blocks == 4
    assert index.match(T[:16], None, 0.0)["e"].confirmed_tokens == 16
    assert index.match(T[32:48], None, 0.0)["e"].confirmed_tokens == 0


def test_stamps_of_removed_runs_are_forgotten() -> None:
    index = _index(("e", 1), cap=10_000)
    for i in range(1500):  # 1,500 one-block runs, each matched once, then removed
        index.apply_stored("e", [i], None, [i], None, 0.0)
        assert index.match([i], None, 0.0)["e"].confirmed_tokens == 1
    index.apply_removed("e", list(range(1500)))
    assert len(index) == 0
    index.apply_stored("e", [1], None, [7], None, 0.0)
    assert index.match([7], None, 0.0)["e"].confirmed_tokens == 1
    # The stamps are kept in a dict of their own; a match prunes it once it outgrows the index.
    assert len(index._last) <= 1
