"""Scrape every pod's sidecar concurrently and turn its metrics into PodSamples.

Why: the policy must see all pods of a service at one moment, and one hung
sidecar must not delay the others, so scrapes run concurrently with a short
timeout each; a failure becomes a sample with ok=False (the policy counts it
towards staleness) rather than an exception. The Prometheus text parser is a
small pure function here so the operator image needs no prometheus_client.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Sequence

import aiohttp

from fusebox_operator.kube import PodView
from fusebox_operator.manifests import METRICS_PORT
from fusebox_operator.policy import PodSample, RequestCounts

Labels = dict[str, str]
Families = dict[str, list[tuple[Labels, float]]]
BREAKER_STATES = {0: "closed", 1: "open", 2: "half_open"}


class ParseError(ValueError):
    pass


def _parse_labels(text: str) -> Labels:
    labels: Labels = {}
    i = 0
    while i < len(text):
        while i < len(text) and text[i] in " ,":
            i += 1
        if i >= len(text):
            break
        eq = text.index("=", i)
        key = text[i:eq].strip()
        if text[eq + 1] != '"':
            raise ParseError(f"label {key}: value not quoted")
        j = eq + 2
        value: list[str] = []
        while text[j] != '"':
            if text[j] == "\\":
                j += 1
                value.append({"n": "\n", "\\": "\\", '"': '"'}.get(text[j], text[j]))
            else:
                value.append(text[j])
            j += 1
        labels[key] = "".join(value)
        i = j + 1
    return labels


def parse_metrics(text: str) -> Families:
    """Prometheus text exposition -> {sample name: [(labels, value)]}."""
    families: Families = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            if "{" in line:
                name, rest = line.split("{", 1)
                label_text, value_text = rest.rsplit("}", 1)
                labels = _parse_labels(label_text)
            else:
                name, value_text = line.split(None, 1)
                labels = {}
            value = float(value_text.split()[0])
        except (ValueError, IndexError) as error:
            raise ParseError(f"bad metrics line {raw_line[:80]!r}") from error
        families.setdefault(name.strip(), []).append((labels, value))
    return families


def _one(families: Families, name: str, **match: str) -> float | None:
    for labels, value in families.get(name, []):
        if all(labels.get(k) == v for k, v in match.items()) and not math.isnan(value):
            return value
    return None


def _total(families: Families, name: str) -> float | None:
    values = [v for _, v in families.get(name, []) if not math.isnan(v)]
    return sum(values) if values else None


def sample_from_metrics(pod: str, families: Families, sampled_at: float, metric: str) -> PodSample:
    """The sidecar's families -> one PodSample (absent metrics stay None)."""
    counts = None
    if "fusebox_requests_total" in families:
        counts = RequestCounts(
            succeeded=_one(families, "fusebox_requests_total", outcome="succeeded") or 0.0,
            failed=_one(families, "fusebox_requests_total", outcome="failed") or 0.0,
            rejected=_one(families, "fusebox_requests_total", outcome="rejected") or 0.0,
            timed_out=_one(families, "fusebox_requests_total", outcome="timed_out") or 0.0,
        )
    heartbeats = [v for _, v in families.get("fusebox_heartbeat_age_seconds", [])]
    breaker = _one(families, "fusebox_breaker_state")
    level = _one(families, "fusebox_degradation_level")
    loaded = _one(families, "fusebox_model_loaded")
    return PodSample(
        pod=pod,
        sampled_at=sampled_at,
        ok=True,
        rss_bytes=_one(families, "fusebox_process_resident_memory_bytes"),
        memory_limit_bytes=_one(families, "fusebox_memory_limit_bytes"),
        gpu_memory_used_bytes=_total(families, "fusebox_gpu_memory_used_bytes"),
        gpu_memory_total_bytes=_total(families, "fusebox_gpu_memory_total_bytes"),
        latency_p99_seconds=_one(families, "fusebox_latency_p99_seconds", metric=metric),
        quality_failure_ratio=_one(families, "fusebox_quality_failure_ratio"),
        stats_age_seconds=_one(families, "fusebox_server_stats_age_seconds"),
        heartbeat_age_seconds=max(heartbeats) if heartbeats else None,
        requests=counts,
        breaker_state=None if breaker is None else BREAKER_STATES.get(int(breaker)),
        degradation_level=None if level is None else int(level),
        model_loaded=None if loaded is None else loaded >= 1,
        queue_length=_one(families, "fusebox_request_queue_length"),
        tokenizer_cache_entries=_one(families, "fusebox_tokenizer_cache_entries"),
        cuda_contexts=_one(families, "fusebox_cuda_contexts"),
    )


def scrapable(pods: Iterable[PodView]) -> list[PodView]:
    """Running pods whose sidecar answers; a wedged server's pod is not Ready but still counts."""
    return [
        p for p in pods if p.phase == "Running" and p.ip and p.sidecar_ready and not p.terminating
    ]


async def scrape_pod(
    session: aiohttp.ClientSession,
    pod: PodView,
    timeout_seconds: float,
    metric: str,
    port: int = METRICS_PORT,
) -> PodSample:
    url = f"http://{pod.ip}:{port}/metrics"
    sampled_at = time.time()
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        async with session.get(url, timeout=timeout) as response:
            if response.status != 200:
                return PodSample(pod.name, sampled_at, ok=False, error=f"HTTP {response.status}")
            text = await response.text()
        return sample_from_metrics(pod.name, parse_metrics(text), sampled_at, metric)
    except (aiohttp.ClientError, TimeoutError, ParseError) as error:
        return PodSample(pod.name, sampled_at, ok=False, error=f"{type(error).__name__}: {error}")


async def scrape_all(
    session: aiohttp.ClientSession,
    pods: Sequence[PodView],
    timeout_seconds: float,
    metric: str,
    port: int = METRICS_PORT,
) -> list[PodSample]:
    """Scrape every pod at once; each failure is a not-ok sample, never an exception."""
    scrapes = (scrape_pod(session, p, timeout_seconds, metric, port) for p in pods)
    return list(await asyncio.gather(*scrapes))
