"""A change of variant is a transaction: it ends with the new variant serving or the old
one serving again, never with none (docs/decisions/fallback-swap.md). On the real tiny
model, with a fallback whose weights are cut short, as corrupt weights on a volume are."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import torch

from fusebox_contract.names import ActionType, DegradationLevel, Quantization, Variant
from fusebox_contract.stats import StatsDocument
from fusebox_server.config import ServerConfig
from fusebox_server.control.runtime import Runtime
from fusebox_server.errors import FallbackUnavailable, ModelUnavailable
from fusebox_server.http.app import CHAT_PATH, build_api_app
from fusebox_server.model import cpu_kernels, engine
from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.load_order import LoadOrder, MemoryRoom, load_order, weights_on_disk_bytes
from fusebox_server.model.tokenization import load_tokenizer
from fusebox_server.model.worker import ControlJob, Failed, Finished

from .runtime_runs import run_with_runtime, settled
from .worker_jobs import cpu_worker, submit_job

T = TypeVar("T")

NO_ROOM = [MemoryRoom("host", used_bytes=1 << 30, limit_bytes=1 << 30)]
ROOM = [MemoryRoom("host", used_bytes=0, limit_bytes=1 << 50)]


@pytest.fixture(scope="module")
def corrupt_fallback_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's config and tokenizer with weights cut short: `--check-config` passes."""
    directory = tmp_path_factory.mktemp("corrupt-fallback")
    for path in tiny_model_dir.iterdir():
        if path.name != "model.safetensors":
            (directory / path.name).symlink_to(path)
    (directory / "model.safetensors").write_bytes(
        (tiny_model_dir / "model.safetensors").read_bytes()[:4096]
    )
    return directory


def test_the_new_variant_loads_first_only_when_both_fit_under_the_guard_ratio() -> None:
    host = MemoryRoom("cgroup", used_bytes=600, limit_bytes=1000)
    gpu = MemoryRoom("gpu", used_bytes=100, limit_bytes=1000)
    assert load_order(300, [host, gpu], 0.95) is LoadOrder.LOAD_FIRST
    assert load_order(400, [host, gpu], 0.95) is LoadOrder.RELEASE_FIRST  # 1000 > 950
    assert load_order(300, [host, MemoryRoom("gpu", 700, 1000)], 0.95) is LoadOrder.RELEASE_FIRST
    assert load_order(None, [host], 0.95) is LoadOrder.RELEASE_FIRST  # need unknown
    assert load_order(1, [MemoryRoom("cgroup", None, 1000)], 0.95) is LoadOrder.RELEASE_FIRST


def test_a_variant_never_loaded_needs_its_weight_files_size(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    assert weights_on_disk_bytes(tiny_model_dir) == (
        (tiny_model_dir / "model.safetensors").stat().st_size
    )
    assert weights_on_disk_bytes(tmp_path) is None  # nothing to measure: release first


def _watch_loads(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Each load from now on: (variant, whether the pod was ready as it began)."""
    seen: list[tuple[str, bool]] = []
    real_load = engine.load_model

    def watched(variant: str, *args: Any, **kwargs: Any) -> Any:
        seen.append((variant, runtime.ready))
        return real_load(variant, *args, **kwargs)

    monkeypatch.setattr(engine, "load_model", watched)
    return seen


def _serving(runtime: Runtime) -> tuple[Variant, bool, str | None]:
    loaded = runtime.variants.loaded
    return runtime.variant, runtime.ready, loaded.quantization.value if loaded else None


@pytest.mark.parametrize(
    ("rooms", "order", "loads"),
    [
        pytest.param(ROOM, LoadOrder.LOAD_FIRST, [("fallback", True)], id="room-for-both"),
        pytest.param(
            NO_ROOM,
            LoadOrder.RELEASE_FIRST,
            [("fallback", False), ("primary", False)],
            id="no-room",
        ),
    ],
)
def test_a_fallback_that_fails_to_load_leaves_the_primary_serving_and_is_marked_unavailable(
    tiny_model_dir: Path,
    corrupt_fallback_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    rooms: list[MemoryRoom],
    order: LoadOrder,
    loads: list[tuple[str, bool]],
) -> None:
    config = ServerConfig(
        model_dir=tiny_model_dir, fallback_dir=corrupt_fallback_dir, torch_threads=1
    )

    async def scenario(runtime: Runtime) -> tuple[Any, ...]:
        seen = _watch_loads(runtime, monkeypatch)
        with pytest.raises(FallbackUnavailable, match="loading it failed") as refused:
            await runtime.run_action("swap-1", ActionType.SWAP, Variant.FALLBACK)
        after_swap = _serving(runtime)
        used_order = runtime.variants.last_load_order
        reason = runtime.variants.unavailable_reason
        loads_after_swap = runtime.variants.loads_total
        # The degradation tier asks again, then the swap rung: refused at once, nothing loads.
        result = runtime.set_degradation(DegradationLevel.FALLBACK_MODEL)
        await settled(runtime)
        with pytest.raises(FallbackUnavailable, match="loading it failed"):
            await runtime.run_action("swap-2", ActionType.SWAP, Variant.FALLBACK)
        after_retry = (_serving(runtime), runtime.variants.loads_total - loads_after_swap)
        return refused.value, after_swap, used_order, reason, list(seen), result, after_retry

    error, after_swap, used_order, reason, seen, result, after_retry = run_with_runtime(
        config, scenario, rooms
    )
    assert used_order is order
    assert seen == loads
    assert error.status == 409 and error.code == "fallback_unavailable"
    assert "SafetensorError" in error.message
    assert reason == error.message
    assert after_swap == (Variant.PRIMARY, True, "none")
    assert not result.converging and result.target_variant is Variant.PRIMARY
    assert after_retry == ((Variant.PRIMARY, True, "none"), 0)


def test_a_fallback_that_fails_under_the_degradation_tier_is_reported_in_the_stats(
    tiny_model_dir: Path, corrupt_fallback_dir: Path
) -> None:
    config = ServerConfig(
        model_dir=tiny_model_dir, fallback_dir=corrupt_fallback_dir, torch_threads=1
    )

    async def scenario(runtime: Runtime) -> StatsDocument:
        assert runtime.set_degradation(DegradationLevel.FALLBACK_MODEL).converging
        await settled(runtime)
        return runtime.stats_document()

    # No room: the order that takes the primary down, and must bring it back.
    state = run_with_runtime(config, scenario, NO_ROOM).state
    assert state.variant is Variant.PRIMARY and state.model_loaded is True
    assert state.fallback_available is False
    assert state.fallback_unavailable_reason is not None
    assert "loading it failed" in state.fallback_unavailable_reason
    assert state.converging is False and state.target_variant is Variant.PRIMARY


def test_a_good_fallback_loads_beside_the_primary_when_both_fit(tiny_model_dir: Path) -> None:
    config = ServerConfig(
        model_dir=tiny_model_dir, fallback_quantization=Quantization.INT8, torch_threads=1
    )

    async def scenario(runtime: Runtime) -> tuple[LoadOrder | None, Any]:
        await runtime.run_action("swap-1", ActionType.SWAP, Variant.FALLBACK)
        return runtime.variants.last_load_order, _serving(runtime)

    order, serving = run_with_runtime(config, scenario, ROOM)
    assert order is LoadOrder.LOAD_FIRST
    assert serving == (Variant.FALLBACK, True, "int8")


def test_a_request_admitted_during_a_load_first_swap_waits_and_is_served_by_the_new_variant(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ServerConfig(
        model_dir=tiny_model_dir, fallback_quantization=Quantization.INT8, torch_threads=1
    )
    real_load = engine.load_model

    def slow_load(*args: Any, **kwargs: Any) -> Any:  # a larger model's load time
        time.sleep(0.5)
        return real_load(*args, **kwargs)

    async def scenario(runtime: Runtime) -> tuple[bool, LoadOrder | None, str, Any]:
        monkeypatch.setattr(engine, "load_model", slow_load)
        swap = asyncio.ensure_future(
            runtime.run_action("swap-1", ActionType.SWAP, Variant.FALLBACK)
        )
        await asyncio.sleep(0.2)
        ready_during_load = runtime.ready
        runtime.check_available()  # admitted: the pod stays ready during a load-first swap
        ids = await runtime.encode_prompt("Hello there", True)
        choices = await runtime.start_generations(
            "r", ids, [DecodeSettings(4, 0.0, 1.0, None, ())], time.monotonic() + 30
        )
        await swap
        while True:
            _, event = await choices.events.get()
            if isinstance(event, Finished | Failed):
                break
        return ready_during_load, runtime.variants.last_load_order, choices.variant, event

    ready, order, served_by, event = run_with_runtime(config, scenario, ROOM)
    assert ready is True and order is LoadOrder.LOAD_FIRST
    assert isinstance(event, Finished), event
    assert event.completion_tokens == 4
    assert served_by == Variant.FALLBACK.value  # what the headers and the access log say


@pytest.mark.parametrize(
    ("fallback_tokenizer", "served"),
    [
        pytest.param("shared", True, id="the-primarys-tokenizer"),
        pytest.param("copy", True, id="a-copy-of-it-from-another-directory"),
        pytest.param("other", False, id="another-tokenizer"),
    ],
)
def test_a_job_queued_when_a_swap_starts_runs_on_the_new_variant_if_its_ids_mean_the_same(
    tiny_model_dir: Path, tiny_tokenizer: Any, fallback_tokenizer: str, served: bool
) -> None:
    tokenizer = tiny_tokenizer
    if fallback_tokenizer != "shared":
        tokenizer = load_tokenizer(tiny_model_dir)
        if fallback_tokenizer == "other":
            tokenizer.add_tokens(["<another-vocabulary>"])
    fallback = engine.load_model(
        "fallback", tiny_model_dir, Quantization.INT8, torch.device("cpu"), tokenizer
    )

    async def scenario() -> Any:
        worker = cpu_worker(asyncio.get_running_loop(), tiny_model_dir, tiny_tokenizer)
        done, _ = submit_job(worker, tiny_tokenizer, tuple(tiny_tokenizer.encode("Hello there")))

        def swap() -> None:  # what a swap does on the worker (`Variants._load_on_worker`)
            worker.abort_active(ModelUnavailable("the model was unloaded"))
            worker.loaded = fallback

        worker.submit(ControlJob(swap, lambda result, error: None))
        while not done.done():
            worker._turn()  # the job and the swap are taken from the inbox in one turn
            await asyncio.sleep(0)
        return done.result()

    event = asyncio.run(scenario())
    if served:
        assert isinstance(event, Finished) and event.completion_tokens == 4, event
    else:  # its token ids would mean other text to the new variant: refused, retryable
        assert isinstance(event, Failed) and isinstance(event.error, ModelUnavailable), event
        assert "another tokenizer" in str(event.error)


def test_a_loaded_variants_footprint_counts_the_plain_weights_it_keeps_for_one_row(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every layer timed faster plain: each keeps its plain weight beside the packed one.
    monkeypatch.setattr(cpu_kernels, "time_single_row", lambda weight, layer: (1.0, 2.0))

    def forward(model: Any) -> float:  # the whole forward: faster with the plain weights on
        packed = [m for m in model.modules() if isinstance(m, cpu_kernels.PackedLinear)]
        return 1.0 if any(m.single_row_weight is not None for m in packed) else 2.0

    monkeypatch.setattr(cpu_kernels, "time_one_row_forward", forward)
    config = ServerConfig(model_dir=tiny_model_dir, torch_threads=1)

    async def scenario(runtime: Runtime) -> tuple[int, int, int]:
        loaded = runtime.variants.loaded
        assert loaded is not None
        kept = loaded.kernels["single_row_plain_bytes"]
        return runtime.variants.footprint_bytes[Variant.PRIMARY], loaded.parameter_bytes, kept

    footprint, weights, kept = run_with_runtime(config, scenario, ROOM)
    assert kept > 0
    assert footprint == weights + kept  # what a swap back to it must find room for


@pytest.fixture(scope="module")
def other_tokenizer_fallback_dir(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny model's weights with another tokenizer and chat template: the BPE without
    its merges (a prompt takes more tokens, every id within the model's vocabulary), and a
    template that opens every conversation with a line of its own."""
    directory = tmp_path_factory.mktemp("other-tokenizer-fallback")
    for path in tiny_model_dir.iterdir():
        if path.name not in ("tokenizer.json", "chat_template.jinja"):
            (directory / path.name).symlink_to(path)
    definition = json.loads((tiny_model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    definition["model"]["merges"] = []
    (directory / "tokenizer.json").write_text(json.dumps(definition), encoding="utf-8")
    template = (tiny_model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    (directory / "chat_template.jinja").write_text("Fallback speaking.\n" + template)
    return directory


def _slow_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    real_load = engine.load_model

    def slow_load(*args: Any, **kwargs: Any) -> Any:  # a larger model's load time
        time.sleep(0.5)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(engine, "load_model", slow_load)


async def _during_a_swap(runtime: Runtime, body: dict[str, Any]) -> tuple[httpx.Response, ...]:
    """`body` sent while a load-first swap to the fallback runs (admitted and encoded by the
    primary, started on the fallback), then again once the fallback serves."""
    transport = httpx.ASGITransport(app=build_api_app(runtime))
    async with httpx.AsyncClient(transport=transport, base_url="http://fusebox") as client:
        swap = asyncio.ensure_future(
            runtime.run_action(f"swap-{time.monotonic_ns()}", ActionType.SWAP, Variant.FALLBACK)
        )
        await asyncio.sleep(0.2)
        assert runtime.variant is Variant.PRIMARY and runtime.ready  # mid-load
        during = await client.post(CHAT_PATH, json=body)
        await swap
        assert runtime.variant is Variant.FALLBACK
        after = await client.post(CHAT_PATH, json=body)
    return during, after


CHAT_BODY: dict[str, Any] = {
    "model": "model",
    "messages": [{"role": "user", "content": "Hello there, how are you today?"}],
    "max_tokens": 6,
    "temperature": 0,
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_prompt_admitted_before_a_swap_to_another_tokenizer_is_encoded_again_and_served(
    tiny_model_dir: Path,
    other_tokenizer_fallback_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    stream: bool,
) -> None:
    config = ServerConfig(
        model_dir=tiny_model_dir, fallback_dir=other_tokenizer_fallback_dir, torch_threads=1
    )
    body = {**CHAT_BODY, "stream": stream, "stream_options": {"include_usage": True}}
    if not stream:
        del body["stream_options"]

    async def scenario(runtime: Runtime) -> tuple[httpx.Response, ...]:
        _slow_loads(monkeypatch)
        return await _during_a_swap(runtime, body)

    during, after = run_with_runtime(config, scenario, ROOM)
    assert during.status_code == 200, during.text
    assert during.headers["x-fusebox-variant"] == Variant.FALLBACK.value
    # Served as if it had arrived after the swap: the fallback's template and tokenizer.
    assert during.text.count("data: ") == after.text.count("data: ")
    if stream:
        assert _streamed(during) == _streamed(after)
    else:
        assert during.json()["choices"] == after.json()["choices"]
        assert during.json()["usage"] == after.json()["usage"]
    usage = _streamed(during)[1] if stream else during.json()["usage"]
    assert usage["prompt_tokens"] == _prompt_tokens(load_tokenizer(other_tokenizer_fallback_dir))
    assert usage["prompt_tokens"] != _prompt_tokens(load_tokenizer(tiny_model_dir))


def _prompt_tokens(tokenizer: Any) -> int:
    return len(
        tokenizer.apply_chat_template(
            CHAT_BODY["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


def _streamed(response: httpx.Response) -> tuple[str, dict[str, Any]]:
    """A stream's content joined, and its usage chunk."""
    events = [
        json.loads(line[len("data: ") :])
        for line in response.text.splitlines()
        if line.startswith("data: {")
    ]
    content = "".join(
        choice["delta"].get("content") or "" for event in events for choice in event["choices"]
    )
    usage = next(event["usage"] for event in events if event.get("usage"))
    return content, usage


def test_a_prompt_that_no_longer_fits_after_a_swap_is_refused_as_at_admission(
    tiny_model_dir: Path, other_tokenizer_fallback_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without merges the prompt takes more tokens than the window leaves it beside
    max_tokens: the 400 the context check gives at admission, streamed or not."""
    primary = load_tokenizer(tiny_model_dir)
    fallback = load_tokenizer(other_tokenizer_fallback_dir)
    window = _prompt_tokens(primary) + CHAT_BODY["max_tokens"]
    assert _prompt_tokens(fallback) + CHAT_BODY["max_tokens"] > window
    config = ServerConfig(
        model_dir=tiny_model_dir,
        fallback_dir=other_tokenizer_fallback_dir,
        torch_threads=1,
        context_window_tokens=window,
        max_input_tokens=4 * window,  # the window refuses it, not the prompt limit
        max_new_tokens=CHAT_BODY["max_tokens"],
    )

    async def scenario(runtime: Runtime) -> tuple[httpx.Response, ...]:
        _slow_loads(monkeypatch)
        during, after = await _during_a_swap(runtime, CHAT_BODY)
        await runtime.run_action("swap-2", ActionType.SWAP, Variant.PRIMARY)
        during_stream, _ = await _during_a_swap(runtime, {**CHAT_BODY, "stream": True})
        return during, after, during_stream

    during, after, during_stream = run_with_runtime(config, scenario, ROOM)
    for response in (during, during_stream):
        assert response.status_code == 400, response.text
        assert response.json() == after.json()
    assert after.json()["error"]["code"] == "context_length_exceeded"
    assert after.json()["error"]["param"] == "messages"
    assert f"maximum context length is {window} tokens" in after.json()["error"]["message"]


def test_a_stream_admitted_before_a_swap_names_the_variant_that_generates_it(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ServerConfig(
        model_dir=tiny_model_dir, fallback_quantization=Quantization.INT8, torch_threads=1
    )

    async def scenario(runtime: Runtime) -> tuple[httpx.Response, ...]:
        _slow_loads(monkeypatch)
        return await _during_a_swap(runtime, {**CHAT_BODY, "stream": True})

    during, after = run_with_runtime(config, scenario, ROOM)
    assert during.status_code == 200 and "data: [DONE]" in during.text
    assert during.headers["x-fusebox-variant"] == Variant.FALLBACK.value
    assert during.headers["x-fusebox-served-by"] == Variant.FALLBACK.value
    assert after.headers["x-fusebox-variant"] == Variant.FALLBACK.value
