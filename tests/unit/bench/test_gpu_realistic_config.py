"""bench/gpu_realistic_config.py: the model the GPU run builds (Llama-3.1-8B's shape, and the
dry run's narrow copy), the run's presets, and what the device's memory could hold of its
KV cache."""

from __future__ import annotations

import pytest

from bench import gpu_realistic_config as realistic_config
from bench.gpu_realistic_verdicts import HEADLINE_CLIENTS


def test_the_full_configuration_is_llama_3_1_8b() -> None:
    config = realistic_config.llama_config(realistic_config.for_gpu().sizes)

    assert config["vocab_size"] == 128256
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (32, 8)
    assert config["rope_parameters"]["rope_type"] == "llama3"
    assert config["eos_token_id"] == [128001, 128008, 128009]
    # Llama-3.1-8B's published parameter count.
    assert realistic_config.parameter_count(config) == 8_030_261_248


def test_the_dry_run_narrows_width_and_depth_but_keeps_the_vocabulary_and_gqa() -> None:
    dry = realistic_config.for_dry_run()
    config = realistic_config.llama_config(dry.sizes, dry.vocab_size)

    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 128
    assert config["num_attention_heads"] // config["num_key_value_heads"] == 4
    assert config["vocab_size"] == 128256
    assert config["rope_parameters"]["rope_type"] == "llama3"


def test_a_vocabulary_too_small_for_the_tokenizers_special_ids_is_refused() -> None:
    with pytest.raises(ValueError, match="128,256"):
        realistic_config.llama_config(realistic_config.DRY_RUN_SIZES, vocab_size=32000)


def test_the_kv_cache_of_an_8b_token_and_what_an_h200_could_hold() -> None:
    config = realistic_config.llama_config(realistic_config.LLAMA31_8B_SIZES)
    per_token = realistic_config.kv_bytes_per_token(config, dtype_bytes=2)
    assert per_token == 2 * 32 * 8 * 128 * 2 == 131072

    weights = 2 * realistic_config.parameter_count(config)
    limit = realistic_config.physical_request_limit(141 * 10**9, weights, per_token, 2048 + 32)
    # (141 GB - 16.06 GB of weights) / (131,072 bytes x 2,080 tokens)
    assert limit == 458


def test_the_8b_save_time_is_estimated_at_the_write_rate_the_build_measured() -> None:
    estimate = realistic_config.build_estimate({"weight_bytes": 10**8, "save_seconds": 0.5})
    assert estimate["save_bytes_per_second"] == pytest.approx(2 * 10**8)
    assert estimate["estimated_8b_save_seconds"] == pytest.approx(2 * 8_030_261_248 / (2 * 10**8))


def test_the_admission_limit_is_the_devices_memory_over_each_requests_kv_cache() -> None:
    model = {
        "config": realistic_config.llama_config(realistic_config.LLAMA31_8B_SIZES),
        "dtype": "bfloat16",
        "device_memory_bytes": 150_000_000_000,
        "weight_bytes": 16_060_522_496,
    }
    limit = realistic_config.admission_limit(model, prompt_tokens=2048, new_tokens=32)
    assert limit["kv_bytes_per_token"] == 131072
    assert limit["tokens_per_request"] == 2080
    assert limit["physical_limit_requests"] == (150_000_000_000 - 16_060_522_496) // (131072 * 2080)


def test_the_gpu_traffic_is_the_full_shape() -> None:
    gpu = realistic_config.for_gpu()
    assert gpu.scale == 1 and gpu.clients[0] == HEADLINE_CLIENTS
    assert sorted(gpu.clients) == [32, 64, 128] and len(gpu.open_rates) == 3
