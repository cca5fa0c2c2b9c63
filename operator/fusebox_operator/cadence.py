"""How often kopf wakes a service's telemetry timer (pure).

Why: kopf's timer interval is fixed per handler, and every wake-up costs kopf's
machinery (a sixth of the operator's steady CPU in the quick fleet bench) even
when the service has nothing to do. A timer every second for the default 5 s
scrape interval spent four wake-ups in five on nothing. So there are two
timers running the same tick: a coarse one every COARSE_TICK_SECONDS, on
kopf's grid, for services whose scrape interval is a whole multiple of it (the
default 5 s among them), and a fine one every second for the rest. kopf's
`when` filters give each service exactly one, and stop the other when a spec
edit moves the interval across.

The coarse tick is half the default interval, not all of it: a tick that
overruns (a slow apiserver under the status patch, a slow sidecar) waits for
the next grid point, and at 5 s that cost a whole interval (measured at 500
services on an overloaded host: 0.26 scrapes per pod per interval); at 2.5 s
it costs at most half of one, for two wake-ups per scrape instead of five.

The interval is the watched spec's (`status.appliedSpec`, the one the tick
scrapes with, spec.watched_spec), else `.spec`'s, read raw: the filters run on
every event of every service, and parsing the whole spec there would cost more
than the wake-ups saved.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

FINE_TICK_SECONDS = 1.0
COARSE_TICK_SECONDS = 2.5
DEFAULT_SCRAPE_INTERVAL_SECONDS = 5.0  # the CRD's default for telemetry.scrapeIntervalSeconds


def watched_scrape_interval(raw_spec: Mapping[str, Any], status: Mapping[str, Any]) -> float:
    """The scrape interval of the spec the tick watches with (an unreadable one: the default,
    which only picks a timer; the tick parses and checks the spec itself)."""
    spec: Any = raw_spec
    applied = status.get("appliedSpec")
    if isinstance(applied, str):
        try:
            spec = json.loads(applied)
        except ValueError:
            spec = raw_spec
    telemetry = spec.get("telemetry") if isinstance(spec, Mapping) else None
    value = telemetry.get("scrapeIntervalSeconds") if isinstance(telemetry, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return DEFAULT_SCRAPE_INTERVAL_SECONDS
    return float(value)


def coarse_ticks(raw_spec: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Whether the coarse timer serves this service: its interval is a whole number of
    coarse ticks, so waking it more often would find no scrape due."""
    ticks = watched_scrape_interval(raw_spec, status) / COARSE_TICK_SECONDS
    return ticks >= 1 and ticks == int(ticks)


def tick_slack_seconds(tick_seconds: float) -> float:
    """How early a scrape may start: half a tick. A timer wakes on its own clock, a little
    before or after the moment the last scrape set; without slack a wake-up a millisecond
    early would wait a whole further tick (5 s on the coarse timer)."""
    return tick_seconds / 2
