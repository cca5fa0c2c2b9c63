"""What constrained decoding costs per step: a row decoded alone, with and without an output
format, on the tiny model (2k vocabulary) and the llama3 zoo model (128k vocabulary).

Reports, per model and format, the median milliseconds of a whole step (forward pass
and choice) and of the token choice alone (`engine.choose_row_token`), next to an
unconstrained greedy row's. Run it niced on a shared machine:

    nice -n 19 python bench/structured_output_bench.py [--steps 48] [--out FILE]

(`make bench` runs it as `structured-output`, writing bench/results/structured-output.json.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from fusebox_server.model import engine
from fusebox_server.model.decode_settings import DecodeSettings
from fusebox_server.model.engine import Decoding, load_model
from fusebox_server.model.structured_output import OutputFormat, vocabulary_of
from fusebox_server.model.tiny_model import ensure_model
from fusebox_server.model.tokenization import load_tokenizer
from fusebox_server.zoo.release import ensure_zoo_model

RESULTS = Path(__file__).resolve().parent / "results" / "structured-output.json"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "kind": {"enum": ["cat", "dog"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "kind", "tags"],
    "additionalProperties": False,
}


def measure(model_dir: Path, steps: int) -> dict[str, Any]:
    tokenizer = load_tokenizer(model_dir)
    started = time.perf_counter()
    vocabulary = vocabulary_of(tokenizer)
    table_ms = (time.perf_counter() - started) * 1000
    loaded = load_model("primary", model_dir, "none", torch.device("cpu"), tokenizer)
    prompt = tuple(tokenizer.backend_tokenizer.encode("Describe a pet as JSON:").ids)
    formats = {
        "none": None,
        "json_object": OutputFormat.json(None),
        "json_schema": OutputFormat.json(SCHEMA),
    }
    results: dict[str, Any] = {"vocabulary": len(vocabulary.token_bytes), "table_ms": table_ms}
    choose = engine.choose_row_token
    for name, output_format in formats.items():
        for temperature in (0.0, 1.0):
            settings = DecodeSettings(steps, temperature, 1.0, 7, (), output_format=output_format)
            row = Decoding(loaded, prompt, settings, vocabulary)
            choice_ms: list[float] = []
            argmax_fit: list[bool] = []

            def timed(
                logits: torch.Tensor,
                decoding: Decoding,
                choice_ms: list[float] = choice_ms,
                argmax_fit: list[bool] = argmax_fit,
            ) -> int:
                begun = time.perf_counter()
                token = choose(logits, decoding)
                choice_ms.append((time.perf_counter() - begun) * 1000)
                greedy = decoding.settings.temperature == 0
                argmax_fit.append(not greedy or token == int(torch.argmax(logits).item()))
                return token

            engine.choose_row_token = timed  # type: ignore[assignment]
            step_ms: list[float] = []
            try:
                for _ in range(steps):
                    begun = time.perf_counter()
                    row.step()
                    step_ms.append((time.perf_counter() - begun) * 1000)
                    if row.document_finished:
                        break
            finally:
                engine.choose_row_token = choose
            key = f"{name}/{'greedy' if temperature == 0 else 'sampled'}"
            # Greedy steps where the model's argmax did not fit the format: the masked path.
            refits = [ms for ms, fit in zip(choice_ms, argmax_fit, strict=True) if not fit]
            results[key] = {
                "steps": len(step_ms),
                "step_ms_median": statistics.median(step_ms[1:] or step_ms),
                "choice_ms_median": statistics.median(choice_ms[1:] or choice_ms),
                "choice_ms_p99": _nearest_rank(choice_ms, 0.99),
                "choice_ms_max": max(choice_ms),
                "refit_choice_ms_p50": _nearest_rank(refits, 0.5) if refits else None,
                "refit_choice_ms_p99": _nearest_rank(refits, 0.99) if refits else None,
                "refits": len(refits),
            }
            print(model_dir.name, key, results[key], flush=True)
    return results


def _nearest_rank(samples: list[float], quantile: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, min(len(ordered) - 1, round(quantile * len(ordered)) - 1))]


def write_results(path: Path, report: dict[str, Any]) -> None:
    """Write this run's keys, keeping the keys other benchmarks put in the same file
    (grammar_engines_bench.py's comparison)."""
    existing = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**existing, **report}, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--out", type=Path, default=RESULTS)
    arguments = parser.parse_args()
    torch.set_num_threads(1)
    report = {
        "tiny": measure(ensure_model("tiny"), arguments.steps),
        "llama3": measure(ensure_zoo_model("llama3"), arguments.steps),
    }
    write_results(arguments.out, report)


if __name__ == "__main__":
    main()
