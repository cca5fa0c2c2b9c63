"""The prefix cache in a real server, through the official openai client.

Two conversations share a system prompt and differ after it, as 30% of the
realistic workload does. The first is prefilled whole and cached; the second
starts from the cached system prompt (a hit in the stats file, with the
tokens it reused), and its greedy answer is exactly the answer the same
request gets once the `empty_cache` admin action has emptied the cache and
its prompt is prefilled whole. Llama 3's shape: GQA, a 128k vocabulary.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fusebox_server_harness import MODEL_NAME, ServerProcess, zoo_server
from test_memory_guard import MemoryCgroup

from fusebox_contract.names import ActionType

FAMILY = "llama3"
# The guard's ratio for the shedding test, and the pressure the test puts the server at:
# within 10 points of the guard (so the cache is shed) and under it (so nothing is refused).
GUARD_RATIO = 0.7
SHEDDING_PRESSURE = 0.65
SYSTEM = (
    "You are the on-call assistant of a platform team. Answer in two short sentences, "
    "name the runbook section you rely on, and say so when you do not know. "
    "你好，请用中文或英文回答。 def handler(event): return event['body']"
)
QUESTIONS = ("How do I drain a node safely?", "Why did my pod get OOMKilled at night?")
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def server(server_workdir: Path) -> Iterator[ServerProcess]:
    with zoo_server(FAMILY, server_workdir, max_new_tokens=64) as process:
        yield process


def _prefix_cache(server: ServerProcess, after: float) -> dict[str, Any]:
    """The stats file's prefix cache block, from a write after `after` (the server's clock)."""

    def fresh() -> dict[str, Any] | None:
        stats = server.stats()
        return stats["prefix_cache"] if stats["written_at"] > after else None

    found: dict[str, Any] = server.wait_for(fresh, what="a stats write")
    return found


def _ask(client: openai.OpenAI, question: str, stream: bool) -> str:
    messages: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    if not stream:
        response = client.chat.completions.create(
            model=MODEL_NAME, messages=messages, max_tokens=NEW_TOKENS, temperature=0
        )
        return response.choices[0].message.content or ""
    chunks = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=NEW_TOKENS, temperature=0, stream=True
    )
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


def test_a_shared_system_prompt_is_a_hit_that_answers_what_a_whole_prefill_answers(
    server: ServerProcess,
) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    before = _prefix_cache(server, 0.0)
    assert before["capacity_bytes"] == 1 << 30  # the documented default

    _ask(client, QUESTIONS[0], stream=False)
    hit_text = _ask(client, QUESTIONS[1], stream=True)
    started = server.stats()["written_at"]
    after_hit = _prefix_cache(server, started)
    assert after_hit["hits_total"] == before["hits_total"] + 1
    assert after_hit["misses_total"] == before["misses_total"] + 1
    assert after_hit["reused_tokens_total"] - before["reused_tokens_total"] >= 32
    assert after_hit["bytes"] > 0 and after_hit["entries"] >= 1

    result = server.act(ActionType.EMPTY_CACHE)
    assert result.type == ActionType.EMPTY_CACHE
    emptied = _prefix_cache(server, server.stats()["written_at"])
    assert (emptied["bytes"], emptied["entries"]) == (0, 0)
    assert emptied["evictions_total"] >= after_hit["entries"]

    whole_text = _ask(client, QUESTIONS[1], stream=False)
    final = _prefix_cache(server, server.stats()["written_at"])
    assert final["hits_total"] == after_hit["hits_total"]  # prefilled whole: a miss
    assert final["misses_total"] == after_hit["misses_total"] + 1
    assert hit_text == whole_text
    assert hit_text  # the model said something to compare


def test_unload_and_reload_leave_the_cache_empty_and_the_next_prompt_misses(
    server: ServerProcess,
) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    _ask(client, QUESTIONS[0], stream=False)
    held = _prefix_cache(server, server.stats()["written_at"])
    assert held["bytes"] > 0

    server.act(ActionType.UNLOAD)
    unloaded = _prefix_cache(server, server.stats()["written_at"])
    assert (unloaded["bytes"], unloaded["entries"]) == (0, 0)
    server.act(ActionType.LOAD)
    server.wait_ready()

    _ask(client, QUESTIONS[0], stream=False)  # cached before the unload: no longer
    after = _prefix_cache(server, server.stats()["written_at"])
    assert after["misses_total"] == unloaded["misses_total"] + 1
    assert after["hits_total"] == unloaded["hits_total"]


def test_memory_nearing_the_guard_sheds_the_cache_while_requests_are_still_served(
    start_server: Any,
) -> None:
    """The cgroup's limit is lowered under a running server (the guard reads it on every
    check) until its memory is 65% of it: 10 points under the guard's 70% the cache goes,
    and the guard, not reached, refuses nothing."""
    cgroup = MemoryCgroup.create(64 << 30)
    procs = str(cgroup.procs)

    def join_cgroup() -> None:
        with open(procs, "w") as handle:
            handle.write(str(os.getpid()))

    server: ServerProcess = start_server(
        flags={"memory-guard-ratio": GUARD_RATIO}, preexec=join_cgroup
    )
    try:
        for question in QUESTIONS:
            assert server.chat(f"{SYSTEM} {question}").status_code == 200
        held = _prefix_cache(server, server.stats()["written_at"])
        assert held["bytes"] > 0

        stats = server.stats()
        used = max(stats["rss_bytes"], stats["cgroup_memory_usage_bytes"])
        limit = int(used / SHEDDING_PRESSURE)
        limit_file = "memory.limit_in_bytes" if cgroup.version == 1 else "memory.max"
        (cgroup.path / limit_file).write_text(str(limit))

        shed = server.wait_for(
            lambda: (lambda cache: cache if cache["bytes"] == 0 else None)(
                server.stats()["prefix_cache"]
            ),
            what="the prefix cache shed",
        )
        assert shed["evictions_total"] >= held["entries"]
        seen_limit = server.stats()["cgroup_memory_limit_bytes"]
        assert limit - 4096 < seen_limit <= limit  # the kernel rounds to a page
        assert not server.stats()["state"]["memory_guard_active"]
        assert server.chat("still served").status_code == 200
    finally:
        server.stop()
        cgroup.remove()
