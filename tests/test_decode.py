# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The rollout engine's model entry points (`jaxgrpo.models.decode`) against the plain full-sequence forward.

`prefill` (prompts padded or packed end to end) and `decode_step` (G rows sharing one prompt cache, one token a step)
must give the hidden states `models.hidden_states` computes on each concatenated, unshared row [prompt; completion]
(itself tested against transformers in test_models_hf.py), with keys/values equal to the plain cache path's.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import pad_rows, random_params, rel_err

from jaxgrpo import models, padding
from jaxgrpo.models import attention, layers

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
G = 3  # samples per prompt


def _prompts(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 97, n).astype(np.int32) for n in LENGTHS]


def _packed_prefill(config, params, prompts, rows, tp, packed=True):
    tok, mask = pad_rows(prompts, tp, "left")
    width = padding.sampler_packed_width([len(p) for p in prompts], rows) if packed else 0
    last, prefix = models.prefill(config, params, jnp.asarray(tok), jnp.asarray(mask), packed_width=width,
                                  pack_rows=rows)  # fmt: skip
    return mask, last, prefix


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("rows", [0, 1, 2])  # 0: left-padded, not packed
def test_prefill_equals_plain_forward(name, rows):
    config = CONFIGS[name]
    params = random_params(config, seed=1)
    prompts, tp = _prompts(), 12
    pmask, last, prefix = _packed_prefill(config, params, prompts, max(rows, 1), tp, packed=rows > 0)
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
    np.testing.assert_array_equal(pmask, mask)
    m = mask[None, :, :, None, None]  # in forward_with_cache's [L, B, S, K, H] layout
    assert rel_err(np.where(m, prefix.k.transpose(0, 1, 3, 2, 4), 0), np.where(m, cache.k, 0)) < 1e-5
    assert rel_err(np.where(m, prefix.v.transpose(0, 1, 4, 2, 3), 0), np.where(m, cache.v, 0)) < 1e-5


def test_pack_layout():
    prompts = [np.array([5, 6, 7]), np.array([8]), np.array([9, 10]), np.array([0])]
    width = padding.sampler_packed_width([len(p) for p in prompts], 2)
    assert width == 16  # longest row 4 tokens -> the smallest width bucket, 16
    tok, mask = pad_rows(prompts, 4, "left")
    np.testing.assert_array_equal(mask[:2], [[0, 1, 1, 1], [0, 0, 0, 1]])
    p = padding.pack_layout(jnp.asarray(mask), width, 2)
    packed = attention.take_rows(jnp.asarray(tok).reshape(2, -1), p["token_slot"])
    np.testing.assert_array_equal(packed[0, :4], [5, 6, 7, 8])
    np.testing.assert_array_equal(packed[1, :3], [9, 10, 0])
    np.testing.assert_array_equal(p["position"][0, :4], [0, 1, 2, 0])
    np.testing.assert_array_equal(p["slot_index"][0, 1:4], [0, 1, 2])  # prompt 0, slots 1..3
    np.testing.assert_array_equal(p["slot_index"][0, 4 + 3], 3)  # prompt 1, slot 3
    np.testing.assert_array_equal(p["token_slot"][0, :4], [1, 2, 3, 7])  # flat slot q * Tp + s
    np.testing.assert_array_equal(p["last"], [[2, 3], [1, 2]])
    with pytest.raises(ValueError, match="cannot hold a packed row of 4 prompt tokens"):
        padding.pack_layout(jnp.asarray(mask), 3, 2)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decode_step_equals_full_rows(name):
    """Six tokens decoded one at a time (`decode.decode_step`, the rollout engine's token step on the per-layer prefix
    and decode caches) give the states of the full rows [prompt; completion]."""
    from jaxgrpo.models import decode

    config = CONFIGS[name]
    params = random_params(config, seed=2)
    prompts, tp, m = _prompts(1), 12, 6
    _, _, kv = _packed_prefill(config, params, prompts, 1, tp)
    prefix = [models.KVCache(kv.k[i], kv.v[i]) for i in range(config.num_layers)]
    _, pmask = pad_rows(prompts, tp, "left")
    n, K, H = len(prompts) * G, config.num_kv_heads, config.head_dim
    gen = np.random.default_rng(3).integers(1, 97, (n, m)).astype(np.int32)
    dt = jnp.dtype(config.dtype)
    cache = [models.KVCache(jnp.zeros((n, K, m, H), dt), jnp.zeros((n, K, H, m), dt)) for _ in prefix]
    step = jax.jit(decode.decode_step, static_argnums=0, donate_argnames="cache")
    weights = decode.decode_weights(config, params)
    hs = []
    for t in range(m):
        pos = jnp.asarray(np.repeat(LENGTHS, G) + t, jnp.int32)
        mask = jnp.broadcast_to(jnp.arange(m) <= t, (n, m))
        h, cache = step(config, weights, jnp.asarray(gen[:, t]), pos, prefix, jnp.asarray(pmask), cache,
                        jnp.int32(t), mask)  # fmt: skip
        chex.assert_shape(h, (n, config.hidden_size))
        chex.assert_tree_all_finite(h)
        hs.append(h)
    rows = [np.concatenate([prompts[i // G], gen[i]]) for i in range(n)]
    tok, mask = pad_rows(rows, tp + m, "left")
    ref = models.hidden_states(config, params, jnp.asarray(tok), attention_mask=jnp.asarray(mask))[:, tp:]
    assert rel_err(jnp.stack(hs, 1), ref) < 1e-5


def test_projection_backward_equals_autodiff_and_finite_differences():
    """The decoder's dense projections can use a hand-written backward (`layers.matmul`, `matmul_backward="explicit"`,
    for XLA:CPU speed). Its gradient must equal (a) finite differences and (b) JAX's automatic transpose of the same
    einsum (`matmul_backward="xla"`), through a whole model (GQA, qkv bias) with padding."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 5)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((5, 4)), jnp.float32)
    jax.test_util.check_grads(layers.matmul, (x, w), order=1, modes=["rev"], atol=1e-2, rtol=1e-2)

    config = CONFIGS["qwen2_bias_mha"]
    params = random_params(config, seed=4)
    tok, mask = pad_rows(_prompts(2), 10, "left")
    target = jnp.asarray(np.random.default_rng(5).standard_normal((len(LENGTHS), 10, config.hidden_size)), jnp.float32)

    def loss(p, mode):
        h = models.hidden_states(config, p, jnp.asarray(tok), attention_mask=jnp.asarray(mask), matmul_backward=mode)
        return jnp.sum(jnp.where(jnp.asarray(mask)[..., None], h * target, 0.0))

    ours = jax.grad(loss)(params, "explicit")
    reference = jax.grad(loss)(params, "xla")
    for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(ours), jax.tree.leaves(reference)):
        if not np.any(np.asarray(r)):  # lm_head: not used by hidden_states
            np.testing.assert_array_equal(g, 0.0)
        else:
            assert rel_err(g, r) < 1e-5, jax.tree_util.keystr(path)


def test_shared_prefix_attention_equals_attention_over_concatenated_keys():
    """`attend_shared_prefix` (kv-head-major operands, softmax taken part by part) against `attend` on each row's
    concatenated keys [prompt's ; own] in the plain [B, S, K, H] layout, values and gradients, including a prompt
    with no real prefix slot and a query that sees no key at all (output 0, finite gradient)."""
    P, G, T, K, R, H, Tp, M = 2, 3, 4, 2, 2, 8, 5, 4  # R: query heads per kv head
    keys = jax.random.split(jax.random.key(0), 5)
    q = jax.random.normal(keys[0], (P * G, T, K, R, H))
    kp, vp = jax.random.normal(keys[1], (P, Tp, K, H)), jax.random.normal(keys[2], (P, Tp, K, H))
    kd, vd = jax.random.normal(keys[3], (P * G, M, K, H)), jax.random.normal(keys[4], (P * G, M, K, H))
    pmask = np.ones((P, Tp), bool)
    pmask[0, :2] = False
    pmask[1] = False  # prompt 1: no prefix slot at all
    dmask = np.tril(np.ones((T, M), bool))[None].repeat(P * G, 0)
    dmask[4, 0] = False  # row 4 (a prompt-1 row), query 0: no visible key at all

    def shared(q, kp, vp, kd, vd):
        return attention.attend_shared_prefix(q, kp.transpose(0, 2, 1, 3), vp.transpose(0, 2, 3, 1), jnp.asarray(pmask),
                                         kd.transpose(0, 2, 1, 3), vd.transpose(0, 2, 3, 1), jnp.asarray(dmask))

    def plain(q, kp, vp, kd, vd):
        k = jnp.concatenate([jnp.repeat(kp, G, 0), kd], 1)
        v = jnp.concatenate([jnp.repeat(vp, G, 0), vd], 1)
        mask = np.concatenate([np.repeat(pmask, G, 0)[:, None].repeat(T, 1), dmask], -1)
        return attention.attend(q, k, v, jnp.asarray(mask))

    out, ref = jax.jit(shared)(q, kp, vp, kd, vd), plain(q, kp, vp, kd, vd)
    chex.assert_shape(out, (P * G, T, K, R, H))
    np.testing.assert_array_equal(out[4, 0], 0.0)
    assert rel_err(out, ref) < 1e-5
    w = jax.random.normal(jax.random.key(1), out.shape)
    g_shared = jax.grad(lambda *a: jnp.sum(shared(*a) * w), argnums=(0, 1, 2, 3, 4))(q, kp, vp, kd, vd)
    g_plain = jax.grad(lambda *a: jnp.sum(plain(*a) * w), argnums=(0, 1, 2, 3, 4))(q, kp, vp, kd, vd)
    chex.assert_tree_all_finite(g_shared)
    for a, b in zip(g_shared, g_plain):
        assert rel_err(a, b) < 1e-5
