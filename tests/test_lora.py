# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""LoRA (jaxgrpo.models.lora): zero-initialised adapters leave the base's logits exactly; the adapter gradient is the
chain rule through the full-weight gradient (dA = s dW Bᵀ, dB = s Aᵀ dW); a train step changes only the adapters,
with optimizer state for them alone; sharded equals unsharded; the PEFT export, applied by `peft` to the transformers
model, gives jaxgrpo's logits with adapters and the merged export's."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import random_params, rel_err
from test_train_step import TEMP, V, make_batch_np, to_batch

from jaxgrpo import models, sharding
from jaxgrpo.config import AlgoConfig, OptimConfig
from jaxgrpo.learner import train_step as ts
from jaxgrpo.models import lora

BASE = models.ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                          num_kv_heads=2, max_position_embeddings=64)  # fmt: skip
SPEC = models.LoraSpec(rank=4, alpha=8.0)


def lora_params(config: models.ModelConfig, seed: int = 0, b_scale: float = 0.0):
    """Random base params with adapters; ``b_scale > 0`` draws B too (a trained adapter)."""
    params = lora.add_adapters(config, random_params(config.replace(lora=None)), jax.random.key(seed))
    if b_scale:
        base, ad = lora.split(params)
        rng = np.random.default_rng(seed + 1)
        ad = {n: {"a": ab["a"], "b": jnp.asarray(b_scale * rng.standard_normal(ab["b"].shape), jnp.float32)}
              for n, ab in ad.items()}  # fmt: skip
        params = lora.join(base, ad)
    return params


def tokens(seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, (3, 7)), jnp.int32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_zero_adapters_give_the_base_logits_exactly(dtype):
    config = BASE.replace(lora=SPEC, dtype=dtype)
    params = lora_params(config)
    base, adapters = lora.split(params)
    chex.assert_trees_all_equal(jax.tree.map(lambda ab: ab["b"], adapters, is_leaf=lambda x: "b" in x),
                                jax.tree.map(lambda ab: jnp.zeros_like(ab["b"]), adapters, is_leaf=lambda x: "b" in x))
    # A is PEFT's Kaiming-uniform: |A| < 1/sqrt(in), not degenerate
    a = adapters["q"]["a"]
    assert float(jnp.max(jnp.abs(a))) < 1 / np.sqrt(BASE.hidden_size) and float(jnp.std(a)) > 0.05
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(adapters))
    assert all(x.dtype == jnp.dtype(dtype) for x in jax.tree.leaves(base))
    plain = models.forward(config.replace(lora=None), base, tokens())
    np.testing.assert_array_equal(np.asarray(models.forward(config, params, tokens())), np.asarray(plain))


def test_adapters_change_the_logits_as_the_merged_weights_do():
    config = BASE.replace(lora=models.LoraSpec(rank=3, alpha=5.0, targets=("q", "o", "down")))
    params = lora_params(config, b_scale=0.3)
    merged = lora.merge(config, params)
    # the merged weight is W + (alpha/r) A B, written out per layer for o (two input axes [N, H])
    base, ad = lora.split(params)
    o_a, o_b = np.asarray(ad["o"]["a"][1]), np.asarray(ad["o"]["b"][1])
    want_o = np.asarray(base["layers"]["o"][1]) + 5.0 / 3 * np.einsum("nhr,rd->nhd", o_a, o_b)
    np.testing.assert_allclose(np.asarray(merged["layers"]["o"][1]), want_o, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(merged["layers"]["k"]), np.asarray(base["layers"]["k"]))
    got = models.forward(config, params, tokens())
    want = models.forward(config.replace(lora=None), merged, tokens())
    assert rel_err(got, want) < 1e-5
    assert rel_err(got, models.forward(config.replace(lora=None), base, tokens())) > 1e-2


def test_sampler_weights_merge_in_float32_and_stay_unmerged_in_bfloat16():
    config = BASE.replace(lora=SPEC)
    params = lora_params(config, b_scale=0.2)
    assert not lora.has_adapters(models.compute_params(config, params))
    low = config.replace(dtype="bfloat16")
    sampler = models.compute_params(low, lora.join(lora.split(params)[0], lora.split(params)[1]))
    assert lora.has_adapters(sampler) and sampler["layers"]["lora"]["q"]["a"].dtype == jnp.float32


ALGO = AlgoConfig(kl_coef=0.0)


def batch_for(config, params, seed=3, P=4, G=2):
    return to_batch(config, models.compute_params(config, params), make_batch_np(seed, P, G), noise=0.1)


def test_adapter_gradient_is_the_chain_rule_through_the_full_weight_gradient():
    """dL/dA = s · dL/dW · Bᵀ and dL/dB = s · Aᵀ · dL/dW, with dL/dW the full fine-tuning gradient at the merged
    weights (a different code path: no adapter in the forward)."""
    config = BASE.replace(lora=models.LoraSpec(rank=4, alpha=6.0, targets=("q", "o", "up")))
    params = lora_params(config, b_scale=0.2)
    batch = batch_for(config, params)
    _, g_ad, _ = ts.policy_gradient(config, ALGO, params, batch, temperature=TEMP)
    full_cfg = config.replace(lora=None)
    _, g_full, _ = ts.policy_gradient(full_cfg, ALGO, lora.merge(config, params), batch, temperature=TEMP)
    s = 6.0 / 4
    _, ad = lora.split(params)
    assert set(g_ad) == {"q", "o", "up"}
    for name, ab in ad.items():
        k = lora.n_in(name)
        a = np.asarray(ab["a"]).reshape(BASE.num_layers, -1, 4)
        b = np.asarray(ab["b"]).reshape(BASE.num_layers, 4, -1)
        dw = np.asarray(g_full["layers"][name]).reshape(BASE.num_layers, a.shape[1], -1)
        want_a = s * np.einsum("lio,lro->lir", dw, b)
        want_b = s * np.einsum("lir,lio->lro", a, dw)
        assert g_ad[name]["a"].shape[1 : 1 + k] == ab["a"].shape[1 : 1 + k]
        assert rel_err(np.asarray(g_ad[name]["a"]).reshape(want_a.shape), want_a) < 1e-4, name
        assert rel_err(np.asarray(g_ad[name]["b"]).reshape(want_b.shape), want_b) < 1e-4, name


def step_once(config, params, mesh=None, steps=2):
    init_fn, step_fn = ts.make_train_step(config, ALGO, OptimConfig(learning_rate=1e-2), mesh=mesh,
                                          temperature=TEMP, total_steps=10)  # fmt: skip
    batch = batch_for(config, params, P=8)
    state = init_fn(jax.tree.map(jnp.copy, params), jax.random.key(1))
    opt_leaves = len(jax.tree.leaves(state.opt_state))
    if mesh is not None:
        batch = ts.global_batch(batch, mesh)
    for _ in range(steps):
        state, metrics = step_fn(state, batch)
    return jax.tree.map(np.asarray, state.params), opt_leaves, metrics


def test_a_step_changes_only_the_adapters():
    config = BASE.replace(lora=SPEC)
    params = lora_params(config)
    new, opt_leaves, metrics = step_once(config, params)
    base0, ad0 = lora.split(params)
    base1, ad1 = lora.split(new)
    chex.assert_trees_all_equal(base1, jax.tree.map(np.asarray, base0))
    for name in SPEC.targets:
        assert np.max(np.abs(ad1[name]["b"])) > 1e-4, name  # B left zero: the adapter learned
        assert np.max(np.abs(ad1[name]["a"] - np.asarray(ad0[name]["a"]))) > 0, name
    # AdamW's two moments cover the adapters alone (plus optax's scalar counts)
    n_adapters = len(jax.tree.leaves(ad0))
    assert 2 * n_adapters <= opt_leaves <= 2 * n_adapters + 4
    assert float(metrics["grad_norm"]) > 0


def test_sharded_step_equals_single_device():
    config = BASE.replace(lora=SPEC)
    params = lora_params(config)
    want, _, _ = step_once(config, params)
    mesh = sharding.make_mesh(2, 2, 2)
    got, _, _ = step_once(config, sharding.shard_params(params, config, mesh), mesh=mesh)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        assert rel_err(g, w) < 1e-5, jax.tree_util.keystr(path)


# ----------------------------------------------------------------------------------------------- PEFT export
def test_peft_applies_the_exported_adapter_to_the_transformers_model(tmp_path):
    import peft
    import torch
    import transformers

    config = BASE.replace(lora=models.LoraSpec(rank=4, alpha=8.0, targets=("q", "k", "v", "o", "gate", "up", "down")))
    params = lora_params(config, b_scale=0.2)
    base, adapters = lora.split(params)
    models.save_pretrained(config.replace(lora=None), base, tmp_path / "base", dtype="float32")
    lora.save_peft(config, adapters, tmp_path / "adapter", base_name_or_path=str(tmp_path / "base"))
    models.save_pretrained(config.replace(lora=None), lora.merge(config, params), tmp_path / "merged",
                           dtype="float32")  # fmt: skip

    ids = np.array(tokens())  # writable: torch.as_tensor warns on a read-only array
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32)
    with_adapter = peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    with torch.no_grad():
        got_peft = with_adapter(torch.as_tensor(ids)).logits.numpy()
        got_merged = merged(torch.as_tensor(ids)).logits.numpy()
    ours = np.asarray(models.forward(config, params, jnp.asarray(ids)))
    assert rel_err(got_peft, ours) < 1e-4
    assert rel_err(got_merged, ours) < 1e-4
    # the adapter matters: the base alone is far from it
    with torch.no_grad(), with_adapter.disable_adapter():
        assert rel_err(with_adapter(torch.as_tensor(ids)).logits.numpy(), ours) > 1e-2


def test_a_bfloat16_merge_rounds_the_sum_and_a_float32_one_keeps_it():
    """``W + s A B`` with a bfloat16 base: cast back to bfloat16 the smallest updates vanish (weights the merge leaves
    unchanged); merged to float32 (what a float32 GGUF export asks for) the sum is kept, by hand."""
    config = BASE.replace(lora=SPEC)
    params = lora_params(config, b_scale=1e-3)
    base, adapters = lora.split(params)
    low = lora.join(jax.tree.map(lambda x: x.astype(jnp.bfloat16), base), adapters)
    w = np.asarray(low["layers"]["q"], np.float32)
    a, bb = (np.asarray(adapters["q"][k], np.float32) for k in ("a", "b"))
    want = w + SPEC.alpha / SPEC.rank * np.einsum("lir,lr...->li...", a, bb)
    kept = np.asarray(lora.merge(config, low, jnp.float32)["layers"]["q"])
    np.testing.assert_allclose(kept, want, rtol=0, atol=1e-6)
    rounded = np.asarray(lora.merge(config, low)["layers"]["q"].astype(jnp.float32))
    assert (rounded == w).mean() > 0.01 and not (kept == w).any()  # the default drops some updates altogether


def test_the_peft_adapter_names_the_pinned_revision_of_its_base(tmp_path):
    import peft

    config = BASE.replace(lora=SPEC)
    adapters = lora.split(lora_params(config, b_scale=0.2))[1]
    lora.save_peft(config, adapters, tmp_path / "adapter", base_name_or_path="org/base", revision="0123abc")
    got = peft.PeftConfig.from_pretrained(tmp_path / "adapter")
    assert (got.base_model_name_or_path, got.revision) == ("org/base", "0123abc")


def test_lora_spec_rejects_bad_settings():
    for kwargs in (dict(rank=0, alpha=1.0), dict(rank=2, alpha=0.0), dict(rank=2, alpha=1.0, targets=("q", "x"))):
        with pytest.raises(models.ModelConfigError):
            models.LoraSpec(**kwargs)
    assert dataclasses.replace(SPEC).scale == 2.0


def test_the_savers_write_a_lora_tree_as_its_merged_model(tmp_path):
    """`save_pretrained` and `save_gguf` given a LoRA config and tree (a trainer's) write the merged model, which
    loads back as the plain weights W + (alpha/r) A B (it failed with a bare KeyError: 'lora')."""
    config = BASE.replace(lora=SPEC)
    params = lora_params(config, b_scale=0.3)
    want = lora.merge(config, params)
    for path in (models.save_pretrained(config, params, tmp_path / "hf"),
                 models.save_gguf(config, params, tmp_path / "m.gguf", None, dtype="float32")):  # fmt: skip
        got_config, got = models.load_pretrained(path)
        assert got_config.lora is None
        chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-7)
