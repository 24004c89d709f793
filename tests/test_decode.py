# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The sampler's model entry points (`jaxgrpo.models.decode`) against the plain full-sequence forward.

`prefill_packed` (prompts packed end to end) and `forward_with_prefix_cache` (G rows sharing one prompt cache) must
give the hidden states `models.hidden_states` computes on each concatenated, unshared row [prompt; completion]
(itself tested against transformers in test_models.py), with keys/values equal to the plain cache path's.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import pad_rows, random_params, rel_err

from jaxgrpo import models, sampling

CONFIGS = {
    "llama_gqa": models.ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                                    num_kv_heads=2, head_dim=16, max_position_embeddings=256),
    "qwen3_qknorm": models.ModelConfig(vocab_size=97, hidden_size=48, intermediate_size=64, num_layers=3, num_heads=6,
                                       num_kv_heads=3, head_dim=8, max_position_embeddings=256, qk_norm=True,
                                       architecture="qwen3"),
    "qwen2_bias_mha": models.ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2,
                                         num_heads=2, num_kv_heads=2, head_dim=16, max_position_embeddings=256,
                                         qkv_bias=True, architecture="qwen2"),
}  # fmt: skip
LENGTHS = [9, 5, 1, 7]  # ragged, including a one-token prompt
R = 3  # samples per prompt


def _prompts(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 97, n).astype(np.int32) for n in LENGTHS]


def _packed_prefill(config, params, prompts, rows, tp):
    packed = sampling.pack_prompts(prompts, rows, tp)
    last, prefix = models.prefill_packed(
        config, params, *(jnp.asarray(packed[k]) for k in ("tokens", "positions", "slot_index", "prefix_mask",
                                                          "token_slot"))
    )  # fmt: skip
    return packed, last, prefix


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("rows", [1, 2])
def test_prefill_packed_equals_plain_forward(name, rows):
    config = CONFIGS[name]
    params = random_params(config, seed=1)
    prompts, tp = _prompts(), 12
    packed, last, prefix = _packed_prefill(config, params, prompts, rows, tp)
    chex.assert_shape(last, (len(prompts), config.hidden_size))
    L, K, H = config.num_layers, config.num_kv_heads, config.head_dim
    chex.assert_shape(prefix.k, (L, len(prompts), K, tp, H))  # kv-head-major; the values' key axis minor
    chex.assert_shape(prefix.v, (L, len(prompts), K, H, tp))
    tok, mask = pad_rows(prompts, tp, "left")
    ref = models.hidden_states(config, params, jnp.asarray(tok), attention_mask=jnp.asarray(mask))
    assert rel_err(last, ref[:, -1]) < 1e-5
    # keys/values on the real slots equal the plain cache path's (forward_with_cache over the left-padded batch)
    pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
    _, cache = models.forward_with_cache(config, params, jnp.asarray(tok), jnp.asarray(pos),
                                         models.init_cache(config, len(prompts), tp), 0, jnp.asarray(mask))  # fmt: skip
    np.testing.assert_array_equal(packed["prefix_mask"].reshape(len(prompts), tp), mask)
    m = mask[None, :, :, None, None]  # in forward_with_cache's [L, B, S, K, H] layout
    assert rel_err(np.where(m, prefix.k.transpose(0, 1, 3, 2, 4), 0), np.where(m, cache.k, 0)) < 1e-5
    assert rel_err(np.where(m, prefix.v.transpose(0, 1, 4, 2, 3), 0), np.where(m, cache.v, 0)) < 1e-5


def test_pack_prompts_layout():
    prompts = [np.array([5, 6, 7]), np.array([8]), np.array([9, 10])]
    p = sampling.pack_prompts(prompts + [np.array([0])], 2, 4)
    assert p["tokens"].shape == (2, 16)  # longest row 4 tokens -> the smallest width bucket, 16
    np.testing.assert_array_equal(p["tokens"][0, :4], [5, 6, 7, 8])
    np.testing.assert_array_equal(p["tokens"][1, :3], [9, 10, 0])
    np.testing.assert_array_equal(p["positions"][0, :4], [0, 1, 2, 0])
    np.testing.assert_array_equal(p["prefix_mask"][0], [[0, 1, 1, 1], [0, 0, 0, 1]])
    np.testing.assert_array_equal(p["slot_index"][0, 0, 1:], [0, 1, 2])
    np.testing.assert_array_equal(p["slot_index"][0, 1, 3], 3)
    np.testing.assert_array_equal(p["token_slot"][0, :4], [1, 2, 3, 7])  # flat slot q * Tp + s


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_forward_with_prefix_cache_equals_full_rows(name):
    """Chunks of 2, 1 and 3 tokens decoded against the shared prompt cache give the states of the full rows."""
    config = CONFIGS[name]
    params = random_params(config, seed=2)
    prompts, tp, m = _prompts(1), 12, 6
    _, _, prefix = _packed_prefill(config, params, prompts, 1, tp)
    _, pmask = pad_rows(prompts, tp, "left")
    n = len(prompts) * R
    gen = np.random.default_rng(3).integers(1, 97, (n, m)).astype(np.int32)
    cache, kv_mask = models.init_decode_cache(config, n, m), jnp.ones((n, m), bool)
    step = jax.jit(models.forward_with_prefix_cache, static_argnums=0, donate_argnames="cache")
    hs, t0 = [], 0
    for t in (2, 1, 3):
        pos = np.repeat(LENGTHS, R)[:, None] + np.arange(t0, t0 + t)[None]
        h, cache = step(config, params, jnp.asarray(gen[:, t0 : t0 + t]), jnp.asarray(pos), prefix, jnp.asarray(pmask),
                        cache, t0, kv_mask)  # fmt: skip
        chex.assert_shape(h, (n, t, config.hidden_size))
        chex.assert_tree_all_finite(h)
        hs.append(h)
        t0 += t
    rows = [np.concatenate([prompts[i // R], gen[i]]) for i in range(n)]
    tok, mask = pad_rows(rows, tp + m, "left")
    ref = models.hidden_states(config, params, jnp.asarray(tok), attention_mask=jnp.asarray(mask))[:, tp:]
    assert rel_err(jnp.concatenate(hs, 1), ref) < 1e-5


def test_forward_with_prefix_cache_rejects_bad_shapes():
    config = CONFIGS["llama_gqa"]
    params = random_params(config)
    prefix = models.init_decode_cache(config, 2, 8)  # the prefix cache has the decode cache's layout
    cache = models.init_decode_cache(config, 6, 4)
    tok, pos = jnp.ones((6, 1), jnp.int32), jnp.zeros((6, 1), jnp.int32)
    ok = dict(prefix_mask=jnp.ones((2, 8), bool), kv_mask=jnp.ones((6, 4), bool))
    with pytest.raises(ValueError, match="cannot be split evenly"):
        models.forward_with_prefix_cache(config, params, tok[:5], pos[:5], prefix, ok["prefix_mask"],
                                         models.init_decode_cache(config, 5, 4), 0, ok["kv_mask"][:5])  # fmt: skip
    with pytest.raises(ValueError, match="prefix_mask shape"):
        models.forward_with_prefix_cache(config, params, tok, pos, prefix, jnp.ones((2, 7), bool), cache, 0,
                                         ok["kv_mask"])  # fmt: skip
    with pytest.raises(ValueError, match="prefix k shape"):  # forward_with_cache's [L, B, S, K, H] layout
        models.forward_with_prefix_cache(config, params, tok, pos, models.init_cache(config, 2, 8), ok["prefix_mask"],
                                         cache, 0, ok["kv_mask"])  # fmt: skip
    with pytest.raises(ValueError, match="init_decode_cache"):
        models.forward_with_prefix_cache(config, params, tok, pos, prefix, ok["prefix_mask"],
                                         models.init_cache(config, 6, 4), 0, ok["kv_mask"])  # fmt: skip
    with pytest.raises(ValueError, match="kv_mask shape"):
        models.forward_with_prefix_cache(config, params, tok, pos, prefix, ok["prefix_mask"], cache, 0,
                                         jnp.ones((6, 5), bool))  # fmt: skip


def test_projection_backward_equals_autodiff_and_finite_differences(monkeypatch):
    """The decoder's dense projections use a hand-written backward (`transformer._matmul`, for XLA:CPU speed). Its
    gradient must equal (a) finite differences and (b) JAX's automatic transpose of the same einsum, through a whole
    model (GQA, qkv bias) with padding."""
    from jaxgrpo.models import transformer as tfm

    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 5)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((5, 4)), jnp.float32)
    jax.test_util.check_grads(tfm._matmul, (x, w), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)

    config = CONFIGS["qwen2_bias_mha"]
    params = random_params(config, seed=4)
    tok, mask = pad_rows(_prompts(2), 10, "left")
    target = jnp.asarray(np.random.default_rng(5).standard_normal((len(LENGTHS), 10, config.hidden_size)), jnp.float32)

    def loss(p):
        h = models.hidden_states(config, p, jnp.asarray(tok), attention_mask=jnp.asarray(mask))
        return jnp.sum(jnp.where(jnp.asarray(mask)[..., None], h * target, 0.0))

    ours = jax.grad(loss)(params)
    monkeypatch.setattr(tfm, "_matmul", lambda a, b: jnp.einsum("...i,io->...o", a, b))
    reference = jax.grad(loss)(params)
    for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(ours), jax.tree.leaves(reference)):
        if not np.any(np.asarray(r)):  # lm_head: not used by hidden_states
            np.testing.assert_array_equal(g, 0.0)
        else:
            assert rel_err(g, r) < 1e-5, jax.tree_util.keystr(path)


def test_shared_prefix_attention_equals_attention_over_concatenated_keys():
    """`_attend_shared_prefix` (kv-head-major operands, softmax taken part by part) against `_attend` on each row's
    concatenated keys [prompt's ; own] in the plain [B, S, K, H] layout, values and gradients, including a prompt
    with no real prefix slot and a query that sees no key at all (output 0, finite gradient)."""
    from jaxgrpo.models import transformer as tfm

    P, R, T, K, G, H, Tp, M = 2, 3, 4, 2, 2, 8, 5, 4
    keys = jax.random.split(jax.random.key(0), 5)
    q = jax.random.normal(keys[0], (P * R, T, K, G, H))
    kp, vp = jax.random.normal(keys[1], (P, Tp, K, H)), jax.random.normal(keys[2], (P, Tp, K, H))
    kd, vd = jax.random.normal(keys[3], (P * R, M, K, H)), jax.random.normal(keys[4], (P * R, M, K, H))
    pmask = np.ones((P, Tp), bool)
    pmask[0, :2] = False
    pmask[1] = False  # prompt 1: no prefix slot at all
    dmask = np.tril(np.ones((T, M), bool))[None].repeat(P * R, 0)
    dmask[4, 0] = False  # row 4 (a prompt-1 row), query 0: no visible key at all

    def shared(q, kp, vp, kd, vd):
        return tfm._attend_shared_prefix(q, kp.transpose(0, 2, 1, 3), vp.transpose(0, 2, 3, 1), jnp.asarray(pmask),
                                         kd.transpose(0, 2, 1, 3), vd.transpose(0, 2, 3, 1), jnp.asarray(dmask))

    def plain(q, kp, vp, kd, vd):
        k = jnp.concatenate([jnp.repeat(kp, R, 0), kd], 1)
        v = jnp.concatenate([jnp.repeat(vp, R, 0), vd], 1)
        mask = np.concatenate([np.repeat(pmask, R, 0)[:, None].repeat(T, 1), dmask], -1)
        return tfm._attend(q, k, v, jnp.asarray(mask))

    out, ref = jax.jit(shared)(q, kp, vp, kd, vd), plain(q, kp, vp, kd, vd)
    chex.assert_shape(out, (P * R, T, K, G, H))
    np.testing.assert_array_equal(out[4, 0], 0.0)
    assert rel_err(out, ref) < 1e-5
    w = jax.random.normal(jax.random.key(1), out.shape)
    g_shared = jax.grad(lambda *a: jnp.sum(shared(*a) * w), argnums=(0, 1, 2, 3, 4))(q, kp, vp, kd, vd)
    g_plain = jax.grad(lambda *a: jnp.sum(plain(*a) * w), argnums=(0, 1, 2, 3, 4))(q, kp, vp, kd, vd)
    chex.assert_tree_all_finite(g_shared)
    for a, b in zip(g_shared, g_plain):
        assert rel_err(a, b) < 1e-5
