"""The sidecar's own counters: the server's, carried across its restarts and variant swaps.

Why: a Prometheus counter must only go up, and by what happened. The server's
counters start again from zero when its process restarts, and its tokenizer
counts belong to the tokenizer of the variant serving now (a fallback with its
own tokenizer has its own counts): relayed as they are, a swap to the fallback
drops the exported counter to the fallback's count and a swap back leaps it to
the primary's. Prometheus reads every drop as a reset and adds the new value,
so a swap back and forth counts the primary's hits twice; and a restart that
climbs past the old value between two scrapes is no drop at all, so what the
new process counted before that scrape is lost.

So each exported counter is a total the sidecar keeps: the server's first value
it sees (what the server counted before the sidecar looked), then, at every
read, what the server counted since the read before:
- the same run and variant: the rise; a drop is a reset, so the new value;
- another run (`started_at`, else `pid`, changed): the new process counted
  from zero, so the new value;
- another variant of the same run: the variants share one tokenizer (one
  count that kept rising) or each has its own (a count that only rises while
  it serves, from where the sidecar last saw it, or from 0). The stats file
  does not say which, so the smaller rise that fits is added: never twice,
  at worst a few hits late after a swap to a variant the sidecar never saw.
A value absent at a read (a field problem) is skipped, not read as 0: the next
value is compared with the last one seen. Histograms are carried as one vector
(every bucket, the count and the sum), so a reset of any part resets them all
and the buckets stay cumulative.

After a sidecar restart the totals start again from the server's values:
Prometheus sees one reset, as for any restarted exporter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from fusebox_contract.metrics import LatencyHistogram
from fusebox_contract.names import Variant
from fusebox_contract.stats import HistogramCounts, StatsDocument

Values = tuple[float, ...]
Run = tuple[float | None, int | None]  # (started_at, pid) of one server process


@dataclass(frozen=True)
class Source:
    """Which count the server's value is: its run and, for per-variant counts, the variant."""

    run: Run
    variant: Variant | None = None


@dataclass
class _Series:
    total: Values
    source: Source
    last: Values  # the server's value at the last read
    last_by_variant: dict[Variant | None, Values] = field(default_factory=dict)


def _rise(value: Values, since: Values) -> Values | None:
    if len(value) != len(since) or any(v < s for v, s in zip(value, since, strict=True)):
        return None
    return tuple(v - s for v, s in zip(value, since, strict=True))


def increment(source: Source, value: Values, before: Source, last: Values, own: Values) -> Values:
    """What the server counted since the last read, by the rules in the module docstring.

    `last` is the value at the last read (under `before`), `own` the last value seen
    for `source`'s variant in this run (zeros when never seen)."""
    if source.run != before.run:
        return value
    candidates = [last] if source.variant == before.variant else [last, own]
    rises = [r for c in candidates if (r := _rise(value, c)) is not None]
    if not rises:
        return value  # lower than every count it could continue: a reset
    return min(rises, key=sum)


class CounterCarry:
    """Totals since the sidecar started, one per counter key."""

    def __init__(self) -> None:
        self._series: dict[Hashable, _Series] = {}

    def carry(self, key: Hashable, source: Source, value: Values) -> Values:
        series = self._series.get(key)
        if series is None:
            series = _Series(value, source, value, {source.variant: value})
            self._series[key] = series
            return value
        if source.run != series.source.run:
            series.last_by_variant = {}
        zeros = tuple(0.0 for _ in value)
        own = series.last_by_variant.get(source.variant, zeros)
        added = increment(source, value, series.source, series.last, own)
        if len(added) != len(series.total):
            series.total = value  # another shape (new bucket bounds): start again
        else:
            series.total = tuple(t + a for t, a in zip(series.total, added, strict=True))
        series.source = source
        series.last = value
        series.last_by_variant[source.variant] = value
        return series.total

    def scalar(self, key: Hashable, source: Source, value: float | None) -> float | None:
        if value is None:
            return None
        return self.carry(key, source, (value,))[0]

    def carried(self, document: StatsDocument) -> StatsDocument:
        """`document` with every counter replaced by the sidecar's total."""
        # started_at names the run; a pid only where the server writes no start time.
        pid = document.pid if document.started_at is None else None
        run: Run = (document.started_at, pid)
        plain = Source(run)
        per_variant = Source(run, document.state.variant)
        cuda, tokens = document.cuda, document.tokens
        cache, quality = document.prefix_cache, document.quality
        return dataclasses.replace(
            document,
            cuda=dataclasses.replace(
                cuda,
                num_alloc_retries=self.scalar("cuda_retries", plain, cuda.num_alloc_retries),
                num_ooms=self.scalar("cuda_ooms", plain, cuda.num_ooms),
            ),
            tokenizer_cache_hits_total=self.scalar(
                "tokenizer_cache_hits", per_variant, document.tokenizer_cache_hits_total
            ),
            tokenizer_template_hits_total=self.scalar(
                "tokenizer_template_hits", per_variant, document.tokenizer_template_hits_total
            ),
            requests={
                outcome: self.carry(("requests", outcome), plain, (count,))[0]
                for outcome, count in document.requests.items()
            },
            histograms=self._histograms(plain, document.histograms),
            tokens=dataclasses.replace(
                tokens,
                prompt_total=self.scalar("prompt_tokens", plain, tokens.prompt_total),
                generation_total=self.scalar("generation_tokens", plain, tokens.generation_total),
            ),
            prefix_cache=dataclasses.replace(
                cache,
                hits_total=self.scalar("prefix_hits", plain, cache.hits_total),
                misses_total=self.scalar("prefix_misses", plain, cache.misses_total),
                evictions_total=self.scalar("prefix_evictions", plain, cache.evictions_total),
                reused_tokens_total=self.scalar(
                    "prefix_reused_tokens", plain, cache.reused_tokens_total
                ),
            ),
            quality=dataclasses.replace(
                quality,
                sampled_total=self.scalar("quality_sampled", plain, quality.sampled_total),
                failed_total=self.scalar("quality_failed", plain, quality.failed_total),
            ),
        )

    def _histograms(
        self, source: Source, histograms: Mapping[LatencyHistogram, HistogramCounts]
    ) -> dict[LatencyHistogram, HistogramCounts]:
        carried = {}
        for name, counts in histograms.items():
            *buckets, count, sum_seconds = self.carry(
                ("histogram", name),
                source,
                (*counts.bucket_counts, counts.count, counts.sum_seconds),
            )
            carried[name] = HistogramCounts(tuple(buckets), count, sum_seconds)
        return carried
