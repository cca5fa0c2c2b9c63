"""Tokenizers of each family's kind, trained here, with special tokens at the real ids.

Why: the tokenizer is where a server meets a family first (special tokens in
the template, byte-level pieces of one Chinese character, SentencePiece
byte-fallback pieces of an emoji, a 256k vocabulary with a few thousand
learned tokens). Two kinds, built with the `tokenizers` library:

- byte-level BPE (Llama 3, Qwen): a regex split into words, numbers and
  punctuation, then bytes mapped to printable characters; every text
  encodes, nothing is unknown;
- SentencePiece-style BPE with byte fallback (Mistral, Gemma, Phi-3): spaces
  become "▁", and a character the vocabulary lacks becomes its UTF-8 bytes
  as the tokens "<0x00>".."<0xFF>", which the decoder fuses back.

A small vocabulary is learned from the corpus (English, Chinese, emoji), then
the vocabulary is laid out as the family lays its own out: the special
tokens and the byte tokens at the family's ids, the learned tokens in the
ids left free. The ids between the learned tokens and the specials are
unused, as reserved ids are in a real vocabulary; the config's vocab_size is
the family's.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Final

from fusebox_server.model.tiny_model import corpus_texts
from fusebox_server.zoo.families import Family

# Learned tokens beyond the alphabet (the corpus is a few kB).
LEARNED_VOCAB: Final = 1024
METASPACE: Final = "▁"


def zoo_corpus() -> list[str]:
    """The model's corpus (English, Chinese) and the zoo's emoji lines, as lines."""
    emoji = (resources.files("fusebox_server.zoo") / "emoji.txt").read_text(encoding="utf-8")
    return [line for text in [*corpus_texts(), emoji] for line in text.splitlines() if line.strip()]


def _split_pattern(digits_per_token: int) -> str:
    """Words with their leading space or mark, numbers, punctuation runs, newlines, spaces."""
    return (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
        r"|[^\r\n\p{L}\p{N}]?\p{L}+"
        rf"|\p{{N}}{{1,{digits_per_token}}}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+"
        r"|\s+(?!\S)"
        r"|\s+"
    )


def _learned(trained: Any) -> tuple[list[str], list[tuple[str, str]]]:
    """A trained BPE's tokens in id order, and its merges."""
    import json

    model = json.loads(trained.to_str())["model"]
    tokens = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]
    return tokens, [(left, right) for left, right in merges]


def _laid_out(family: Family, learned: list[str], fixed: dict[str, int]) -> dict[str, int]:
    """`fixed` tokens at their ids, the learned ones in order in the ids left free."""
    vocab = dict(fixed)
    taken = set(fixed.values())
    next_id = 0
    for token in learned:
        if token in vocab:
            continue
        while next_id in taken:
            next_id += 1
        vocab[token] = next_id
        taken.add(next_id)
    if max(vocab.values()) >= family.vocab_size:
        raise ValueError(f"{family.name}: the tokenizer does not fit a {family.vocab_size} vocab")
    return vocab


def _add_family_tokens(tokenizer: Any, family: Family) -> None:
    """The family's added tokens at their ids: special ones (never split, dropped when
    decoding skips specials) and the plain ones its release decodes as text."""
    from tokenizers import AddedToken

    ordered = sorted(family.special_tokens, key=family.special_tokens.__getitem__)
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t in ordered
            if t not in family.plain_tokens
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t in ordered
            if t in family.plain_tokens
        ]
    )


def _with_bos(tokenizer: Any, family: Family) -> None:
    """Encoding with special tokens prepends the family's bos, as its tokenizer does."""
    from tokenizers import processors

    if family.bos_token is None:
        return
    bos = family.bos_token
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {bos} $B",
        special_tokens=[(bos, family.token_id(bos))],
    )


def byte_level(family: Family) -> Any:
    """A byte-level BPE tokenizer for `family` (Llama 3 and Qwen kinds)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    split = pre_tokenizers.Split(Regex(_split_pattern(family.digits_per_token)), "isolated")
    pre_tokenizer = pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    trainee = Tokenizer(models.BPE())
    trainee.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=LEARNED_VOCAB,
        min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trainee.train_from_iterator(zoo_corpus(), trainer=trainer)
    learned, merges = _learned(trainee)
    vocab = _laid_out(family, learned, family.special_tokens)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    _add_family_tokens(tokenizer, family)
    _with_bos(tokenizer, family)
    return tokenizer


def sentencepiece(family: Family) -> Any:
    """A SentencePiece-style BPE tokenizer with byte fallback (Mistral, Gemma, Phi-3 kinds)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    prepend = "first" if family.prefix_space else "never"
    pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme=prepend)
    trainee = Tokenizer(models.BPE())
    trainee.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=LEARNED_VOCAB, min_frequency=1, show_progress=False)
    trainee.train_from_iterator(zoo_corpus(), trainer=trainer)
    learned, merges = _learned(trainee)
    byte_tokens = {f"<0x{value:02X}>": family.byte_tokens_at + value for value in range(256)}
    vocab = _laid_out(family, learned, {**family.special_tokens, **byte_tokens})
    unknown = "<unk>"
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=unknown, byte_fallback=True)
    )
    tokenizer.pre_tokenizer = pre_tokenizer
    steps = [decoders.Replace(METASPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if family.prefix_space:
        steps.append(decoders.Strip(" ", 1, 0))  # the space the pre-tokenizer prepended
    tokenizer.decoder = decoders.Sequence(steps)
    _add_family_tokens(tokenizer, family)
    _with_bos(tokenizer, family)
    return tokenizer


def train(family: Family) -> Any:
    """The family's tokenizer, as a `tokenizers.Tokenizer`."""
    return byte_level(family) if family.tokenizer_kind == "byte_level" else sentencepiece(family)


def transformers_tokenizer(family: Family) -> Any:
    """The family's tokenizer wrapped for transformers, with its template and special tokens."""
    from transformers import PreTrainedTokenizerFast

    fast: Any = PreTrainedTokenizerFast
    return fast(
        tokenizer_object=train(family),
        bos_token=family.bos_token,
        eos_token=family.eos_token,
        pad_token=family.pad_token,
        unk_token="<unk>" if "<unk>" in family.special_tokens else None,
        chat_template=family.chat_template,
        clean_up_tokenization_spaces=False,
        model_max_length=int(family.config["max_position_embeddings"]),
    )
