"""bench/gpu_realistic.py's figures turned into comparisons and pass/fail against its targets.

Why apart from the script: realistic.json is rewritten after every phase, so
the verdicts must read a result that is partly measured (a peer that failed,
a phase cut by the budget) and say "not measured" as a failure, never as a
pass; that reading is pure and tested on hand-made results.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

TARGETS = {
    "headline_tokens_per_second_vs_best_peer_at_least": 1.2,
    "headline_ttft_p99_vs_best_peer_at_most": 0.8,
    "headline_http_vs_in_process_engine_at_least": 0.8,
    "c1_latency_vs_compiled_static_generate_at_most": 1.05,
}


HEADLINE_CLIENTS = 64  # the targets' client count on the device (the dry run's is its first)


def best_by(
    figures_by_setting: dict[str, dict[str, Any]], key: Callable[[dict[str, Any]], float | None]
) -> str | None:
    """The setting with the highest `key` (None values left out)."""
    scored = {name: key(f) for name, f in figures_by_setting.items()}
    valid = {name: value for name, value in scored.items() if value is not None}
    return max(valid, key=lambda name: valid[name]) if valid else None


def round_tokens_per_second(figures: dict[str, Any] | None) -> float | None:
    """A round's tokens/s, or None when it failed: an error other than a request cut at
    the round's end (`timeouts`, the budget's doing, not the server's) disqualifies it."""
    if not figures or not figures.get("tokens_per_second"):
        return None
    if figures.get("errors", 0) > figures.get("timeouts", 0):
        return None
    return float(figures["tokens_per_second"])


def best_peers(peers: dict[str, Any], clients: Sequence[int]) -> dict[str, str | None]:
    """Per client count, the peer setting with the most tokens/s (errors disqualify)."""
    best: dict[str, str | None] = {}
    for count in clients:
        by_setting = {
            name: (part.get("closed") or {}).get(str(count))
            for name, part in peers.items()
            if isinstance(part, dict)
        }
        best[str(count)] = best_by(
            {name: f for name, f in by_setting.items() if f}, round_tokens_per_second
        )
    return best


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0 or math.isnan(denominator):
        return None
    if math.isnan(numerator):
        return None
    return numerator / denominator


def comparisons(result: dict[str, Any], clients: Sequence[int]) -> dict[str, Any]:
    """Fusebox against the best peer, its own engine in process, and compiled `generate`."""
    fusebox = (result.get("fusebox") or {}).get("closed") or {}
    peers = result.get("peers") or {}
    engine = (result.get("engine") or {}).get("closed") or {}
    best = best_peers(peers, clients)
    per_clients: dict[str, Any] = {}
    for count in clients:
        key = str(count)
        ours = fusebox.get(key)
        peer_name = best.get(key)
        theirs = (peers.get(peer_name) or {}).get("closed", {}).get(key) if peer_name else None
        in_process = engine.get(key)
        row: dict[str, Any] = {"best_peer": peer_name}
        row["tokens_per_second_vs_best_peer"] = _ratio(
            round_tokens_per_second(ours), round_tokens_per_second(theirs)
        )
        paired = (ours or {}).get("ttft_p99_paired_with", {}).get(peer_name or "")
        row["ttft_p99_vs_best_peer"] = _ratio(paired["fusebox"], paired["peer"]) if paired else None
        row["http_vs_in_process_engine"] = _ratio(
            round_tokens_per_second(ours), round_tokens_per_second(in_process)
        )
        per_clients[key] = row
    c1 = (result.get("generate") or {}).get("c1") or {}
    fusebox_c1 = (result.get("fusebox") or {}).get("c1") or {}
    return {
        "by_clients": per_clients,
        "c1_latency_vs_compiled_static_generate": _ratio(
            fusebox_c1.get("median_latency_seconds"), c1.get("median_latency_seconds")
        ),
    }


def verdicts(compared: dict[str, Any], headline_clients: int) -> list[dict[str, Any]]:
    """Each target with its measured value and pass/fail; a value not measured fails. The
    `headline_` targets are read at `headline_clients` (64 on the device)."""
    row = compared["by_clients"].get(str(headline_clients)) or {}
    measured = {
        "headline_tokens_per_second_vs_best_peer_at_least": row.get(
            "tokens_per_second_vs_best_peer"
        ),
        "headline_ttft_p99_vs_best_peer_at_most": row.get("ttft_p99_vs_best_peer"),
        "headline_http_vs_in_process_engine_at_least": row.get("http_vs_in_process_engine"),
        "c1_latency_vs_compiled_static_generate_at_most": compared[
            "c1_latency_vs_compiled_static_generate"
        ],
    }
    lines = []
    for name, bound in TARGETS.items():
        value = measured[name]
        at_least = name.endswith("_at_least")
        passed = value is not None and (value >= bound if at_least else value <= bound)
        lines.append(
            {
                "target": name,
                "clients": headline_clients if name.startswith("headline_") else 1,
                "value": value,
                "bound": bound,
                "pass": passed,
            }
        )
    return lines


def texts_equal(ours: Sequence[dict[str, Any]], theirs: Sequence[dict[str, Any]]) -> str:
    """How many of `theirs` answers Fusebox gave word for word, as "equal/compared"."""
    by_index = {answer["index"]: answer["text"] for answer in ours}
    compared = [answer for answer in theirs if answer["index"] in by_index]
    equal = sum(1 for answer in compared if by_index[answer["index"]] == answer["text"])
    return f"{equal}/{len(compared)}"
