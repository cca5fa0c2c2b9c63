"""Metric names the sidecar exports and the operator (and dashboards) read.

Counters are named without `_total` here, as prometheus_client's families
take them; `.sample` gives the exposed sample name.
"""

from __future__ import annotations

import enum


class Metric(enum.StrEnum):
    PROCESS_RESIDENT_MEMORY_BYTES = "fusebox_process_resident_memory_bytes"
    MEMORY_LIMIT_BYTES = "fusebox_memory_limit_bytes"
    CGROUP_MEMORY_USAGE_BYTES = "fusebox_cgroup_memory_usage_bytes"
    GPU_MEMORY_USED_BYTES = "fusebox_gpu_memory_used_bytes"  # {gpu}
    GPU_MEMORY_TOTAL_BYTES = "fusebox_gpu_memory_total_bytes"  # {gpu}
    GPU_PROCESS_MEMORY_USED_BYTES = "fusebox_gpu_process_memory_used_bytes"  # {gpu}
    GPU_VISIBLE = "fusebox_gpu_visible"
    GPU_LOST = "fusebox_gpu_lost"  # {gpu}
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

    @property
    def is_counter(self) -> bool:
        return self in _COUNTERS

    @property
    def sample(self) -> str:
        """The name of the exposed sample (`_total` appended to counters)."""
        return f"{self.value}_total" if self.is_counter else self.value


_COUNTERS = frozenset(
    {
        Metric.CUDA_ALLOC_RETRIES,
        Metric.CUDA_OOMS,
        Metric.REQUESTS,
        Metric.TOKENIZER_CACHE_HITS,
        Metric.TOKENIZER_TEMPLATE_HITS,
        Metric.QUALITY_SAMPLED,
        Metric.QUALITY_FAILURES,
    }
)
