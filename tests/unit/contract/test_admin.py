"""The admin API's bodies (`fusebox_contract.admin`): golden wire text, round trips, errors.

The golden examples are the bytes the server and the operator exchanged before the
bodies were typed (the keys, values and order the dict literals in `runtime.py`,
`admin.py` and `actuator.py` wrote), so a new operator still talks to an old server
and the other way round.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest

from fusebox_contract.admin import (
    ActionRequest,
    ActionResult,
    AdminBodyError,
    AdminPath,
    BreakerRequest,
    BreakerView,
    DegradationRequest,
    DegradationResult,
    ErrorAnswer,
    FaultsRequest,
    FaultsResult,
    MemoryFigures,
    ServerState,
    SwapMemory,
    WorkerDebug,
)
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
from fusebox_server.errors import FallbackUnavailable
from fusebox_server.http.rendering import error_body

MIB = 1024 * 1024


def wire(body: dict[str, Any]) -> str:
    return json.dumps(body, separators=(",", ":"))


def test_every_request_knows_its_path() -> None:
    assert ActionRequest("a", ActionType.GC).path is AdminPath.ACTIONS
    assert BreakerRequest(BreakerState.OPEN).path is AdminPath.BREAKER
    assert DegradationRequest(DegradationLevel.NONE).path is AdminPath.DEGRADATION
    assert FaultsRequest({Fault.LEAK: 0}).path is AdminPath.FAULTS


def test_every_path_has_its_one_method() -> None:
    assert {(path.method, path.value) for path in AdminPath} == {
        ("POST", "/admin/v1/actions"),
        ("PUT", "/admin/v1/breaker"),
        ("PUT", "/admin/v1/degradation"),
        ("GET", "/admin/v1/state"),
        ("PUT", "/admin/v1/faults"),
    }


# ----- golden wire text: what the old dict literals wrote -----

REQUESTS = [
    pytest.param(
        ActionRequest("tick-7-gc", ActionType.GC), '{"id":"tick-7-gc","type":"gc"}', id="gc"
    ),
    pytest.param(
        ActionRequest("a-load", ActionType.LOAD, Variant.PRIMARY),
        '{"id":"a-load","type":"load","variant":"primary"}',
        id="load",
    ),
    pytest.param(
        BreakerRequest(BreakerState.HALF_OPEN, 20),
        '{"state":"half_open","admitPercent":20}',
        id="breaker",
    ),
    pytest.param(BreakerRequest(BreakerState.OPEN), '{"state":"open"}', id="breaker-no-percent"),
    pytest.param(
        DegradationRequest(
            DegradationLevel.CANNED_ANSWERS,
            (DegradationTier.NO_STREAMING, DegradationTier.CANNED_ANSWERS),
        ),
        '{"level":3,"tiers":["no-streaming","canned-answers"]}',
        id="degradation",
    ),
    pytest.param(
        DegradationRequest(DegradationLevel.NONE), '{"level":0}', id="degradation-no-tiers"
    ),
    pytest.param(
        FaultsRequest({Fault.LEAK: 64, Fault.WEDGE: 1}), '{"leak":64,"wedge":1}', id="faults"
    ),
]

BEFORE = MemoryFigures(
    rss_bytes=900 * MIB,
    cgroup_memory_usage_bytes=1000 * MIB,
    cuda_allocated_bytes=None,
    cuda_reserved_bytes=None,
)
AFTER = MemoryFigures(rss_bytes=600 * MIB, cgroup_memory_usage_bytes=700 * MIB)
MEMORY_TEXT = {
    "before": '{"rss_bytes":943718400,"cgroup_memory_usage_bytes":1048576000,'
    '"cuda_allocated_bytes":null,"cuda_reserved_bytes":null}',
    "after": '{"rss_bytes":629145600,"cgroup_memory_usage_bytes":734003200,'
    '"cuda_allocated_bytes":null,"cuda_reserved_bytes":null}',
}
UNLOAD = ActionResult(
    id="p-unload",
    type=ActionType.UNLOAD,
    variant=Variant.PRIMARY,
    previous_variant=Variant.PRIMARY,
    model_loaded=False,
    memory_before=BEFORE,
    memory_after=AFTER,
    duration_seconds=0.4321,
)
LEAKS_BEFORE = {
    Fault.LEAK_CYCLES: 128 * MIB,
    Fault.LEAK_ALLOCATOR: None,
    Fault.LEAK_PROMPT_CACHE: 0,
    Fault.LEAK_PINNED: None,
}
STATE = ServerState(
    model_name="tiny",
    model_revision="main",
    variant=Variant.FALLBACK,
    target_variant=Variant.FALLBACK,
    converging=False,
    convergence_error=None,
    model_loaded=True,
    ready=True,
    fallback_configured=True,
    fallback_unavailable_reason=None,
    quantization=Quantization.INT8,
    dtype="float32",
    parameter_bytes=1234,
    leaked_bytes=0,
    model_loads=2,
    leaks=None,
    breaker=BreakerView(BreakerState.HALF_OPEN, 20),
    degradation_level=DegradationLevel.FALLBACK_MODEL,
    degradation_tiers=(DegradationTier.NO_STREAMING, DegradationTier.FALLBACK_MODEL),
    memory_guard_active=False,
    requests={RequestOutcome.SUCCEEDED: 5, RequestOutcome.INVALID: 1},
    running=0,
    queue_length=0,
    worker_active=0,
    torch_threads=2,
    asyncio_tasks=7,
    threads=9,
    tokenizer_cache_entries=3,
    faults={Fault.LEAK: 0},
    device="cpu",
    pid=4242,
)
STATE_TEXT = (
    '{"model_name":"tiny","model_revision":"main","variant":"fallback",'
    '"target_variant":"fallback","converging":false,"convergence_error":null,'
    '"model_loaded":true,"ready":true,"fallback_configured":true,'
    '"fallback_unavailable_reason":null,"quantization":"int8","dtype":"float32",'
    '"parameter_bytes":1234,"leaked_bytes":0,"model_loads":2,"leaks":null,'
    '"breaker":{"state":"half_open","admit_percent":20},"degradation_level":2,'
    '"degradation_tiers":["no-streaming","fallback-model"],"memory_guard_active":false,'
    '"requests":{"succeeded":5,"invalid":1},"running":0,"queue_length":0,'
    '"worker_active":0,"torch_threads":2,"asyncio_tasks":7,"threads":9,'
    '"tokenizer_cache_entries":3,"faults":{"leak":0},"device":"cpu","pid":4242}'
)

RESULTS = [
    pytest.param(
        UNLOAD,
        '{"id":"p-unload","type":"unload","variant":"primary","previous_variant":"primary",'
        f'"model_loaded":false,"memory_before":{MEMORY_TEXT["before"]},'
        f'"memory_after":{MEMORY_TEXT["after"]},"duration_seconds":0.4321,"replayed":false}}',
        id="action",
    ),
    pytest.param(
        ActionResult(
            id="g",
            type=ActionType.GC,
            variant=Variant.PRIMARY,
            previous_variant=Variant.PRIMARY,
            model_loaded=True,
            memory_before=BEFORE,
            memory_after=AFTER,
            duration_seconds=0.01,
            leaks_before=LEAKS_BEFORE,
            leaks_after={**LEAKS_BEFORE, Fault.LEAK_CYCLES: 0},
            replayed=True,
        ),
        '{"id":"g","type":"gc","variant":"primary","previous_variant":"primary",'
        f'"model_loaded":true,"memory_before":{MEMORY_TEXT["before"]},'
        f'"memory_after":{MEMORY_TEXT["after"]},"duration_seconds":0.01,'
        '"leaks_before":{"leak_cycles":134217728,"leak_allocator":null,'
        '"leak_prompt_cache":0,"leak_pinned":null},'
        '"leaks_after":{"leak_cycles":0,"leak_allocator":null,'
        '"leak_prompt_cache":0,"leak_pinned":null},"replayed":true}',
        id="action-with-leaks",
    ),
    pytest.param(
        ActionResult(
            id="s",
            type=ActionType.SWAP,
            variant=Variant.FALLBACK,
            previous_variant=Variant.PRIMARY,
            model_loaded=True,
            memory_before=BEFORE,
            memory_after=AFTER,
            duration_seconds=2.5,
            swap_memory=SwapMemory("summary one", None, {"num_alloc_retries": 1}),
        ),
        '{"id":"s","type":"swap","variant":"fallback","previous_variant":"primary",'
        f'"model_loaded":true,"memory_before":{MEMORY_TEXT["before"]},'
        f'"memory_after":{MEMORY_TEXT["after"]},"duration_seconds":2.5,'
        '"memory_summary_before":"summary one","memory_summary_after":null,'
        '"memory_stats_diff":{"num_alloc_retries":1},"replayed":false}',
        id="swap-on-cuda",
    ),
    pytest.param(
        DegradationResult(
            DegradationLevel.FALLBACK_MODEL,
            (DegradationTier.NO_STREAMING, DegradationTier.FALLBACK_MODEL),
            Variant.PRIMARY,
            Variant.FALLBACK,
            True,
        ),
        '{"level":2,"tiers":["no-streaming","fallback-model"],"variant":"primary",'
        '"targetVariant":"fallback","converging":true}',
        id="degradation",
    ),
    pytest.param(
        FaultsResult({Fault.LEAK: 64, Fault.SLOW: 0}),
        '{"faults":{"leak":64,"slow":0}}',
        id="faults",
    ),
    pytest.param(STATE, STATE_TEXT, id="state-as-the-breaker-answers"),
    pytest.param(
        replace(STATE, debug=WorkerDebug(batch_rows=2, inbox=0)),
        STATE_TEXT[:-1] + ',"debug":{"batch_rows":2,"inbox":0}}',
        id="state-with-debug",
    ),
    pytest.param(
        ErrorAnswer("'id' is too long", "invalid_request_error", "id", "invalid_request"),
        '{"error":{"message":"\'id\' is too long","type":"invalid_request_error",'
        '"param":"id","code":"invalid_request"}}',
        id="error",
    ),
]


@pytest.mark.parametrize(("body", "text"), [*REQUESTS, *RESULTS])
def test_every_body_writes_the_wire_text_it_always_did_and_reads_it_back(
    body: Any, text: str
) -> None:
    assert wire(body.encode()) == text
    assert type(body).parse(json.loads(text)) == body


def test_a_reader_ignores_keys_a_newer_server_adds() -> None:
    newer = {**json.loads(STATE_TEXT), "kv_cache_bytes": 5, "requests": {"shed": 3}}
    newer["faults"] = {"leak": 0, "leak_disk": 9}
    state = ServerState.parse(newer)
    assert state.requests == {}
    assert state.faults == {Fault.LEAK: 0}
    assert state.model_loaded is True


def test_a_state_from_an_older_server_reads_what_it_has() -> None:
    assert ServerState.parse({"variant": "primary", "breaker": {"state": "open"}}) == ServerState(
        variant=Variant.PRIMARY, breaker=BreakerView(BreakerState.OPEN)
    )


def test_a_replayed_result_is_the_first_one_marked_replayed() -> None:
    replayed = UNLOAD.replay()
    assert replayed.replayed and not UNLOAD.replayed
    assert replayed.encode() == {**UNLOAD.encode(), "replayed": True}


def test_the_description_says_what_was_freed_the_variant_and_a_replay() -> None:
    def mib(size: float) -> str:
        return f"{size / MIB:.0f}Mi"

    assert UNLOAD.describe(mib) == "RSS 900Mi -> 600Mi (freed 300Mi); variant primary"
    grew = replace(UNLOAD, memory_before=AFTER, memory_after=BEFORE)
    assert grew.replay().describe(mib) == (
        "RSS 600Mi -> 900Mi (grew 300Mi); variant primary; replayed"
    )
    on_cuda = MemoryFigures(rss_bytes=None, cuda_reserved_bytes=2048 * MIB)
    swap = replace(UNLOAD, memory_before=on_cuda, memory_after=on_cuda)
    assert swap.describe(mib) == "CUDA reserved 2048Mi -> 2048Mi (freed 0Mi); variant primary"


def test_the_server_s_error_answer_reads_as_an_error_answer() -> None:
    refused = error_body(FallbackUnavailable("no fallback is configured", param="variant"))
    assert ErrorAnswer.parse(refused) == ErrorAnswer(
        "no fallback is configured", "invalid_request_error", "variant", "fallback_unavailable"
    )
    assert ErrorAnswer.message_of("<html>bad gateway</html>") == ""


# ----- requests the server refuses: status class and message, as it always answered -----


@pytest.mark.parametrize(
    ("parse", "raw", "field", "malformed", "message"),
    [
        (ActionRequest.parse, [], None, True, "the body must be a JSON object"),
        (ActionRequest.parse, {"type": "gc"}, "id", True, "'id' must be a non-empty string"),
        (ActionRequest.parse, {"id": "", "type": "gc"}, "id", True, "non-empty string"),
        (ActionRequest.parse, {"id": "x" * 257, "type": "gc"}, "id", False, "'id' is too long"),
        (ActionRequest.parse, {"id": "a"}, "type", True, "'type' must be a string"),
        (
            ActionRequest.parse,
            {"id": "a", "type": "explode"},
            "type",
            False,
            "'type' must be one of gc, empty_cache, unload, load, swap",
        ),
        (
            ActionRequest.parse,
            {"id": "a", "type": "load", "variant": 1},
            "variant",
            True,
            "'variant' must be a string",
        ),
        (
            ActionRequest.parse,
            {"id": "a", "type": "load", "variant": "third"},
            "variant",
            False,
            "'variant' must be one of primary, fallback",
        ),
        (
            ActionRequest.parse,
            {"id": "a", "type": "gc", "varient": "fallback"},
            "varient",
            False,
            "unknown key 'varient' (known: id, type, variant)",
        ),
        (BreakerRequest.parse, {}, "state", True, "'state' must be one of closed, open"),
        (BreakerRequest.parse, {"state": 5}, "state", True, "'state' must be one of closed"),
        (BreakerRequest.parse, {"state": "ajar"}, "state", False, "must be one of"),
        (
            BreakerRequest.parse,
            {"state": "half_open", "admit_percent": 5},
            "admit_percent",
            False,
            "unknown key 'admit_percent' (known: state, admitPercent)",
        ),
        (
            BreakerRequest.parse,
            {"state": "half_open", "admitPercent": 0},
            "admitPercent",
            False,
            "'admitPercent' must be 1..100 when half_open (0: use open)",
        ),
        (
            BreakerRequest.parse,
            {"state": "half_open", "admitPercent": "5"},
            "admitPercent",
            True,
            "'admitPercent' must be an integer 0..100",
        ),
        (
            BreakerRequest.parse,
            {"state": "half_open", "admitPercent": 101},
            "admitPercent",
            False,
            "'admitPercent' must be an integer 0..100",
        ),
        (
            BreakerRequest.parse,
            {"state": "half_open", "admitPercent": True},
            "admitPercent",
            True,
            "must be an integer 0..100",
        ),
        (DegradationRequest.parse, {"level": "1"}, "level", True, "'level' must be an integer"),
        (DegradationRequest.parse, {"level": True}, "level", True, "must be an integer 0..3"),
        (DegradationRequest.parse, {}, "level", True, "'level' must be an integer 0..3"),
        (
            DegradationRequest.parse,
            {"level": 1, "tier": ["no-streaming"]},
            "tier",
            False,
            "unknown key 'tier' (known: level, tiers)",
        ),
        (
            DegradationRequest.parse,
            {"level": 4},
            "level",
            False,
            "'level' must be one of 0, 1, 2, 3",
        ),
        (
            DegradationRequest.parse,
            {"level": 3, "tiers": "canned-answers"},
            "tiers",
            True,
            "'tiers' must be a list of tier names",
        ),
        (
            DegradationRequest.parse,
            {"level": 3, "tiers": [3]},
            "tiers",
            True,
            "'tiers' must be a list of tier names",
        ),
        (
            DegradationRequest.parse,
            {"level": 3, "tiers": ["canned-answers", "canned-answers"]},
            "tiers",
            False,
            "'tiers' must not repeat a tier",
        ),
        (FaultsRequest.parse, {}, None, False, 'expected a JSON object such as {"leak": 64}'),
        (FaultsRequest.parse, {"leak": -1}, "leak", False, "needs a non-negative integer"),
        (FaultsRequest.parse, {"leak": True}, "leak", False, "needs a non-negative integer"),
        (FaultsRequest.parse, {"explode": 1}, "explode", False, "unknown fault 'explode'"),
    ],
)
def test_a_request_that_does_not_fit_names_its_field(
    parse: Any, raw: object, field: str | None, malformed: bool, message: str
) -> None:
    with pytest.raises(AdminBodyError, match=re.escape(message)) as refused:
        parse(raw)
    assert (refused.value.field, refused.value.malformed) == (field, malformed)
    assert isinstance(refused.value, ValueError)


@pytest.mark.parametrize("action_type", [ActionType.GC, ActionType.EMPTY_CACHE, ActionType.UNLOAD])
def test_a_variant_on_an_action_that_ignores_it_is_refused(action_type: ActionType) -> None:
    with pytest.raises(AdminBodyError, match="'variant' applies only to load and swap") as refused:
        ActionRequest.parse({"id": "a", "type": action_type.value, "variant": "fallback"})
    assert (refused.value.field, refused.value.malformed) == ("variant", False)


def test_load_and_swap_take_a_variant() -> None:
    for action_type in (ActionType.LOAD, ActionType.SWAP):
        asked = ActionRequest("a", action_type, Variant.FALLBACK)
        assert ActionRequest.parse(asked.encode()) == asked


def test_every_admit_percent_the_operator_sends_is_read() -> None:
    # policy.admit_percent: 0 with OPEN, 100 with CLOSED, the CRD's 1..100 when half open.
    for asked in (
        BreakerRequest(BreakerState.OPEN, 0),
        BreakerRequest(BreakerState.CLOSED, 100),
        BreakerRequest(BreakerState.HALF_OPEN, 1),
        BreakerRequest(BreakerState.HALF_OPEN, 100),
    ):
        assert BreakerRequest.parse(asked.encode()) == asked


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"memory_before": None}, "memory_before"),
        ({"memory_after": {"rss_bytes": "900"}}, "memory_after.rss_bytes"),
        ({"variant": "third"}, "variant"),
        ({"replayed": None}, "replayed"),
        ({"duration_seconds": "fast"}, "duration_seconds"),
        ({"leaks_before": {"leak_cycles": 1.5}}, "leaks_before.leak_cycles"),
    ],
)
def test_a_result_that_does_not_fit_names_its_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(AdminBodyError) as refused:
        ActionResult.parse({**UNLOAD.encode(), **change})
    assert refused.value.field == field
    assert f"'{field}'" in str(refused.value)


def test_a_state_field_of_the_wrong_type_is_an_error_even_though_it_may_be_missing() -> None:
    with pytest.raises(AdminBodyError, match="'breaker.admit_percent' must be an integer"):
        ServerState.parse({"breaker": {"state": "open", "admit_percent": "all"}})
