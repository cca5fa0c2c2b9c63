"""Writes a deterministic Llama-architecture model and its tokenizer to a directory.

Why: tests, the demo and the benchmarks need a real transformers model that
loads with `local_files_only=True`, but nothing may be downloaded. The weights
are random with a fixed seed (the text is gibberish, yet reproducible); the
byte-level BPE tokenizer is trained on English and Chinese text shipped in
`fusebox_server/model/corpus/`, which includes the template prompts, so those encode
to few tokens. The same arguments give the same files byte for byte.

Greedy decoding must produce text: the output rows of the special tokens are
zeroed, so their logits are exactly 0 while the best ordinary token's logit is
positive, and the model never ends a generation early or emits only markup.

    python -m fusebox_server.model.tiny_model OUT [--size tiny|small]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

SEED = 20261129
END_OF_TEXT = "<|endoftext|>"
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"
SPECIAL_TOKENS = (END_OF_TEXT, TURN_START, TURN_END)
TOKENIZER_VOCAB_SIZE = 2048

# ChatML: each turn is "<|im_start|>role\ncontent<|im_end|>\n".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int


SIZES = {
    # About 1.3M parameters, mostly in the linear layers so that int8 weight-only
    # quantization visibly shrinks it (embeddings stay float32).
    "tiny": ModelSize(
        hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4
    ),
    # About 27M parameters: the benchmark model (FACTS.md measures this shape).
    "small": ModelSize(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8
    ),
}


def corpus_texts() -> list[str]:
    """The bundled training text, in a fixed order."""
    corpus = resources.files("fusebox_server.model") / "corpus"
    return [(corpus / name).read_text(encoding="utf-8") for name in ("english.txt", "chinese.txt")]


def generator_fingerprint() -> str:
    """A short hash of this generator and its corpus: a cache key for generated models."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for text in corpus_texts():
        digest.update(text.encode("utf-8"))
    return digest.hexdigest()[:16]


def _train_tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for text in corpus_texts() for line in text.splitlines() if line.strip()]
    tokenizer.train_from_iterator(lines, trainer=trainer)
    return tokenizer


def make_greedy_text(model: Any, tokenizer: Any) -> None:
    """Zero the output rows of the special tokens and of the padding beyond the
    tokenizer, and decode greedily: generation then yields ordinary tokens and
    never ends early (the module docstring says why)."""
    import torch

    with torch.no_grad():
        for token in SPECIAL_TOKENS:
            model.lm_head.weight[tokenizer.convert_tokens_to_ids(token)].zero_()
        # Padding rows beyond the tokenizer never win either.
        model.lm_head.weight[len(tokenizer) :].zero_()
    model.generation_config.do_sample = False


def write_model(out_dir: Path, size: str = "tiny") -> Path:
    """Write model, tokenizer and chat template into out_dir (replaced atomically)."""
    import torch
    import transformers

    LlamaConfig: Any = transformers.LlamaConfig
    LlamaForCausalLM: Any = transformers.LlamaForCausalLM
    PreTrainedTokenizerFast: Any = transformers.PreTrainedTokenizerFast

    shape = SIZES[size]
    backend = _train_tokenizer()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=TURN_END,
        pad_token=END_OF_TEXT,
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
    )
    special_ids = [tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS]
    vocab_size = -(-len(tokenizer) // 64) * 64
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_attention_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=[tokenizer.convert_tokens_to_ids(TURN_END), special_ids[0]],
        pad_token_id=special_ids[0],
        dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    make_greedy_text(model, tokenizer)

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        staging.chmod(0o755)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return out_dir


def ensure_model(size: str = "tiny", cache_dir: Path | None = None) -> Path:
    """The model for `size` under the cache (FUSEBOX_CACHE/models/SIZE-FINGERPRINT), made once.

    Keyed by the generator's fingerprint, so a change to this file or the
    corpus makes a new model; a file lock lets parallel processes share it.
    """
    import fcntl

    root = cache_dir or Path(os.environ.get("FUSEBOX_CACHE", Path.home() / ".cache" / "fusebox"))
    target = root / "models" / f"{size}-{generator_fingerprint()}"
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "model.safetensors").exists():
            write_model(target, size)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fusebox_server.model.tiny_model", description=__doc__
    )
    parser.add_argument("out", type=Path, help="directory to write (replaced if present)")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = parser.parse_args(argv)
    write_model(args.out, args.size)
    print(args.out)


if __name__ == "__main__":
    main()
