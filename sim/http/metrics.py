"""The face's ``/metrics``: the engine's load and prefix-cache counters under vLLM's names.

Routers read ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` as a pod's load and
``vllm:prefix_cache_queries_total`` / ``_hits_total`` as its cache hit rate;
``process_start_time_seconds`` tells a restarted process (prometheus_client's process metric,
which vLLM exports too); ``vllm:cache_config_info`` carries the KV block size as a label.
``vllm:request_queue_time_seconds`` and ``vllm:time_to_first_token_seconds`` are vLLM's
histograms, timed from the engine's receipt of each request (vLLM times TTFT from its API
server's; the sim's face adds well under a millisecond).
"""

from __future__ import annotations

import time

from sim.engine import SimEngine

_STARTED = time.time()


def metrics_text(engine: SimEngine, model: str) -> bytes:
    t = engine.totals
    labels = f'{{engine="{engine.config.data_parallel_rank}",model_name="{model}"}}'
    lines = [
        "# HELP process_start_time_seconds Start time of the process since unix epoch in "
        "seconds.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {_STARTED}",
    ]
    for name, kind, doc, value in (
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
         float(t.running)),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
         float(t.waiting)),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
         t.kv_cache_usage),
        ("vllm:prefix_cache_queries_total", "counter",
         "Prefix cache queries, in terms of number of queried tokens.", float(t.prefix_queries)),
        ("vllm:prefix_cache_hits_total", "counter",
         "Prefix cache hits, in terms of number of cached tokens.", float(t.prefix_hits)),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
         float(t.prompt_tokens)),
        ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
         float(t.generation_tokens)),
    ):
        base = name.removesuffix("_total")
        lines += [f"# HELP {base} {doc}", f"# TYPE {base} {kind}", f"{name}{labels} {value}"]
    # vLLM's CacheConfig as an info gauge (vLLM labels it with every CacheConfig field).
    c = engine.config
    lines += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
              "# TYPE vllm:cache_config_info gauge",
              f'vllm:cache_config_info{{block_size="{c.block_size}",enable_prefix_caching="True",'
              f'num_gpu_blocks="{c.num_gpu_blocks}",engine="{c.data_parallel_rank}"}} 1.0']
    for name, doc, hist in (
        ("vllm:request_queue_time_seconds",
         "Histogram of time spent in WAITING phase for request.", t.queue_time),
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
         t.ttft),
    ):
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} histogram",
                  *hist.lines(name, labels[1:-1])]
    return ("\n".join(lines) + "\n").encode()
