"""What a spec edit does to the running pods, said once in a SpecApplied event.

Why: on a GPU service an edit that rolls the pods costs a model load per pod,
while another reaches the running servers live (the ConfigMap) or changes
only the operator's own decisions. A platform engineer needs to know which
before it happens, and `kubectl describe` should say which it was. The answer
is computed from the children the operator renders for the old and the new
spec, so it is what is applied, not a hand-kept list of fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fusebox_contract.names import ConditionType
from fusebox_operator.manifests import Manifest
from fusebox_operator.spec import InferenceServiceSpec, SpecError, parse_spec

SHOWN_CHANGES = 4
"""How many changed parts of the pod template the message names before "and N more"."""
ENV_ENTRY = re.compile(
    r"spec\.(?:init)?[cC]ontainers\[(?P<container>[^\]]+)\]\.env\[(?P<variable>[^\]]+)\]"
)
CONTAINER_ENTRY = re.compile(
    r"spec\.(?:init)?[cC]ontainers\[(?P<container>[^\]]+)\]\.?(?P<rest>.*)"
)


@dataclass(frozen=True)
class EditEffect:
    """The difference an edit makes to the rendered children."""

    pod_template: tuple[str, ...] = ()  # what changed in the pods: they roll, one at a time
    live_files: tuple[str, ...] = ()  # ConfigMap keys: the running servers reread them
    replicas: tuple[int | None, int | None] | None = None  # (before, after) when it changed
    other_children: tuple[str, ...] = ()  # Service, PDB, NetworkPolicy, claim template
    # spec.replicas edited while spec.autoscaling owns the count: (the edit, the count kept)
    replicas_not_applied: tuple[int, int] | None = None

    def message(self, generation: int) -> str:
        parts = []
        if self.pod_template:
            shown = ", ".join(self.pod_template[:SHOWN_CHANGES])
            more = len(self.pod_template) - SHOWN_CHANGES
            parts.append(
                f"rolls the pods one at a time: {shown}{f' and {more} more' if more > 0 else ''}"
            )
        if self.live_files:
            restart = "" if self.pod_template else ", no restart"
            parts.append(
                f"reaches the running servers through the ConfigMap{restart}: "
                f"{', '.join(self.live_files)}"
            )
        if self.replicas is not None:
            before, after = self.replicas
            parts.append(f"replicas {before} -> {after}")
        if self.other_children:
            parts.append(f"updates the {', '.join(self.other_children)}")
        if self.replicas_not_applied is not None:
            asked, kept = self.replicas_not_applied
            parts.append(
                f"spec.replicas {asked} not applied: spec.autoscaling owns the count "
                f"(now {kept}); replicas sets only where a new service starts"
            )
        if not parts:
            parts.append("changes only the operator's own decisions, no pod or child changes")
        return f"generation {generation}: " + "; ".join(parts)


def _by_kind(children: Sequence[Manifest]) -> dict[str, Manifest]:
    return {str(child["kind"]): child for child in children}


def _keyed(items: Sequence[Any]) -> dict[str, Any] | None:
    """A list of named entries (containers, env, volumes, ports) keyed by name, else None."""
    if items and all(isinstance(item, Mapping) and "name" in item for item in items):
        return {str(item["name"]): item for item in items}
    return None


def changed_paths(before: Any, after: Any, path: str = "") -> Iterator[str]:
    """Dotted paths where two rendered objects differ; named list entries matched by name."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        for key in sorted(set(before) | set(after), key=str):
            yield from changed_paths(before.get(key), after.get(key), f"{path}.{key}")
        return
    if isinstance(before, list) and isinstance(after, list):
        old, new = _keyed(before), _keyed(after)
        if old is not None and new is not None:
            for name in sorted(set(old) | set(new)):
                yield from changed_paths(old.get(name), new.get(name), f"{path}[{name}]")
            return
    if before != after:
        yield path.lstrip(".")


def _shown(path: str) -> str:
    """A template path in the words of the message: `server env FUSEBOX_DTYPE`."""
    env = ENV_ENTRY.match(path)
    if env is not None:
        return f"{env['container']} env {env['variable']}"
    container = CONTAINER_ENTRY.match(path)
    if container is not None:
        return f"{container['container']} {container['rest']}"
    return path.removeprefix("spec.")


def _template_changes(before: Manifest | None, after: Manifest | None) -> tuple[str, ...]:
    """What changed in the Deployment's pod template, env entries named by variable."""
    old = ((before or {}).get("spec") or {}).get("template") or {}
    new = ((after or {}).get("spec") or {}).get("template") or {}
    named: list[str] = []
    for path in changed_paths(old, new):
        shown = _shown(path)
        if shown not in named:
            named.append(shown)
    return tuple(named)


def edit_effect(before: Sequence[Manifest], after: Sequence[Manifest]) -> EditEffect:
    """How the children rendered for the new spec differ from those of the old one."""
    old, new = _by_kind(before), _by_kind(after)
    old_deployment, new_deployment = old.get("Deployment"), new.get("Deployment")
    old_files = (old.get("ConfigMap") or {}).get("data") or {}
    new_files = (new.get("ConfigMap") or {}).get("data") or {}
    old_count = ((old_deployment or {}).get("spec") or {}).get("replicas")
    new_count = ((new_deployment or {}).get("spec") or {}).get("replicas")
    others = sorted(
        kind
        for kind in (set(old) | set(new)) - {"Deployment", "ConfigMap", "Secret"}
        if old.get(kind) != new.get(kind)
    )
    return EditEffect(
        pod_template=_template_changes(old_deployment, new_deployment),
        live_files=tuple(
            sorted(
                key
                for key in set(old_files) | set(new_files)
                if old_files.get(key) != new_files.get(key)
            )
        ),
        replicas=(old_count, new_count) if old_count != new_count else None,
        other_children=tuple(others),
    )


def edit_base(old: Any, status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The spec an edit is compared with: kopf's `old` (the spec it last handled), or,
    while InvalidSpec is True (the last edit was refused), the one whose children run
    (`status.appliedSpec`); None when this is no edit (a create or resume: no `old`).

    Why the applied one then: kopf records a spec it handled even when the reconcile
    refused it, so after a refused edit `old` is that refused spec, nothing ran from
    it, and the first accepted edit after it said nothing (no SpecApplied). Not the
    applied one always: a generation handled again (a retry, a replica taking over)
    finds its own spec applied already and would tell its edit a second time.
    """
    if not isinstance(old, Mapping):
        return None
    refused = any(
        c.get("type") == ConditionType.INVALID_SPEC and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    text = status.get("appliedSpec")
    if not refused or not isinstance(text, str):
        return old
    try:
        applied = json.loads(text)
    except ValueError:
        return old
    return applied if isinstance(applied, Mapping) else old


def edit_message(
    old_spec: Mapping[str, Any],
    new_spec: InferenceServiceSpec,
    new_children: Sequence[Manifest],
    render: Callable[[InferenceServiceSpec], Sequence[Manifest]],
    generation: int,
) -> str | None:
    """The SpecApplied message for an edit from `old_spec`; None when the old spec was invalid
    (then nothing was running from it to compare with).

    `kubectl scale` on an autoscaled service edits spec.replicas, which the
    autoscaler's count overrides: the message says so rather than nothing.
    """
    try:
        old_parsed = parse_spec(old_spec)
        old_children = render(old_parsed)
    except SpecError:
        return None
    if old_parsed == new_spec:
        return None  # the same spec handled again (a retry, a replica taking over): told
    effect = edit_effect(old_children, new_children)
    if new_spec.autoscaling is not None and new_spec.replicas != old_parsed.replicas:
        kept = _deployment_replicas(new_children)
        if kept is not None:
            effect = replace(effect, replicas_not_applied=(new_spec.replicas, kept))
    return effect.message(generation)


def _deployment_replicas(children: Sequence[Manifest]) -> int | None:
    count = ((_by_kind(children).get("Deployment") or {}).get("spec") or {}).get("replicas")
    return int(count) if count is not None else None
