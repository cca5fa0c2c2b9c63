"""Which engine should enforce `response_format`: the JSON grammar written here
(`model/json_grammar.py`) or a maintained library (xgrammar, llguidance, outlines-core)?

Issue 33 asked for the choice by measurement. Every engine gets the same inputs:
the same tokenizers (the zoo's llama3 and qwen2.5, whose logits are 128k and 152k
wide but whose tokenizers learned ~1k tokens, and a byte-level BPE of 128,000
tokens trained here on the transformers and torch sources, so a realistic number
of tokens is behind the mask), the same schemas (a free `json_object` and three
pydantic models in the strict shape `openai` sends) and the same documents. Per
engine, tokenizer and schema it reports:

- compile: the first compile of a schema (cold) and what a repeat request with
  the same schema pays (cached: the engine's cache or one keyed by the schema,
  plus a new matcher);
- per step, along a fixed valid document tokenized by the tokenizer: the
  allowed-token bitmask filled by the engine, the mask applied to a row of
  logits of the model's width (one torch function for every engine, so only
  the fill differs) and the token consumed; p50 and p99 in microseconds. Ours
  has no token mask: its step is `ConstrainedRow.choose` (the model's argmax
  tried first) with the document's token as the argmax, and with random logits
  (a random model, where the first-byte mask and scans run);
- memory: RSS after import, after the tokenizer is prepared, and per schema
  after its cold compile;
- correctness (llama3 tokenizer): our grammar's unit-test documents, each
  driven token by token, with the verdict (whole / prefix / invalid) next to
  ours; and the keywords ours refuses with a 400, each with a document that
  breaks it: refused, enforced, or ignored by the engine.

Each (engine, tokenizer) runs in a fresh process (cold imports, clean RSS),
niced, with one torch thread and one thread per library. The libraries are not
in the project lock: install them outside it and put them on PYTHONPATH:

    python -m pip install --target /tmp/grammar-libs --no-deps \\
        xgrammar==0.2.8 llguidance==1.9.1 outlines-core==0.2.14 apache-tvm-ffi
    PYTHONPATH=/tmp/grammar-libs nice -n 19 python bench/grammar_engines_bench.py

Results go to bench/results/structured-output.json under "grammar_engines";
docs/decisions/structured-output.md reads them.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.grammar_inputs import (  # noqa: E402  (the repository root is on the path only now)
    FREE_DOCUMENTS,
    PERSON,
    PERSON_DOCUMENTS,
    REFUSED_BY_OURS,
    schemas_and_documents,
)

RESULTS = REPO / "bench" / "results" / "structured-output.json"
RESULTS_KEY = "grammar_engines"
ENGINES = ("ours", "xgrammar", "llguidance", "outlines-core")
LIBRARIES = {"xgrammar": "xgrammar", "llguidance": "llguidance", "outlines-core": "outlines_core"}
DISTRIBUTIONS = {
    "xgrammar": ("xgrammar", "apache-tvm-ffi"),
    "llguidance": ("llguidance",),
    "outlines-core": ("outlines-core",),
}
TOKENIZERS = ("llama3", "qwen2.5", "wide-bpe-128k")
WIDE_VOCAB = 128_000  # learned tokens of the wide tokenizer; its logits are llama3's 128,256
WIDE_WIDTH = 128_256
CACHED_REPEATS = 5

# ----- pure helpers (tests/unit/bench/test_grammar_engines_bench.py) -----


def missing_libraries(engines: Iterable[str] = ENGINES) -> list[str]:
    """The grammar libraries of `engines` this interpreter cannot import (llguidance is in
    the lock; the others are not)."""
    wanted = [LIBRARIES[engine] for engine in engines if engine in LIBRARIES]
    return [module for module in wanted if importlib.util.find_spec(module) is None]


def update_results(path: Path, report: dict[str, Any]) -> None:
    """Put the comparison under RESULTS_KEY, keeping structured_output_bench.py's keys."""
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing[RESULTS_KEY] = report
    path.write_text(json.dumps(existing, indent=2, ensure_ascii=False) + "\n")


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set to -inf, in place, every logit whose bit is 0 in a packed int32 bitmask (bit
    `i % 32` of word `i // 32`: the layout all three libraries fill); ids past the mask
    are masked too. Eager torch, the same for every engine, so only the fill differs."""
    width = logits.shape[-1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().reshape(*bitmask.shape[:-1], -1)
    keep = bits[..., :width]
    logits[..., : keep.shape[-1]].masked_fill_(~keep, -math.inf)
    if keep.shape[-1] < width:
        logits[..., keep.shape[-1] :] = -math.inf


def percentiles_us(samples_seconds: Sequence[float]) -> dict[str, float]:
    """p50 and p99 (nearest rank) of durations, in microseconds."""
    if not samples_seconds:
        return {}
    ordered = sorted(samples_seconds)

    def rank(fraction: float) -> float:
        index = max(0, math.ceil(fraction * len(ordered)) - 1)
        return round(ordered[index] * 1e6, 2)

    return {"p50_us": rank(0.50), "p99_us": rank(0.99), "steps": len(ordered)}


Verdict = Literal["whole", "prefix", "invalid"]


def verdict(consumed_all: bool, accepting: bool) -> Verdict:
    """A document driven token by token: rejected somewhere, a valid prefix, or whole."""
    if not consumed_all:
        return "invalid"
    return "whole" if accepting else "prefix"


def keyword_outcome(compile_error: str | None, breaking_document: Verdict | None) -> str:
    """What an engine does with a keyword ours refuses: refuses it too, enforces it
    (a document that breaks it is not whole), or ignores it (that document is whole)."""
    if compile_error is not None:
        return "refused"
    return "ignored" if breaking_document == "whole" else "enforced"


# ----- the engines, behind one small interface -----


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


class Engine:
    """Prepare for a tokenizer, compile a schema, and drive a matcher token by token,
    filling the packed bitmask of the tokens allowed next."""

    name = ""

    def prepare(self, tokenizer: Any, width: int, vocabulary: Any) -> None:
        raise NotImplementedError

    def compile(self, schema: dict[str, Any]) -> Any:
        raise NotImplementedError

    def start(self, compiled: Any) -> Any:
        raise NotImplementedError

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        raise NotImplementedError

    def advance(self, matcher: Any, token: int) -> bool:
        raise NotImplementedError

    def accepting(self, matcher: Any) -> bool:
        raise NotImplementedError

    def cached(self, schema: dict[str, Any], compiled: Any) -> Any:
        """What a repeat request with the same schema pays: the compiled grammar from a
        cache keyed by the schema's JSON (the engine's own where it has one), a matcher."""
        return self.start(compiled)

    def reported_bytes(self, compiled: Any) -> int | None:
        return None

    def native_apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> bool:
        """The library's own CPU kernel for applying its mask, where it has one that
        needs no `torch.compile` (False: none)."""
        return False


class XGrammar(Engine):
    name = "xgrammar"

    def prepare(self, tokenizer: Any, width: int, vocabulary: Any) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=width)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=True)

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.compiler.compile_json_schema(json.dumps(schema))

    def cached(self, schema: dict[str, Any], compiled: Any) -> Any:
        return self.start(self.compile(schema))  # a hit in the compiler's own cache

    def start(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.fill_next_token_bitmask(bitmask)

    def advance(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def accepting(self, matcher: Any) -> bool:
        return bool(matcher.is_completed())

    def reported_bytes(self, compiled: Any) -> int | None:
        return int(compiled.memory_size_bytes)

    def native_apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> bool:
        self.xgr.apply_token_bitmask_inplace(logits, bitmask, backend="cpu")
        return True


class LLGuidance(Engine):
    name = "llguidance"

    def prepare(self, tokenizer: Any, width: int, vocabulary: Any) -> None:
        import llguidance

        self.llg = llguidance
        # From the tokenizer's JSON, as llguidance.hf.from_tokenizer does; the eos id is
        # left to llguidance: the zoo's sparse vocabularies put it past the learned tokens,
        # which from_tokenizer's explicit eos refuses ("out of range").
        self.tokenizer = llguidance.LLTokenizer(tokenizer.backend_tokenizer.to_str(), n_vocab=width)

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema)
        error = self.llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise ValueError(error)
        return grammar

    def start(self, compiled: Any) -> Any:
        matcher = self.llg.LLMatcher(self.tokenizer, compiled)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def cached(self, schema: dict[str, Any], compiled: Any) -> Any:
        # No compile cache in the library: a server keeps one matcher per schema and
        # copies it for each request.
        key = json.dumps(schema, sort_keys=True)
        prototypes: dict[str, Any] = self.__dict__.setdefault("prototypes", {})
        if key not in prototypes:
            prototypes[key] = self.start(compiled)
        return prototypes[key].deep_copy()

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * 4)

    def advance(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token)) and not matcher.is_error()

    def accepting(self, matcher: Any) -> bool:
        return bool(matcher.is_accepting())


class OutlinesCore(Engine):
    name = "outlines-core"

    def prepare(self, tokenizer: Any, width: int, vocabulary: Any) -> None:
        import outlines_core

        self.oc = outlines_core
        # Each token's bytes from our table (Vocabulary.from_pretrained downloads).
        by_bytes: dict[bytes, list[int]] = {}
        for token_id, data in enumerate(vocabulary.token_bytes):
            if data is not None:
                by_bytes.setdefault(data, []).append(token_id)
        self.vocabulary = outlines_core.Vocabulary(_end_id(tokenizer), by_bytes)

    def compile(self, schema: dict[str, Any]) -> Any:
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Index(regex, self.vocabulary)

    def start(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor) -> None:
        matcher.write_mask_into(bitmask.data_ptr(), bitmask.numel(), 4)

    def advance(self, matcher: Any, token: int) -> bool:
        try:
            matcher.advance(token)
        except ValueError:
            return False
        return True

    def accepting(self, matcher: Any) -> bool:
        return bool(matcher.is_finished())


def _end_id(tokenizer: Any) -> int:
    end = tokenizer.eos_token_id
    return int(end[0] if isinstance(end, list) else end)


def _tokens(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)


def drive(engine: Engine, matcher: Any, tokens: Sequence[int], width: int) -> dict[str, Any]:
    """Fill, apply and consume along `tokens`; per-step times and whether all were taken."""
    bitmask = torch.full((1, (width + 31) // 32), -1, dtype=torch.int32)
    generator = torch.Generator().manual_seed(7)
    fill_s: list[float] = []
    apply_s: list[float] = []
    advance_s: list[float] = []
    mask_s: list[float] = []
    argmax_s: list[float] = []
    native_s: list[float] = []
    allowed: list[int] = []
    consumed = 0
    for token in tokens:
        logits = torch.randn((1, width), generator=generator)
        begun = time.perf_counter()
        engine.fill(matcher, bitmask)
        filled = time.perf_counter()
        apply_bitmask(logits, bitmask)
        applied = time.perf_counter()
        fill_s.append(filled - begun)
        apply_s.append(applied - filled)
        mask_s.append(applied - begun)
        begun = time.perf_counter()
        torch.argmax(logits)
        argmax_s.append(time.perf_counter() - begun)
        unmasked = torch.randn((1, width), generator=generator)
        begun = time.perf_counter()
        if engine.native_apply(unmasked, bitmask):
            native_s.append(time.perf_counter() - begun)
        if logits[0, token] == -math.inf:
            break  # the engine would never let the model write this document
        allowed.append(int(torch.isfinite(logits).sum()))
        begun = time.perf_counter()
        taken = engine.advance(matcher, token)
        advance_s.append(time.perf_counter() - begun)
        if not taken:
            break
        consumed += 1
    return {
        "tokens": len(tokens),
        "consumed": consumed,
        "whole": consumed == len(tokens) and engine.accepting(matcher),
        "fill": percentiles_us(fill_s),
        "apply": percentiles_us(apply_s),
        "mask": percentiles_us(mask_s),
        "argmax": percentiles_us(argmax_s),
        "native_apply": percentiles_us(native_s),
        "advance": percentiles_us(advance_s),
        "allowed_tokens_median": statistics.median(allowed) if allowed else 0,
    }


def drive_ours(
    schema: dict[str, Any], tokenizer: Any, vocabulary: Any, tokens: Sequence[int], width: int
) -> dict[str, Any]:
    """Ours per step: `ConstrainedRow.choose` (greedy) on the document's token as the argmax
    (the model agrees), and on random logits (a random model: masks and scans), then `took`."""
    from fusebox_server.model.structured_output import ConstrainedRow, OutputFormat

    output_format = OutputFormat.json(None if schema == {"type": "object"} else schema)
    results: dict[str, Any] = {"tokens": len(tokens)}
    for case in ("agrees", "random"):
        row = ConstrainedRow(output_format, vocabulary, [_end_id(tokenizer)], len(tokens) + 64)
        generator = torch.Generator().manual_seed(7)
        choose_s: list[float] = []
        took_s: list[float] = []
        consumed = 0
        for token in tokens:
            logits = torch.randn((width,), generator=generator)
            if case == "agrees":
                logits[token] = 100.0
            begun = time.perf_counter()
            chosen = row.choose(logits, None)
            choose_s.append(time.perf_counter() - begun)
            if case == "agrees" and chosen != token:
                break
            if not row.allows(token, budgeted=False):
                break
            begun = time.perf_counter()
            row.took(token)
            took_s.append(time.perf_counter() - begun)
            consumed += 1
        results[case] = {
            "consumed": consumed,
            "whole": consumed == len(tokens) and row.complete,
            "choose": percentiles_us(choose_s),
            "advance": percentiles_us(took_s),
        }
    return results


class Ours(Engine):
    """Our grammar behind the same interface, for the compile and correctness figures
    (its steps are measured by `drive_ours`: it has no token mask)."""

    name = "ours"

    def prepare(self, tokenizer: Any, width: int, vocabulary: Any) -> None:
        from fusebox_server.model.structured_output import OutputFormat

        self.output_format = OutputFormat
        self.vocabulary = vocabulary
        self.end_ids = [_end_id(tokenizer)]
        self.cache: dict[str, Any] = {}

    def compile(self, schema: dict[str, Any]) -> Any:
        return self.output_format.json(None if schema == {"type": "object"} else schema)

    def cached(self, schema: dict[str, Any], compiled: Any) -> Any:
        key = json.dumps(schema, sort_keys=True)
        return self.start(self.cache.setdefault(key, compiled))

    def start(self, compiled: Any) -> Any:
        from fusebox_server.model.structured_output import ConstrainedRow

        return ConstrainedRow(compiled, self.vocabulary, self.end_ids, 1 << 20)

    def advance(self, matcher: Any, token: int) -> bool:
        if not matcher.allows(token, budgeted=False):
            return False
        matcher.took(token)
        return True

    def accepting(self, matcher: Any) -> bool:
        return bool(matcher.complete)


ENGINE_CLASSES: dict[str, Callable[[], Engine]] = {
    "ours": Ours,
    "xgrammar": XGrammar,
    "llguidance": LLGuidance,
    "outlines-core": OutlinesCore,
}


def judged(engine: Engine, compiled: Any, tokenizer: Any, text: str) -> Verdict:
    matcher = engine.start(compiled)
    tokens = _tokens(tokenizer, text)
    taken = all(engine.advance(matcher, token) for token in tokens)
    return verdict(taken, taken and engine.accepting(matcher))


def our_verdict(schema: dict[str, Any] | None, text: str) -> Verdict:
    """The server's verdict (`ConstrainedRow`: llguidance's matcher and our closing
    bookkeeping), byte by byte, whatever a tokenizer would make of the text."""
    from fusebox_server.model.structured_output import ConstrainedRow, OutputFormat

    row = ConstrainedRow(OutputFormat.json(schema), _byte_vocabulary(), (), 1 << 20)
    for byte in text.encode("utf-8"):
        if not row.allows(byte, budgeted=False):
            return "invalid"
        row.took(byte)
    return "whole" if row.complete else "prefix"


@functools.lru_cache(maxsize=1)
def _byte_vocabulary() -> Any:
    from fusebox_server.model.structured_output import vocabulary_from_bytes

    return vocabulary_from_bytes([bytes([byte]) for byte in range(256)])


def correctness(engine: Engine, tokenizer: Any) -> dict[str, Any]:
    """Our test documents: the engine's verdict where it differs from ours; the keywords
    ours refuses: refused, enforced or ignored."""
    differences: list[dict[str, str]] = []
    checked = 0
    for schema, texts in (({"type": "object"}, FREE_DOCUMENTS), (PERSON, PERSON_DOCUMENTS)):
        compiled = engine.compile(schema)
        for text in texts:
            ours = our_verdict(None if schema == {"type": "object"} else schema, text)
            theirs = judged(engine, compiled, tokenizer, text)
            checked += 1
            if theirs != ours:
                differences.append({"document": text, "ours": ours, "engine": theirs})
    keywords: dict[str, str] = {}
    for keyword, schema, breaking in REFUSED_BY_OURS:
        try:
            compiled = engine.compile(schema)
            engine.start(compiled)
        except Exception as error:  # each library has its own error type
            keywords[keyword] = keyword_outcome(str(error)[:160], None)
            continue
        keywords[keyword] = keyword_outcome(None, judged(engine, compiled, tokenizer, breaking))
    return {"documents": checked, "differences": differences, "refused_keywords": keywords}


# ----- tokenizers -----


def wide_tokenizer_dir() -> Path:
    """A byte-level BPE of WIDE_VOCAB tokens (llama3's split and byte alphabet) trained
    on the transformers and torch sources, built once into the cache: the zoo's
    tokenizers learned ~1k tokens, and a mask's cost grows with the tokens behind it."""
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from fusebox_server.zoo.release import ensure_zoo_model

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    target = cache / "fusebox" / "bench" / f"wide-bpe-{WIDE_VOCAB}"
    if (target / "tokenizer.json").exists():
        return target
    zoo = json.loads((ensure_zoo_model("llama3") / "tokenizer.json").read_text())
    split = zoo["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    sources = [Path(transformers.__file__).parent, Path(torch.__file__).parent]
    files = sorted(str(path) for source in sources for path in source.rglob("*.py"))
    trainer = trainers.BpeTrainer(
        vocab_size=WIDE_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|end_of_text|>"],
        show_progress=False,
    )
    tokenizer.train(files, trainer)
    target.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|end_of_text|>"})
    )
    return target


def load(name: str) -> tuple[Any, int]:
    """The tokenizer and the width of the model's logits row."""
    from fusebox_server.model.tokenization import load_tokenizer
    from fusebox_server.zoo.release import ensure_zoo_model

    if name == "wide-bpe-128k":
        return load_tokenizer(wide_tokenizer_dir()), WIDE_WIDTH
    directory = ensure_zoo_model(name)
    width = json.loads((directory / "config.json").read_text())["vocab_size"]
    return load_tokenizer(directory), int(width)


# ----- one (engine, tokenizer) in this process -----


def measure(engine_name: str, tokenizer_name: str, check: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    from fusebox_server.model.structured_output import vocabulary_of

    tokenizer, width = load(tokenizer_name)
    begun = time.perf_counter()
    vocabulary = vocabulary_of(tokenizer)  # ours's token table; outlines-core's input
    table_ms = (time.perf_counter() - begun) * 1000
    base = rss_bytes()
    begun = time.perf_counter()
    engine = ENGINE_CLASSES[engine_name]()
    engine.prepare(tokenizer, width, vocabulary)
    report: dict[str, Any] = {
        "width": width,
        "tokenizer_tokens": len(tokenizer),
        "token_table_ms": round(table_ms, 2),
        "prepare_ms": round((time.perf_counter() - begun) * 1000, 2),
        "prepare_rss_mib": round((rss_bytes() - base) / 2**20, 1),
        "schemas": {},
    }
    for schema_name, (schema, document) in schemas_and_documents().items():
        before = rss_bytes()
        begun = time.perf_counter()
        compiled = engine.compile(schema)
        matcher = engine.start(compiled)
        cold_s = time.perf_counter() - begun
        grown = rss_bytes() - before
        repeats: list[float] = []
        for _ in range(CACHED_REPEATS):
            begun = time.perf_counter()
            engine.cached(schema, compiled)
            repeats.append(time.perf_counter() - begun)
        tokens = _tokens(tokenizer, document)
        if engine_name == "ours":
            steps = drive_ours(schema, tokenizer, vocabulary, tokens, width)
        else:
            steps = drive(engine, matcher, tokens, width)
        report["schemas"][schema_name] = {
            "compile_cold_ms": round(cold_s * 1000, 3),
            "compile_cached_ms": round(statistics.median(repeats) * 1000, 3),
            "compile_rss_kib": round(grown / 1024),
            "reported_bytes": engine.reported_bytes(compiled),
            **steps,
        }
    report["rss_mib"] = round(rss_bytes() / 2**20, 1)
    if check:
        report["correctness"] = correctness(engine, tokenizer)
    return report


def _versions() -> dict[str, str]:
    found = {}
    for names in DISTRIBUTIONS.values():
        for name in names:
            try:
                distribution = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                continue
            size = sum(file.size or 0 for file in distribution.files or ())
            found[name] = f"{distribution.version} ({size / 2**20:.1f} MiB installed)"
    for name in ("torch", "transformers", "tokenizers"):
        found[name] = importlib.metadata.version(name)
    return found


def _child(engine: str, tokenizer: str, check: bool) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", engine, tokenizer]
    if check:
        command.append("--check")
    environ = {**os.environ, "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=environ, timeout=1800)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="*", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--tokenizers", nargs="*", default=list(TOKENIZERS), choices=TOKENIZERS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "TOKENIZER"))
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args(list(argv) if argv is not None else None)
    if arguments.child:
        engine, tokenizer = arguments.child
        print(json.dumps(measure(engine, tokenizer, arguments.check)))
        return
    missing = missing_libraries(arguments.engines)
    if missing:
        sys.exit(f"not importable: {', '.join(missing)} (see this file's docstring)")
    random.seed(7)
    report: dict[str, Any] = {
        "host": {
            "cpus": os.cpu_count(),
            "load_average_before": os.getloadavg(),
            "niceness": os.nice(0),
            "versions": _versions(),
        },
        "runs": {},
    }
    for tokenizer in arguments.tokenizers:
        for engine in arguments.engines:
            check = tokenizer == "llama3"
            result = _child(engine, tokenizer, check)
            report["runs"].setdefault(tokenizer, {})[engine] = result
            print(tokenizer, engine, json.dumps(result)[:400], flush=True)
    report["host"]["load_average_after"] = os.getloadavg()
    update_results(arguments.out, report)


if __name__ == "__main__":
    main()
