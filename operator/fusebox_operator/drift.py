"""Does a child in the cluster still say what the operator rendered? (pure)

Why: a child edited or deleted by hand (`kubectl edit deployment`, `kubectl
delete networkpolicy`) must be put back, and put back only when it differs:
the operator's periodic resync compares every child and writes nothing when
nothing moved, so an untouched service costs reads only and posts no event.

The comparison is containment, the way the apiserver treats an object it
was given: every field the operator set must be there with its value, and
fields the apiserver or other controllers add (defaults, a clusterIP, a
`kubectl` annotation, a status) are not drift. The apiserver's own
rewrites are not drift either: an empty value it omits (`value: ""`,
`readOnly: false`, `[]`) and a quantity it writes in canonical form
(`0.5` as `500m`, `2147483648` as `2Gi`).

Containment alone would let a hand edit *add* what decides what the pods may
do (`hostNetwork`, `privileged`, `capabilities.add`, a `command`, an
`envFrom`) or where they may reach (an `egress` rule, `externalIPs`), since
Fusebox renders those absent. Under `OWNED_PATHS` the comparison is
equality: a key the operator did not render is drift unless it is empty or
a value the apiserver fills in itself (`DEFAULTED`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Context, Decimal, InvalidOperation
from typing import Any

EMPTY: tuple[Any, ...] = (None, "", 0)  # scalars the apiserver omits (False is 0)
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_FACTORS: dict[str | None, Decimal] = {
    None: Decimal(1),
    # Below a milli the apiserver writes micro and nano (`1.5m` is read back `1500u`).
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("0.001"),
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}
_NANO = Decimal("1e-9")
NAMED_PATHS = 3  # an event names this many drifted fields, then counts the rest

_POD = "spec.template.spec"
OWNED_PATHS: frozenset[str] = frozenset(
    {
        # The pod template's keys that decide what the pods may do.
        *(f"{_POD}.{key}" for key in ("hostNetwork", "hostPID", "hostIPC", "hostUsers")),
        f"{_POD}.hostAliases",
        f"{_POD}.securityContext",
        f"{_POD}.volumes",
        *(
            f"{_POD}.{containers}[*].{key}"
            for containers in ("containers", "initContainers")
            for key in ("securityContext", "command", "args", "envFrom", "env")
        ),
        # The NetworkPolicy's rules (no other child has these under spec).
        "spec.podSelector",
        "spec.policyTypes",
        "spec.ingress",
        "spec.egress",
        # The Service's reach beyond the cluster.
        "spec.externalIPs",
    }
)
"""Paths (list indices as `[*]`) compared for equality, not containment."""
DEFAULTED: frozenset[tuple[str, Any]] = frozenset(
    {
        ("defaultMode", 420),  # configMap, secret, projected and downwardAPI volumes
        ("apiVersion", "v1"),  # fieldRef
        ("expirationSeconds", 3600),  # a projected serviceAccountToken
        ("divisor", "0"),  # resourceFieldRef
        ("protocol", "TCP"),  # ports
        ("procMount", "Default"),  # a container's securityContext, where the gate defaults it
    }
)
"""What the apiserver writes under an owned path when the operator rendered nothing."""
_INDEX = re.compile(r"\[[0-9]+\]")


@dataclass(frozen=True)
class Applied:
    """What one apply did to one child: created, updated, scaled or unchanged."""

    manifest: Mapping[str, Any]
    outcome: str
    drifted: Sequence[str] = ()

    @property
    def wrote(self) -> bool:
        return self.outcome != "unchanged"

    @property
    def child(self) -> str:
        return f"{self.manifest['kind']} {self.manifest['metadata']['name']}"


def restored_message(applied: Applied, service: str) -> str:
    """What a resync that had to write says: the child, what had moved, what it did."""
    if applied.outcome == "created":
        return f"{applied.child} was missing (deleted outside Fusebox): recreated"
    if applied.outcome == "scaled":
        replicas = applied.manifest["spec"]["replicas"]
        return (
            f"{applied.child} was scaled outside Fusebox: spec.replicas back to {replicas}; "
            f"scale the service instead (kubectl scale fis {service} --replicas N)"
        )
    named = ", ".join(applied.drifted[:NAMED_PATHS])
    more = len(applied.drifted) - NAMED_PATHS
    return (
        f"{applied.child} was edited outside Fusebox ({named}"
        f"{f' and {more} more' if more > 0 else ''}): restored to the spec"
    )


def secret_restored_message(secret: Mapping[str, Any], service: str, same_token: bool) -> str:
    """A recreated admin Secret: whether the pods' token survived the deletion."""
    recreated = restored_message(Applied(secret, "created"), service)
    if same_token:
        return f"{recreated} with the token the pods hold"
    return (
        f"{recreated} with a new token; the pods read theirs at start and refuse the "
        f"operator's admin calls until they restart (kubectl rollout restart deployment {service})"
    )


def differences(wanted: Any, current: Any, path: str = "", owned: bool = False) -> list[str]:
    """The paths where `current` does not carry what `wanted` says, or (under an owned
    path) carries more than it; [] when it does."""
    if isinstance(wanted, Mapping):
        if not isinstance(current, Mapping):
            return [] if _is_empty(wanted) and current is None else [path or "."]
        found: list[str] = []
        for key, value in wanted.items():
            child = f"{path}.{key}" if path else str(key)
            if key not in current:
                if not _is_empty(value):
                    found.append(child)
                continue
            found.extend(differences(value, current[key], child, owned or _owned(child)))
        for key, value in current.items():
            child = f"{path}.{key}" if path else str(key)
            if key not in wanted and (owned or _owned(child)) and not _unset(key, value):
                found.append(child)
        return found
    if isinstance(wanted, Sequence) and not isinstance(wanted, str):
        if current is None and not wanted:
            return []
        if not isinstance(current, Sequence) or isinstance(current, str):
            return [path]
        if len(wanted) != len(current):
            return [path]
        found = []
        for index, (value, there) in enumerate(zip(wanted, current, strict=True)):
            found.extend(differences(value, there, f"{path}[{index}]", owned))
        return found
    if isinstance(wanted, bool) != isinstance(current, bool):
        return [] if _is_empty(wanted) and current is None else [path]
    if wanted == current or (_is_empty(wanted) and current is None):
        return []
    return [] if _same_quantity(wanted, current) else [path]


def _owned(path: str) -> bool:
    return _INDEX.sub("[*]", path) in OWNED_PATHS


def _unset(key: Any, value: Any) -> bool:
    """An added key under an owned path that sets nothing: empty, or the apiserver's own
    default. Stricter than `_is_empty`: `runAsUser: 0` or `egress: [{}]` sets a lot."""
    if value is None or value is False or value == "":
        return True
    if isinstance(value, Mapping):
        return all(_unset(k, v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return not value
    try:
        return (key, value) in DEFAULTED and not isinstance(value, bool)
    except TypeError:  # an unhashable value
        return False


def _is_empty(value: Any) -> bool:
    if isinstance(value, bool):
        return value is False
    if isinstance(value, Mapping | list | tuple):
        return all(_is_empty(v) for v in (value.values() if isinstance(value, Mapping) else value))
    return value in EMPTY


def _same_quantity(wanted: Any, current: Any) -> bool:
    """`500m` and `0.5`, `2Gi` and `2147483648`: one quantity in two spellings. The
    apiserver keeps nothing finer than a nano and rounds up (`0.0000000001` is `1n`)."""
    first, second = _quantity(wanted), _quantity(current)
    if first is None or second is None:
        return False
    try:
        return _nanos(first) == _nanos(second)
    except InvalidOperation:  # more digits than a quantity holds: compare as written
        return first == second


def _nanos(value: Decimal) -> Decimal:
    return value.quantize(_NANO, ROUND_CEILING, Context(prec=64))


def _quantity(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    match = _QUANTITY.fullmatch(str(value))
    if match is None:
        return None
    number: Decimal = Decimal(match.group(1)) * _FACTORS[match.group(2)]  # the regex's digits
    return number
