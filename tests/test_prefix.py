# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Prefix-shared forward (jaxgrpo.models.prefix) == the plain path (models.hidden_states on the concatenated rows).

The plain path is tested against transformers in test_models_hf.py; here every prefix-shared output (hidden states,
per-token log-probs, a GRPO-style loss, and its gradient w.r.t. every parameter) must equal it to 1e-5, on tiny
random llama / qwen2 (qkv bias, tied) / qwen3 (qk-norm, explicit head_dim) models with ragged left-padded prompts
and ragged right-padded completions, with and without jit.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import random_params, rel_err

from jaxgrpo.models import ModelConfig, hidden_states, lm_head
from jaxgrpo.models.prefix import check_groups, group_prompts, prefix_shared_hidden, prefix_shared_predictors
from jaxgrpo.padding import packed_width

V = 61
P, G, TP, TC = 2, 3, 6, 5


def tiny(arch: str, **kw) -> ModelConfig:
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                architecture=arch, qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3")  # fmt: skip
    if arch == "qwen3":
        base["head_dim"] = 16
    base.update(kw)
    return ModelConfig(**base)


# Weights large enough (std 0.3) that attention is far from uniform; norms ~1.
PARAMS = dict(scale=0.3, norm_scale=0.03, dtype=jnp.float32)

CONFIGS = {"llama": tiny("llama"), "qwen2_tied": tiny("qwen2", tie_word_embeddings=True), "qwen3": tiny("qwen3")}


def rollout(seed: int = 0):
    """Train-step rows: prompt p left-padded (lengths 6 and 2), completions right-padded (lengths 5, 1, 3 / 2, 5, 4)."""
    rng = np.random.default_rng(seed)
    plen, clen = np.array([TP, 2]), np.array([[TC, 1, 3], [2, TC, 4]])
    prompts = rng.integers(1, V, (P, TP))
    pmask = np.arange(TP)[None, :] >= (TP - plen)[:, None]
    prompts = np.where(pmask, prompts, 0)
    comp = rng.integers(1, V, (P, G, TC))
    cmask = np.arange(TC)[None, None, :] < clen[..., None]
    comp = np.where(cmask, comp, 0)
    tokens = np.concatenate([np.repeat(prompts, G, 0), comp.reshape(P * G, TC)], 1).astype(np.int32)
    rows = (tokens, np.repeat(pmask, G, 0), cmask.reshape(P * G, TC))
    groups = (prompts.astype(np.int32), pmask, comp.astype(np.int32), cmask)
    return tuple(jnp.asarray(x) for x in rows + groups)


def plain_predictors(cfg, params, tokens, pmask, cmask):
    h = hidden_states(cfg, params, tokens, attention_mask=jnp.concatenate([pmask, cmask], 1))
    return h[:, TP - 1 : TP + TC - 1]


def logprobs(cfg, params, h_BCD, tokens):
    logits = jnp.einsum("bcd,dv->bcv", h_BCD, lm_head(cfg, params))
    return jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, TP:, None], axis=-1)[..., 0]


# Packed prompt rows (prompt lengths 6 and 2): two rows of width 7 (one unused column each) or one row of exactly 8.
PACKINGS = {"shared": {}, "packed": dict(packed_width=7, pack_rows=2), "remat": dict(remat="full", packed_width=8)}


def loss_fn(cfg, params, tokens, pmask, cmask, adv, mode: str):
    if mode != "plain":
        h = prefix_shared_predictors(cfg, params, tokens, pmask, cmask, G, **PACKINGS[mode])
    else:
        h = plain_predictors(cfg, params, tokens, pmask, cmask)
    logp = logprobs(cfg, params, h, tokens)
    return -jnp.sum(jnp.where(cmask, logp * adv[:, None], 0.0)) / jnp.sum(cmask), logp


class TestPrefixShared(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hidden_states_equal_plain(self):
        # op-by-op (no jit) is slow on CPU: one model there, all three under jit
        for arch in sorted(CONFIGS) if self.variant.type == chex.ChexVariantType.WITH_JIT else ["qwen3"]:
            cfg = CONFIGS[arch]
            params = random_params(cfg, **PARAMS)
            tokens, pm, cm, prompts, pmask, comp, cmask = rollout()
            h_c, h_last = self.variant(prefix_shared_hidden, static_argnums=0)(cfg, params, prompts, pmask, comp, cmask)
            chex.assert_shape(h_c, (P, G, TC, cfg.hidden_size))
            chex.assert_shape(h_last, (P, cfg.hidden_size))
            chex.assert_tree_all_finite((h_c, h_last))
            ref = jax.jit(hidden_states, static_argnums=0)(cfg, params, tokens, None, jnp.concatenate([pm, cm], 1))
            # every completion position (padding ones too: they see the same keys in both paths)
            np.testing.assert_allclose(h_c.reshape(P * G, TC, -1), ref[:, TP:], rtol=1e-5, atol=1e-5, err_msg=arch)
            np.testing.assert_allclose(h_last, ref[::G, TP - 1], rtol=1e-5, atol=1e-5, err_msg=arch)
            # not trivially equal: different completions of one prompt give different states, and the prompt matters
            assert float(jnp.abs(h_c[0, 0, 0] - h_c[0, 1, 0]).max()) > 1e-3
            assert float(jnp.abs(h_last[0] - h_last[1]).max()) > 1e-3

    @pytest.mark.slow
    def test_logprobs_loss_and_gradients_equal_plain(self):
        # One jitted function per model computes the plain and the shared (qwen3: also shared+remat) loss/logp/grads.
        # (llama's attention/MLP path is the qwen ones minus bias / qk-norm; its forward is checked above.)
        adv = jnp.asarray([1.0, -0.5, 0.25, -1.0, 2.0, 0.5])
        for arch in ("qwen2_tied", "qwen3"):
            cfg = CONFIGS[arch]
            params = random_params(cfg, seed=1, **PARAMS)
            tokens, pm, cm, *_ = rollout(seed=2)

            # "packed": prompts packed end to end; "remat": recomputed layers, prompts packed in one row
            modes = ("plain", "shared", "remat") if arch == "qwen3" else ("plain", "shared", "packed")

            @jax.jit
            def run(params, tokens, pm, cm, adv, cfg=cfg, modes=modes):
                fn = jax.value_and_grad(loss_fn, argnums=1, has_aux=True)
                outs = {m: fn(cfg, params, tokens, pm, cm, adv, m) for m in set(modes)}
                return [outs[m] for m in modes]

            ((l0, lp0), g0), ((l1, lp1), g1), ((l2, lp2), g2) = run(params, tokens, pm, cm, adv)
            chex.assert_tree_all_finite((l1, lp1, g1))
            np.testing.assert_allclose(lp1, lp0, rtol=1e-5, atol=1e-5, err_msg=arch)
            np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-6, err_msg=arch)
            # Gradients are sums over every token in a different order in the two paths (the shared path sums a
            # prompt's G cotangents first): compare each leaf at its own scale, max|g1 - g0| <= 1e-5 max|g0|, not
            # element by element (a small element of a sum with cancellation differs by float32 rounding alone).
            for (path, a), b, c in zip(jax.tree_util.tree_flatten_with_path(g0)[0], jax.tree.leaves(g1),
                                       jax.tree.leaves(g2)):  # fmt: skip
                assert rel_err(b, a) < 1e-5 and rel_err(c, a) < 1e-5, (arch, jax.tree_util.keystr(path))
            np.testing.assert_allclose(l2, l0, rtol=1e-5, atol=1e-6, err_msg=arch)
            # every parameter gets gradient (so equality is not 0 == 0), including the prompt-only path's weights
            for path, g in jax.tree_util.tree_flatten_with_path(g1)[0]:
                assert float(jnp.abs(g).max()) > 0, (arch, jax.tree_util.keystr(path))

    def test_packed_prompts_equal_padded(self):
        # Prompts packed end to end (one row, or one per prompt; exact width or with unused columns) compute the same
        # states as the left-padded prompt rows and the plain forward.
        for arch in ("llama", "qwen3"):
            cfg = CONFIGS[arch]
            params = random_params(cfg, **PARAMS)
            tokens, pm, cm, prompts, pmask, comp, cmask = rollout(seed=3)
            ref = jax.jit(hidden_states, static_argnums=0)(cfg, params, tokens, None, jnp.concatenate([pm, cm], 1))
            for rows, width in ((1, 8), (1, 13), (2, 6), (2, 9)):
                fn = jax.jit(prefix_shared_hidden, static_argnums=0, static_argnames=("packed_width", "pack_rows"))
                h_c, h_last = fn(cfg, params, prompts, pmask, comp, cmask, packed_width=width, pack_rows=rows)
                chex.assert_shape((h_c, h_last), ((P, G, TC, cfg.hidden_size), (P, cfg.hidden_size)))
                chex.assert_tree_all_finite((h_c, h_last))
                msg = f"{arch} rows={rows} width={width}"
                np.testing.assert_allclose(h_c.reshape(P * G, TC, -1), ref[:, TP:], rtol=1e-5, atol=1e-5, err_msg=msg)
                np.testing.assert_allclose(h_last, ref[::G, TP - 1], rtol=1e-5, atol=1e-5, err_msg=msg)

    def test_packed_width_and_errors(self):
        # the sum of the P/rows longest prompts, rounded up to 64; 0 when not narrower than the padded rows
        assert packed_width([100, 30, 70, 20], 2) == 192
        assert packed_width([100, 30, 70, 20], 2, prompt_width=128) == 192
        assert packed_width([100, 30, 70, 20], 1, prompt_width=128) == 256
        assert packed_width([100, 30, 70, 20], 4, prompt_width=100) == 0  # 128 >= 1 * 100
        assert packed_width([6, 2], 1) == 64
        with pytest.raises(ValueError, match="pack_rows=3 must divide the 4 prompts"):
            packed_width([1, 2, 3, 4], 3)
        cfg = CONFIGS["llama"]
        params = random_params(cfg, **PARAMS)
        _, _, _, prompts, pmask, comp, cmask = rollout()
        with pytest.raises(ValueError, match="packed_width=7 cannot hold a packed row of 8 prompt tokens"):
            prefix_shared_hidden(cfg, params, prompts, pmask, comp, cmask, packed_width=7)
        with pytest.raises(ValueError, match="pack_rows=3 must divide the 2 prompts"):
            prefix_shared_hidden(cfg, params, prompts, pmask, comp, cmask, packed_width=8, pack_rows=3)

    def test_single_completion_token(self):
        cfg = CONFIGS["llama"]
        params = random_params(cfg, **PARAMS)
        tokens, pm, cm, *_ = rollout()
        tokens1, cm1 = tokens[:, : TP + 1], cm[:, :1]
        h = jax.jit(prefix_shared_predictors, static_argnums=(0, 5))(cfg, params, tokens1, pm, cm1, G)
        ref = hidden_states(cfg, params, tokens1, attention_mask=jnp.concatenate([pm, cm1], 1))[:, TP - 1 : TP]
        np.testing.assert_allclose(h, ref, rtol=1e-5, atol=1e-5)

    def test_group_prompts_and_errors(self):
        tokens, pm, cm, prompts, pmask, comp, cmask = rollout()
        pr, m = group_prompts(tokens, pm, G)
        np.testing.assert_array_equal(pr, prompts)
        np.testing.assert_array_equal(m, pmask)
        check_groups(tokens, pm, G)  # the rollout layout passes
        bad = np.asarray(tokens).copy()
        bad[4, TP - 1] = (bad[4, TP - 1] + 1) % V  # row 4 is in group 1
        with pytest.raises(ValueError, match="group 1 .rows 3..5. does not share one prompt"):
            check_groups(bad, pm, G)
        with pytest.raises(ValueError, match="group_size=4"):
            group_prompts(tokens, pm, 4)
        cfg = CONFIGS["llama"]
        params = random_params(cfg, **PARAMS)
        with pytest.raises(ValueError, match="completion_tokens must be .P, G, Tc."):
            prefix_shared_hidden(cfg, params, prompts, pmask, comp[0])
        with pytest.raises(ValueError, match="prompt_mask has shape"):
            prefix_shared_hidden(cfg, params, prompts, pmask[:, 1:], comp)
        with pytest.raises(ValueError, match="tokens has shape .6, 11., expected .6, 10."):
            prefix_shared_predictors(cfg, params, tokens, pm, cm[:, 1:], G)
