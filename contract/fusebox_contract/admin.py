"""The admin API (port 8001, docs/server.md): how the operator acts on one server.

Why one module: the admin API crosses a process boundary, and while its paths
lived in the server's routes and again in the operator's actuator, with
bodies built as plain dicts and read back with string keys by the operator,
the bench and the tests, nothing but a test run noticed a key spelled two
ways. Here each path is one `AdminPath` member and each body one frozen
dataclass: `encode()` is the only writer and `parse(raw)` the only reader
of it, so `Body.parse(body.encode()) == body`. The server parses requests
and encodes results; the operator, the bench and the tests do the reverse.

Wire compatibility: `encode()` writes exactly the keys and values the server
and the operator exchanged before this module existed, in the same order
(`admitPercent` and `targetVariant` in camelCase, snake_case elsewhere;
optional request keys left out, not null), so a new operator still talks
to an old server and an old operator to a new one.
`tests/unit/contract/test_admin.py` pins a golden example of every body.

Parsing raises `AdminBodyError` (a ValueError) naming the field. Requests
are read strictly, with the messages the server has always answered: a key
outside the body's own is refused by name (a misspelt key would otherwise
get 200 and do nothing), as is a `variant` on an action that ignores it. A
result is read as an old or a new server writes it: keys this module does
not know are ignored, and in `ServerState` (a view for people and tests) a
missing key is None, as in the stats file; a key present with the wrong
type is an error wherever it is.

Stdlib only: the server, the sidecar and the operator all install this.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, ClassVar, Final, Self, TypeVar

from fusebox_contract.names import (
    ActionType,
    BreakerState,
    DegradationLevel,
    DegradationTier,
    Fault,
    Quantization,
    RequestOutcome,
    Variant,
)

MAX_ACTION_ID_CHARS: Final = 256
VARIANT_ACTIONS: Final = frozenset({ActionType.LOAD, ActionType.SWAP})
"""The action types a `variant` means something to; the others refuse one."""

_E = TypeVar("_E", bound=enum.Enum)


class AdminPath(enum.StrEnum):
    """Every route of the admin port; `method` is the one HTTP method it answers."""

    ACTIONS = "/admin/v1/actions"
    BREAKER = "/admin/v1/breaker"
    DEGRADATION = "/admin/v1/degradation"
    STATE = "/admin/v1/state"
    FAULTS = "/admin/v1/faults"

    @property
    def method(self) -> str:
        if self is AdminPath.ACTIONS:
            return "POST"
        if self is AdminPath.STATE:
            return "GET"
        return "PUT"


class AdminBodyError(ValueError):
    """A body that does not fit its class.

    `field` names the offending field (dotted inside a result, None for the
    body as a whole). `malformed` is True when a request field is missing or
    of the wrong JSON type (the server answers 422), False when its value is
    refused (400).
    """

    def __init__(self, field: str | None, message: str, *, malformed: bool = False) -> None:
        super().__init__(message)
        self.field = field
        self.malformed = malformed


def _frozen(mapping: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(mapping))


def _object(raw: object, where: str | None = None) -> Mapping[str, object]:
    if not isinstance(raw, dict):
        what = f"'{where}'" if where else "the body"
        raise AdminBodyError(where, f"{what} must be a JSON object", malformed=True)
    return raw


def _member(enum_type: type[_E], value: object, name: str) -> _E:
    """An enum member from its wire value, or an error naming the allowed values."""
    for member in enum_type:
        if member.value == value and isinstance(value, bool) == isinstance(member.value, bool):
            return member
    raise AdminBodyError(name, f"'{name}' must be one of {_allowed(enum_type)}")


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _known_keys(body: Mapping[str, object], known: tuple[str, ...]) -> None:
    """Refuse a key the body does not have: a misspelt or snake_case key must not
    get 200 and do nothing (a half-open breaker would keep admitting everything)."""
    for key in body:
        if key not in known:
            raise AdminBodyError(key, f"unknown key {key!r} (known: {', '.join(known)})")


def _allowed(enum_type: type[enum.Enum]) -> str:
    return ", ".join(str(m.value) for m in enum_type)


# ----- requests (the operator writes them, the server reads them) -----


@dataclass(frozen=True)
class ActionRequest:
    """`POST /admin/v1/actions`: run one action, once per id (a repeat replays)."""

    path: ClassVar[AdminPath] = AdminPath.ACTIONS
    keys: ClassVar[tuple[str, ...]] = ("id", "type", "variant")
    id: str
    type: ActionType
    variant: Variant | None = None  # load: which one; swap: to which (None: the other one)

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "type": self.type.value}
        if self.variant is not None:
            body["variant"] = self.variant.value
        return body

    @classmethod
    def parse(cls, raw: object) -> Self:
        body = _object(raw)
        _known_keys(body, cls.keys)
        action_id = body.get("id")
        if not isinstance(action_id, str) or not action_id:
            raise AdminBodyError("id", "'id' must be a non-empty string", malformed=True)
        if len(action_id) > MAX_ACTION_ID_CHARS:
            raise AdminBodyError("id", "'id' is too long")
        if not isinstance(body.get("type"), str):
            raise AdminBodyError("type", "'type' must be a string", malformed=True)
        action_type = _member(ActionType, body["type"], "type")
        variant = body.get("variant")
        if variant is not None and not isinstance(variant, str):
            raise AdminBodyError("variant", "'variant' must be a string", malformed=True)
        if variant is not None and action_type not in VARIANT_ACTIONS:
            # gc, empty_cache and unload ignore it, and it is part of the id's
            # idempotency key: accepting it would only make a repeat a 409.
            raise AdminBodyError("variant", "'variant' applies only to load and swap")
        return cls(
            action_id,
            action_type,
            None if variant is None else _member(Variant, variant, "variant"),
        )


@dataclass(frozen=True)
class BreakerRequest:
    """`PUT /admin/v1/breaker`: the state the operator decided; the answer is `ServerState`."""

    path: ClassVar[AdminPath] = AdminPath.BREAKER
    keys: ClassVar[tuple[str, ...]] = ("state", "admitPercent")
    state: BreakerState
    # What HALF_OPEN admits: 1..100 there (the CRD's bound), 0..100 with the other
    # states (the operator sends 0 with OPEN, 100 with CLOSED); None: keep (100 if closed).
    admit_percent: int | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"state": self.state.value}
        if self.admit_percent is not None:
            body["admitPercent"] = self.admit_percent
        return body

    @classmethod
    def parse(cls, raw: object) -> Self:
        body = _object(raw)
        _known_keys(body, cls.keys)
        if not isinstance(body.get("state"), str):
            message = f"'state' must be one of {_allowed(BreakerState)}"
            raise AdminBodyError("state", message, malformed=True)
        state = _member(BreakerState, body["state"], "state")
        percent = body.get("admitPercent")
        if percent is None:
            return cls(state)
        if isinstance(percent, bool) or not isinstance(percent, int):
            message = "'admitPercent' must be an integer 0..100"
            raise AdminBodyError("admitPercent", message, malformed=True)
        if not 0 <= percent <= 100:
            raise AdminBodyError("admitPercent", "'admitPercent' must be an integer 0..100")
        if percent == 0 and state is BreakerState.HALF_OPEN:
            # A half-open breaker that admits nothing never gets the requests it
            # needs to close, while the pod looks ready: that is OPEN, say so.
            raise AdminBodyError(
                "admitPercent", "'admitPercent' must be 1..100 when half_open (0: use open)"
            )
        return cls(state, percent)


def _tiers(raw: object) -> tuple[DegradationTier, ...] | None:
    """`tiers`: the service's degradation tiers (absent: every tier)."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
        raise AdminBodyError("tiers", "'tiers' must be a list of tier names", malformed=True)
    tiers = tuple(_member(DegradationTier, name, "tiers") for name in raw)
    if len(set(tiers)) != len(tiers):
        raise AdminBodyError("tiers", "'tiers' must not repeat a tier")
    return tiers


@dataclass(frozen=True)
class DegradationRequest:
    """`PUT /admin/v1/degradation`: the level, and the service's tiers (None: every tier)."""

    path: ClassVar[AdminPath] = AdminPath.DEGRADATION
    keys: ClassVar[tuple[str, ...]] = ("level", "tiers")
    level: DegradationLevel
    tiers: tuple[DegradationTier, ...] | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"level": int(self.level)}
        if self.tiers is not None:
            body["tiers"] = [tier.value for tier in self.tiers]
        return body

    @classmethod
    def parse(cls, raw: object) -> Self:
        body = _object(raw)
        _known_keys(body, cls.keys)
        level = body.get("level")
        if not _is_integer(level):
            top = int(max(DegradationLevel))
            raise AdminBodyError("level", f"'level' must be an integer 0..{top}", malformed=True)
        return cls(_member(DegradationLevel, level, "level"), _tiers(body.get("tiers")))


@dataclass(frozen=True)
class FaultsRequest:
    """`PUT /admin/v1/faults`: new values for faults armed at start (docs: faults.py)."""

    path: ClassVar[AdminPath] = AdminPath.FAULTS
    values: Mapping[Fault, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", _frozen(self.values))

    def encode(self) -> dict[str, Any]:
        return {fault.value: value for fault, value in self.values.items()}

    @classmethod
    def parse(cls, raw: object) -> Self:
        if not isinstance(raw, dict) or not raw:
            raise AdminBodyError(None, 'expected a JSON object such as {"leak": 64}')
        values: dict[Fault, int] = {}
        for name, value in raw.items():
            if name not in set(Fault):
                known = ", ".join(fault.value for fault in Fault)
                raise AdminBodyError(name, f"unknown fault {name!r} (known: {known})")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise AdminBodyError(name, f"fault {name!r} needs a non-negative integer")
            values[Fault(name)] = value
        return cls(values)


AdminRequest = ActionRequest | BreakerRequest | DegradationRequest | FaultsRequest
"""Every request body; `request.path` is where it goes (`GET` on the state path has none)."""


# ----- results (the server writes them, the operator, the bench and tests read them) -----


class _Fields:
    """Typed reads of one JSON object inside a result; an error names the dotted field.

    A read with `optional=True` gives None for a key that is missing or null;
    without it, a missing or null key is an error, so the value is never None
    (`_present` tells mypy so).
    """

    def __init__(self, raw: object, where: str = "") -> None:
        self.where = where
        self.body = _object(raw, where.rstrip(".") or None)

    def _error(self, key: str, expected: str) -> AdminBodyError:
        name = f"{self.where}{key}"
        return AdminBodyError(name, f"'{name}' must be {expected}")

    def _value(self, key: str, optional: bool, expected: str) -> object:
        value = self.body.get(key)
        if value is None and not optional:
            raise self._error(key, expected)
        return value

    def integer(self, key: str, *, optional: bool = False) -> int | None:
        value = self._value(key, optional, "an integer")
        if value is None or _is_integer(value):
            return value  # type: ignore[return-value]  # None or an int, just checked
        raise self._error(key, "an integer")

    def number(self, key: str, *, optional: bool = False) -> float | None:
        value = self._value(key, optional, "a number")
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise self._error(key, "a finite number")
        return value

    def boolean(self, key: str, *, optional: bool = False) -> bool | None:
        value = self._value(key, optional, "true or false")
        if value is None or isinstance(value, bool):
            return value
        raise self._error(key, "true or false")

    def text(self, key: str, *, optional: bool = False) -> str | None:
        value = self._value(key, optional, "a string")
        if value is None or isinstance(value, str):
            return value
        raise self._error(key, "a string")

    def member(self, key: str, enum_type: type[_E], *, optional: bool = False) -> _E | None:
        allowed = ", ".join(str(m.value) for m in enum_type)
        value = self._value(key, optional, f"one of {allowed}")
        return None if value is None else _member(enum_type, value, f"{self.where}{key}")

    def members(
        self, key: str, enum_type: type[_E], *, optional: bool = False
    ) -> tuple[_E, ...] | None:
        value = self._value(key, optional, "a list")
        if value is None:
            return None
        if not isinstance(value, list):
            raise self._error(key, "a list")
        return tuple(_member(enum_type, item, f"{self.where}{key}") for item in value)

    def counts(
        self, key: str, names: type[_E], *, optional: bool = False, nullable: bool = True
    ) -> dict[_E, int | None] | None:
        """An object of integers keyed by names (null ones too if `nullable`);
        names this module does not know are skipped (a newer server's)."""
        inner = self.nested(key, optional=optional)
        if inner is None:
            return None
        return {
            name: inner.integer(str(name.value), optional=nullable)
            for name in names
            if name.value in inner.body
        }

    def nested(self, key: str, *, optional: bool = False) -> _Fields | None:
        value = self._value(key, optional, "a JSON object")
        return None if value is None else _Fields(value, f"{self.where}{key}.")


_T = TypeVar("_T")


def _present(value: _T | None) -> _T:
    """A value read without `optional`: `_Fields` raised if it were None."""
    assert value is not None
    return value


@dataclass(frozen=True)
class MemoryFigures:
    """The server's memory as an action saw it, before or after (None: not measurable here)."""

    rss_bytes: int | None = None
    cgroup_memory_usage_bytes: int | None = None
    cuda_allocated_bytes: int | None = None
    cuda_reserved_bytes: int | None = None

    def encode(self) -> dict[str, Any]:
        return {
            "rss_bytes": self.rss_bytes,
            "cgroup_memory_usage_bytes": self.cgroup_memory_usage_bytes,
            "cuda_allocated_bytes": self.cuda_allocated_bytes,
            "cuda_reserved_bytes": self.cuda_reserved_bytes,
        }

    @classmethod
    def parse(cls, raw: object, where: str = "") -> Self:
        f = _Fields(raw, where)
        return cls(
            rss_bytes=f.integer("rss_bytes", optional=True),
            cgroup_memory_usage_bytes=f.integer("cgroup_memory_usage_bytes", optional=True),
            cuda_allocated_bytes=f.integer("cuda_allocated_bytes", optional=True),
            cuda_reserved_bytes=f.integer("cuda_reserved_bytes", optional=True),
        )


LeakFigures = Mapping[Fault, int | None]
"""Bytes each leak kind holds (None: the kind cannot run on this device)."""


@dataclass(frozen=True)
class SwapMemory:
    """A swap's CUDA allocator report (CUDA only): `torch.cuda.memory_summary` before and
    after, and each numeric `memory_stats` entry the swap changed (after minus before)."""

    summary_before: str
    summary_after: str | None
    stats_diff: Mapping[str, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "stats_diff", _frozen(self.stats_diff))


def _by_name(figures: Mapping[Fault, int | None]) -> dict[str, int | None]:
    return {fault.value: value for fault, value in figures.items()}


@dataclass(frozen=True)
class ActionResult:
    """The answer to `POST /admin/v1/actions`: what the action did to memory and model.

    `replayed` is True when the id had run before and this is its recorded
    result (the action happened once). `leaks_before`/`leaks_after` are there
    only when faults were armed at start, `swap_memory` only for a swap on CUDA.
    """

    id: str
    type: ActionType
    variant: Variant  # serving after the action
    previous_variant: Variant
    model_loaded: bool
    memory_before: MemoryFigures
    memory_after: MemoryFigures
    duration_seconds: float
    leaks_before: LeakFigures | None = None
    leaks_after: LeakFigures | None = None
    swap_memory: SwapMemory | None = None
    replayed: bool = False

    def __post_init__(self) -> None:
        for name in ("leaks_before", "leaks_after"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _frozen(getattr(self, name)))

    def replay(self) -> ActionResult:
        """This result as a repeat of its id gets it."""
        return replace(self, replayed=True)

    def describe(self, bytes_text: Callable[[float], str]) -> str:
        """Memory before -> after, the variant, a replay: one line for status and events."""
        before, after = self.memory_before, self.memory_after
        parts = []
        for label, was, now in (
            ("RSS", before.rss_bytes, after.rss_bytes),
            ("CUDA reserved", before.cuda_reserved_bytes, after.cuda_reserved_bytes),
        ):
            if was is not None and now is not None:
                freed = was - now
                parts.append(
                    f"{label} {bytes_text(was)} -> {bytes_text(now)} "
                    f"({'freed' if freed >= 0 else 'grew'} {bytes_text(abs(freed))})"
                )
        parts.append(f"variant {self.variant.value}")
        if self.replayed:
            parts.append("replayed")
        return "; ".join(parts)

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "type": self.type.value,
            "variant": self.variant.value,
            "previous_variant": self.previous_variant.value,
            "model_loaded": self.model_loaded,
            "memory_before": self.memory_before.encode(),
            "memory_after": self.memory_after.encode(),
            "duration_seconds": self.duration_seconds,
        }
        if self.leaks_before is not None:
            body["leaks_before"] = _by_name(self.leaks_before)
        if self.leaks_after is not None:
            body["leaks_after"] = _by_name(self.leaks_after)
        if self.swap_memory is not None:
            body["memory_summary_before"] = self.swap_memory.summary_before
            body["memory_summary_after"] = self.swap_memory.summary_after
            body["memory_stats_diff"] = dict(self.swap_memory.stats_diff)
        body["replayed"] = self.replayed
        return body

    @classmethod
    def parse(cls, raw: object) -> Self:
        f = _Fields(raw)
        swap_memory = None
        if f.text("memory_summary_before", optional=True) is not None:
            diff = _present(f.nested("memory_stats_diff"))
            swap_memory = SwapMemory(
                summary_before=_present(f.text("memory_summary_before")),
                summary_after=f.text("memory_summary_after", optional=True),
                stats_diff={key: _present(diff.integer(key)) for key in diff.body},
            )
        return cls(
            id=_present(f.text("id")),
            type=_present(f.member("type", ActionType)),
            variant=_present(f.member("variant", Variant)),
            previous_variant=_present(f.member("previous_variant", Variant)),
            model_loaded=_present(f.boolean("model_loaded")),
            memory_before=MemoryFigures.parse(f.body.get("memory_before"), "memory_before."),
            memory_after=MemoryFigures.parse(f.body.get("memory_after"), "memory_after."),
            duration_seconds=_present(f.number("duration_seconds")),
            leaks_before=f.counts("leaks_before", Fault, optional=True),
            leaks_after=f.counts("leaks_after", Fault, optional=True),
            swap_memory=swap_memory,
            replayed=_present(f.boolean("replayed")),
        )


@dataclass(frozen=True)
class DegradationResult:
    """The answer to `PUT /admin/v1/degradation` (HTTP 202 while `converging`)."""

    level: DegradationLevel
    tiers: tuple[DegradationTier, ...]  # the engaged ones, in level order
    variant: Variant  # serving now
    target_variant: Variant  # serving once the level's variant change has converged
    converging: bool

    def encode(self) -> dict[str, Any]:
        return {
            "level": int(self.level),
            "tiers": [tier.value for tier in self.tiers],
            "variant": self.variant.value,
            "targetVariant": self.target_variant.value,
            "converging": self.converging,
        }

    @classmethod
    def parse(cls, raw: object) -> Self:
        f = _Fields(raw)
        return cls(
            level=_present(f.member("level", DegradationLevel)),
            tiers=_present(f.members("tiers", DegradationTier)),
            variant=_present(f.member("variant", Variant)),
            target_variant=_present(f.member("targetVariant", Variant)),
            converging=_present(f.boolean("converging")),
        )


@dataclass(frozen=True)
class FaultsResult:
    """The answer to `PUT /admin/v1/faults`: every armed fault's value now."""

    values: Mapping[Fault, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", _frozen(self.values))

    def encode(self) -> dict[str, Any]:
        return {"faults": {fault.value: value for fault, value in self.values.items()}}

    @classmethod
    def parse(cls, raw: object) -> Self:
        counts = _present(_Fields(raw).counts("faults", Fault, nullable=False))
        return cls({fault: _present(value) for fault, value in counts.items()})


@dataclass(frozen=True)
class ErrorAnswer:
    """The body of a refused admin call (any status but 200 and 202): the OpenAI error
    object every port of the server answers with."""

    message: str
    type: str | None = None
    param: str | None = None
    code: str | None = None

    def encode(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    @classmethod
    def parse(cls, raw: object) -> Self:
        f = _Fields(_present(_Fields(raw).nested("error")).body, "error.")
        return cls(
            message=_present(f.text("message")),
            type=f.text("type", optional=True),
            param=f.text("param", optional=True),
            code=f.text("code", optional=True),
        )

    @classmethod
    def message_of(cls, raw: object) -> str:
        """The message of an answer that may not be ours at all (a proxy's): "" then."""
        try:
            return cls.parse(raw).message
        except AdminBodyError:
            return ""


@dataclass(frozen=True)
class BreakerView:
    state: BreakerState | None = None
    admit_percent: int | None = None


@dataclass(frozen=True)
class WorkerDebug:
    """What a leak test reads beside the state: batch rows and jobs the worker holds."""

    batch_rows: int | None = None
    inbox: int | None = None


@dataclass(frozen=True)
class ServerState:
    """`GET /admin/v1/state` (with `debug`), and the answer to `PUT /admin/v1/breaker`
    (without): what the server is doing, for people, tests and the bench.

    Every field may be None: a missing key reads as None, so a reader copes
    with a server older or newer than itself (the stats file is what the
    operator acts on). `encode` writes every key, null where None.
    """

    model_name: str | None = None
    model_revision: str | None = None
    variant: Variant | None = None
    target_variant: Variant | None = None
    converging: bool | None = None
    convergence_error: str | None = None
    model_loaded: bool | None = None
    ready: bool | None = None
    fallback_configured: bool | None = None
    fallback_unavailable_reason: str | None = None
    quantization: Quantization | None = None
    dtype: str | None = None
    parameter_bytes: int | None = None
    leaked_bytes: int | None = None
    model_loads: int | None = None  # completed loads since start, the first one included
    leaks: LeakFigures | None = None  # only when faults were armed at start
    breaker: BreakerView = BreakerView()
    degradation_level: DegradationLevel | None = None
    degradation_tiers: tuple[DegradationTier, ...] | None = None  # engaged, in level order
    memory_guard_active: bool | None = None
    requests: Mapping[RequestOutcome, int | None] = field(default_factory=dict)
    running: int | None = None
    queue_length: int | None = None
    worker_active: int | None = None
    torch_threads: int | None = None
    asyncio_tasks: int | None = None
    threads: int | None = None
    tokenizer_cache_entries: int | None = None
    faults: Mapping[Fault, int | None] | None = None  # only when faults were armed at start
    device: str | None = None
    pid: int | None = None
    debug: WorkerDebug | None = None  # GET state only

    def __post_init__(self) -> None:
        for name in ("leaks", "requests", "faults"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _frozen(getattr(self, name)))

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model_name": self.model_name,
            "model_revision": self.model_revision,
            "variant": _wire(self.variant),
            "target_variant": _wire(self.target_variant),
            "converging": self.converging,
            "convergence_error": self.convergence_error,
            "model_loaded": self.model_loaded,
            "ready": self.ready,
            "fallback_configured": self.fallback_configured,
            "fallback_unavailable_reason": self.fallback_unavailable_reason,
            "quantization": _wire(self.quantization),
            "dtype": self.dtype,
            "parameter_bytes": self.parameter_bytes,
            "leaked_bytes": self.leaked_bytes,
            "model_loads": self.model_loads,
            "leaks": None if self.leaks is None else _by_name(self.leaks),
            "breaker": {
                "state": _wire(self.breaker.state),
                "admit_percent": self.breaker.admit_percent,
            },
            "degradation_level": _wire(self.degradation_level),
            "degradation_tiers": None
            if self.degradation_tiers is None
            else [tier.value for tier in self.degradation_tiers],
            "memory_guard_active": self.memory_guard_active,
            "requests": {outcome.value: count for outcome, count in self.requests.items()},
            "running": self.running,
            "queue_length": self.queue_length,
            "worker_active": self.worker_active,
            "torch_threads": self.torch_threads,
            "asyncio_tasks": self.asyncio_tasks,
            "threads": self.threads,
            "tokenizer_cache_entries": self.tokenizer_cache_entries,
            "faults": None if self.faults is None else _by_name(self.faults),
            "device": self.device,
            "pid": self.pid,
        }
        if self.debug is not None:
            body["debug"] = {"batch_rows": self.debug.batch_rows, "inbox": self.debug.inbox}
        return body

    @classmethod
    def parse(cls, raw: object) -> Self:
        f = _Fields(raw)
        breaker = f.nested("breaker", optional=True)
        debug = f.nested("debug", optional=True)
        return cls(
            model_name=f.text("model_name", optional=True),
            model_revision=f.text("model_revision", optional=True),
            variant=f.member("variant", Variant, optional=True),
            target_variant=f.member("target_variant", Variant, optional=True),
            converging=f.boolean("converging", optional=True),
            convergence_error=f.text("convergence_error", optional=True),
            model_loaded=f.boolean("model_loaded", optional=True),
            ready=f.boolean("ready", optional=True),
            fallback_configured=f.boolean("fallback_configured", optional=True),
            fallback_unavailable_reason=f.text("fallback_unavailable_reason", optional=True),
            quantization=f.member("quantization", Quantization, optional=True),
            dtype=f.text("dtype", optional=True),
            parameter_bytes=f.integer("parameter_bytes", optional=True),
            leaked_bytes=f.integer("leaked_bytes", optional=True),
            model_loads=f.integer("model_loads", optional=True),
            leaks=f.counts("leaks", Fault, optional=True),
            breaker=BreakerView()
            if breaker is None
            else BreakerView(
                state=breaker.member("state", BreakerState, optional=True),
                admit_percent=breaker.integer("admit_percent", optional=True),
            ),
            degradation_level=f.member("degradation_level", DegradationLevel, optional=True),
            degradation_tiers=f.members("degradation_tiers", DegradationTier, optional=True),
            memory_guard_active=f.boolean("memory_guard_active", optional=True),
            requests=f.counts("requests", RequestOutcome, optional=True) or {},
            running=f.integer("running", optional=True),
            queue_length=f.integer("queue_length", optional=True),
            worker_active=f.integer("worker_active", optional=True),
            torch_threads=f.integer("torch_threads", optional=True),
            asyncio_tasks=f.integer("asyncio_tasks", optional=True),
            threads=f.integer("threads", optional=True),
            tokenizer_cache_entries=f.integer("tokenizer_cache_entries", optional=True),
            faults=f.counts("faults", Fault, optional=True),
            device=f.text("device", optional=True),
            pid=f.integer("pid", optional=True),
            debug=None
            if debug is None
            else WorkerDebug(
                batch_rows=debug.integer("batch_rows", optional=True),
                inbox=debug.integer("inbox", optional=True),
            ),
        )


def _wire(value: enum.Enum | None) -> object:
    return None if value is None else value.value
