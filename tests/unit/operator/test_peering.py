"""Peering: replicas of one Deployment must never tie on priority (kopf
pauses every operator sharing the highest one)."""

from fusebox_operator.__main__ import peering_priority
from fusebox_operator.settings import OperatorSettings


def test_replicas_with_the_same_settings_draw_distinct_priorities() -> None:
    settings = OperatorSettings.from_env({"FUSEBOX_OPERATOR_REPLICAS": "3"})
    drawn = {peering_priority(settings.peering_priority) for _ in range(50)}
    assert len(drawn) == 50
    assert all(priority > 0 for priority in drawn)


def test_an_explicit_priority_is_kept() -> None:
    settings = OperatorSettings.from_env({"FUSEBOX_PEERING_PRIORITY": "7"})
    assert peering_priority(settings.peering_priority) == 7
