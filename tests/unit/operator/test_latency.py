"""The latency breaker's p99 from the sidecars' histograms (operator/fusebox_operator/latency.py).

The quantile must be the one Prometheus shows for the same buckets, so a
user who reads the dashboard's p99 sees what tripped the breaker: the
agreement is checked against promtool's own PromQL engine.
"""

from __future__ import annotations

import math
import random
import subprocess
from pathlib import Path

import pytest
import yaml

from fusebox_contract.metrics import LatencyHistogram, Metric
from fusebox_contract.names import BreakerState, LatencyMetric
from fusebox_operator.latency import (
    Buckets,
    bucket_quantile,
    increase,
    merge,
    remember,
    window_quantile,
)
from fusebox_operator.observations import PodSample, RequestCounts
from fusebox_operator.policy import decide
from fusebox_operator.policy_state import PolicyState
from fusebox_operator.spec import InferenceServiceSpec, parse_spec
from fusebox_operator.telemetry import parse_metrics, sample_from_metrics

INF = math.inf
T0 = 1_800_000_000.0


def cumulative(bounds: tuple[float, ...], per_bucket: list[float]) -> Buckets:
    """Buckets from per-bucket counts (one more than the bounds: the last is +Inf)."""
    running, out = 0.0, []
    for bound, count in zip((*bounds, INF), per_bucket, strict=True):
        running += count
        out.append((bound, running))
    return tuple(out)


# --- the quantile ----------------------------------------------------------------------


def test_the_quantile_interpolates_within_the_bucket_that_holds_its_rank() -> None:
    # 100 observations: 50 <= 0.1, 40 in (0.1, 0.2], 10 in (0.2, 0.4]; rank 99 lies in
    # the last finite bucket, 9 of its 10 in: 0.2 + 0.2 * 9/10.
    buckets = cumulative((0.1, 0.2, 0.4), [50, 40, 10, 0])
    assert bucket_quantile(0.99, buckets) == pytest.approx(0.38)
    assert bucket_quantile(0.5, buckets) == pytest.approx(0.1)


def test_the_first_bucket_starts_at_zero() -> None:
    assert bucket_quantile(0.5, cumulative((0.2, 1.0), [10, 0, 0])) == pytest.approx(0.1)


def test_a_rank_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    assert bucket_quantile(0.99, cumulative((0.1, 0.2), [50, 0, 50])) == 0.2


def test_no_observations_is_no_quantile_not_a_fast_service() -> None:
    assert bucket_quantile(0.99, cumulative((0.1, 0.2), [0, 0, 0])) is None
    assert bucket_quantile(0.99, ((0.1, 5.0),)) is None  # no +Inf bucket


# --- increase, merge, window -----------------------------------------------------------


def test_the_increase_is_what_each_bucket_gained() -> None:
    earlier = cumulative((0.1, 0.2), [5, 1, 0])
    later = cumulative((0.1, 0.2), [7, 4, 1])
    assert increase(earlier, later) == ((0.1, 2.0), (0.2, 5.0), (INF, 6.0))


def test_a_counter_reset_counts_the_new_process_from_zero() -> None:
    earlier = cumulative((0.1, 0.2), [50, 10, 0])
    later = cumulative((0.1, 0.2), [1, 2, 0])  # the server restarted in between
    assert increase(earlier, later) == later


def test_pods_are_summed_by_bucket_bound() -> None:
    a = cumulative((0.1, 0.2), [1, 1, 0])
    b = cumulative((0.1, 0.2), [0, 3, 1])
    assert merge([a, b]) == ((0.1, 1.0), (0.2, 5.0), (INF, 6.0))


def test_the_window_keeps_recent_snapshots_and_needs_two_to_see_an_increase() -> None:
    bounds = (0.1, 0.2)
    history = remember([], T0, cumulative(bounds, [0, 0, 0]), 60)
    assert window_quantile(0.99, [history]) is None  # one scrape: no increase yet
    history = remember(history, T0 + 30, cumulative(bounds, [0, 10, 0]), 60)
    assert window_quantile(0.99, [history]) == pytest.approx(0.199)
    history = remember(history, T0 + 90, cumulative(bounds, [90, 10, 0]), 60)
    assert [at for at, _ in history] == [T0 + 30, T0 + 90]  # T0 fell out of the window
    # Over the last 60 s only the 90 fast ones came: the slow ten are forgotten.
    assert window_quantile(0.99, [history]) == pytest.approx(0.099)


# --- agreement with Prometheus ---------------------------------------------------------


def _promtool_agrees(tmp_path: Path, pods: dict[str, tuple[Buckets, Buckets]], q: float) -> bool:
    """Whether promtool's histogram_quantile over `pods`' increases equals ours."""
    name = Metric.TIME_TO_FIRST_TOKEN_SECONDS.bucket
    series = [
        {
            "series": f'{name}{{pod="{pod}",le="{"+Inf" if math.isinf(bound) else bound}"}}',
            "values": f"{before} {after}",
        }
        for pod, (earlier, later) in pods.items()
        for (bound, before), (_, after) in zip(earlier, later, strict=True)
    ]
    ours = window_quantile(q, [[(T0, e), (T0 + 60, later)] for e, later in pods.values()])
    assert ours is not None
    expression = (
        f"abs(histogram_quantile({q}, sum by (le) ({name} - {name} offset 1m)) - {ours!r})"
        " < bool 1e-9"
    )
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {"expr": expression, "eval_time": "1m", "exp_samples": [{"value": 1}]}
                ],
            }
        ],
    }
    path = tmp_path / "agreement.yaml"
    path.write_text(yaml.safe_dump(test), encoding="utf-8")
    done = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert "FAILED" in done.stdout + done.stderr or done.returncode == 0, done.stderr
    return done.returncode == 0


@pytest.mark.parametrize("seed", range(6))
def test_the_p99_is_what_prometheus_histogram_quantile_shows(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    bounds = LatencyHistogram.TTFT.buckets
    pods: dict[str, tuple[Buckets, Buckets]] = {}
    for pod in ("a", "b", "c"):
        before = [rng.randint(0, 50) for _ in range(len(bounds) + 1)]
        gained = [rng.choice([0, 0, rng.randint(1, 200)]) for _ in range(len(bounds) + 1)]
        after = [x + y for x, y in zip(before, gained, strict=True)]
        pods[pod] = (cumulative(bounds, before), cumulative(bounds, after))
    for q in (0.5, 0.9, 0.99):
        assert _promtool_agrees(tmp_path, pods, q), (seed, q)


# --- from the scrape to the breaker ----------------------------------------------------


def _exposition(per_bucket: list[int]) -> str:
    metric = Metric.TIME_TO_FIRST_TOKEN_SECONDS
    bounds = LatencyHistogram.TTFT.buckets
    lines = [f"# TYPE {metric.value} histogram"]
    for bound, count in cumulative(bounds, [float(c) for c in per_bucket]):
        le = "+Inf" if math.isinf(bound) else str(bound)
        lines.append(f'{metric.bucket}{{le="{le}"}} {count}')
    lines += [f"{metric.value}_count {sum(per_bucket)}", f"{metric.value}_sum 1.0"]
    # The p99 gauge disagrees on purpose: the breaker must not read it.
    lines += [
        f"# TYPE {Metric.LATENCY_P99_SECONDS.value} gauge",
        f'{Metric.LATENCY_P99_SECONDS.value}{{metric="ttft"}} 0.001',
    ]
    return "\n".join(lines) + "\n"


def test_telemetry_reads_the_breaker_metric_s_histogram_buckets() -> None:
    per_bucket = [0] * (len(LatencyHistogram.TTFT.buckets) + 1)
    per_bucket[3] = 7
    sample = sample_from_metrics(
        "p", parse_metrics(_exposition(per_bucket)), T0, LatencyMetric.TTFT.value
    )
    assert sample.latency_buckets is not None
    assert sample.latency_buckets[-1] == (INF, 7.0)
    assert [bound for bound, _ in sample.latency_buckets[:-1]] == list(
        LatencyHistogram.TTFT.buckets
    )
    other = sample_from_metrics("p", parse_metrics(_exposition(per_bucket)), T0, "itl")
    assert other.latency_buckets is None  # no itl histogram in this scrape


SPEC = parse_spec(
    {
        "model": {"name": "chat", "source": "pvc://models/tiny"},
        "breaker": {
            "latency": {"p99ThresholdMillis": 200, "forSeconds": 10, "minRequests": 10},
            "halfOpen": {"minRequests": 20, "p99RecoveryMillis": 100},
        },
        "telemetry": {"scrapeIntervalSeconds": 5},
    }
)


def _tick(state: PolicyState, at: float, pods: dict[str, list[int]], calls: float) -> PolicyState:
    samples = [
        PodSample(
            pod,
            at,
            stats_age_seconds=1.0,
            heartbeat_age_seconds=0.5,
            latency_p99_seconds=0.001,  # the server's own window: not the breaker's input
            latency_buckets=cumulative(LatencyHistogram.TTFT.buckets, [float(c) for c in counts]),
            requests=RequestCounts(succeeded=calls),
        )
        for pod, counts in pods.items()
    ]
    state, _ = decide(state, samples, at, SPEC)
    return state


def _slow(n: int) -> list[int]:
    """n first tokens in (0.4, 0.5] s."""
    counts = [0] * (len(LatencyHistogram.TTFT.buckets) + 1)
    counts[LatencyHistogram.TTFT.buckets.index(0.5)] = n
    return counts


def _fast(n: int) -> list[int]:
    counts = [0] * (len(LatencyHistogram.TTFT.buckets) + 1)
    counts[LatencyHistogram.TTFT.buckets.index(0.05)] = n
    return counts


def _plus(*parts: list[int]) -> list[int]:
    return [sum(column) for column in zip(*parts, strict=True)]


def test_the_breaker_opens_on_the_histogram_p99_over_all_pods() -> None:
    """One slow pod among fast ones: its few slow requests are the service's 1%+ tail."""
    state = PolicyState("svc")
    for i in range(6):
        at = T0 + 5 * i
        pods = {"fast": _fast(100 * i), "slow": _slow(5 * i)}
        state = _tick(state, at, pods, calls=105 * i)
    assert state.p99_millis is not None and 400 < state.p99_millis <= 500
    assert state.breaker is BreakerState.OPEN
    assert "p99 ttft" in state.breaker_reason


def test_the_breaker_stays_closed_when_the_slow_tail_is_under_one_percent() -> None:
    state = PolicyState("svc")
    for i in range(6):
        state = _tick(state, T0 + 5 * i, {"p": _plus(_fast(1000 * i), _slow(i))}, 1001 * i)
    assert state.p99_millis is not None and state.p99_millis <= 50
    assert state.breaker is BreakerState.CLOSED


def test_a_sidecar_without_histograms_counts_with_its_p99_gauge() -> None:
    """A pod still on an image from before the histograms, during an upgrade."""
    state = PolicyState("svc")
    old = PodSample("old", T0, stats_age_seconds=1.0, latency_p99_seconds=0.3)
    state, _ = decide(state, [old], T0, SPEC)
    assert state.p99_millis == pytest.approx(300)


def test_a_gone_pod_s_histogram_is_forgotten() -> None:
    state = _tick(PolicyState("svc"), T0, {"p": _fast(1)}, 1)
    assert "p" in state.latency_history
    state, _ = decide(state, [PodSample("q", T0 + 5, stats_age_seconds=1.0)], T0 + 5, SPEC)
    assert "p" not in state.latency_history


def test_a_recovered_service_closes_at_its_first_half_open_on_the_default_spec() -> None:
    """openSeconds (30 s by default) is shorter than the 60 s window: the half-open
    decision must judge the requests admitted since half-open, not the slow ones that
    opened the breaker and are still in the window."""
    spec = parse_spec({"model": {"name": "chat", "source": "pvc://models/tiny"}})
    admitted = spec.breaker.half_open.admit_percent / 100
    state, at = PolicyState("svc"), T0
    slow, fast, served = 0, 0, 0.0
    while state.breaker is BreakerState.CLOSED:  # 100 rps, every first token in ~0.5 s
        at, slow, served = at + 5, slow + 500, served + 500
        state = _tick_with(spec, state, at, {"p": _slow(slow)}, served)
        assert at < T0 + 400
    moves = []
    for _ in range(12):  # the server is fast again from the moment the breaker opens
        at += 5
        if state.breaker is BreakerState.HALF_OPEN:
            fast, served = fast + round(500 * admitted), served + round(500 * admitted)
        before = state.breaker
        state = _tick_with(spec, state, at, {"p": _plus(_slow(slow), _fast(fast))}, served)
        if state.breaker is not before:
            moves.append(state.breaker)
    assert moves[:2] == [BreakerState.HALF_OPEN, BreakerState.CLOSED]
    assert state.trips == 1
    assert f"{fast} half-open requests: p99 ttft 50 ms" in state.breaker_reason


def _tick_with(
    spec: InferenceServiceSpec,
    state: PolicyState,
    at: float,
    pods: dict[str, list[int]],
    calls: float,
) -> PolicyState:
    samples = [
        PodSample(
            pod,
            at,
            stats_age_seconds=1.0,
            heartbeat_age_seconds=0.5,
            latency_buckets=cumulative(LatencyHistogram.TTFT.buckets, [float(c) for c in counts]),
            requests=RequestCounts(succeeded=calls),
        )
        for pod, counts in pods.items()
    ]
    state, _ = decide(state, samples, at, spec)
    return state
