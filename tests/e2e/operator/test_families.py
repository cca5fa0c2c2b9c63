"""Issue 33, every model family on a real cluster: one InferenceService per zoo family,
each Ready from its release on a PVC, each answering the OpenAI surface through its
Service with the official `openai` client (chat, stream, `json_schema` through the
client's `parse()`, tools where the family's template has a tool format, logprobs),
and each swapping to its int8 fallback and back under traffic with no answer other
than a 200 or a 503 carrying Retry-After.

The families run in two waves, so that every wave's pods fit the 2-core node beside
the suite's operator (CPU requests; see tests/e2e/capacity.py). Within a wave the
services start, answer and swap side by side; the swap is asked for the way a person
on call would, with the `fusebox.dev/pin-tier` annotation, and released with `none`.
The weights are random: what is proven is that the server runs each family's
architecture, tokenizer and template end to end, and that the grammar keeps even a
random model's structured answers valid.
"""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest

from fusebox_contract.names import ConditionType, DegradationTier, Variant
from fusebox_contract.wiring import VARIANT_HEADER
from fusebox_operator.incident import PIN_TIER
from fusebox_server.zoo.families import FAMILIES
from fusebox_server.zoo.release import ensure_zoo_model

from ..conftest import Cluster, fresh_namespace, local_claim, wait_for
from .conftest import OperatorRelease, Reply, Service, apply_service, base_spec, chat_reply

# Two waves of at most four services: 4 x (250m server + 100m sidecar) beside the operator.
WAVES = (("llama3", "qwen2.5", "gemma2", "mistral"), ("qwen3", "phi3", "qwen2_moe"))
# The families whose template has a tool format (README, "Model families").
TOOL_FAMILIES = frozenset({"llama3", "qwen2.5", "qwen3", "qwen2_moe"})
MODEL = "chat"
USER_TURN = [{"role": "user", "content": "你好, name a city and its weather 🌦"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


class CityWeather(pydantic.BaseModel):
    """The structured answer `parse()` asks for."""

    city: str
    sunny: bool


def test_every_family_matches_the_waves() -> None:
    assert sorted(name for wave in WAVES for name in wave) == sorted(FAMILIES)
    assert TOOL_FAMILIES <= set(FAMILIES)


@pytest.fixture(scope="module")
def zoo_root() -> Iterator[Path]:
    """Every zoo release as `<root>/<family>`, world-readable (pods run as uid 65532)."""
    root = Path("/var/tmp") / f"fusebox-e2e-zoo-{uuid.uuid4().hex[:8]}"
    for family in FAMILIES:
        shutil.copytree(ensure_zoo_model(family), root / family)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def zoo_namespace(cluster: Cluster, operator: OperatorRelease, zoo_root: Path) -> Iterator[str]:
    """One namespace the suite's operator watches, with the zoo's claim `models`."""
    name = f"e2e-families-{uuid.uuid4().hex[:6]}"
    with fresh_namespace(cluster, name), local_claim(cluster, name, "models", zoo_root):
        yield name


def family_spec(family: str) -> dict[str, Any]:
    return base_spec(
        model={"name": MODEL, "source": f"pvc://models/{family}"},
        server={"cpu": "250m", "maxNewTokens": 48, "requestTimeoutSeconds": 60, "env": []},
        memory={"limit": "1536Mi"},
        # A 250m server is slow by design here; the latency breaker is not under test.
        breaker={"latency": {"p99ThresholdMillis": 30000}},
        # Only the pin moves the tier: nothing the policy decides on its own.
        degradation={
            "tiers": [DegradationTier.FALLBACK_MODEL.value],
            "coolOffSeconds": 3600,
            "cannedAnswers": {},  # no canned-answers tier: the CRD refuses answers for it
        },
    )


def service_name(family: str) -> str:
    return "fam-" + family.replace(".", "").replace("_", "-")


@contextmanager
def wave_services(
    cluster: Cluster, namespace: str, wave: tuple[str, ...]
) -> Iterator[dict[str, Service]]:
    """The wave's services applied at once, Ready, and deleted afterwards."""
    services = {
        family: apply_service(cluster, namespace, service_name(family), family_spec(family))
        for family in wave
    }
    try:
        for service in services.values():
            wait_for(
                f"{service.name} Ready",
                lambda s=service: s.condition(ConditionType.READY).get("status") == "True",
                timeout=600,
                diagnose=service.diagnose,
            )
        yield services
    finally:
        for service in services.values():
            service.kubectl("delete", "inferenceservice", service.name, "--wait=false", check=False)
        for service in services.values():
            wait_for(
                f"{service.name}'s pods gone",
                lambda s=service: not s.pods(),
                timeout=180,
            )


def client_for(service: Service) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{service.service_url()}/v1", api_key="unused", max_retries=0, timeout=120
    )


def check_openai_surface(family: str, service: Service) -> list[str]:
    """What the family's service got wrong on the OpenAI surface (empty: all of it right)."""
    client = client_for(service)
    problems: list[str] = []
    request: Any = {"model": MODEL, "messages": USER_TURN, "max_tokens": 8, "temperature": 0}

    answer = client.chat.completions.create(**request)
    text = answer.choices[0].message.content or ""
    if answer.usage is None or answer.usage.completion_tokens < 1:
        problems.append(f"chat usage {answer.usage}")
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(**request, stream=True)
        if chunk.choices
    )
    if streamed != text:
        problems.append(f"stream {streamed!r} != answer {text!r}")

    parsed = client.beta.chat.completions.parse(
        model=MODEL, messages=USER_TURN, response_format=CityWeather, max_tokens=40
    )
    if not isinstance(parsed.choices[0].message.parsed, CityWeather):
        problems.append(f"parse(): {parsed.choices[0].message.content!r}")

    with_logprobs = client.chat.completions.create(**request, logprobs=True, top_logprobs=2)
    content = with_logprobs.choices[0].logprobs and with_logprobs.choices[0].logprobs.content
    usage = with_logprobs.usage
    if not content or usage is None or len(content) != usage.completion_tokens:
        problems.append(f"logprobs {content!r} for usage {usage}")
    elif any(len(entry.top_logprobs) != 2 or entry.logprob > 0 for entry in content):
        problems.append(f"top_logprobs {content[0]!r}")

    problems += check_tools(family, client)
    return [f"{family}: {problem}" for problem in problems]


def check_tools(family: str, client: openai.OpenAI) -> list[str]:
    """A named call and its result turn where the template has tools; a 400 naming
    `tools` where it has none."""
    forced: Any = {
        "model": MODEL,
        "messages": USER_TURN,
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 40,
    }
    if family not in TOOL_FAMILIES:
        try:
            client.chat.completions.create(**forced)
        except openai.BadRequestError as refused:
            body: Any = refused.body
            param = body.get("param") if isinstance(body, dict) else None
            return [] if param == "tools" else [f"tools refused naming {param!r}: {body}"]
        return ["tools answered by a family without a tool format"]
    called = client.chat.completions.create(**forced)
    choice = called.choices[0]
    calls = choice.message.tool_calls or []
    if choice.finish_reason != "tool_calls" or len(calls) != 1:
        return [f"tool call: finish {choice.finish_reason}, calls {calls}"]
    call: Any = calls[0]
    arguments = json.loads(call.function.arguments)
    if call.function.name != "get_weather" or set(arguments) != {"city"}:
        return [f"tool call {call.function.name}({arguments})"]
    turns: Any = [
        *USER_TURN,
        {"role": "assistant", "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'},
    ]
    after = client.chat.completions.create(model=MODEL, messages=turns, max_tokens=8)
    if after.choices[0].finish_reason not in ("stop", "length"):
        return [f"after the tool turn: {after.choices[0].finish_reason}"]
    return []


@dataclass
class Traffic:
    """Chat requests to several Services, one thread each, every reply kept."""

    replies: dict[str, list[Reply]] = field(default_factory=dict)

    def failures(self) -> list[str]:
        """Replies that are neither 200 nor a 429/503 carrying Retry-After."""
        return [
            f"{name}: {reply.status} {str(reply.body)[:200]}"
            for name, replies in self.replies.items()
            for reply in replies
            if reply.status != 200
            and not (reply.status in (429, 503) and "retry-after" in reply.headers)
        ]

    def last_variants(self, name: str, count: int) -> list[str | None]:
        answered = [r for r in self.replies.get(name, []) if r.status == 200]
        return [r.headers.get(VARIANT_HEADER.lower()) for r in answered[-count:]]


@contextmanager
def traffic_to(services: dict[str, Service]) -> Iterator[Traffic]:
    seen = Traffic({service.name: [] for service in services.values()})
    stop = threading.Event()

    def send(service: Service, url: str) -> None:
        while not stop.is_set():
            seen.replies[service.name].append(chat_reply(url, max_tokens=4, timeout=90))
            stop.wait(0.5)

    threads = [
        threading.Thread(target=send, args=(s, s.service_url()), daemon=True)
        for s in services.values()
    ]
    for thread in threads:
        thread.start()
    try:
        yield seen
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)


def pin(service: Service, tier: str) -> None:
    service.kubectl(
        "annotate", "--overwrite", "inferenceservice", service.name, f"{PIN_TIER}={tier}"
    )


def serves_variant(service: Service, seen: Traffic, variant: Variant) -> bool:
    return (
        service.status().get("activeVariant") == variant
        and seen.last_variants(service.name, 2) == [variant] * 2
    )


@pytest.mark.parametrize("wave", WAVES, ids=["-".join(w) for w in WAVES])
def test_each_family_serves_the_openai_surface_and_swaps_to_int8_and_back(
    cluster: Cluster, zoo_namespace: str, wave: tuple[str, ...]
) -> None:
    with wave_services(cluster, zoo_namespace, wave) as services:
        problems = [p for family, s in services.items() for p in check_openai_surface(family, s)]
        assert not problems, "\n".join(problems)

        with traffic_to(services) as seen:
            for variant, tier in (
                (Variant.FALLBACK, DegradationTier.FALLBACK_MODEL.value),
                (Variant.PRIMARY, "none"),
            ):
                for service in services.values():
                    pin(service, tier)
                for service in services.values():
                    wait_for(
                        f"{service.name} answering from its {variant}",
                        lambda s=service, v=variant: serves_variant(s, seen, v),
                        timeout=300,
                        diagnose=service.diagnose,
                    )
        assert not seen.failures(), seen.failures()[:10]
        answered = {
            name: sum(r.status == 200 for r in replies) for name, replies in seen.replies.items()
        }
        assert all(answered.values()), answered
