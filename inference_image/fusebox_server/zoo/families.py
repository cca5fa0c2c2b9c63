"""The families of the zoo: each one's published architecture fields, narrowed for CPU tests.

Why: the places where a server breaks on a real model are its architecture
fields (a 128k or 256k vocabulary, grouped-query heads, RoPE scaling,
sliding windows, soft-capping, biased or normed projections, fused
projections, routed experts, tied embeddings, several end ids) and its
tokenizer and chat format. A family here keeps every one of those fields at
the value its public release uses; only the depth (layers), the width
(hidden size, MLP width) and for the fused Phi-3 layout the head count are
cut, so that a model builds in seconds and decodes on two CPU cores. Where
a family's head_dim is a config field it keeps the real one.

Each `Family` names the transformers config class, its fields, the kind of
tokenizer (byte-level BPE, or SentencePiece-style BPE with byte fallback),
its special tokens at the family's real ids, and its chat template
(`templates.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from fusebox_server.zoo import templates

TokenizerKind = Literal["byte_level", "sentencepiece"]

# The narrowed width of every family (the real ones are 896 to 4096).
HIDDEN: Final = 64
# Two layers: enough for Gemma 2's alternation (one sliding, one global layer).
LAYERS: Final = 2


@dataclass(frozen=True)
class Family:
    """One model family as the zoo builds it."""

    name: str
    config_class: str  # a transformers config class
    # The config's fields: the family's real architecture values, narrowed where noted.
    config: dict[str, Any]
    tokenizer_kind: TokenizerKind
    # Special tokens at the family's real ids, in the tokenizer (and the model's vocabulary).
    special_tokens: dict[str, int]
    bos_token: str | None
    eos_token: str  # the tokenizer's eos (the end of an assistant turn)
    pad_token: str | None
    generation_eos: tuple[int, ...]  # generation_config.json's eos_token_id
    chat_template: str
    # What of a real release this family exercises (docs, `--help`).
    exercises: str
    # SentencePiece kinds: the id of "<0x00>" (the 256 byte tokens follow it), and whether
    # a space is prepended to the text (Llama/Mistral-style) or not (Gemma).
    byte_tokens_at: int = 3
    prefix_space: bool = True
    # Byte-level kinds: how many digits one pre-token holds (Llama 3: up to 3; Qwen: 1).
    digits_per_token: int = 3
    # Texts the template's tests expect to see in a rendered system + two turns.
    turn_markers: tuple[str, ...] = field(default=())
    # Tokens of special_tokens that the family's release marks not special, so decoding
    # keeps them in the text: Qwen's `<tool_call>` markers, which call parsers read.
    plain_tokens: frozenset[str] = frozenset()

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    def token_id(self, token: str) -> int:
        return self.special_tokens[token]


LLAMA3 = Family(
    name="llama3",
    config_class="LlamaConfig",
    config={
        # Llama 3.1 8B: untied embeddings, 32 heads over 8 KV heads of 128, llama3 RoPE.
        "vocab_size": 128256,
        "hidden_size": HIDDEN,
        "intermediate_size": 4 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
    },
    tokenizer_kind="byte_level",
    special_tokens={
        "<|begin_of_text|>": 128000,
        "<|end_of_text|>": 128001,
        "<|start_header_id|>": 128006,
        "<|end_header_id|>": 128007,
        "<|eom_id|>": 128008,
        "<|eot_id|>": 128009,
        "<|python_tag|>": 128010,
    },
    bos_token="<|begin_of_text|>",
    eos_token="<|eot_id|>",
    pad_token=None,
    generation_eos=(128001, 128008, 128009),
    chat_template=templates.LLAMA3,
    exercises="128,256-token vocabulary, GQA (32 heads over 8 KV heads), llama3 RoPE scaling, "
    "eos_token_id a list of three, untied embeddings",
    turn_markers=("<|start_header_id|>system<|end_header_id|>", "<|eot_id|>"),
)

_QWEN_SPECIALS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
}
# Qwen 2.5 and 3 releases add the call markers as ordinary (not special) tokens.
_QWEN_PLAIN = frozenset({"<tool_call>", "</tool_call>"})

QWEN2_5 = Family(
    name="qwen2.5",
    config_class="Qwen2Config",
    config={
        # Qwen2.5 0.5B Instruct: biased q/k/v, 14 heads over 2 KV heads of 64, tied embeddings.
        "vocab_size": 151936,
        "hidden_size": HIDDEN,
        "intermediate_size": 4 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    tokenizer_kind="byte_level",
    special_tokens=_QWEN_SPECIALS,
    plain_tokens=_QWEN_PLAIN,
    digits_per_token=1,
    bos_token=None,
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    generation_eos=(151645, 151643),
    chat_template=templates.QWEN2_5,
    exercises="ChatML with a default system prompt and <tool_call> tools, biased q/k/v, "
    "GQA 14 over 2, 151,936-token vocabulary, tied embeddings",
    turn_markers=("<|im_start|>system\n", "<|im_end|>\n<|im_start|>user\n"),
)

QWEN3 = Family(
    name="qwen3",
    config_class="Qwen3Config",
    config={
        # Qwen3 0.6B: q/k RMS norms, 16 heads over 8 KV heads of 128, tied embeddings.
        "vocab_size": 151936,
        "hidden_size": HIDDEN,
        "intermediate_size": 4 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "use_sliding_window": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    tokenizer_kind="byte_level",
    special_tokens=_QWEN_SPECIALS,
    plain_tokens=_QWEN_PLAIN,
    digits_per_token=1,
    bos_token=None,
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    generation_eos=(151645, 151643),
    chat_template=templates.QWEN3,
    exercises="q/k RMS norms, ChatML with <tool_call> tools, GQA 16 over 8, tied embeddings",
    turn_markers=("<|im_start|>system\n", "<|im_end|>\n<|im_start|>user\n"),
)

MISTRAL = Family(
    name="mistral",
    config_class="MistralConfig",
    config={
        # Mistral 7B v0.1: a 4,096-token sliding window on every layer, 32 heads over 8 KV.
        "vocab_size": 32000,
        "hidden_size": HIDDEN,
        "intermediate_size": 4 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "sliding_window": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    tokenizer_kind="sentencepiece",
    special_tokens={"<unk>": 0, "<s>": 1, "</s>": 2},
    bos_token="<s>",
    eos_token="</s>",
    pad_token=None,
    generation_eos=(2,),
    chat_template=templates.MISTRAL,
    exercises="sliding-window attention (4,096), SentencePiece-style BPE with byte fallback, "
    "[INST] turns, GQA 32 over 8",
    turn_markers=("<s>[INST] ", " [/INST]"),
)

GEMMA2 = Family(
    name="gemma2",
    config_class="Gemma2Config",
    config={
        # Gemma 2 2B: soft-capped attention (50) and logits (30), sliding (4,096) and global
        # layers alternating, 8 heads over 4 KV heads of 256, tied embeddings scaled by
        # sqrt(hidden) in the model.
        "vocab_size": 256000,
        "hidden_size": HIDDEN,
        "intermediate_size": 4 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "layer_types": ["sliding_attention", "full_attention"],
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 1,
    },
    tokenizer_kind="sentencepiece",
    special_tokens={
        "<pad>": 0,
        "<eos>": 1,
        "<bos>": 2,
        "<unk>": 3,
        "<start_of_turn>": 106,
        "<end_of_turn>": 107,
    },
    bos_token="<bos>",
    eos_token="<end_of_turn>",
    pad_token="<pad>",
    generation_eos=(1, 107),
    chat_template=templates.GEMMA2,
    exercises="attention and final logit soft-capping, alternating sliding/global layers, "
    "<start_of_turn> turns, tied embeddings scaled by sqrt(hidden), 256,000-token vocabulary",
    byte_tokens_at=217,
    prefix_space=False,
    turn_markers=("<bos><start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n"),
)

PHI3 = Family(
    name="phi3",
    config_class="Phi3Config",
    config={
        # Phi-3 mini 128k: fused qkv_proj and gate_up_proj, LongRoPE from 4,096 to 131,072.
        # Phi3Config has no head_dim field: 2 heads of the real 96 make the narrowed width.
        "vocab_size": 32064,
        "hidden_size": 192,
        "intermediate_size": 4 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "sliding_window": 262144,
        "rope_parameters": {
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            # One factor per rotary frequency (head_dim / 2): values rising like the release's.
            "short_factor": [round(1.0 + 0.02 * i, 4) for i in range(48)],
            "long_factor": [round(1.0 + 1.25 * i, 4) for i in range(48)],
        },
        "bos_token_id": 1,
        "eos_token_id": 32000,
        "pad_token_id": 32000,
    },
    tokenizer_kind="sentencepiece",
    special_tokens={
        "<unk>": 0,
        "<s>": 1,
        "</s>": 2,
        "<|endoftext|>": 32000,
        "<|assistant|>": 32001,
        "<|system|>": 32006,
        "<|end|>": 32007,
        "<|user|>": 32010,
    },
    bos_token="<s>",
    eos_token="<|end|>",
    pad_token="<|endoftext|>",
    generation_eos=(32000, 32001, 32007),
    chat_template=templates.PHI3,
    exercises="fused qkv_proj and gate_up_proj, LongRoPE scaling (4,096 -> 131,072), "
    "SentencePiece-style BPE with byte fallback, <|user|> turns, eos a list of three",
    turn_markers=("<|system|>\n", "<|end|>\n<|user|>\n"),
)

QWEN2_MOE = Family(
    name="qwen2_moe",
    config_class="Qwen2MoeConfig",
    config={
        # Qwen1.5 MoE A2.7B: 60 routed experts, 4 per token, a gated shared expert, biased q/k/v.
        "vocab_size": 151936,
        "hidden_size": HIDDEN,
        "intermediate_size": 4 * HIDDEN,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 4 * HIDDEN,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "norm_topk_prob": False,
        "decoder_sparse_step": 1,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    },
    tokenizer_kind="byte_level",
    special_tokens=_QWEN_SPECIALS,
    plain_tokens=_QWEN_PLAIN,
    digits_per_token=1,
    bos_token=None,
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    generation_eos=(151645, 151643),
    chat_template=templates.QWEN2_5,
    exercises="mixture of experts: 60 routed experts, top-4 routing, a gated shared expert",
    turn_markers=("<|im_start|>system\n", "<|im_end|>\n<|im_start|>user\n"),
)

FAMILIES: Final = {
    family.name: family for family in (LLAMA3, QWEN2_5, QWEN3, MISTRAL, GEMMA2, PHI3, QWEN2_MOE)
}
