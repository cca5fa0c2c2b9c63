"""The requests bench/gpu_realistic.py sends, and the figures one round of them makes.

Why apart from the script: every server (Fusebox, each peer setting, the
engine in process, `generate`) must get the same seeded requests, and the
in-process phases get them across a process boundary as JSON; drawing them,
carrying them and summing a round up are pure, so they are tested here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.gpu_realistic_budget import round_requests
from bench.gpu_realistic_config import RealisticConfig
from bench.realistic_bench import with_system_prompt
from bench.serving_metrics import ResponseRecord, summarize
from bench.workload import Workload, WorkloadRequest, WorkloadShape, build_workload

TIMEOUT = "timeout:"  # a request's error when it outlived its timeout


@dataclass
class Traffic:
    """The requests every server gets: a workload per closed round (by client count) and
    per open rate, the warm-up, c=1 and the admission probe's 2,048-token prompts.

    Each round draws its own prompts (a prompt sent twice to one server would hit
    Fusebox's prefix cache whole, which no user's traffic does); the closed and open
    rounds share the warm-up's system prompt, as a deployment's system prompt outlives
    every conversation, so from the first round on its 30% are the hits a cache earns.
    """

    closed: dict[int, Workload]
    open: dict[str, Workload]
    warmup: Workload
    c1: Workload
    admission: Workload


def make_traffic(config: RealisticConfig, count_tokens: Callable[[str], int]) -> Traffic:
    shape = WorkloadShape().scaled(config.scale) if config.scale > 1 else WorkloadShape()
    long_prompt = shape.prompt_tokens[1]
    warmup = build_workload(config.warmup_requests, count_tokens, shape, seed=1034)

    def drawn(count: int, seed: int) -> Workload:
        fresh = build_workload(count, count_tokens, shape, seed=seed)
        return with_system_prompt(fresh, warmup.system_prompt)

    return Traffic(
        closed={
            count: drawn(round_requests(count, config.requests_per_client), 34 + position)
            for position, count in enumerate(config.clients)
        },
        open={
            rate_key(rate): drawn(config.open_requests, 134 + position)
            for position, rate in enumerate(config.open_rates)
        },
        warmup=warmup,
        c1=build_workload(config.c1_requests + 1, count_tokens, shape, seed=36),
        admission=build_workload(
            max(config.admission_levels),
            count_tokens,
            WorkloadShape(
                prompt_tokens=(long_prompt, long_prompt),
                output_tokens=(config.admission_new_tokens, config.admission_new_tokens),
                system_prompt_share=0.0,
                scale=shape.scale,
            ),
            seed=37,
        ),
    )


def rate_key(rate: float) -> str:
    """An open-loop rate as the results name it: 2.0 -> "2"."""
    return f"{rate:g}"


def request_to_json(request: WorkloadRequest) -> dict[str, Any]:
    return asdict(request)


def request_from_json(data: dict[str, Any]) -> WorkloadRequest:
    return WorkloadRequest(**data)


def round_figures(records: Sequence[ResponseRecord], offered: int) -> dict[str, Any]:
    """serving_metrics' figures (over the requests that ended), how many of the round's
    requests were not sent, and how many were cut at the round's end (`timeouts`)."""
    timeouts = sum(1 for record in records if (record.error or "").startswith(TIMEOUT))
    return summarize(records) | {
        "offered": offered,
        "not_sent": offered - len(records),
        "timeouts": timeouts,
    }
