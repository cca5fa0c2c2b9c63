"""Writes a family's checkpoint laid out as a release, and caches it per generator fingerprint.

Why: a server that only ever loaded `save_pretrained`'s one file has never
seen a release: sharded safetensors with `model.safetensors.index.json`,
`config.json` naming its `torch_dtype`, a `generation_config.json` whose
eos is a list, and the tokenizer's three files. The weights are random with
a fixed seed (the text is gibberish, yet reproducible) in float32, so CPU
tests can hold Fusebox's greedy tokens to transformers' exactly.

As in `tiny_model`, the output rows of the special tokens and of the unused
ids are zeroed, so greedy decoding yields ordinary text and never ends
early (for tied families that zeroes those input embeddings too).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, Final

from fusebox_server.zoo.families import FAMILIES, Family
from fusebox_server.zoo.tokenizer_training import transformers_tokenizer, zoo_corpus

SEED: Final = 20261205
# Every release here has at least this many weight shards (`model.safetensors.index.json`).
SHARDS: Final = 2
INDEX: Final = "model.safetensors.index.json"


def generator_fingerprint() -> str:
    """A short hash of the zoo's code and corpus: a cache key for generated releases."""
    digest = hashlib.sha256()
    package = resources.files("fusebox_server.zoo")
    for name in sorted(entry.name for entry in package.iterdir() if entry.name.endswith(".py")):
        digest.update((package / name).read_bytes())
    for line in zoo_corpus():
        digest.update(line.encode("utf-8"))
    return digest.hexdigest()[:16]


def _config(family: Family) -> Any:
    import transformers

    config_class: Any = getattr(transformers, family.config_class)
    return config_class(**family.config, dtype="float32")


def _quiet_specials(model: Any, tokenizer: Any, family: Family) -> None:
    """Zero the output rows of the special tokens and of every id the tokenizer lacks."""
    import torch

    used = set(tokenizer.get_vocab().values()) - set(family.special_tokens.values())
    silent = torch.ones(family.vocab_size, dtype=torch.bool)
    silent[sorted(used)] = False
    with torch.no_grad():
        model.get_output_embeddings().weight[silent] = 0.0


def _shard_size(model: Any) -> int:
    """A shard size that splits the weights into at least `SHARDS` files."""
    total = sum(int(p.numel() * p.element_size()) for p in model.state_dict().values())
    return total // (SHARDS + 1) + 1


def _as_released(directory: Path, family: Family) -> None:
    """The config names its `torch_dtype` as releases do, and the special-tokens map exists."""
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["torch_dtype"] = config.pop("dtype", "float32")
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    specials = {
        key: value
        for key, value in {
            "bos_token": family.bos_token,
            "eos_token": family.eos_token,
            "pad_token": family.pad_token,
            "unk_token": "<unk>" if "<unk>" in family.special_tokens else None,
        }.items()
        if value is not None
    }
    specials["additional_special_tokens"] = [  # type: ignore[assignment]
        token
        for token in family.special_tokens
        if token not in specials.values() and token not in family.plain_tokens
    ]
    (directory / "special_tokens_map.json").write_text(
        json.dumps(specials, indent=2) + "\n", encoding="utf-8"
    )


def write_release(family_name: str, out_dir: Path) -> Path:
    """Write `family_name`'s release into out_dir (replaced atomically)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    family = FAMILIES[family_name]
    tokenizer = transformers_tokenizer(family)
    torch.manual_seed(SEED)
    auto: Any = AutoModelForCausalLM
    model: Any = auto.from_config(_config(family), dtype=torch.float32)
    _quiet_specials(model, tokenizer, family)
    generation = model.generation_config
    generation.eos_token_id = list(family.generation_eos)
    generation.bos_token_id = family.config.get("bos_token_id")
    if family.pad_token is not None:
        generation.pad_token_id = family.token_id(family.pad_token)

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        staging.chmod(0o755)
        model.save_pretrained(staging, max_shard_size=_shard_size(model))
        tokenizer.save_pretrained(staging)
        _as_released(staging, family)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return out_dir


def cache_root(cache_dir: Path | None = None) -> Path:
    return cache_dir or Path(os.environ.get("FUSEBOX_CACHE", Path.home() / ".cache" / "fusebox"))


def ensure_zoo_model(family_name: str, cache_dir: Path | None = None) -> Path:
    """The family's release under the cache, made once.

    The directory is FUSEBOX_CACHE/models/zoo-FAMILY-FINGERPRINT.

    Keyed by the generator's fingerprint, so a change to the zoo or its corpus
    makes a new release; a file lock lets parallel processes share it.
    """
    if family_name not in FAMILIES:
        raise KeyError(f"no family {family_name!r} in the zoo (families: {', '.join(FAMILIES)})")
    root = cache_root(cache_dir)
    target = root / "models" / f"zoo-{family_name}-{generator_fingerprint()}"
    if (target / INDEX).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / INDEX).exists():
            write_release(family_name, target)
    return target
