"""The HTTP transport's parsers as properties: SSE cut anywhere, /metrics bodies, logprob rows.

- A pod's generate stream, split into arbitrary TCP reads, gives the same outputs as whole: the
  delta token ids in order, one finishing output carrying the usage chunk's cached tokens.
- The /metrics scan sums every sample of a name (labels, timestamps, comments, longer names
  with the same prefix and non-finite values aside), as a Prometheus parser reads the body.
- Logprob rows rebuilt from a pod's listing (asked for k + 1) equal the engine's own rows.
"""

from __future__ import annotations

import asyncio
import json

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from router.link.engine_state import QueueCounts
from router.link.generate_stream import GenerateReader, rows_from_content
from router.link.http_state import _metric, parse_load, pod_counts
from router.link.request_stream import RequestStream
from wire.engine import EngineCoreOutput, FinishReason
from wire.token_api import GenerateLogprob, GenerateLogprobsContent

tokens = st.lists(st.lists(st.integers(0, 150_000), min_size=1, max_size=3), min_size=1,
                  max_size=12)


def _sse(deltas: list[list[int]], cached: int | None) -> bytes:
    events = []
    for i, ids in enumerate(deltas):
        last = i == len(deltas) - 1
        events.append({"request_id": "generate-tokens-r", "usage": None, "output_mode": "tokens",
                       "choices": [{"index": 0, "finish_reason": "length" if last else None,
                                    "stop_reason": None, "token_ids": ids,
                                    "routed_experts": None, "logprobs": None}]})
    usage = {"prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    events.append({"request_id": "generate-tokens-r", "usage": usage, "output_mode": "tokens",
                   "choices": []})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return body + b"data: [DONE]\n\n"


@given(tokens, st.one_of(st.none(), st.integers(0, 4096)), st.data())
def test_a_stream_cut_anywhere_reads_the_same(deltas: list[list[int]], cached: int | None,
                                              data: st.DataObject) -> None:
    body = _sse(deltas, cached)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=20)))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    stream = RequestStream("r", "pod")
    ended: list[object] = []
    reader = GenerateReader(stream, None, lambda r, err: ended.append(err))
    reader.on_head(200)
    for piece in pieces:
        if piece:
            reader.on_body(piece)
    reader.on_end()
    outs: list[EngineCoreOutput] = asyncio.run(stream.collect())
    assert ended == [None]
    assert [o.new_token_ids for o in outs] == deltas
    assert [o.finish_reason for o in outs] == [None] * (len(deltas) - 1) + [FinishReason.LENGTH]
    stats = outs[-1].prefill_stats
    assert (stats or {}).get("num_cached_tokens") == cached
    assert reader.tokens == sum(len(d) for d in deltas)


def test_a_stream_without_a_finish_fails() -> None:
    stream = RequestStream("r", "pod")
    reader = GenerateReader(stream, None, lambda r, err: None)
    reader.on_head(200)
    reader.on_body(b'data: {"choices": [{"index": 0, "token_ids": [5]}]}\n\ndata: [DONE]\n\n')
    try:
        asyncio.run(stream.collect())
    except Exception as exc:
        assert "without a finish reason" in str(exc)
    else:
        raise AssertionError("a stream without a finish must fail")


names = st.sampled_from(["vllm:num_requests_running", "vllm:num_requests_waiting"])
label_values = st.text(st.characters(codec="ascii", exclude_characters='"\\\n'), max_size=8)
samples = st.lists(st.tuples(names, st.dictionaries(st.sampled_from(["engine", "model_name"]),
                                                    label_values, max_size=2),
                             st.integers(0, 10_000), st.booleans()), max_size=8)


@given(samples)
def test_metric_sums_match_prometheus_parser(rows: list[tuple[str, dict[str, str], int, bool]]
                                             ) -> None:
    lines = ["# HELP vllm:num_requests_running Running.", "# TYPE vllm:num_requests_running gauge",
             "vllm:num_requests_running_other 99", "process_start_time_seconds 1.5e9"]
    for i, (name, labels, value, stamped) in enumerate(rows):
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        head = f"{name}{{{text}}}" if labels else name
        lines.append(f"{head} {float(value)}" + (f" {1000 + i}" if stamped else ""))
    body = ("\n".join(lines) + "\n").encode()
    want: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            want[s.name] = want.get(s.name, 0.0) + s.value
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        got = _metric(b"\n" + body, name.encode())
        assert (got or 0.0) == want.get(name, 0.0)
    load = parse_load(body, 1.0)
    assert load.start_time == 1.5e9
    assert load.running == int(want.get("vllm:num_requests_running", 0.0))


def test_non_finite_and_negative_counts_are_not_load() -> None:
    body = b'vllm:num_requests_running{engine="0"} NaN\nvllm:num_requests_waiting -3\n'
    load = parse_load(body, 0.0)
    assert (load.running, load.waiting) == (0, 0)
    assert _metric(b"\n" + body, b"vllm:num_requests_running") is None


def test_a_pods_count_of_our_requests_is_taken_as_they_are_now() -> None:
    """Scraped with 5 of ours running and 1 other frontend's waiting; ours finished since."""
    load = parse_load(b"vllm:num_requests_running 5\nvllm:num_requests_waiting 1\n", 0.0, 5)
    assert pod_counts(load, 0) == QueueCounts(0, 1)  # the pod is free but for the other one
    assert pod_counts(load, 7) == QueueCounts(7, 1)  # ours went up to 7 since


@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 60), st.integers(0, 60))
def test_pod_counts_are_the_others_as_scraped_plus_ours_now(running: int, waiting: int,
                                                            ours: int, now: int) -> None:
    body = f"vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n"
    counts = pod_counts(parse_load(body.encode(), 0.0, ours), now)
    total = counts.num_running_reqs + counts.num_waiting_reqs
    assert total == max(0, running + waiting - ours) + now
    assert 0 <= counts.num_waiting_reqs <= waiting and counts.num_running_reqs >= 0


@st.composite
def engine_rows(draw: st.DrawFn) -> tuple[list[int], list[float], int, int]:
    """An engine row [sampled, rank 1 .. rank k] (distinct top-k ids), the sampled rank, k."""
    k = draw(st.integers(0, 6))
    top = draw(st.lists(st.integers(0, 1000), min_size=k + 2, max_size=k + 2, unique=True))
    lps = sorted(draw(st.lists(st.floats(-20, 0), min_size=k + 2, max_size=k + 2)),
                 reverse=True)
    rank = draw(st.integers(1, k + 2))  # the sampled token: in the top-k, or just past it
    sampled, sampled_lp = top[rank - 1], lps[rank - 1]
    return [sampled, *top[:k]], [sampled_lp, *lps[:k]], rank, k


@given(engine_rows())
def test_rows_rebuilt_from_a_pods_listing_equal_the_engines(
        row: tuple[list[int], list[float], int, int]) -> None:
    ids, lps, rank, k = row
    # The pod was asked for k + 1: its map holds the sampled token, then ranks 1..k+1 without
    # it; it lists the first max(k + 1, 1) entries with their ranks.
    entries = [(ids[0], lps[0], rank)]
    top_ids = [*ids[1:], 1001]  # rank k + 1 (beyond the engine row)
    top_lps = [*lps[1:], -30.0]
    for r, (tid, lp) in enumerate(zip(top_ids, top_lps, strict=True), start=1):
        if tid != ids[0]:
            entries.append((tid, lp, r))
    listed = entries[:max(k + 1, 1)]
    content = [GenerateLogprobsContent(ids[0], lps[0], rank,
                                       [GenerateLogprob(t, lp, r) for t, lp, r in listed])]
    rows = rows_from_content(content, k)
    assert rows.width == k + 1
    assert list(rows.token_ids) == ids and list(rows.logprobs) == lps
    assert list(rows.sampled_ranks) == [rank]
