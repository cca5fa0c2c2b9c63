"""What an edit does to the pods, from the children the operator really renders.

The SpecApplied event's words come from `edits.edit_effect` over the output
of `manifests.build_children` for the old and the new spec, so these tests
render real specs and read the message a user sees in `kubectl describe`.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fusebox_operator.edits import SHOWN_CHANGES, changed_paths, edit_effect, edit_message
from fusebox_operator.manifests import Manifest, build_children
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import size_memory
from fusebox_operator.spec import InferenceServiceSpec, parse_spec

BASE: dict[str, Any] = {
    "model": {"name": "chat", "source": "pvc://models/tiny"},
    "fallback": {},
    "gpu": {"count": 1},
}


def render(spec: InferenceServiceSpec) -> list[Manifest]:
    return build_children(
        spec, "svc", "ns", size_memory(spec, [24576]), OperatorSettings(), "a-token"
    )


def edited(path: str, value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    node = raw
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return raw


def message_for(path: str, value: Any) -> str:
    new = parse_spec(edited(path, value))
    message = edit_message(BASE, new, render(new), render, 7)
    assert message is not None
    return message


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("server.maxConcurrency", 3, "server env FUSEBOX_MAX_CONCURRENCY"),
        ("server.env", [{"name": "TEAM_FLAG", "value": "1"}], "server env TEAM_FLAG"),
        ("memory.headroomRatio", 1.5, "server resources.limits.memory"),
        ("telemetry.wedgeAfterSeconds", 90, "server livenessProbe.failureThreshold"),
        ("model.revision", "v2", "metadata.annotations.fusebox.dev/model-revision"),
    ],
)
def test_an_edit_that_changes_the_pod_template_says_it_rolls_the_pods_and_names_what(
    path: str, value: Any, named: str
) -> None:
    message = message_for(path, value)
    assert message.startswith("generation 7: rolls the pods one at a time: "), message
    assert named in message
    assert "no restart" not in message


@pytest.mark.parametrize(
    ("path", "value", "file"),
    [
        ("degradation.cannedAnswers", {"hi": "busy, try again"}, "canned-answers.json"),
        ("server.templates", ["You are a helpful assistant."], "templates.json"),
        ("breaker.quality.blockedTerms", ["secret"], "quality.json"),
        ("breaker.quality.sampleRate", 0.2, "quality.json"),
        ("breaker.quality.maxOutputInputRatio", 20, "quality.json"),
    ],
)
def test_an_edit_carried_by_the_config_map_reaches_the_servers_without_a_restart(
    path: str, value: Any, file: str
) -> None:
    assert message_for(path, value) == (
        f"generation 7: reaches the running servers through the ConfigMap, no restart: {file}"
    )


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("breaker.latency.p99ThresholdMillis", 900),
        ("breaker.resource.cooldownSeconds", 10),
        ("degradation.tiers", ["no-streaming"]),
        ("degradation.coolOffSeconds", 60),
    ],
)
def test_an_edit_of_the_operator_s_own_policy_touches_no_pod(path: str, value: Any) -> None:
    assert message_for(path, value) == (
        "generation 7: changes only the operator's own decisions, no pod or child changes"
    )


def test_a_replica_edit_says_the_count_and_rolls_nothing() -> None:
    assert message_for("replicas", 3) == "generation 7: replicas 1 -> 3"


def test_a_replica_edit_on_an_autoscaled_service_says_the_autoscaler_keeps_its_count() -> None:
    autoscaled = {**BASE, "replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}

    def render_at(count: int) -> Any:
        # The autoscaler's count, as reconcile passes it from status.
        return lambda spec: build_children(
            spec, "svc", "ns", size_memory(spec, [24576]), OperatorSettings(), "t", replicas=count
        )

    scaled = parse_spec({**autoscaled, "replicas": 4})
    message = edit_message(autoscaled, scaled, render_at(3)(scaled), render_at(3), 5)
    assert message == (
        "generation 5: spec.replicas 4 not applied: spec.autoscaling owns the count (now 3);"
        " replicas sets only where a new service starts"
    )


def test_a_long_list_of_template_changes_is_cut_with_a_count() -> None:
    raw = edited("server.env", [{"name": f"VAR_{i}", "value": "1"} for i in range(6)])
    effect = edit_effect(render(parse_spec(BASE)), render(parse_spec(raw)))
    assert len(effect.pod_template) == 6
    message = effect.message(2)
    assert message.endswith(f"and {6 - SHOWN_CHANGES} more"), message
    assert "VAR_0" in message and "VAR_5" not in message


def test_an_edit_from_an_invalid_spec_has_nothing_to_compare_with() -> None:
    invalid = edited("memory.limit", "1Mi")  # below VRAM: the operator refuses it
    base = parse_spec(BASE)
    assert edit_message(invalid, base, render(base), render, 3) is None


def test_named_list_entries_are_matched_by_name_not_position() -> None:
    before = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
    after = {"env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]}
    assert list(changed_paths(before, after)) == []
    after["env"][0]["value"] = "3"
    assert list(changed_paths(before, after)) == ["env[B].value"]
