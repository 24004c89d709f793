# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Transformer on random parameters: shapes/dtypes, jit and no-jit, causality, padding invariance, KV cache
consistency with the full forward, masked rows without NaN, config validation. HF parity lives in test_models_hf.py."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import pad_rows, random_params

from jaxgrpo.models import (
    KVCache,
    ModelConfig,
    ModelConfigError,
    RopeScaling,
    count_params,
    forward,
    forward_with_cache,
    from_hf_config,
    hidden_states,
    init_cache,
    init_params,
    lm_head,
    param_axes,
)
from jaxgrpo.models.layers import apply_rope
from jaxgrpo.models.prefix import prefix_shared_hidden

V = 97
# Tests call these jitted versions (one compile per shape) instead of op-by-op dispatch, which on CPU compiles every
# primitive separately and is much slower; the chex.variants tests cover the un-jitted path.
fwd = jax.jit(forward, static_argnums=0, static_argnames="remat")
hid = jax.jit(hidden_states, static_argnums=0)


def tiny(arch: str = "llama", **kw) -> ModelConfig:
    base = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                rope_theta=10000.0, rms_norm_eps=1e-6, architecture=arch, qkv_bias=arch == "qwen2",
                qk_norm=arch == "qwen3")  # fmt: skip
    if arch == "qwen3":
        base["head_dim"] = 32  # explicit head_dim != hidden / heads
    base.update(kw)
    return ModelConfig(**base)


CONFIGS = {
    "llama": tiny("llama"),
    "llama3rope": tiny("llama", rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 16), rope_theta=500000.0),
    "qwen2_tied": tiny("qwen2", tie_word_embeddings=True),
    "qwen3": tiny("qwen3"),
}


def tokens(B: int, T: int, seed: int = 3) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (B, T), 0, V, dtype=jnp.int32)


class TestForward(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_shapes_dtypes_finite(self):
        cfg = CONFIGS["qwen3"]
        params = random_params(cfg)
        logits = self.variant(lambda p, t: forward(cfg, p, t))(params, tokens(2, 5))
        chex.assert_shape(logits, (2, 5, V))
        chex.assert_type(logits, jnp.float32)
        chex.assert_tree_all_finite(logits)
        h = self.variant(lambda p, t: hidden_states(cfg, p, t))(params, tokens(2, 5))
        chex.assert_shape(h, (2, 5, cfg.hidden_size))
        np.testing.assert_allclose(h @ lm_head(cfg, params), logits, rtol=1e-5, atol=1e-5)

    def test_all_families_finite(self):
        for name, cfg in CONFIGS.items():
            logits = fwd(cfg, random_params(cfg), tokens(2, 5))
            chex.assert_shape(logits, (2, 5, V))
            chex.assert_tree_all_finite(logits)
            assert float(jnp.std(logits)) > 1e-3, name

    def test_bfloat16_params_give_float32_logits_close_to_float32(self):
        cfg = CONFIGS["qwen3"]
        params = random_params(cfg)
        cfg16 = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
        p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
        chex.assert_trees_all_equal_dtypes(p16, jax.eval_shape(lambda: init_params(cfg16, jax.random.key(0))))
        l32 = fwd(cfg, params, tokens(2, 6))
        l16 = fwd(cfg16, p16, tokens(2, 6))
        chex.assert_type(l16, jnp.float32)
        assert jax.eval_shape(lambda: hidden_states(cfg16, p16, tokens(2, 6))).dtype == jnp.bfloat16
        # bf16 has ~3 significant digits; logits here are O(1)
        np.testing.assert_allclose(l16, l32, atol=0.1)
        assert float(jnp.mean(jnp.abs(l16 - l32))) < 0.02

    def test_causal(self):
        cfg = CONFIGS["llama3rope"]
        params = random_params(cfg)
        t = tokens(2, 8)
        t2 = t.at[:, 5:].set((t[:, 5:] + 1) % V)
        a, b = fwd(cfg, params, t), fwd(cfg, params, t2)
        np.testing.assert_allclose(a[:, :5], b[:, :5], rtol=1e-6, atol=1e-6)
        assert not np.allclose(a[:, 5:], b[:, 5:])

    def test_left_and_right_padding_match_unpadded(self):
        for name in ("llama3rope",):  # the other families' padding is covered by the HF parity tests
            cfg = CONFIGS[name]
            params = random_params(cfg)
            seqs = [np.asarray(tokens(1, n, seed=n)[0]) for n in (7, 1)]
            ref = [fwd(cfg, params, jnp.asarray(s)[None])[0] for s in seqs]
            W = 9
            for side in ("left", "right"):
                tok, mask = pad_rows(seqs, W, side)
                logits = fwd(cfg, params, jnp.asarray(tok), None, jnp.asarray(mask))
                chex.assert_tree_all_finite(logits)  # padding query rows (no visible key) must not be NaN
                for i in range(len(seqs)):
                    np.testing.assert_allclose(logits[i][mask[i]], ref[i], rtol=1e-5, atol=1e-5,
                                               err_msg=f"{name} {side} row {i}")  # fmt: skip

    def test_fully_masked_row_is_finite(self):
        cfg = CONFIGS["qwen2_tied"]
        params = random_params(cfg)
        mask = jnp.array([[0, 0, 0, 0], [1, 1, 1, 0]], bool)
        logits = fwd(cfg, params, tokens(2, 4), None, mask)
        chex.assert_tree_all_finite(logits)

    def test_remat_same_values_and_gradients(self):
        cfg = CONFIGS["qwen3"]
        params = random_params(cfg)
        t = tokens(2, 5)
        mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], bool)  # left padding: fully masked query rows

        def loss(p, remat):
            logp = jax.nn.log_softmax(forward(cfg, p, t, None, mask, remat=remat))[..., 0]  # jitted below
            return jnp.sum(jnp.where(mask, logp, 0.0))

        g0 = jax.jit(jax.grad(loss), static_argnums=1)(params, "projections")
        g1 = jax.jit(jax.grad(loss), static_argnums=1)(params, "full")
        g2 = jax.jit(jax.grad(loss), static_argnums=1)(params, "none")
        # float32 reassociation only; atol for entries summed with cancellation (an embed entry of 0.014 differed by
        # 8e-7 under the tests' -O0 CPU codegen)
        chex.assert_trees_all_close(g0, g1, rtol=1e-5, atol=2e-6)
        chex.assert_trees_all_close(g0, g2, rtol=1e-5, atol=2e-6)
        chex.assert_tree_all_finite(g1)
        assert float(jnp.abs(g1["layers"]["q_norm"]).max()) > 0

    def test_explicit_positions_shift_changes_logits_only_through_rope(self):
        # RoPE is relative: shifting all positions by a constant leaves the logits unchanged.
        cfg = CONFIGS["llama"]
        params = random_params(cfg)
        t = tokens(2, 6)
        pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
        np.testing.assert_allclose(fwd(cfg, params, t, pos + 11), fwd(cfg, params, t, pos), rtol=2e-4, atol=2e-4)


def _numpy_rope(x: np.ndarray, cos_h: np.ndarray, sin_h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two closed forms in NumPy float32 (``x`` [B, T, heads, H], tables [B, T, H/2]): RoFormer's rotation
    (Su et al. 2021, eq. 34) of each pair (i, i + H/2), ``[[cos, -sin], [sin, cos]] @ [x_i, x_{i+H/2}]``, and HF's
    ``x * cos + rotate_half(x) * sin`` (``modeling_llama.apply_rotary_pos_emb``, tables repeated to [H])."""
    x = x.astype(np.float32)
    c, s = cos_h[:, :, None, :], sin_h[:, :, None, :]
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    roformer = np.concatenate([c * x1 - s * x2, s * x1 + c * x2], axis=-1)
    rotate_half = np.concatenate([-x2, x1], axis=-1)
    hf = x * np.concatenate([c, c], axis=-1) + rotate_half * np.concatenate([s, s], axis=-1)
    return roformer, hf


class TestRope(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_apply_rope_is_the_closed_form_rotation(self):
        """Bit for bit op by op (float32 products and sums as NumPy rounds them; bfloat16 results rounded to nearest
        even as ml_dtypes does). Compiled, XLA may contract a product and the sum into one FMA (XLA:CPU at its default
        optimisation level, XLA:GPU): within one float32 rounding of a product then, and one bfloat16 ulp."""
        B, T, X, H = 2, 7, 3, 16
        rng = np.random.default_rng(0)
        pos = rng.integers(0, 4096, (B, T)).astype(np.float32)
        inv_freq = (1.0 / 10000.0 ** (np.arange(0, H, 2) / H)).astype(np.float32)
        angle = pos[..., None] * inv_freq
        cos_h, sin_h = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        rope = self.variant(apply_rope)
        for dtype in (jnp.float32, jnp.bfloat16):
            x = (rng.standard_normal((B, T, X, H)) * 3).astype(np.float32).astype(dtype)
            roformer, hf = _numpy_rope(np.asarray(x), cos_h, sin_h)
            np.testing.assert_array_equal(roformer, hf)  # the two published forms agree exactly in float32
            want = roformer.astype(dtype).astype(np.float32)
            got = rope(jnp.asarray(x), jnp.asarray(cos_h), jnp.asarray(sin_h))
            assert got.dtype == dtype and got.shape == x.shape
            got = np.asarray(got).astype(np.float32)
            if self.variant.type == chex.ChexVariantType.WITHOUT_JIT:
                np.testing.assert_array_equal(got, want)
            else:  # |x1 cos| + |x2 sin| per element bounds both products
                xf = np.abs(np.asarray(x).astype(np.float32))
                c2 = np.abs(np.concatenate([cos_h, cos_h], axis=-1))[:, :, None, :]
                s2 = np.abs(np.concatenate([sin_h, sin_h], axis=-1))[:, :, None, :]
                partner = np.concatenate([xf[..., H // 2 :], xf[..., : H // 2]], axis=-1)
                bound = 2.0**-22 * (xf * c2 + partner * s2)
                if dtype == jnp.bfloat16:
                    bound = bound + 2.0**-7 * np.abs(want)
                assert np.all(np.abs(got - want) <= bound), np.abs(got - want).max()


def _mlp_width_residuals(capsys, fn, params, cfg) -> int:
    """How many activations of MLP width, stacked over the layers, the backward of ``fn`` keeps (JAX's own account)."""
    capsys.readouterr()
    jax.ad_checkpoint.print_saved_residuals(fn, params)
    lines = capsys.readouterr().out.splitlines()
    return sum(ln.startswith(f"f32[{cfg.num_layers},") and f",{cfg.intermediate_size}] output of scan" in ln
               for ln in lines)  # fmt: skip


def test_remat_policies_keep_what_they_name(capsys):
    # remat="projections" (default): of the SwiGLU MLP only gate and up are kept (silu, the product and the rest are
    # recomputed in the backward); the prefix-shared path keeps them for its prompt and completion rows. "full" keeps
    # none. Without a policy ("none") JAX keeps more (the check that this count can fail), and its gradients are the
    # reference the policy must reproduce.
    cfg = CONFIGS["llama"]
    params = random_params(cfg)
    t = tokens(4, 5)
    pt, pm = t[:2], jnp.ones((2, 5), bool)
    plain = lambda remat: lambda p: jnp.sum(jnp.sin(hidden_states(cfg, p, t, remat=remat)))  # noqa: E731
    shared = lambda remat: lambda p: jnp.sum(jnp.sin(prefix_shared_hidden(  # noqa: E731
        cfg, p, pt, pm, t[2:].reshape(2, 1, 5), remat=remat)[0]))
    for f, kept in ((plain, 2), (shared, 4)):
        assert _mlp_width_residuals(capsys, f("projections"), params, cfg) == kept
        assert _mlp_width_residuals(capsys, f("full"), params, cfg) == 0
    g_policy = jax.jit(jax.grad(plain("projections")))(params)
    assert _mlp_width_residuals(capsys, plain("none"), params, cfg) > 2
    g_ref = jax.jit(jax.grad(plain("none")))(params)
    # up to float32 rounding: the embedding's gradient sums terms up to ~100 (an ulp ~8e-6); recomputing RoPE in the
    # backward lets XLA order its sums differently (3e-5 at most, as remat="full" against "none")
    chex.assert_trees_all_close(g_policy, g_ref, rtol=1e-5, atol=1e-4)


class TestKVCache(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_prefill_then_decode_matches_full_forward(self):
        # qwen3: qk-norm, explicit head_dim, untied head (bias, tying and rope variants share the code paths)
        cfg = CONFIGS["qwen3"]
        self._check(self.variant(lambda p, t, pos, c, s, m: forward_with_cache(cfg, p, t, pos, c, s, m)), cfg)

    @staticmethod
    def _check(step, cfg):
        params = random_params(cfg)
        # row 0: 5 real prompt tokens; row 1: 3 real tokens, left-padded by 2
        prompt = np.asarray(tokens(2, 5))
        pmask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], bool)
        new = np.asarray(tokens(2, 3, seed=9))
        S = 10
        kv_mask = np.zeros((2, S), bool)
        kv_mask[:, :5] = pmask
        pos = np.maximum(np.cumsum(pmask, 1) - 1, 0)
        cache = init_cache(cfg, 2, S)
        chex.assert_shape(cache.k, (cfg.num_layers, 2, S, cfg.num_kv_heads, cfg.head_dim))
        h, cache = step(params, jnp.asarray(prompt), jnp.asarray(pos), cache, 0, jnp.asarray(kv_mask))
        assert isinstance(cache, KVCache)
        outs = [h]
        nxt = pos[:, -1] + 1
        for i in range(3):
            kv_mask[:, 5 + i] = True
            h, cache = step(params, jnp.asarray(new[:, i : i + 1]), jnp.asarray(nxt[:, None] + i), cache,
                            jnp.int32(5 + i), jnp.asarray(kv_mask))  # fmt: skip
            outs.append(h)
        h_all = jnp.concatenate(outs, axis=1)
        full_tok = jnp.asarray(np.concatenate([prompt, new], 1))
        full_mask = jnp.asarray(np.concatenate([pmask, np.ones((2, 3), bool)], 1))
        ref = hid(cfg, params, full_tok, None, full_mask)
        m = np.asarray(full_mask)
        np.testing.assert_allclose(h_all[m], ref[m], rtol=1e-5, atol=1e-5)

    def test_cache_dtype_and_shape_errors(self):
        cfg = CONFIGS["llama"]
        params = random_params(cfg)
        cache = init_cache(cfg, 2, 8, dtype=jnp.bfloat16)
        assert cache.k.dtype == jnp.bfloat16
        with pytest.raises(ValueError, match="kv_mask shape"):
            forward_with_cache(cfg, params, tokens(2, 1), jnp.zeros((2, 1), jnp.int32), cache, 0, jnp.ones((2, 7)))
        with pytest.raises(ValueError, match="does not fit batch"):
            forward_with_cache(cfg, params, tokens(3, 1), jnp.zeros((3, 1), jnp.int32), cache, 0, jnp.ones((3, 8)))


class TestConfig:
    def test_hashable_static_arg(self):
        cfg = CONFIGS["llama3rope"]
        assert hash(cfg) == hash(cfg.replace())
        f = jax.jit(forward, static_argnums=0)
        chex.assert_shape(f(cfg, random_params(cfg), tokens(2, 5)), (2, 5, V))

    def test_param_axes_match_param_ranks(self):
        for cfg in CONFIGS.values():
            params = init_params(cfg, jax.random.key(0))
            axes = param_axes(cfg)
            flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))
            for x, a in zip(jax.tree.leaves(params), flat_axes):
                assert x.ndim == len(a)
            assert jax.tree.structure(params) == jax.tree.structure(axes, is_leaf=lambda x: isinstance(x, tuple))

    def test_count_params_closed_form(self):
        cfg = CONFIGS["qwen3"]  # untied, qk-norm, head_dim 32
        D, F, N, K, H, L = 64, 96, 4, 2, 32, 2
        per_layer = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F + 2 * D + 2 * H
        assert count_params(cfg) == 2 * V * D + L * per_layer + D

    def test_errors(self):
        with pytest.raises(ModelConfigError, match="supported: \\('llama', 'qwen2', 'qwen3'\\)"):
            tiny("gpt2")
        with pytest.raises(ModelConfigError, match="multiple of num_kv_heads"):
            tiny(num_kv_heads=3)
        with pytest.raises(ModelConfigError, match="unsupported dtype"):
            tiny(dtype="float16")
        with pytest.raises(ModelConfigError, match="unsupported dtype 'float16'"):
            tiny(dtype=jnp.float16)
        assert tiny(dtype=jnp.bfloat16).dtype == "bfloat16" and tiny(dtype=np.float32).dtype == "float32"
        with pytest.raises(ModelConfigError, match="rope scaling type 'yarn'"):
            RopeScaling("yarn")
        with pytest.raises(ModelConfigError, match="model_type='mistral'.*supported"):
            from_hf_config({"model_type": "mistral", "architectures": ["MistralForCausalLM"]})
        with pytest.raises(ModelConfigError, match="missing 'intermediate_size'"):
            from_hf_config({"model_type": "llama", "vocab_size": 3, "hidden_size": 4, "num_hidden_layers": 1,
                            "num_attention_heads": 1})  # fmt: skip
        hf = {"model_type": "llama", "vocab_size": 3, "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 1}  # fmt: skip
        with pytest.raises(ModelConfigError, match="hidden_act='gelu' is not supported; supported: 'silu'"):
            from_hf_config({**hf, "hidden_act": "gelu"})
        with pytest.raises(ModelConfigError, match="use_sliding_window=True is not supported"):
            from_hf_config({**hf, "model_type": "qwen2", "use_sliding_window": True})
        with pytest.raises(ValueError, match="tokens must be"):
            forward(CONFIGS["llama"], init_params(CONFIGS["llama"], jax.random.key(0)), jnp.zeros((3,), jnp.int32))

    def test_from_hf_config_reads_rope_parameters(self):
        hf = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "eos_token_id": [1, 2],
              "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192}}  # fmt: skip
        cfg = from_hf_config(hf)
        assert cfg.rope_theta == 500000.0 and cfg.head_dim == 4 and cfg.eos_token_ids == (1, 2)
        assert cfg.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
        # a missing key takes transformers' default for the architecture: LlamaConfig 2048 positions, head_dim
        # hidden / heads; Qwen2Config and Qwen3Config 32768 positions, Qwen3Config head_dim 128
        plain = {k: v for k, v in hf.items() if k != "rope_parameters"}
        assert (cfg.max_position_embeddings, from_hf_config(plain).head_dim) == (2048, 4)
        q3 = from_hf_config({**plain, "model_type": "qwen3"})
        assert (q3.max_position_embeddings, q3.head_dim) == (32768, 128)
        assert from_hf_config({**plain, "model_type": "qwen2"}).max_position_embeddings == 32768


def test_the_loader_stops_on_the_generation_configs_eos_ids_too(tmp_path):
    """Qwen2.5/Qwen3 Instruct list <|im_end|> in config.json and <|im_end|>, <|endoftext|> in generation_config.json,
    where transformers' generate reads them: a rollout stops on both."""
    import json

    from jaxgrpo.models import load_pretrained, save_pretrained

    config = CONFIGS["llama"].replace(eos_token_ids=(5,))
    save_pretrained(config, init_params(config, jax.random.key(0)), tmp_path / "m", dtype="float32")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    assert load_pretrained(tmp_path / "m")[0].eos_token_ids == (5, 7)


def test_models_package_has_one_layer_loop():
    """Every forward of the package runs the one `layers.run_layers` scan: no second loop over layers may appear."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "jaxgrpo"
    scans = {str(p.relative_to(root)): len(re.findall(r"\blax\.(?:scan|fori_loop|while_loop)\(", p.read_text()))
             for p in root.rglob("*.py")}  # fmt: skip
    in_models = {k: v for k, v in scans.items() if k.startswith("models") and v}
    # models/chunked.py loops over key chunks inside one attention call (memory-efficient attention), and
    # models/pallas_attention.py over key blocks inside one decode kernel: neither over layers
    within = ("models/chunked.py", "models/pallas_attention.py")
    assert {k: v for k, v in in_models.items() if k not in within} == {"models/layers.py": 1}, in_models
    for name in within:
        assert "layers" not in (root / name).read_text().replace("layers.py", ""), name
