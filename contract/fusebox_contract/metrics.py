"""Metric names the sidecar exports and the operator (and dashboards) read.

Counters are named without `_total` here, as prometheus_client's families
take them; `.sample` gives the exposed sample name. Histograms expose
`_bucket`, `_sum` and `_count` samples; their bucket bounds are declared
here once (`LatencyHistogram.buckets`), so the server that counts, the
sidecar that exports and the operator that reads them cannot disagree.
"""

from __future__ import annotations

import enum
from typing import Final

from fusebox_contract.names import LatencyMetric


class Metric(enum.StrEnum):
    PROCESS_RESIDENT_MEMORY_BYTES = "fusebox_process_resident_memory_bytes"
    MEMORY_LIMIT_BYTES = "fusebox_memory_limit_bytes"
    CGROUP_MEMORY_USAGE_BYTES = "fusebox_cgroup_memory_usage_bytes"
    GPU_MEMORY_USED_BYTES = "fusebox_gpu_memory_used_bytes"  # {gpu}
    GPU_MEMORY_TOTAL_BYTES = "fusebox_gpu_memory_total_bytes"  # {gpu}
    GPU_PROCESS_MEMORY_USED_BYTES = "fusebox_gpu_process_memory_used_bytes"  # {gpu}
    GPU_VISIBLE = "fusebox_gpu_visible"
    GPU_LOST = "fusebox_gpu_lost"  # no labels: 1 when any visible device is lost
    CUDA_MEMORY_ALLOCATED_BYTES = "fusebox_cuda_memory_allocated_bytes"
    CUDA_MEMORY_RESERVED_BYTES = "fusebox_cuda_memory_reserved_bytes"
    CUDA_ALLOC_RETRIES = "fusebox_cuda_alloc_retries"  # counter
    CUDA_OOMS = "fusebox_cuda_ooms"  # counter
    CUDA_CONTEXTS = "fusebox_cuda_contexts"
    REQUEST_QUEUE_LENGTH = "fusebox_request_queue_length"
    REQUESTS_RUNNING = "fusebox_requests_running"
    REQUESTS = "fusebox_requests"  # counter {outcome}
    TOKENIZER_CACHE_ENTRIES = "fusebox_tokenizer_cache_entries"
    LATENCY_P99_SECONDS = "fusebox_latency_p99_seconds"  # {metric}
    QUALITY_FAILURE_RATIO = "fusebox_quality_failure_ratio"
    SERVER_STATS_AGE_SECONDS = "fusebox_server_stats_age_seconds"
    STATS_VALID = "fusebox_stats_valid"
    HEARTBEAT_AGE_SECONDS = "fusebox_heartbeat_age_seconds"  # {thread}
    BREAKER_STATE = "fusebox_breaker_state"
    DEGRADATION_LEVEL = "fusebox_degradation_level"
    FALLBACK_ACTIVE = "fusebox_fallback_active"
    MODEL_LOADED = "fusebox_model_loaded"
    MEMORY_GUARD_ACTIVE = "fusebox_memory_guard_active"
    SIDECAR_MEASURED = "fusebox_sidecar_measured"  # {quantity}
    TOKENIZER_CACHE_HITS = "fusebox_tokenizer_cache_hits"  # counter
    TOKENIZER_TEMPLATE_HITS = "fusebox_tokenizer_template_hits"  # counter
    # The prefix cache: hits and misses per prompt, tokens whose prefill a hit saved (vLLM
    # counts those as vllm:prefix_cache_hits), entries evicted, and its size against its bound.
    PREFIX_CACHE_HITS = "fusebox_prefix_cache_hits"  # counter
    PREFIX_CACHE_MISSES = "fusebox_prefix_cache_misses"  # counter
    PREFIX_CACHE_REUSED_TOKENS = "fusebox_prefix_cache_reused_tokens"  # counter
    PREFIX_CACHE_EVICTIONS = "fusebox_prefix_cache_evictions"  # counter
    PREFIX_CACHE_ENTRIES = "fusebox_prefix_cache_entries"
    PREFIX_CACHE_BYTES = "fusebox_prefix_cache_bytes"
    PREFIX_CACHE_CAPACITY_BYTES = "fusebox_prefix_cache_capacity_bytes"
    LATENCY_WINDOW_SAMPLES = "fusebox_latency_window_samples"  # {metric}
    QUALITY_SAMPLED = "fusebox_quality_sampled"  # counter
    QUALITY_FAILURES = "fusebox_quality_failures"  # counter
    BREAKER_ADMIT_RATIO = "fusebox_breaker_admit_ratio"
    MODEL_INFO = "fusebox_model_info"  # {model,variant,quantization,dtype,revision}, value 1
    FALLBACK_CONFIGURED = "fusebox_fallback_configured"
    FALLBACK_AVAILABLE = "fusebox_fallback_available"
    FALLBACK_UNAVAILABLE_INFO = "fusebox_fallback_unavailable_info"  # {reason}, value 1
    FALLBACK_TARGET = "fusebox_fallback_target"
    VARIANT_CONVERGING = "fusebox_variant_converging"
    # Histograms and token counters, named after vLLM's (vllm:time_to_first_token_seconds,
    # vllm:inter_token_latency_seconds, vllm:e2e_request_latency_seconds,
    # vllm:request_queue_time_seconds, vllm:prompt_tokens_total,
    # vllm:generation_tokens_total) so existing queries carry over by prefix.
    TIME_TO_FIRST_TOKEN_SECONDS = "fusebox_time_to_first_token_seconds"  # histogram
    INTER_TOKEN_LATENCY_SECONDS = "fusebox_inter_token_latency_seconds"  # histogram
    E2E_REQUEST_LATENCY_SECONDS = "fusebox_e2e_request_latency_seconds"  # histogram
    REQUEST_QUEUE_TIME_SECONDS = "fusebox_request_queue_time_seconds"  # histogram
    PROMPT_TOKENS = "fusebox_prompt_tokens"  # counter
    SERVER_START_TIME_SECONDS = "fusebox_server_start_time_seconds"  # Unix time
    GENERATION_TOKENS = "fusebox_generation_tokens"  # counter
    # The node's memory as the pod sees it (/proc/meminfo, /proc/pressure/memory):
    # another tenant's growth, which no per-pod figure shows.
    NODE_MEMORY_AVAILABLE_BYTES = "fusebox_node_memory_available_bytes"
    NODE_MEMORY_TOTAL_BYTES = "fusebox_node_memory_total_bytes"
    NODE_MEMORY_PRESSURE_RATIO = "fusebox_node_memory_pressure_ratio"  # {stall}, avg10
    # The model fetcher's report file (a pod whose model is s3:// or hf://): what it has of
    # the model, how fast, and how long since it last wrote (a stalled download's grows).
    MODEL_FETCH_INFO = "fusebox_model_fetch_info"  # {reason}, value 1
    MODEL_FETCH_DOWNLOADED_BYTES = "fusebox_model_fetch_downloaded_bytes"
    MODEL_FETCH_TOTAL_BYTES = "fusebox_model_fetch_total_bytes"
    MODEL_FETCH_RATE_BYTES_PER_SECOND = "fusebox_model_fetch_rate_bytes_per_second"
    MODEL_FETCH_REPORT_AGE_SECONDS = "fusebox_model_fetch_report_age_seconds"
    MODEL_FETCH_WAITING = "fusebox_model_fetch_waiting"  # another pod's download holds the cache

    @property
    def is_counter(self) -> bool:
        return self in _COUNTERS

    @property
    def is_histogram(self) -> bool:
        return self in _HISTOGRAMS

    @property
    def sample(self) -> str:
        """The name of the exposed sample (`_total` appended to counters).

        A histogram has no sample of its own name: see `samples`."""
        return f"{self.value}_total" if self.is_counter else self.value

    @property
    def samples(self) -> tuple[str, ...]:
        """Every sample name this metric exposes (a histogram's _bucket, _sum, _count)."""
        if self.is_histogram:
            return (self.bucket, f"{self.value}_sum", f"{self.value}_count")
        return (self.sample,)

    @property
    def bucket(self) -> str:
        """A histogram's cumulative bucket sample, labelled `le`."""
        return f"{self.value}_bucket"


_COUNTERS = frozenset(
    {
        Metric.CUDA_ALLOC_RETRIES,
        Metric.CUDA_OOMS,
        Metric.REQUESTS,
        Metric.TOKENIZER_CACHE_HITS,
        Metric.TOKENIZER_TEMPLATE_HITS,
        Metric.PREFIX_CACHE_HITS,
        Metric.PREFIX_CACHE_MISSES,
        Metric.PREFIX_CACHE_REUSED_TOKENS,
        Metric.PREFIX_CACHE_EVICTIONS,
        Metric.QUALITY_SAMPLED,
        Metric.QUALITY_FAILURES,
        Metric.PROMPT_TOKENS,
        Metric.GENERATION_TOKENS,
    }
)
# Measured only where the process has a GPU (NVML) or a CUDA allocator: on a
# CPU-only machine the sidecar leaves them out rather than export a fake zero.
MEASURED_ONLY_WITH_A_GPU: Final = frozenset(
    {
        Metric.GPU_MEMORY_USED_BYTES,
        Metric.GPU_MEMORY_TOTAL_BYTES,
        Metric.GPU_PROCESS_MEMORY_USED_BYTES,
        Metric.GPU_LOST,
        Metric.CUDA_MEMORY_ALLOCATED_BYTES,
        Metric.CUDA_MEMORY_RESERVED_BYTES,
        Metric.CUDA_ALLOC_RETRIES,
        Metric.CUDA_OOMS,
        Metric.CUDA_CONTEXTS,
    }
)
# Exported only by the sidecar of a pod whose model the fetcher downloads (its report file).
ONLY_WITH_A_FETCHED_MODEL: Final = frozenset(
    {
        Metric.MODEL_FETCH_INFO,
        Metric.MODEL_FETCH_DOWNLOADED_BYTES,
        Metric.MODEL_FETCH_TOTAL_BYTES,
        Metric.MODEL_FETCH_RATE_BYTES_PER_SECOND,
        Metric.MODEL_FETCH_REPORT_AGE_SECONDS,
        Metric.MODEL_FETCH_WAITING,
    }
)
FETCH_REASON_LABEL: Final = "reason"  # MODEL_FETCH_INFO's label: a FetchReason value
_HISTOGRAMS = frozenset(
    {
        Metric.TIME_TO_FIRST_TOKEN_SECONDS,
        Metric.INTER_TOKEN_LATENCY_SECONDS,
        Metric.E2E_REQUEST_LATENCY_SECONDS,
        Metric.REQUEST_QUEUE_TIME_SECONDS,
    }
)

BUCKET_LABEL: Final = "le"  # Prometheus' own name for a bucket's upper bound
STALL_LABEL: Final = "stall"  # NODE_MEMORY_PRESSURE_RATIO's label: a MemoryStall value


QUANTITY_LABEL: Final = "quantity"  # SIDECAR_MEASURED's label: a MeasuredQuantity value
GPU_LABEL: Final = "gpu"  # the GPU_* families' label: the device's NVML index


class MeasuredQuantity(enum.StrEnum):
    """What SIDECAR_MEASURED says the sidecar measured itself (1) or relays from the
    server's stats file (0): a relayed figure is as old as that file."""

    RSS = "rss"  # /proc/<pid>/status VmRSS, else the server's own figure
    GPU_MEMORY = "gpu_memory"  # NVML, else the server's NVML figures


class MemoryStall(enum.StrEnum):
    """The two lines of the kernel's memory pressure (PSI, /proc/pressure/memory)."""

    SOME = "some"  # share of time at least one task waited for memory
    FULL = "full"  # share of time every non-idle task waited for memory at once


class LatencyHistogram(enum.StrEnum):
    """The latencies the server counts into histograms; the value is the stats file's key.

    Bucket bounds (seconds, ascending; +Inf is implicit) suit LLM serving: fine
    around the latency breaker's usual thresholds (100 ms to 1 s for the first
    token), a few ms per token, and minutes for a whole long generation.
    """

    TTFT = "ttft"  # arrival to the first generated piece
    ITL = "itl"  # between consecutive pieces of one response
    E2E = "e2e"  # arrival to the end of a successful response
    QUEUE = "queue"  # arrival to a generation slot (maxConcurrency)

    @property
    def metric(self) -> Metric:
        return _HISTOGRAM_METRICS[self]

    @property
    def buckets(self) -> tuple[float, ...]:
        return _BUCKETS[self]

    @classmethod
    def of(cls, latency: LatencyMetric) -> LatencyHistogram:
        """The histogram behind a latency the breaker can watch."""
        return cls(latency.value)


_HISTOGRAM_METRICS: Final = {
    LatencyHistogram.TTFT: Metric.TIME_TO_FIRST_TOKEN_SECONDS,
    LatencyHistogram.ITL: Metric.INTER_TOKEN_LATENCY_SECONDS,
    LatencyHistogram.E2E: Metric.E2E_REQUEST_LATENCY_SECONDS,
    LatencyHistogram.QUEUE: Metric.REQUEST_QUEUE_TIME_SECONDS,
}
_BUCKETS: Final = {
    LatencyHistogram.TTFT: (
        0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3,
        0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0,
    ),
    LatencyHistogram.ITL: (
        0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075,
        0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
    ),
    LatencyHistogram.E2E: (
        0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0,
        20.0, 30.0, 45.0, 60.0, 120.0, 300.0,
    ),
    LatencyHistogram.QUEUE: (
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
        2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
    ),
}  # fmt: skip
