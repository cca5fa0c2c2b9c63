"""How bench/gpu_realistic.py shares one device call's seconds among its phases and rounds.

Why apart from the script: a run that overruns its budget loses every figure
after the device call ends, so the arithmetic that cuts phases, peer
settings, rounds and admission levels to fit is plain functions of the time
left, tested without a clock or a device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.gpu_realistic_config import RealisticConfig

# A round stops sending at this share of its time; what is in flight may use the rest.
SEND_SHARE = 0.5
MIN_REQUEST_TIMEOUT_SECONDS = 10.0
PHASES = ("fusebox", "admission", "peers", "engine", "generate")
# Shares of the budget left after the model is built; a phase that ends early passes
# its rest on. Fusebox and the peers are the comparison; the rest bound and explain it.
PHASE_WEIGHTS = {"fusebox": 3.0, "admission": 1.0, "peers": 4.0, "engine": 1.5, "generate": 2.0}
SETTLE_RESERVE_SECONDS = 15.0  # stopping the last server and writing the files


def round_requests(clients: int, per_client: float) -> int:
    """Requests in a closed-loop round: at least one per client, so every client sends."""
    return max(clients, math.ceil(clients * per_client))


def phase_seconds(seconds_left: float, weights_left: Sequence[float], reserve: float) -> float:
    """The next phase's share: its weight's part of what is left after the reserve."""
    total = sum(weights_left)
    if total <= 0:
        return 0.0
    return max(0.0, seconds_left - reserve) * weights_left[0] / total


def phase_share(seconds_left: float, phase: str, chosen: Sequence[str]) -> float:
    """`phase`'s seconds of what is left: the phases after it that run keep their weights'
    parts, and phases not chosen take none."""
    weights_left = [
        PHASE_WEIGHTS[name]
        for name in PHASES[PHASES.index(phase) :]
        if name == phase or name in chosen
    ]
    return phase_seconds(seconds_left, weights_left, SETTLE_RESERVE_SECONDS)


def setting_seconds(seconds_left: float, settings_left: int, minimum: float) -> float:
    """A peer setting's time: an equal share of what is left, but at least `minimum` (or all
    that is left), so that a short budget measures the first settings and cuts the last
    rather than starting every one with no time to measure it."""
    equal = seconds_left / max(1, settings_left)
    return max(equal, min(seconds_left, minimum))


def next_level_fits(last_cost: float | None, seconds_left: float, growth: float) -> bool:
    """Whether the admission probe's next level fits: it costs `growth` times the last
    (the requests grow by about that much); the first level needs only some time left."""
    if last_cost is None:
        return seconds_left > 0
    return last_cost * growth <= seconds_left


def request_timeout(config: RealisticConfig, round_seconds: float) -> float:
    """A request may outlive its round's sending time by the rest of the round, at most
    the configured timeout (and at least a floor, so a short round still measures)."""
    rest = round_seconds * (1.0 - SEND_SHARE)
    return min(config.request_timeout_seconds, max(MIN_REQUEST_TIMEOUT_SECONDS, rest))
