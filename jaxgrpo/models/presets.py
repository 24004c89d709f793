# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Architecture presets of published checkpoints (numbers copied from each model's HF ``config.json``).

Use them to build full-size abstract models (``jax.eval_shape``), to plan sharding and memory, or to train from
scratch at a known shape; `load_pretrained` reads the real config from the checkpoint instead. Token ids: the
instruct models' end-of-turn id comes first in ``eos_token_ids``, the base models' end-of-text id second.
"""

from __future__ import annotations

from typing import Any

from jaxgrpo.models.config import ModelConfig, RopeScaling

_QWEN_VOCAB = 151936
_LLAMA3_VOCAB = 128256

PRESETS: dict[str, ModelConfig] = {
    "qwen2.5-0.5b": ModelConfig(
        vocab_size=_QWEN_VOCAB, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
        rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=True, qkv_bias=True,
        architecture="qwen2", bos_token_id=151643, eos_token_ids=(151645, 151643),
    ),
    "qwen2.5-1.5b": ModelConfig(
        vocab_size=_QWEN_VOCAB, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
        rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=131072, tie_word_embeddings=True, qkv_bias=True,
        architecture="qwen2", bos_token_id=151643, eos_token_ids=(151645, 151643),
    ),
    "qwen2.5-7b": ModelConfig(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4,
        rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=131072, tie_word_embeddings=False, qkv_bias=True,
        architecture="qwen2", bos_token_id=151643, eos_token_ids=(151645, 151643),
    ),
    "qwen3-0.6b": ModelConfig(
        vocab_size=_QWEN_VOCAB, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16, num_kv_heads=8,
        head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=True,
        qk_norm=True, architecture="qwen3", bos_token_id=151643, eos_token_ids=(151645, 151643),
    ),
    "qwen3-1.7b": ModelConfig(
        vocab_size=_QWEN_VOCAB, hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16, num_kv_heads=8,
        head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=True,
        qk_norm=True, architecture="qwen3", bos_token_id=151643, eos_token_ids=(151645, 151643),
    ),
    "qwen3-8b": ModelConfig(
        vocab_size=_QWEN_VOCAB, hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32, num_kv_heads=8,
        head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=False,
        qk_norm=True, architecture="qwen3", bos_token_id=151643, eos_token_ids=(151645, 151643),
    ),
    "llama-3.2-1b": ModelConfig(
        vocab_size=_LLAMA3_VOCAB, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
        num_kv_heads=8, head_dim=64, rope_theta=500000.0, rope_scaling=RopeScaling("llama3", 32.0, 1.0, 4.0, 8192),
        rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=True, architecture="llama",
        bos_token_id=128000, eos_token_ids=(128009, 128001, 128008),
    ),
    "llama-3.1-8b": ModelConfig(
        vocab_size=_LLAMA3_VOCAB, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
        num_kv_heads=8, head_dim=128, rope_theta=500000.0, rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192),
        rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False, architecture="llama",
        bos_token_id=128000, eos_token_ids=(128009, 128001, 128008),
    ),
    "smollm2-135m": ModelConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
        head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True,
        architecture="llama", bos_token_id=1, eos_token_ids=(2,),
    ),
}  # fmt: skip


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """A preset by (case-insensitive) name, with optional field overrides such as ``dtype="bfloat16"``."""
    key = name.lower()
    if key not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; available: {sorted(PRESETS)}")
    return PRESETS[key].replace(**overrides) if overrides else PRESETS[key]
