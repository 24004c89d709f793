# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Full-size presets, without allocating them: `jax.eval_shape(init_params)` parameter counts equal the published
counts, the presets equal `from_hf_config` of the published config.json values, the full-size forward traces, and
every full-size parameter gets a valid sharding on an 8-device mesh."""

import math

import jax
import jax.numpy as jnp
import pytest

from jaxgrpo import sharding
from jaxgrpo.models import count_params, forward, from_hf_config, init_params
from jaxgrpo.models.presets import PRESETS, get_preset

# Published parameter counts (model cards / safetensors metadata "total" of each HF repository).
PUBLISHED = {
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-0.6b": 596_049_920,
    "qwen3-1.7b": 1_720_574_976,  # model card: 1.7B, 1.4B non-embedding (tied embeddings: 151936 × 2048 = 0.31B)
    "qwen3-8b": 8_190_735_360,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.1-8b": 8_030_261_248,
    "smollm2-135m": 134_515_008,
}

# The shape-relevant fields of each repository's config.json.
_Q = {"model_type": "qwen2", "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1e6}
_Q3 = {"model_type": "qwen3", "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "head_dim": 128,
       "max_position_embeddings": 40960}  # fmt: skip
_L3 = {"model_type": "llama", "vocab_size": 128256, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
       "rope_scaling": {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}, "rope_theta": 500000.0}  # fmt: skip
HF_CONFIGS = {
    "qwen2.5-0.5b": {**_Q, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True,
                     "max_position_embeddings": 32768},
    "qwen2.5-1.5b": {**_Q, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "tie_word_embeddings": True,
                     "max_position_embeddings": 131072},
    "qwen2.5-7b": {**_Q, "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                   "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                   "tie_word_embeddings": False, "max_position_embeddings": 131072},
    "qwen3-0.6b": {**_Q3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "qwen3-1.7b": {**_Q3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "qwen3-8b": {**_Q3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
    "llama-3.2-1b": {**_L3, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True,
                     "rope_scaling": {**_L3["rope_scaling"], "factor": 32.0}},
    "llama-3.1-8b": {**_L3, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False,
                     "rope_scaling": {**_L3["rope_scaling"], "factor": 8.0}},
    "smollm2-135m": {"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
                     "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                     "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
                     "tie_word_embeddings": True},
}  # fmt: skip


def closed_form_count(hf: dict) -> int:
    """Parameter count of a Llama/Qwen2/Qwen3 decoder from its config.json fields."""
    D, F, L, V = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"], hf["vocab_size"]
    N, K = hf["num_attention_heads"], hf["num_key_value_heads"]
    H = hf.get("head_dim", D // N)
    attn = D * N * H + 2 * D * K * H + N * H * D
    if hf["model_type"] == "qwen2":
        attn += N * H + 2 * K * H  # q/k/v bias
    if hf["model_type"] == "qwen3":
        attn += 2 * H  # q/k norm
    per_layer = attn + 3 * D * F + 2 * D
    return V * D * (1 if hf["tie_word_embeddings"] else 2) + L * per_layer + D


def test_preset_names():
    assert set(PRESETS) == set(PUBLISHED)
    assert get_preset("Qwen3-0.6B", dtype="bfloat16").dtype == "bfloat16"
    with pytest.raises(KeyError, match="unknown model preset 'gpt2'; available: \\["):
        get_preset("gpt2")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_matches_published(name):
    cfg = PRESETS[name]
    assert closed_form_count(HF_CONFIGS[name]) == PUBLISHED[name]
    abstract = jax.eval_shape(lambda k: init_params(cfg, k), jax.random.key(0))
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(abstract)) == PUBLISHED[name]
    assert count_params(cfg) == PUBLISHED[name]
    hf_cfg = from_hf_config(HF_CONFIGS[name])
    assert hf_cfg == cfg.replace(bos_token_id=None, eos_token_ids=())


@pytest.mark.parametrize("name", ["qwen3-8b", "llama-3.1-8b"])
def test_full_size_forward_traces_and_shards(name):
    cfg = get_preset(name, dtype="bfloat16")
    params = jax.eval_shape(lambda k: init_params(cfg, k), jax.random.key(0))
    tokens = jax.ShapeDtypeStruct((2, 16), jnp.int32)
    out = jax.eval_shape(lambda p, t: forward(cfg, p, t), params, tokens)
    assert out.shape == (2, 16, cfg.vocab_size) and out.dtype == jnp.float32
    mesh = sharding.make_mesh(1, 4, 2)
    shard = sharding.param_shardings(cfg, mesh)
    total = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    per_device = sum(math.prod(s.shard_shape(x.shape)) for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(shard)))
    # fsdp x tensor shard every large matrix 8 ways; only norms are replicated
    assert per_device < 1.01 * total / 8
