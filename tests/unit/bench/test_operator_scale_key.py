"""The fleet bench's results keys: a status-only run lands under its own key."""

from bench.operator_scale_bench import results_key


def test_a_full_run_keeps_the_fleet_keys() -> None:
    assert results_key(False, False, 0.0, "") == "fleet"
    assert results_key(True, False, 0.0, "_s41") == "fleet_quick_s41"
    assert results_key(False, False, 0.5, "_x") == "fleet_hung_x"


def test_a_status_only_run_never_overwrites_a_fleet_key() -> None:
    assert results_key(False, True, 0.0, "_500_s42") == "status_500_s42"
    assert results_key(True, True, 0.0, "") == "status_quick"
