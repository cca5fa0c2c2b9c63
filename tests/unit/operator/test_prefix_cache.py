"""spec.server.prefixCache.maxBytes: parsed and refused with its name, rendered into the
server's env, owned by the operator (server.env may not set it), and sized into the
memory limit where the cache lives in host memory (the CPU), beyond the server's default.

The server's side of the same value (its own config parser reading the rendered env) is
tests/unit/contract/test_every_field.py; the API server's CEL messages are
tests/integration/operator/test_prefix_cache_crd.py.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from fusebox_contract.settings import PREFIX_CACHE_BYTES
from fusebox_operator.edits import edit_message
from fusebox_operator.manifests import Manifest, build_children
from fusebox_operator.reconcile_status import memory_sized_message
from fusebox_operator.settings import OperatorSettings
from fusebox_operator.sizing import PREFIX_CACHE_ROOM_BYTES, MemorySizing, size_memory
from fusebox_operator.spec import GIB, InferenceServiceSpec, SpecError, parse_spec

MIB = 1024**2
CPU = {"count": 0}
GPU_24GIB = {"count": 1, "memoryGiB": 24}


def spec(
    max_bytes: str | None = None,
    gpu: dict[str, Any] | None = None,
    memory: dict[str, Any] | None = None,
    rss_ratio: float | None = None,
) -> InferenceServiceSpec:
    raw: dict[str, Any] = {
        "model": {"name": "chat", "source": "pvc://models/tiny"},
        "fallback": {},
        "gpu": gpu or CPU,
        "memory": memory or {},
    }
    if max_bytes is not None:
        raw["server"] = {"prefixCache": {"maxBytes": max_bytes}}
    if rss_ratio is not None:
        raw["breaker"] = {"resource": {"rss": {"ratioOfLimit": rss_ratio}}}
    return parse_spec(raw)


def sized(parsed: InferenceServiceSpec) -> MemorySizing:
    return size_memory(parsed, [])


def server_env(parsed: InferenceServiceSpec) -> dict[str, str]:
    children = render(parsed)
    deployment = next(c for c in children if c["kind"] == "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    server: Manifest = next(c for c in containers if c["name"] == "server")
    return {item["name"]: item["value"] for item in server["env"]}


# --- parsing ------------------------------------------------------------------------


def test_left_out_it_is_the_servers_default_of_one_gib() -> None:
    assert spec().server.prefix_cache_bytes == PREFIX_CACHE_BYTES.default == GIB


@pytest.mark.parametrize(
    ("text", "size_bytes"),
    [
        ("512Mi", 512 * MIB),
        ("2Gi", 2 * GIB),
        ("0", 0),
        ("1500M", 1_500_000_000),
        ("1Ti", 1024 * GIB),
    ],
)
def test_a_memory_quantity_is_read_in_bytes(text: str, size_bytes: int) -> None:
    assert spec(text).server.prefix_cache_bytes == size_bytes


@pytest.mark.parametrize("text", ["lots", "512MB", "-1Gi", "1 Gi", "", "500m"])
def test_a_value_that_is_not_a_memory_quantity_is_refused_naming_the_field(text: str) -> None:
    with pytest.raises(SpecError, match=r"server\.prefixCache\.maxBytes: .* is not a memory"):
        spec(text)


def test_more_than_one_tebibyte_is_refused_naming_the_bound() -> None:
    with pytest.raises(SpecError, match=r"server\.prefixCache\.maxBytes must be at most 1Ti"):
        spec("2Ti")


def raw_with(max_bytes: Any) -> dict[str, Any]:
    return {
        "model": {"name": "chat", "source": "pvc://models/tiny"},
        "server": {"prefixCache": {"maxBytes": max_bytes}},
    }


def test_a_whole_number_is_bytes_as_in_a_containers_resources() -> None:
    assert parse_spec(raw_with(536870912)).server.prefix_cache_bytes == 512 * MIB
    assert parse_spec(raw_with(0)).server.prefix_cache_bytes == 0


def test_a_negative_number_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError, match=r"server\.prefixCache\.maxBytes must be 0 or more bytes"):
        parse_spec(raw_with(-1))


def test_a_number_beyond_one_tebibyte_is_refused() -> None:
    with pytest.raises(SpecError, match=r"server\.prefixCache\.maxBytes must be at most 1Ti"):
        parse_spec(raw_with(2 << 40))


@pytest.mark.parametrize("value", [True, 1.5, ["1Gi"]])
def test_neither_a_quantity_nor_a_whole_number_is_refused(value: Any) -> None:
    with pytest.raises(SpecError, match=r"server\.prefixCache\.maxBytes must be a memory quantity"):
        parse_spec(raw_with(value))


def test_prefix_cache_that_is_not_an_object_is_refused() -> None:
    raw = {
        "model": {"name": "chat", "source": "pvc://models/tiny"},
        "server": {"prefixCache": "1Gi"},
    }
    with pytest.raises(SpecError, match=r"server\.prefixCache must be an object"):
        parse_spec(raw)


# --- the server's env -----------------------------------------------------------------


def test_the_server_gets_the_bytes_in_its_env() -> None:
    assert server_env(spec("512Mi"))[PREFIX_CACHE_BYTES.env] == str(512 * MIB)


def test_the_default_is_rendered_too_so_the_pod_says_what_it_runs_with() -> None:
    assert server_env(spec())[PREFIX_CACHE_BYTES.env] == str(GIB)


def test_zero_reaches_the_server_as_zero_which_disables_the_cache() -> None:
    assert server_env(spec("0"))[PREFIX_CACHE_BYTES.env] == "0"


def test_server_env_may_not_set_the_prefix_cache_bytes() -> None:
    raw = {
        "model": {"name": "chat", "source": "pvc://models/tiny"},
        "server": {"env": [{"name": PREFIX_CACHE_BYTES.env, "value": "1"}]},
    }
    with pytest.raises(SpecError, match=f"server.env may not set {PREFIX_CACHE_BYTES.env}"):
        parse_spec(raw)


def render(parsed: InferenceServiceSpec) -> list[Manifest]:
    return build_children(parsed, "svc", "ns", sized(parsed), OperatorSettings(), "a-token")


def edit_words(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    new = parse_spec(after)
    return edit_message(before, new, render(new), render, 2)


def test_an_edit_of_max_bytes_on_a_gpu_pod_rolls_the_pods_for_the_env_alone() -> None:
    base = {"model": {"name": "chat", "source": "pvc://models/tiny"}, "gpu": GPU_24GIB}
    after = {**base, "server": {"prefixCache": {"maxBytes": "2Gi"}}}
    assert edit_words(base, after) == (
        f"generation 2: rolls the pods one at a time: server env {PREFIX_CACHE_BYTES.env}"
    )


def test_an_edit_of_max_bytes_on_a_cpu_pod_also_says_the_limit_grows() -> None:
    base = {"model": {"name": "chat", "source": "pvc://models/tiny"}, "gpu": CPU}
    after = {**base, "server": {"prefixCache": {"maxBytes": "4Gi"}}}
    assert edit_words(base, after) == (
        f"generation 2: rolls the pods one at a time: server env {PREFIX_CACHE_BYTES.env}, "
        "server resources.limits.memory, server resources.requests.memory"
    )


# --- sizing ---------------------------------------------------------------------------


def test_the_default_cache_adds_nothing_to_a_cpu_pods_limit() -> None:
    # The server sheds its cache short of its guard, so the default lives inside the
    # limit: pods that never asked for a cache keep the limit they had (2 GiB on the CPU).
    assert sized(spec()).limit_bytes == 2 * GIB
    assert sized(spec(memory={"limit": "2Gi"})).limit_bytes == 2 * GIB


@pytest.mark.parametrize("text", ["0", "512Mi", "1Gi"])
def test_a_cache_at_or_below_the_default_adds_nothing(text: str) -> None:
    assert sized(spec(text)).limit_bytes == sized(spec()).limit_bytes


def test_a_cpu_cache_beyond_the_default_is_added_over_the_rss_ratio() -> None:
    # 4 GiB asked: 3 GiB beyond the default, over ratioOfLimit 0.75 = 4 GiB, on top of 2 GiB.
    sizing = sized(spec("4Gi"))
    assert sizing.limit_bytes == 6 * GIB
    assert sizing.request_bytes == sizing.limit_bytes  # still Guaranteed


def test_the_addition_follows_the_rss_ratio_of_limit() -> None:
    # 2 GiB asked, 1 GiB beyond the default, over 0.5 = 2 GiB on top of 2 GiB.
    assert sized(spec("2Gi", rss_ratio=0.5)).limit_bytes == 4 * GIB


def test_a_cpu_cache_beyond_the_default_is_added_on_top_of_an_explicit_limit() -> None:
    # The explicit limit was sized for the model's weights; the cache needs room beside them.
    # 8 GiB + (3 - 1) GiB / 0.75 = 10.67 GiB, rounded up to 11 GiB.
    assert sized(spec("3Gi", memory={"limit": "8Gi"})).limit_bytes == 11 * GIB


@pytest.mark.parametrize("asked_gib", [1.5, 2, 3, 8, 64])
def test_a_full_cache_stays_under_the_rss_ratio_of_what_it_added(asked_gib: float) -> None:
    parsed = spec(f"{asked_gib}Gi")
    added_bytes = sized(parsed).limit_bytes - sized(spec()).limit_bytes
    beyond_bytes = parsed.server.prefix_cache_bytes - PREFIX_CACHE_ROOM_BYTES
    assert beyond_bytes <= parsed.breaker.resource.rss.ratio * added_bytes
    assert added_bytes < beyond_bytes / parsed.breaker.resource.rss.ratio + GIB


def test_a_gpu_pods_cache_is_in_gpu_memory_and_leaves_the_host_limit_alone() -> None:
    # 24 GiB x 1.25 + 2 GiB = 32 GiB whatever the cache: its bytes live on the device.
    assert sized(spec("16Gi", gpu=GPU_24GIB)).limit_bytes == 32 * GIB
    assert sized(spec("16Gi", gpu=GPU_24GIB)) == sized(spec(gpu=GPU_24GIB))


def test_swap_allowed_keeps_the_request_under_the_grown_limit() -> None:
    sizing = sized(spec("4Gi", memory={"allowSwap": True}))
    assert sizing.limit_bytes == 6 * GIB
    assert sizing.request_bytes == math.ceil(6 / 2) * GIB


def test_the_memory_sized_event_says_what_the_cache_added() -> None:
    parsed = spec("4Gi")
    assert memory_sized_message(sized(parsed), parsed) == (
        "memory limit 6Gi, request 6Gi (Guaranteed); VRAM 0.00 GiB x 0 from no GPU requested, "
        "headroom 1.25; +4.00 GiB for server.prefixCache.maxBytes 4.00 GiB (beyond 1 GiB, over "
        "rss.ratioOfLimit 0.75)"
    )


def test_the_memory_sized_event_is_silent_about_a_cache_that_added_nothing() -> None:
    assert "prefixCache" not in memory_sized_message(sized(spec()), spec())
