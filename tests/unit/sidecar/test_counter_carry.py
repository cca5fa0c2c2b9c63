"""The sidecar's counters across the server's variant swaps and restarts: each read
goes through the real observer and a real stats file, and the test reads what a
scrape exports. A counter must never go back, never count a hit twice, and keep
what a restarted server counted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from prometheus_client.registry import CollectorRegistry

from fusebox_contract.metrics import LatencyHistogram, Metric
from fusebox_contract.names import RequestOutcome, Variant
from fusebox_contract.stats import HistogramCounts, StatsDocument, Tokens, dumps
from fusebox_sidecar.collectors import SidecarCollector
from fusebox_sidecar.nvml import NvmlReader
from fusebox_sidecar.observer import ServerObserver

Sample = Callable[..., float | None]  # get_sample_value of one scrape
Scrape = Callable[[StatsDocument], Sample]


def _scraper(tmp_path: Path) -> Scrape:
    """Writes each document as the server would, then scrapes the same sidecar once."""
    path = tmp_path / "stats.json"
    observer = ServerObserver(path, tmp_path / "proc", NvmlReader(None), lambda: 1796000001.0)

    def scrape(document: StatsDocument) -> Sample:
        path.write_text(dumps(document))
        observation = observer.observe()
        registry = CollectorRegistry()
        registry.register(SidecarCollector(lambda: observation))
        return registry.get_sample_value

    return scrape


def _hits(
    document: StatsDocument, variant: Variant, hits: float, templates: float
) -> StatsDocument:
    return replace(
        document,
        tokenizer_cache_hits_total=hits,
        tokenizer_template_hits_total=templates,
        state=replace(document.state, variant=variant),
    )


def _exported(value: Sample) -> tuple[float | None, float | None]:
    return value(Metric.TOKENIZER_CACHE_HITS.sample), value(Metric.TOKENIZER_TEMPLATE_HITS.sample)


def test_tokenizer_hits_carry_across_a_swap_to_a_fallback_with_its_own_tokenizer_and_back(
    tmp_path: Path, stats_document: StatsDocument
) -> None:
    scrape = _scraper(tmp_path)
    seen = [
        _exported(scrape(_hits(stats_document, variant, hits, templates)))
        for variant, hits, templates in [
            (Variant.PRIMARY, 100, 30),
            (Variant.FALLBACK, 4, 1),  # the fallback's own tokenizer: its own count
            (Variant.FALLBACK, 10, 2),
            (Variant.PRIMARY, 103, 31),  # back: the primary's count goes on from 100
            (Variant.FALLBACK, 12, 2),
        ]
    ]

    assert seen == [(100, 30), (104, 31), (110, 32), (113, 33), (115, 33)]


def test_tokenizer_hits_shared_by_both_variants_are_not_counted_twice(
    tmp_path: Path, stats_document: StatsDocument
) -> None:
    scrape = _scraper(tmp_path)
    seen = [
        _exported(scrape(_hits(stats_document, variant, hits, templates)))
        for variant, hits, templates in [
            (Variant.PRIMARY, 100, 30),
            (Variant.FALLBACK, 120, 35),  # one tokenizer for both: one count
            (Variant.PRIMARY, 125, 35),
        ]
    ]

    assert seen == [(100, 30), (120, 35), (125, 35)]


def test_a_restarted_server_s_counts_are_added_even_when_they_passed_the_old_value(
    tmp_path: Path, stats_document: StatsDocument
) -> None:
    scrape = _scraper(tmp_path)
    first = replace(stats_document, requests={RequestOutcome.SUCCEEDED: 100})
    scrape(first)
    # A new process (new started_at) counted 150 before the next scrape: not a rise of 50.
    restarted = replace(
        first,
        started_at=first.started_at + 60 if first.started_at else None,
        requests={RequestOutcome.SUCCEEDED: 150},
    )
    after_restart = scrape(restarted)(Metric.REQUESTS.sample, {"outcome": "succeeded"})
    # The same process again, a little later.
    later = scrape(replace(restarted, requests={RequestOutcome.SUCCEEDED: 155}))

    assert after_restart == 250
    assert later(Metric.REQUESTS.sample, {"outcome": "succeeded"}) == 255


def test_a_counter_that_drops_is_a_reset_and_a_missing_value_is_no_reset(
    tmp_path: Path, stats_document: StatsDocument
) -> None:
    scrape = _scraper(tmp_path)
    totals = []
    for prompt_total in (500, 40, None, 45):
        value = scrape(replace(stats_document, tokens=Tokens(prompt_total=prompt_total)))
        totals.append(value(Metric.PROMPT_TOKENS.sample))

    assert totals == [500, 540, None, 545]


def test_a_histogram_is_carried_whole_across_a_restart(
    tmp_path: Path, stats_document: StatsDocument
) -> None:
    scrape = _scraper(tmp_path)
    name = LatencyHistogram.QUEUE
    before = stats_document.histograms[name]
    scrape(stats_document)
    fresh = HistogramCounts(tuple(1.0 for _ in before.bucket_counts), 1.0, 0.001)
    restarted = replace(
        stats_document,
        started_at=(stats_document.started_at or 0) + 60,
        histograms={**stats_document.histograms, name: fresh},
    )
    value = scrape(restarted)

    assert value(f"{name.metric.value}_count") == before.count + 1
    assert value(f"{name.metric.value}_sum") == before.sum_seconds + 0.001
    assert value(f"{name.metric.value}_bucket", {"le": "+Inf"}) == before.count + 1
