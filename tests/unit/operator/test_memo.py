"""memo: each service's schedule and memory between handler calls, typed."""

from __future__ import annotations

import copy
import json

import kopf
import pytest

from fusebox_operator import memo as memo_module
from fusebox_operator.memo import (
    CONTEXT_KEY,
    OperatorContext,
    ServiceMemo,
    operator_context,
    service_memo,
)
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.spec import InferenceServiceSpec

T0 = 1_800_000_000.0


def test_a_service_scrapes_once_per_interval_whatever_the_timer_rate() -> None:
    memo = ServiceMemo()
    assert memo.scrape_due(T0)
    memo.scraped(T0, 5.0)
    assert not memo.scrape_due(T0 + 1) and not memo.scrape_due(T0 + 4.9)
    assert memo.scrape_due(T0 + 5)


def test_the_first_resync_is_one_period_after_the_service_is_first_seen() -> None:
    memo = ServiceMemo()
    assert not memo.resync_due(T0, 60)  # a reconcile just applied the children
    assert not memo.resync_due(T0 + 59, 60)
    assert memo.resync_due(T0 + 60, 60)
    assert not memo.resync_due(T0 + 61, 60)  # the next one a period later
    assert memo.resync_due(T0 + 120, 60)


def test_services_share_the_operator_context_and_keep_their_own_memory() -> None:
    # kopf gives each object a shallow copy of the operator-level memo.
    operator_memo = kopf.Memo()
    context = OperatorContext(OperatorSettings.from_env({}), None, None, None)  # type: ignore[arg-type]
    operator_memo[CONTEXT_KEY] = context
    chat, code = copy.copy(operator_memo), copy.copy(operator_memo)
    service_memo(chat).admin_token = "chat's"
    assert service_memo(code).admin_token is None
    assert service_memo(chat) is service_memo(chat)  # made once, then kept
    assert operator_context(chat) is operator_context(code) is context


def test_the_applied_spec_record_is_parsed_once_until_it_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parses: list[str] = []
    real = memo_module.parse_applied

    def counted(text: str) -> InferenceServiceSpec:
        parses.append(text)
        return real(text)

    monkeypatch.setattr(memo_module, "parse_applied", counted)
    memo = ServiceMemo()
    first = json.dumps({"model": {"name": "chat", "source": "pvc://models/chat"}})
    edited = json.dumps({"model": {"name": "chat2", "source": "pvc://models/chat"}})

    specs = [memo.parse_applied(text) for text in (first, first, edited, edited)]

    assert parses == [first, edited]
    assert [s.model.name for s in specs] == ["chat", "chat", "chat2", "chat2"]
    assert specs[0] is specs[1]
