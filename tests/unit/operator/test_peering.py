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


def test_the_peering_lifetime_reaches_kopf_and_a_short_one_is_refused() -> None:
    import kopf
    import pytest

    from fusebox_operator.handlers import configure

    ours = OperatorSettings.from_env(
        {"FUSEBOX_OPERATOR_REPLICAS": "2", "FUSEBOX_PEERING_LIFETIME_SECONDS": "12"}
    )
    settings = kopf.OperatorSettings()
    configure(settings, ours)
    assert settings.peering.lifetime == 12
    assert OperatorSettings.from_env({}).peering_lifetime_seconds == 15
    with pytest.raises(ValueError, match="FUSEBOX_PEERING_LIFETIME_SECONDS=5 must be at least 10"):
        OperatorSettings.from_env({"FUSEBOX_PEERING_LIFETIME_SECONDS": "5"})


def test_the_replica_names_itself_by_its_pod() -> None:
    assert OperatorSettings.from_env({"POD_ID": "fusebox-operator-7d-x2"}).pod_name == (
        "fusebox-operator-7d-x2"
    )
    assert OperatorSettings.from_env({}).pod_name  # the host's name outside a pod
