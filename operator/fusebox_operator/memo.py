"""What the handlers keep in kopf's memo, typed: the operator's own parts and each
service's memory between handler calls.

Why: kopf's memo is a dict any handler can write any key into; six string keys
read back with `.get` were a typo away from a silent reset (a resync every tick,
a token read on every tick). kopf hands each object a shallow copy of the
operator-level memo, so the `OperatorContext` set at startup is shared by every
service while the `ServiceMemo` made on a service's first handler call is its own.
Both are lost on an operator restart by design: status, the admin Secret and the
pods hold what must survive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fusebox_operator.settings import OperatorSettings
from fusebox_operator.spec import InferenceServiceSpec, parse_applied
from fusebox_operator.tick import TickMemory, written_elsewhere

if TYPE_CHECKING:
    import aiohttp

    from fusebox_operator.actuator import Actuator
    from fusebox_operator.kube import Kube

CONTEXT_KEY = "fusebox"
SERVICE_KEY = "service"
SECRET_CHECK_EVERY_RESYNCS = 4
"""A resync reads the admin Secret (is it there, which token does it hold) at every
fourth run only: the operator's role may not watch Secrets, so each read is a GET,
and at every resync it was a third of a quiet service's requests. A token refused
by a pod (HTTP 401 or 403) is read again at the next tick, whatever the count."""
RECONCILE_SETTLE_SECONDS = 30.0
"""How long after a reconcile a tick still reads the stored conditions before writing
its own: kopf gives a timer the body of the last watch event, which lags a patch by
well under this even on a loaded apiserver."""


@dataclass
class OperatorContext:
    """Made once at startup, shared by every service's handlers."""

    settings: OperatorSettings
    kube: Kube
    # Scrapes and admin calls each have a pool: a scrape storm never delays an action.
    scrape_session: aiohttp.ClientSession  # telemetry.scrape_session
    actuator: Actuator  # holds the admin calls' pool (actuator.admin_session)


@dataclass
class ServiceMemo:
    """One InferenceService's memory between its handler calls."""

    next_scrape_at: float = 0.0
    next_resync_at: float | None = None
    admin_token: str | None = None  # read from the Secret, never logged
    # When the Secret was last read or written: the token above is at most
    # SECRET_CHECK_EVERY_RESYNCS resyncs old, or dropped at once when a pod refuses it.
    secret_seen_at: float | None = None
    # Why the Secret of the token's name was last refused (admin_secret.py), while it
    # is, and when a read found that: one Warning per spell, not one per retry or
    # tick, and no read at every tick while it stands.
    admin_secret_refusal: str | None = None
    secret_refused_at: float | None = None
    # The generation whose children this process applied: a resync renders only those.
    applied_generation: int | None = None
    # One writer of a service's children at a time: the reconcile or the resync.
    children_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tick: TickMemory = field(default_factory=TickMemory)
    # When this process last ran a reconcile of the service (it writes conditions).
    reconciled_at: float | None = None
    # The last status.appliedSpec parsed, with its parse: every tick reads the record.
    applied: tuple[str, InferenceServiceSpec] | None = None

    def scrape_due(self, now: float, slack_seconds: float = 0.0) -> bool:
        """Whether this timer call scrapes. The kopf timer ticks every second or every
        2.5 s (cadence.py); each service scrapes at its own `telemetry.scrapeIntervalSeconds`,
        up to `slack_seconds` early so a wake-up a little before the moment is not lost."""
        return now >= self.next_scrape_at - slack_seconds

    def scraped(self, now: float, interval_seconds: float) -> None:
        """A scrape starts now: the next one is an interval away."""
        self.next_scrape_at = now + interval_seconds

    def reconciled_lately(self, now: float) -> bool:
        """Whether a reconcile may have written conditions the tick's body does not show.

        Only a reconcile writes conditions besides the tick (and only one operator
        replica acts), so a tick long after the last one reads what is stored and
        needs no GET of its own object before it writes: that GET was one of the
        two requests per service per minute in steady state.
        """
        return (
            self.reconciled_at is not None and now - self.reconciled_at < RECONCILE_SETTLE_SECONDS
        )

    def resync_due(self, now: float, resync_seconds: float) -> bool:
        """Whether to look for drifted children now: every `resync_seconds`, the first
        time one period after this service was first seen (a reconcile just applied
        them)."""
        if self.next_resync_at is None:
            self.next_resync_at = now + resync_seconds
        if now < self.next_resync_at:
            return False
        self.next_resync_at = now + resync_seconds
        return True

    def catch_up(self, status: Mapping[str, Any], operator_pod: str, generation: int) -> None:
        """Take the applied generation from status when another operator replica wrote it
        since this memory last ticked (`tick.written_elsewhere`): that replica acted while
        this one was paused, and its children (of `generation`, the generation status
        records as applied) are the ones a resync keeps. No resume handler runs on a
        replica kopf's peering resumes, so with the generation this process last applied
        itself every resync returned early, leaving a child deleted or edited by hand as
        it was. The tick then rebuilds its own memory from the same status."""
        if written_elsewhere(self.tick, status, operator_pod):
            self.applied_generation = max(self.applied_generation or 0, generation)

    def parse_applied(self, text: str) -> InferenceServiceSpec:
        """status.appliedSpec parsed, once per record: a parse took about 1 ms a tick,
        as much as deciding, and the record changes only when a reconcile applies."""
        if self.applied is None or self.applied[0] != text:
            self.applied = (text, parse_applied(text))
        return self.applied[1]

    def token_known(self, token: str, now: float) -> None:
        """The Secret was just read or written and holds `token`."""
        self.admin_token, self.secret_seen_at = token, now
        self.admin_secret_refusal = self.secret_refused_at = None

    def secret_refused(self, reason: str, now: float) -> bool:
        """A read found the Secret refused for `reason`: whether that is news worth a Warning."""
        news = reason != self.admin_secret_refusal
        self.admin_secret_refusal, self.secret_refused_at = reason, now
        return news

    def refused_lately(self, now: float, resync_seconds: float) -> bool:
        """Whether a read found the Secret refused within the last resync period: a tick
        then goes without a token rather than GET it again every few seconds."""
        return self.secret_refused_at is not None and now - self.secret_refused_at < resync_seconds

    def forget_token(self) -> None:
        """A pod refused the token (rotated, or the Secret recreated): read it again."""
        self.admin_token, self.secret_seen_at = None, None

    def secret_check_due(self, now: float, resync_seconds: float) -> bool:
        """Whether this resync reads the Secret: SECRET_CHECK_EVERY_RESYNCS periods after
        it was last seen, or at once while its token is unknown."""
        if self.admin_token is None or self.secret_seen_at is None:
            return True
        # Half a period early: resyncs run at ticks, a hair either side of the moment.
        due_after = (SECRET_CHECK_EVERY_RESYNCS - 0.5) * resync_seconds
        return now - self.secret_seen_at >= due_after


def operator_context(memo: MutableMapping[str, Any]) -> OperatorContext:
    context = memo[CONTEXT_KEY]
    assert isinstance(context, OperatorContext), "startup sets the operator context"
    return context


def service_memo(memo: MutableMapping[str, Any]) -> ServiceMemo:
    """This service's memory, made on its first handler call."""
    found = memo.get(SERVICE_KEY)
    if not isinstance(found, ServiceMemo):
        found = memo[SERVICE_KEY] = ServiceMemo()
    return found
