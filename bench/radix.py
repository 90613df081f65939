"""Benchmark radix.PrefixIndex (ingest, match, RSS) beside a minimal SGLang-style character tree.

    .venv/bin/python bench/radix.py            # full run
    .venv/bin/python bench/radix.py --quick    # smaller sizes, for a smoke run
    .venv/bin/python bench/radix.py --plot docs/img/radix_match.png   # also the length sweep

Every figure is measured in this run; memory is RSS growth in a fresh subprocess per structure.
Times are CPU time of this process (``time.process_time``): the benchmark machine is shared, and
wall time there measures the neighbours.  A calibration row (a fixed pure-Python loop) is printed
so results from machines of different speed can be compared.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from radix import PrefixIndex  # noqa: E402
from radix.keys import token_array  # noqa: E402
from wire.engine import BlockStored, KVEventBatch  # noqa: E402

BLOCK = 16
VOCAB = 150_000


# ---- the anchor: a character-keyed radix tree in the style of sgl-router's tree.rs ----

class CharNode:
    """Edge text, children by first character, tenant -> last access (as SGLang keeps)."""

    __slots__ = ("text", "children", "tenants")

    def __init__(self, text: str) -> None:
        self.text = text
        self.children: dict[str, CharNode] = {}
        self.tenants: dict[str, float] = {}


class CharTree:
    def __init__(self) -> None:
        self.root = CharNode("")

    def insert(self, text: str, tenant: str, now: float) -> None:
        node, pos = self.root, 0
        node.tenants[tenant] = now
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                leaf = CharNode(text[pos:])
                leaf.tenants[tenant] = now
                node.children[text[pos]] = leaf
                return
            edge = child.text
            common = _common_prefix(edge, text, pos)
            if common < len(edge):  # split the edge
                mid = CharNode(edge[:common])
                mid.tenants = dict(child.tenants)
                child.text = edge[common:]
                mid.children[child.text[0]] = child
                node.children[text[pos]] = mid
                child = mid
            child.tenants[tenant] = now
            node, pos = child, pos + common

    def prefix_match(self, text: str) -> tuple[int, str | None]:
        """Matched characters and the tenant at the deepest matched node (SGLang's answer)."""
        node, pos, tenant = self.root, 0, None
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                break
            common = _common_prefix(child.text, text, pos)
            pos += common
            if child.tenants:
                tenant = next(iter(child.tenants))
            if common < len(child.text):
                break
            node = child
        return pos, tenant


def _common_prefix(edge: str, text: str, pos: int) -> int:
    if text.startswith(edge, pos):
        return len(edge)
    n = 0
    for a, b in zip(edge, text[pos:], strict=False):
        if a != b:
            break
        n += 1
    return n


# ---- workloads ----

def words(seed: int = 7) -> list[str]:
    """A pseudo-vocabulary: ~4.3 characters per token, like English BPE text."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    return [" " + "".join(rng.choice(letters) for _ in range(rng.randint(2, 5)))
            for _ in range(VOCAB)]


def prompt_set(n: int, tokens: int, shared: int, seed: int = 1) -> list[list[int]]:
    """n prompts of ``tokens`` ids: a shared system prefix of ``shared`` ids, then unique ids."""
    rng = random.Random(seed)
    system = [rng.randrange(VOCAB) for _ in range(shared)]
    return [system + [rng.randrange(VOCAB) for _ in range(tokens - shared)] for _ in range(n)]


def store_prompt(index: PrefixIndex, engine: str, tokens: list[int], rng: random.Random,
                 hashes: dict[tuple[str, int], int]) -> int:
    """Store a prompt as vLLM would announce it: only blocks the engine lacks, with its parent."""
    n = len(tokens) // BLOCK
    have = 0
    while have < n and (engine, hash(tuple(tokens[: (have + 1) * BLOCK]))) in hashes:
        have += 1
    if have == n:
        return 0
    parent = hashes[(engine, hash(tuple(tokens[: have * BLOCK])))] if have else None
    new = []
    for i in range(have, n):
        h = rng.getrandbits(64)
        hashes[(engine, hash(tuple(tokens[: (i + 1) * BLOCK])))] = h
        new.append(h)
    index.apply_stored(engine, new, parent, tokens[have * BLOCK : n * BLOCK], None, 0.0)
    return len(new)


def best(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(repeat))


# ---- measurements ----

Event = tuple[str, list[int], int | None, list[int]]


def ingest_events(n_events: int, blocks_per_event: int, engines: int) -> list[Event]:
    """BlockStored events as (engine, hashes, parent, token ids): chains continuing their parents,
    every 8th event starting a new prompt."""
    rng = random.Random(3)
    events: list[Event] = []
    tails: dict[str, int | None] = {}
    for i in range(n_events):
        engine = f"e{i % engines}"
        parent = tails.get(engine) if i % 8 else None
        hashes = [rng.getrandbits(64) for _ in range(blocks_per_event)]
        base = rng.randrange(VOCAB - BLOCK * blocks_per_event)
        events.append((engine, hashes, parent, list(range(base, base + BLOCK * blocks_per_event))))
        tails[engine] = hashes[-1]
    return events


def bench_ingest(n_events: int, blocks_per_event: int, engines: int) -> dict[str, float]:
    """Apply pre-built BlockStored events (chains continuing their parents) to a fresh index."""
    events = ingest_events(n_events, blocks_per_event, engines)
    total = n_events * blocks_per_event

    def run_index() -> float:
        index = fresh(engines)
        gc.collect()
        t0 = time.process_time()
        for engine, hashes, parent, tokens in events:
            index.apply_stored(engine, hashes, parent, tokens, None, 0.0)
        return time.process_time() - t0

    enc = msgspec.msgpack.Encoder()
    frames = []
    for start in range(0, n_events, 8):  # 8 events per KVEventBatch, as one scheduler step
        chunk = events[start : start + 8]
        frames.append((chunk[0][0], enc.encode(KVEventBatch(ts=0.0, events=[
            BlockStored(block_hashes=list[bytes | int](h), parent_block_hash=p, token_ids=t,
                        block_size=BLOCK, lora_id=None, medium="GPU", lora_name=None, group_idx=0,
                        kv_cache_spec_kind="full_attention") for _, h, p, t in chunk]))))
    decoder = msgspec.msgpack.Decoder(KVEventBatch)

    def run_wire() -> float:
        index = fresh(engines)
        gc.collect()
        t0 = time.process_time()
        for i, (_, payload) in enumerate(frames):
            batch = decoder.decode(payload)
            for j, ev in enumerate(batch.events):
                assert isinstance(ev, BlockStored)
                index.apply_stored(events[i * 8 + j][0], ev.block_hashes, ev.parent_block_hash,
                                   ev.token_ids, None, batch.ts, block_size=ev.block_size,
                                   group_idx=ev.group_idx, kind=ev.kv_cache_spec_kind,
                                   medium=ev.medium)
        return time.process_time() - t0

    return {"blocks": total, "index_s": best(run_index, 3), "wire_s": best(run_wire, 3)}


def fresh(engines: int) -> PrefixIndex:
    index = PrefixIndex(max_blocks=10_000_000)
    for e in range(engines):
        index.add_engine(f"e{e}", BLOCK)
    return index


def bench_match(prompt_tokens: int, engines: int, repeat: int) -> dict[str, float]:
    """A prompt fully cached on 1 of ``engines``; the others hold its first (up to) 1k tokens."""
    rng = random.Random(5)
    vocab = words()
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_tokens)]
    index, tree = fresh(engines), CharTree()
    hashes: dict[tuple[str, int], int] = {}
    for e in range(engines):
        part = prompt if e == engines // 2 else prompt[: min(1024, prompt_tokens // 2)] + [1] * 512
        store_prompt(index, f"e{e}", part, rng, hashes)
        tree.insert("".join(vocab[t] for t in part), f"e{e}", 0.0)
    text = "".join(vocab[t] for t in prompt)
    got = index.match(prompt, None, 1.0)
    assert got[f"e{engines // 2}"].confirmed_tokens == prompt_tokens, got
    assert tree.prefix_match(text)[0] == len(text)

    def timed(fn: Callable[[], object]) -> float:
        samples = []
        for _ in range(repeat):
            t0 = time.process_time()
            fn()
            samples.append(time.process_time() - t0)
        return statistics.median(samples)

    index_ms = timed(lambda: index.match(prompt, None, 1.0)) * 1e3
    # The parts of that match, interleaved: list -> uint32 conversion, every key (conversion
    # included), and the walk + LRU renewal + answer on keys already computed.
    parts: dict[str, list[float]] = {"conv": [], "keys": [], "walk": []}
    n_blocks = prompt_tokens // BLOCK
    for _ in range(repeat):
        parts["conv"].append(timed_once(lambda: token_array(prompt)))
        prepared = index.prepare(prompt, None)
        parts["keys"].append(timed_once(partial(prepared.keys, BLOCK, n_blocks)))
        parts["walk"].append(timed_once(partial(index.match_keys, prepared, 1.0)))
    clock = iter(range(2, 10**9))  # each routing 1 s later, entries live 0.5 s: no pile-up
    route_ms = timed(lambda: index.note_routed("e0", prompt, None, next(clock), 0.5)) * 1e3
    # Now e0 has unexpired optimistic entries for the whole prompt (at now=1.0): the slow path.
    assert index.match(prompt, None, 1.0)["e0"].optimistic_tokens == prompt_tokens
    match_opt_ms = timed(lambda: index.match(prompt, None, 1.0)) * 1e3

    # A whole routing decision as router.routing.policy makes it: match, then note the engine.
    # Token calls hash the prompt twice; a prepared PromptKeys hashes it once for both.
    def by_tokens() -> None:
        now = next(clock)
        index.match(prompt, None, now)
        index.note_routed("e1", prompt, None, now, 0.5)

    def by_keys() -> None:
        now = next(clock)
        keys = index.prepare(prompt, None)
        index.match_keys(keys, now)
        index.note_routed_keys("e1", keys, now, 0.5)

    decide_tokens, decide_keys = [], []
    for _ in range(repeat):  # interleaved: both see the same machine load
        decide_tokens.append(timed_once(by_tokens))
        decide_keys.append(timed_once(by_keys))
    return {
        "decide_tokens_ms": statistics.median(decide_tokens) * 1e3,
        "decide_keys_ms": statistics.median(decide_keys) * 1e3,
        "route_ms": route_ms,
        "match_opt_ms": match_opt_ms,
        "index_ms": index_ms,
        **{f"{k}_ms": statistics.median(v) * 1e3 for k, v in parts.items()},
        "tree_ms": timed(lambda: tree.prefix_match(text)) * 1e3,
        "chars": len(text),
    }


def timed_once(fn: Callable[[], object]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def baseline_rows(rev: str, repeat: int) -> list[tuple[str, str, str]]:
    """This tree's radix against ``rev``'s (a git revision), interleaved in one process: match and
    a whole routing decision (match + note_routed), 64 engines, as in :func:`bench_match`."""
    import importlib
    import re
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="radix_baseline_"))
    pkg = tmp / "radix_baseline"
    pkg.mkdir()
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:radix"],
                           check=True, capture_output=True, text=True).stdout.split()
    for name in names:
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:radix/{name}"],
                             check=True, capture_output=True, text=True).stdout
        (pkg / name).write_text(re.sub(r"\bfrom radix(\.| import)", r"from radix_baseline\1", src))
    sys.path.insert(0, str(tmp))
    old_mod = importlib.import_module("radix_baseline")
    rows = []
    events = ingest_events(4_000, 32, 64)
    ingest: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(3):  # best of 3, interleaved
        for label, cls in (("old", old_mod.PrefixIndex), ("new", PrefixIndex)):
            fresh_index = cls(max_blocks=10_000_000)
            for e in range(64):
                fresh_index.add_engine(f"e{e}", BLOCK)
            gc.collect()
            t0 = time.process_time()
            for engine, block_hashes, parent, tokens in events:
                fresh_index.apply_stored(engine, block_hashes, parent, tokens, None, 0.0)
            ingest[label].append(time.process_time() - t0)
    rate = {k: len(events) * 32 / min(v) / 1e3 for k, v in ingest.items()}
    rows.append((f"ingest, apply_stored, 32-block events: {rev} | this tree",
                 f"{rate['old']:,.0f}k | {rate['new']:,.0f}k blocks/s",
                 f"new/old = {rate['new'] / rate['old']:.2f}x"))
    for n in (2_048, 32_768):
        rng = random.Random(5)
        prompt = [rng.randrange(VOCAB) for _ in range(n)]
        built = []
        for cls in (old_mod.PrefixIndex, PrefixIndex):
            index = cls(max_blocks=10_000_000)
            hashes: dict[tuple[str, int], int] = {}
            for e in range(64):
                index.add_engine(f"e{e}", BLOCK)
            for e in range(64):
                part = prompt if e == 32 else prompt[: min(1024, n // 2)] + [1] * 512
                store_prompt(index, f"e{e}", part, random.Random(e), hashes)
            built.append(index)
        old, new = built
        assert old.match(prompt, None, 1.0) == new.match(prompt, None, 1.0)
        clock = iter(range(2, 10**9))

        def old_decide(old: Any = old, prompt: list[int] = prompt, clock: Any = clock) -> None:
            now = next(clock)
            old.match(prompt, None, now)
            old.note_routed("e1", prompt, None, now, 0.5)

        def new_decide(new: PrefixIndex = new, prompt: list[int] = prompt,
                       clock: Any = clock) -> None:
            now = next(clock)
            keys = new.prepare(prompt, None)
            new.match_keys(keys, now)
            new.note_routed_keys("e1", keys, now, 0.5)

        fns: dict[str, Callable[[], object]] = {
            "old match": partial(old.match, prompt, None, 1.0),
            "new match": partial(new.match, prompt, None, 1.0),
            "old decide": old_decide, "new decide": new_decide}
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(repeat):
            for k, fn in fns.items():
                samples[k].append(timed_once(fn))
        med = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
        for what in ("match", "decide"):
            label = "match" if what == "match" else "decision (match + note)"
            rows.append((f"{label}, {n // 1024}k tokens, 64 engines: {rev} | this tree",
                         f"{med['old ' + what]:.3f} ms | {med['new ' + what]:.3f} ms",
                         f"new/old = {med['new ' + what] / med['old ' + what]:.2f}x"))
    return rows


def calibration_ms() -> float:
    """CPU time of ``sum(range(100_000))``: the machine's speed, to scale figures between runs."""
    samples = []
    for _ in range(20):
        t0 = time.process_time()
        sum(range(100_000))
        samples.append(time.process_time() - t0)
    return statistics.median(samples) * 1e3


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def child(kind: str, n: int, tokens: int, engines: int) -> dict[str, Any]:
    """Runs in a fresh interpreter: RSS growth of one structure holding n prompts."""
    rng = random.Random(11)
    vocab = words() if kind == "tree" else []
    structure: Any
    gc.collect()
    before = rss_bytes()
    if kind == "index":
        structure = fresh(engines)
        system = [rng.randrange(VOCAB) for _ in range(tokens // 4)]
        blocks = 0
        for i in range(n):
            # Unique prompts over a shared system prompt, announced as vLLM would (tail only).
            toks = system + [rng.randrange(VOCAB) for _ in range(tokens - len(system))]
            engine = f"e{i % engines}"
            parent_needed = i >= engines
            head = len(system) // BLOCK
            if not parent_needed:
                hs = [rng.getrandbits(64) for _ in range(tokens // BLOCK)]
                structure.apply_stored(engine, hs, None, toks[: len(hs) * BLOCK], None, 0.0)
                blocks += len(hs)
                heads = getattr(structure, "_bench_heads", {})
                heads[engine] = hs[head - 1]
                structure._bench_heads = heads
            else:
                hs = [rng.getrandbits(64) for _ in range(tokens // BLOCK - head)]
                structure.apply_stored(engine, hs, structure._bench_heads[engine],
                                       toks[head * BLOCK : (head + len(hs)) * BLOCK], None, 0.0)
                blocks += len(hs)
        del structure._bench_heads
        units = len(structure)
    else:
        structure = CharTree()
        system = [rng.randrange(VOCAB) for _ in range(tokens // 4)]
        for i in range(n):
            toks = system + [rng.randrange(VOCAB) for _ in range(tokens - len(system))]
            structure.insert("".join(vocab[t] for t in toks), f"e{i % engines}", float(i))
        units = n
    gc.collect()
    after = rss_bytes()
    return {"kind": kind, "prompts": n, "units": units, "rss_growth": after - before}


def child_blocks(n_blocks: int, engines: int) -> dict[str, Any]:
    """RSS per unique cached block: n_blocks unique blocks over ``engines`` engines."""
    rng = random.Random(13)
    per_event = 128
    gc.collect()
    before = rss_bytes()
    index = fresh(engines)
    for i in range(n_blocks // per_event):
        base = rng.randrange(VOCAB - BLOCK * per_event)
        toks = list(range(base, base + BLOCK * per_event))
        toks[0] = i  # a unique first block makes the whole chain unique
        hs = [rng.getrandbits(64) for _ in range(per_event)]
        index.apply_stored(f"e{i % engines}", hs, None, toks, None, 0.0)
    gc.collect()
    after = rss_bytes()
    return {"blocks": len(index), "rss_growth": after - before}


def in_subprocess(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True,
                         capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def plot(path: str, lengths: list[int], sweep: list[dict[str, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(lengths, [r["index_ms"] for r in sweep], "o-", label="PrefixIndex.match (64 engines)")
    ax.plot(lengths, [r["tree_ms"] for r in sweep], "s-", label="char tree prefix_match")
    ax.axhline(1.0, color="grey", linestyle=":", label="1 ms target at 32k")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens (fully cached on 1 of 64 engines)")
    ax.set_ylabel("CPU ms per match (median)")
    ax.set_title(f"radix match cost (calibration {calibration_ms():.1f} ms)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", nargs="+")
    ap.add_argument("--plot", help="PNG path: match time vs prompt length, index and tree")
    ap.add_argument("--baseline", metavar="REV",
                    help="also time match and a routing decision against radix/ at git REV")
    args = ap.parse_args()
    if args.child:
        if args.child[0] == "blocks":
            print(json.dumps(child_blocks(int(args.child[1]), int(args.child[2]))))
        else:
            kind, n, tokens, engines = args.child
            print(json.dumps(child(kind, int(n), int(tokens), int(engines))))
        return
    q = args.quick
    rows: list[tuple[str, str, str]] = []
    rows.append(("calibration: sum(range(100_000)) CPU time (median)",
                 f"{calibration_ms():.2f} ms", "machine speed reference"))

    ing = bench_ingest(n_events=2_000 if q else 8_000, blocks_per_event=32, engines=64)
    rows.append(("ingest, apply_stored (16-token blocks, 64 engines, best of 3)",
                 f"{ing['blocks'] / ing['index_s'] / 1e3:,.0f}k blocks/s", ">= 300k blocks/s"))
    rows.append(("ingest, msgpack decode (wire.engine) + apply_stored",
                 f"{ing['blocks'] / ing['wire_s'] / 1e3:,.0f}k blocks/s", "-"))

    m = bench_match(32_768, engines=64, repeat=20 if q else 50)
    rows.append(("match 32k-token prompt, cached on 1 of 64 engines (median)",
                 f"{m['index_ms']:.3f} ms", "<= 1 ms"))
    rows.append(("  its parts: list -> uint32 | all keys (incl. conversion) | walk + renew",
                 f"{m['conv_ms']:.3f} | {m['keys_ms']:.3f} | {m['walk_ms']:.3f} ms", "-"))
    rows.append(("note_routed, same prompt on an engine lacking it (median)",
                 f"{m['route_ms']:.3f} ms", "-"))
    rows.append(("match, same prompt, another engine holding it optimistically (median)",
                 f"{m['match_opt_ms']:.3f} ms", "-"))
    rows.append((f"char tree prefix_match, same prompt ({m['chars']:,} chars, median)",
                 f"{m['tree_ms']:.3f} ms", f"index/tree = {m['index_ms'] / m['tree_ms']:.2f}x"))
    for label, r in (("32k", m), ("2k", bench_match(2_048, engines=64, repeat=50 if q else 200))):
        rows.append((f"decision on a {label}-token prompt: match + note_routed (token calls)",
                     f"{r['decide_tokens_ms']:.3f} ms", "-"))
        rows.append((f"decision on a {label}-token prompt: prepare + match_keys + note_routed_keys",
                     f"{r['decide_keys_ms']:.3f} ms",
                     f"keys/tokens = {r['decide_keys_ms'] / r['decide_tokens_ms']:.2f}x"))

    n_blocks = 200_000 if q else 1_000_000
    blk = in_subprocess("blocks", str(n_blocks), "8")
    rows.append((f"RSS per unique cached block at {blk['blocks']:,} blocks (8 engines)",
                 f"{blk['rss_growth'] / blk['blocks']:.0f} B", "<= 200 B"))

    n_prompts = 5_000 if q else 20_000
    idx = in_subprocess("index", str(n_prompts), "352", "8")
    tree = in_subprocess("tree", str(n_prompts), "352", "8")
    rows.append((f"RSS, {n_prompts:,} unique ~1.5 KB prompts (352 tokens, 88 shared), index",
                 f"{idx['rss_growth'] / 2**20:.1f} MiB ({idx['units']:,} blocks)",
                 f"{idx['rss_growth'] / n_prompts:,.0f} B/prompt"))
    rows.append(("RSS, same prompts as text in the character tree",
                 f"{tree['rss_growth'] / 2**20:.1f} MiB",
                 f"tree/index = {tree['rss_growth'] / idx['rss_growth']:.1f}x"))

    if args.baseline:
        rows += baseline_rows(args.baseline, repeat=20 if q else 100)

    if args.plot:
        lengths = [1024, 4096, 8192, 16384, 32768]
        sweep = [bench_match(n, engines=64, repeat=20) for n in lengths]
        plot(args.plot, lengths, sweep)
        for n, r in zip(lengths, sweep, strict=True):
            rows.append((f"match {n:,}-token prompt (sweep), index | char tree",
                         f"{r['index_ms']:.3f} ms | {r['tree_ms']:.3f} ms",
                         f"index/tree = {r['index_ms'] / r['tree_ms']:.0f}x"))

    width = max(len(r[0]) for r in rows)
    print(f"{'measurement':<{width}}  {'result':>28}  target / ratio")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>28}  {target}")


if __name__ == "__main__":
    main()
