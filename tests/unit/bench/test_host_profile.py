"""bench/host_profile.py: the server's CPU per streamed token, split by what spent it."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.host_profile import measure, part_of, read_folded, report, split

WORKER = "stdlib/threading.py:_bootstrap;/x/inference_image/fusebox_server/model/worker.py:run"
LOOP = (
    "/x/fusebox_server/__main__.py:<module>;/usr/lib/python3.11/asyncio/base_events.py:run_forever"
)


def test_each_stack_is_charged_to_the_worker_inside_or_outside_the_model_the_loop_or_else() -> None:
    step = f"{WORKER};/x/inference_image/fusebox_server/model/worker.py:_batched_step"
    assert part_of(f"{step};/x/fusebox_server/model/slot_batch.py:step;torch:mm".split(";")) == (
        "worker_model"
    )
    assert part_of(f"{step};/x/fusebox_server/model/engine.py:step".split(";")) == "worker_model"
    prefill = f"{WORKER};/x/fusebox_server/model/engine.py:prefill"
    assert part_of(prefill.split(";")) == "worker_model"
    posting = f"{step};/x/fusebox_server/model/worker.py:_post;asyncio:_write_to_self"
    assert part_of(posting.split(";")) == "worker_host"
    assert part_of(f"{LOOP};/x/fusebox_server/http/app.py:_stream".split(";")) == "loop"
    assert part_of(["/x/fusebox_server/control/stats.py:run"]) == "other"


def test_the_split_is_microseconds_per_token_with_each_parts_costliest_leaves() -> None:
    folded = "\n".join(
        [
            f"{WORKER};/x/fusebox_server/model/engine.py:step 3000",
            f"{WORKER};/x/inference_image/fusebox_server/model/worker.py:_append 1000",
            f"{LOOP};/x/inference_image/fusebox_server/http/rendering.py:sse 1500",
            f"{LOOP};/x/inference_image/fusebox_server/http/rendering.py:sse 500",
            "/x/stats.py:run 100",
        ]
    )
    stacks = read_folded(folded)
    assert (
        stacks[tuple(f"{LOOP};/x/inference_image/fusebox_server/http/rendering.py:sse".split(";"))]
        == 2000
    )
    result = split(stacks, tokens=10)
    assert result["cpu_us_per_token"] == {
        "worker_model": 300.0,
        "worker_host": 100.0,
        "loop": 200.0,
        "other": 10.0,
    }
    assert result["host_us_per_token"] == 300.0
    assert result["top_fusebox_frames_us_per_token"]["worker_host"] == [
        ["fusebox_server/model/worker.py:_append", 100.0]
    ]
    assert result["top_leaves_us_per_token"]["loop"] == [
        ["fusebox_server/http/rendering.py:sse", 200.0]
    ]


def test_a_short_run_on_the_cpu_profiles_the_real_server(tmp_path: Path) -> None:
    args = argparse.Namespace(
        device="cpu", clients=4, seconds=1.5, warmup_seconds=0.5, max_tokens=8, work_dir=None
    )
    result = measure(args)
    assert result["tokens"] == result["requests"] * 8 > 0  # every request ran to max_tokens
    per_token = result["cpu_us_per_token"]
    assert per_token["worker_model"] > 0 and per_token["loop"] > 0
    assert set(result["top_leaves_us_per_token"]) == set(per_token)
    assert "| loop |" in report(result)
