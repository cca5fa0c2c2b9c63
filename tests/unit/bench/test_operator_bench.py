"""The scale benchmark's steady-state arithmetic: apiserver metrics in, per-service costs out."""

from __future__ import annotations

from bench.operator_bench import RESYNC_SECONDS, _apiserver, steady_summary

METRICS = """\
# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",resource="deployments",verb="GET"} 40
apiserver_request_total{code="404",resource="deployments",verb="GET"} 2
apiserver_request_total{code="409",resource="secrets",verb="POST"} 7
apiserver_request_total{code="200",resource="pods",verb="LIST"} 5
# HELP apiserver_request_duration_seconds Response latency.
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{le="0.1",resource="pods",verb="LIST"} 99
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
"""


def test_requests_are_summed_over_codes_by_verb_and_resource() -> None:
    requests, cpu = _apiserver(METRICS)

    assert requests == {"GET deployments": 42.0, "POST secrets": 7.0, "LIST pods": 5.0}
    assert cpu == 12.5


def window(services: int, rates: dict[str, float], operator: float) -> dict[str, object]:
    return {
        "seconds": 30.0,
        "requests_per_second": rates,
        "apiserver_cpu_cores": 0.03,
        "operator_cpu_cores": operator,
        "services": services,
    }


def test_the_summary_prices_each_extra_service() -> None:
    one = window(1, {"GET deployments": 0.1, "LIST pods": 0.2, "PUT leases": 0.2}, 0.004)
    every = window(
        11,
        {
            "GET deployments": 1.1,
            "GET secrets": 1.0,
            "LIST pods": 2.2,
            "PATCH inferenceservices": 0.3,
        },
        0.044,
    )

    summary = steady_summary({"one": one, "all": every})

    assert summary["writes_per_second"] == {"one": 0.2, "all": 0.3}
    # (2.1 - 0.1) GET/s over 10 extra services, times the resync interval
    assert summary["gets_per_extra_service_per_resync"] == round(2.0 * RESYNC_SECONDS / 10, 2)
    assert summary["pod_lists_per_extra_service_per_second"] == 0.2
    assert summary["operator_cpu_all_vs_one_ratio"] == 11.0
    assert summary["apiserver_cpu_all_vs_one_ratio"] == 1.0
