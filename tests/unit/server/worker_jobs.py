"""An inference worker on the CPU and the jobs the unit tests hand it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.engine import load_model
from fusebox_server.model.faults import Faults
from fusebox_server.model.worker import GenerationJob, InferenceWorker, Piece

GREEDY = DecodeSettings(max_new_tokens=8, temperature=0.0, top_p=1.0, seed=None, stop=())


def cpu_worker(loop: asyncio.AbstractEventLoop, model_dir: Path, tokenizer: Any) -> InferenceWorker:
    """A worker holding the primary model, its thread not yet started."""
    worker = InferenceWorker(loop, Faults({}), inbox_size=8)
    worker.loaded = load_model("primary", model_dir, "none", torch.device("cpu"), tokenizer)
    return worker


def submit_job(
    worker: InferenceWorker,
    tokenizer: Any,
    prompt_ids: tuple[int, ...],
    *,
    settings: DecodeSettings = GREEDY,
    max_new_tokens: int = 4,
    variant: str = "primary",
) -> tuple[asyncio.Future[Any], list[str]]:
    """Queue one job: the future gets its final event, the list its text pieces."""
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    pieces: list[str] = []

    def deliver(event: Any) -> None:
        if isinstance(event, Piece):
            pieces.append(event.text)
        elif not done.done():
            done.set_result(event)

    worker.submit(
        GenerationJob(
            request_id="t",
            variant=variant,
            prompt_ids=prompt_ids,
            settings=replace(settings, max_new_tokens=max_new_tokens),
            deadline_monotonic=time.monotonic() + 60,
            tokenizer=tokenizer,
            deliver=deliver,
        )
    )
    return done, pieces
