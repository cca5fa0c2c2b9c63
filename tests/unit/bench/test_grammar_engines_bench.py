"""bench/grammar_engines_bench.py's own logic, without the grammar libraries (they are not
in the lock): the mask every engine's bitmask goes through, the figures, the verdicts,
the results file shared with structured_output_bench.py, and the suite's skip."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import structured_output_bench
from bench.grammar_engines_bench import (
    RESULTS_KEY,
    apply_bitmask,
    keyword_outcome,
    percentiles_us,
    update_results,
    verdict,
)
from bench.grammar_inputs import REFUSED_BY_OURS, schemas_and_documents

REPO = Path(__file__).resolve().parents[3]


def test_the_bitmask_keeps_exactly_the_tokens_whose_bit_is_set() -> None:
    width = 70  # three words, the last one partly past the row
    allowed = {0, 5, 31, 32, 63, 64, 69}
    words = [0, 0, 0]
    for token in allowed:
        words[token // 32] |= 1 << (token % 32)
    bitmask = torch.tensor([[word - (1 << 32) if word >= 1 << 31 else word for word in words]])
    logits = torch.zeros((1, width))

    apply_bitmask(logits, bitmask.to(torch.int32))

    kept = {token for token in range(width) if math.isfinite(logits[0, token].item())}
    assert kept == allowed


def test_ids_past_the_bitmask_are_masked() -> None:
    logits = torch.zeros((1, 40))

    apply_bitmask(logits, torch.full((1, 1), -1, dtype=torch.int32))

    assert torch.isfinite(logits[0, :32]).all()
    assert torch.isinf(logits[0, 32:]).all()


def test_percentiles_are_nearest_rank_in_microseconds() -> None:
    samples = [n / 1e6 for n in range(1, 201)]  # 1..200 us

    figures = percentiles_us(samples)

    assert figures == {"p50_us": 100.0, "p99_us": 198.0, "steps": 200}
    assert percentiles_us([]) == {}


@pytest.mark.parametrize(
    ("consumed_all", "accepting", "expected"),
    [(False, False, "invalid"), (True, False, "prefix"), (True, True, "whole")],
)
def test_a_driven_document_is_whole_a_prefix_or_invalid(
    consumed_all: bool, accepting: bool, expected: str
) -> None:
    assert verdict(consumed_all, accepting) == expected


def test_a_keyword_is_refused_enforced_or_ignored() -> None:
    assert keyword_outcome("unsupported keyword: pattern", None) == "refused"
    assert keyword_outcome(None, "invalid") == "enforced"
    assert keyword_outcome(None, "prefix") == "enforced"
    assert keyword_outcome(None, "whole") == "ignored"


def test_both_benchmarks_keep_each_others_keys_in_the_results_file(tmp_path: Path) -> None:
    results = tmp_path / "structured-output.json"
    structured_output_bench.write_results(results, {"tiny": {"table_ms": 1.0}})

    update_results(results, {"runs": {}})
    structured_output_bench.write_results(results, {"llama3": {"table_ms": 2.0}})

    assert json.loads(results.read_text()) == {
        "tiny": {"table_ms": 1.0},
        RESULTS_KEY: {"runs": {}},
        "llama3": {"table_ms": 2.0},
    }


def test_without_the_libraries_the_suite_skips_the_comparison_with_the_reason() -> None:
    environ = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    listing = subprocess.run(
        [sys.executable, "-m", "bench", "--list", "grammar-engines"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert listing.returncode == 0, listing.stderr
    assert "grammar-engines: skip:" in listing.stdout
    assert "not in the project lock" in listing.stdout


def test_every_input_document_is_whole_under_our_grammar() -> None:
    from bench.grammar_engines_bench import our_verdict

    for name, (schema, document) in schemas_and_documents().items():
        ours = None if schema == {"type": "object"} else schema
        assert our_verdict(ours, document) == "whole", name
        assert len(document) > 300, name  # a few hundred decode steps


LLGUIDANCE_REFUSES = {"uniqueItems", "oneOf", "not", "if/then"}


@pytest.mark.parametrize(
    ("keyword", "schema", "breaking"),
    REFUSED_BY_OURS,
    ids=[keyword for keyword, _, _ in REFUSED_BY_OURS],
)
def test_every_keyword_the_old_grammar_refused_is_now_enforced_or_refused_by_name(
    keyword: str, schema: dict[str, Any], breaking: str
) -> None:
    from bench.grammar_engines_bench import our_verdict
    from fusebox_server.model.json_grammar import OutputFormat, UnsupportedSchema

    json.loads(breaking)  # the document that breaks it is JSON: only the keyword rules it out
    if keyword in LLGUIDANCE_REFUSES:
        with pytest.raises(UnsupportedSchema) as caught:
            OutputFormat.json(schema)
        assert keyword.split("/")[0] in str(caught.value) or "oneOf" in str(caught.value)
    else:
        assert our_verdict(schema, breaking) != "whole"
