# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Parity with transformers (torch, CPU, float32) on tiny random checkpoints written by transformers' own
save_pretrained: llama (plain and llama3 RoPE scaling), qwen2 (q/k/v bias, tied head), qwen3 (q/k norm, explicit
head_dim). Also: save_pretrained -> AutoModelForCausalLM round trip, sharded index loading, loading straight onto a
mesh, and the error messages for bad checkpoints.

Error measure: max relative logit error = max |ours - ref| / max |ref| over the real (unpadded) tokens.
"""

import json
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from model_helpers import pad_rows, random_params, rel_err

from jaxgrpo import sharding
from jaxgrpo.models import (
    CheckpointError,
    ModelConfig,
    ModelConfigError,
    RopeScaling,
    forward,
    load_pretrained,
    save_pretrained,
)
from jaxgrpo.models.layers import rope_inv_freq

V = 128
COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5)  # fmt: skip
# not the loader's defaults (10000, 1e-6): a loader that dropped them would not match transformers
ROPE = {"rope_type": "default", "rope_theta": 500000.0}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32, "rope_theta": 10000.0}  # fmt: skip (its 3 regimes at 64 dims)


def hf_configs():
    return {
        "llama": transformers.LlamaConfig(**COMMON, tie_word_embeddings=False, rope_parameters=ROPE),
        "llama3": transformers.LlamaConfig(**COMMON, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE),
        "qwen2": transformers.Qwen2Config(**COMMON, tie_word_embeddings=True, rope_parameters=ROPE),
        "qwen3": transformers.Qwen3Config(**COMMON, head_dim=24, tie_word_embeddings=False, rope_parameters=ROPE),
    }


def randomize(model, seed: int) -> None:
    """Every parameter (norms and biases included) random, so that each one is exercised by the comparison."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.3 if ("norm" in name or "bias" in name) else 0.08
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + scale * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for i, (name, cfg) in enumerate(hf_configs().items()):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
        randomize(model, i)
        d = tmp_path_factory.mktemp(name)
        model.save_pretrained(d, max_shard_size="100KB" if name == "qwen3" else "5GB")  # qwen3: sharded index
        out[name] = (d, model)
    return out


def torch_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids, dtype=torch.long)).logits.float().numpy()


SEQS = [np.random.default_rng(0).integers(0, V, n) for n in (24, 9, 1)]

# What float32 gives: the largest error over the four architectures, unpadded and padded, is 5e-7 to 8e-7 (max |Δ| /
# max |logit|, eager transformers on CPU); planted bugs give 5e-4 to 1.2e-3 (RMSNorm eps ×10, RoPE θ +1%, see
# test_parity_tolerance_catches_planted_bugs), so a bug a hundred times subtler still fails this bound.
PARITY_RTOL = 3e-6


@pytest.mark.parametrize("name", ["llama", "llama3", "qwen2", "qwen3"])
def test_parity_with_transformers_unpadded_and_padded(checkpoints, name):
    d, model = checkpoints[name]
    if name == "qwen3":
        assert (d / "model.safetensors.index.json").exists(), "qwen3 checkpoint should be sharded"
    config, params = load_pretrained(d)
    assert config.architecture == name.rstrip("3") if name == "llama3" else config.architecture == name
    refs = [torch_logits(model, s[None])[0] for s in SEQS]
    fwd = jax.jit(forward, static_argnums=0)
    # unpadded
    ours = fwd(config, params, jnp.asarray(SEQS[0][None], jnp.int32))
    chex.assert_type(ours, jnp.float32)
    assert rel_err(ours[0], refs[0]) < PARITY_RTOL
    # left- and right-padded batch of ragged rows vs each row alone in transformers
    W = 26
    for side in ("left", "right"):
        tok, mask = pad_rows(SEQS, W, side)
        logits = np.asarray(fwd(config, params, jnp.asarray(tok), None, jnp.asarray(mask)))
        assert np.isfinite(logits).all()
        for i in range(len(SEQS)):
            assert rel_err(logits[i][mask[i]], refs[i]) < PARITY_RTOL, (name, side, i)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_parity_tolerance_catches_planted_bugs(checkpoints, name):
    # negative control of PARITY_RTOL: the same weights with a subtly wrong RMSNorm eps (×10) or RoPE base (+1%)
    d, model = checkpoints[name]
    config, params = load_pretrained(d)
    ids = SEQS[0][None]
    ref = torch_logits(model, ids)[0]
    fwd = jax.jit(forward, static_argnums=0)
    assert rel_err(fwd(config, params, jnp.asarray(ids, jnp.int32))[0], ref) < PARITY_RTOL
    for bug in (dict(rms_norm_eps=config.rms_norm_eps * 10), dict(rope_theta=config.rope_theta * 1.01)):
        err = rel_err(fwd(config.replace(**bug), params, jnp.asarray(ids, jnp.int32))[0], ref)
        assert err > 10 * PARITY_RTOL, (bug, err)


def test_llama3_inv_freq_matches_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = hf_configs()["llama3"]
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, None)
    cfg = ModelConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                      rope_theta=LLAMA3_ROPE["rope_theta"], rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 32))
    ours = rope_inv_freq(cfg)
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-6)
    # the tiny config exercises all three regimes (unscaled, smoothed, divided by factor)
    base = rope_inv_freq(cfg.replace(rope_scaling=None))
    ratio = base / ours
    assert np.isclose(ratio, 1.0).any() and np.isclose(ratio, 8.0).any()
    assert ((ratio > 1.01) & (ratio < 7.99)).any()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_save_pretrained_round_trip_through_transformers(tmp_path, arch):
    scaling = RopeScaling("llama3", 4.0, 1.0, 4.0, 16) if arch == "llama" else None
    cfg = ModelConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=24 if arch == "qwen3" else None, architecture=arch, qkv_bias=arch == "qwen2",
                      qk_norm=arch == "qwen3", tie_word_embeddings=arch == "qwen2", rope_scaling=scaling,
                      rope_theta=1e4, rms_norm_eps=1e-5, eos_token_ids=(3, 4), bos_token_id=1)  # fmt: skip
    params = random_params(cfg)
    # small max_shard_bytes -> several shards + index
    save_pretrained(cfg, params, tmp_path, max_shard_bytes=200_000)
    assert (tmp_path / "model.safetensors.index.json").exists()
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = SEQS[0][None]
    ref = torch_logits(model, ids)
    ours = np.asarray(forward(cfg, params, jnp.asarray(ids, jnp.int32)))
    assert rel_err(ours, ref) < PARITY_RTOL
    # and back into jaxgrpo: identical config and params
    cfg2, params2 = load_pretrained(tmp_path)
    assert cfg2 == cfg
    chex.assert_trees_all_equal(params2, params)


def test_bfloat16_save_and_load(tmp_path, checkpoints):
    d, _ = checkpoints["qwen2"]
    cfg, masters = load_pretrained(d, dtype="bfloat16")  # bfloat16 compute over float32 master weights (default)
    assert cfg.dtype == "bfloat16" and cfg.param_dtype == "float32"
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(masters))
    cfg, params = load_pretrained(d, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)  # a dtype object or its name
    assert cfg.dtype == "bfloat16"
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
    save_pretrained(cfg, params, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert next(model.parameters()).dtype == torch.bfloat16
    _, back = load_pretrained(tmp_path, dtype="bfloat16", param_dtype="bfloat16")
    chex.assert_trees_all_equal(back, params)
    # the float32 masters exported in the compute dtype (the default) or exactly (dtype="float32")
    save_pretrained(cfg.replace(param_dtype="float32"), masters, tmp_path / "f32", dtype="float32")
    assert json.loads((tmp_path / "f32" / "config.json").read_text())["torch_dtype"] == "float32"
    chex.assert_trees_all_equal(load_pretrained(tmp_path / "f32")[1], masters)


def test_load_onto_mesh(checkpoints):
    d, _ = checkpoints["qwen3"]
    mesh = sharding.make_mesh(1, 4, 2)
    cfg, params = load_pretrained(d, shardings=mesh)
    q = params["layers"]["q"]
    assert q.sharding == sharding.param_shardings(cfg, mesh)["layers"]["q"]
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
    _, ref = load_pretrained(d)
    chex.assert_trees_all_equal(jax.device_get(params), jax.device_get(ref))


# ----------------------------------------------------------------------------------------------- errors
def _copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_errors(tmp_path, checkpoints):
    d_llama, _ = checkpoints["llama"]
    d_qwen3, _ = checkpoints["qwen3"]
    with pytest.raises(CheckpointError, match="does not exist"):
        load_pretrained(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_pretrained(empty)
    (empty / "config.json").write_text((d_llama / "config.json").read_text())
    (empty / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no \*.safetensors weights .*pytorch_model.bin"):
        load_pretrained(empty)
    # partial sharded download
    partial = _copy(d_qwen3, tmp_path / "partial")
    shard = sorted(partial.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"missing: \\['{shard.name}'\\].*partial download"):
        load_pretrained(partial)
    # unsupported architecture
    gpt = _copy(d_llama, tmp_path / "gpt")
    cfg = json.loads((gpt / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (gpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="model_type='gpt2'.*supported.*llama.*qwen2.*qwen3"):
        load_pretrained(gpt)
    # shape mismatch between config.json and the weights
    bad = _copy(d_llama, tmp_path / "bad")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"gate_proj.weight' .* has shape \(128, 64\), but the config expects"
                                              r" \(96, 64\)"):  # fmt: skip
        load_pretrained(bad)
    # a missing tensor (untied config whose checkpoint has no lm_head)
    untied = _copy(checkpoints["qwen2"][0], tmp_path / "untied")
    cfg = json.loads((untied / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (untied / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="tensor 'lm_head.weight' not found"):
        load_pretrained(untied)
    # tensors the config would ignore (a qwen2 checkpoint relabelled as llama: its q/k/v biases are unused)
    relabel = _copy(checkpoints["qwen2"][0], tmp_path / "relabel")
    cfg = json.loads((relabel / "config.json").read_text())
    cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (relabel / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"relabel has 6 tensors that a llama model .* does not use.*q_proj.bias"):
        load_pretrained(relabel)
    with pytest.raises(ModelConfigError, match="unsupported dtype 'float16'"):
        load_pretrained(d_llama, dtype="float16")
    with pytest.raises(CheckpointError, match="neither a directory"):
        load_pretrained(d_llama / "config.json")
