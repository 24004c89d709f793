# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""``perf.remat="projections+norms"``: the backward keeps each layer's two RMSNorm outputs besides the dense
projections' (`jaxgrpo.models.layers`). What it keeps is read from jax's own residual listing
(`jax.ad_checkpoint.print_saved_residuals`); the loss and gradients equal ``"projections"``'s and ``"none"``'s (it
changes only what is saved). Its memory is a benchmark (BENCHMARKS), not a test."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_step import assert_trees_close, tiny_config

from jaxgrpo import config as config_lib
from jaxgrpo import models
from jaxgrpo.models.attention import DENSE, Kernel
from jaxgrpo.models.transformer import hidden_states


def layer_residuals(config: models.ModelConfig, params, remat: str, kernel: Kernel = DENSE) -> list[str]:
    """The shapes of the residuals the layer scan saves for the backward (``bf16[L, ...]``/``f32[L, ...]`` entries;
    traced only, so cuDNN's attention needs no GPU)."""
    tokens = jnp.ones((2, 8), jnp.int32)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(lambda p: hidden_states(
            config, p, tokens, remat=remat, attention_kernel=kernel).astype(jnp.float32).sum(), params)  # fmt: skip
    return sorted(re.findall(r"^((?:bf16|f32)\[[0-9,]+\]) output of scan", out.getvalue(), re.M))


def test_projections_and_norms_keep_two_norm_outputs_more_per_layer():
    """bf16 compute: ``projections`` keeps the 7 projections' outputs of every layer (q, k, v, o, gate, up, down);
    ``projections+norms`` those and two ``[L, B, T, D]`` norm outputs; ``full`` only each layer's input."""
    config = dataclasses.replace(tiny_config(), dtype="bfloat16")
    params = models.init_params(config, jax.random.key(0))
    L, B, T, D = config.num_layers, 2, 8, config.hidden_size
    proj = layer_residuals(config, params, "projections")
    both = layer_residuals(config, params, "projections+norms")
    assert len(proj) == 7, proj
    norm = f"bf16[{L},{B},{T},{D}]"
    assert sorted(proj + [norm, norm]) == both, (proj, both)
    assert layer_residuals(config, params, "full") == [norm]  # the residual stream into each layer only


def test_projections_keep_the_cudnn_attention_forward(monkeypatch):
    """With cuDNN's fused attention, ``projections`` (and ``projections+norms``) also keep that kernel's forward
    outputs, its ``[L, B, T, N, H]`` output and float32 ``[L, B, N, T]`` softmax statistics, so the backward does not
    run the flash forward a second time (on an H200 it was 4 x 48 extra forward calls of ~0.27 ms in a 1.17-s step of
    the Qwen2.5-0.5B shape, BENCHMARKS §9); ``full`` keeps only each layer's input. Traced only: jax's check for an
    installed cuDNN library is answered with a version (9.10), since nothing is compiled or run."""
    from jax._src.cudnn import fused_attention_stablehlo

    monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 91000)
    config = dataclasses.replace(tiny_config(), dtype="bfloat16")
    params = models.init_params(config, jax.random.key(0))
    L, B, T, N, H = config.num_layers, 2, 8, config.num_heads, config.head_dim
    cudnn = Kernel(kind="cudnn")
    proj = layer_residuals(config, params, "projections")
    attention = [f"bf16[{L},{B},{T},{N},{H}]", f"f32[{L},{B},{N},{T}]"]
    assert layer_residuals(config, params, "projections", cudnn) == sorted(proj + attention)
    norm = f"bf16[{L},{B},{T},{config.hidden_size}]"
    assert layer_residuals(config, params, "projections+norms", cudnn) == sorted(proj + attention + [norm, norm])
    assert layer_residuals(config, params, "full", cudnn) == [norm]


@pytest.mark.slow
def test_same_loss_and_gradients_as_projections():
    """A loss of the decoder's hidden states (a fixed random projection of them), and its gradient in every
    parameter, under jit: ``projections+norms`` equals ``projections`` and no remat at all, in float32."""
    config = tiny_config()
    params = models.init_params(config, jax.random.key(1))
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, config.vocab_size, (3, 12)), jnp.int32)
    probe = jax.random.normal(jax.random.key(2), (3, 12, config.hidden_size))

    def value_and_grad(remat):
        loss = lambda p: jnp.sum(jnp.tanh(hidden_states(config, p, tokens, remat=remat)) * probe)  # noqa: E731
        return jax.jit(jax.value_and_grad(loss))(params)

    got = {r: value_and_grad(r) for r in ("none", "projections", "projections+norms")}
    for r in ("none", "projections"):
        np.testing.assert_allclose(float(got["projections+norms"][0]), float(got[r][0]), rtol=1e-6)
        # float32 reassociation only; gradient entries reach ~40 (one of 0.094 differed by 4e-6 under -O0 codegen)
        assert_trees_close(got["projections+norms"][1], got[r][1], rtol=1e-5, atol=1e-5)


def test_config_accepts_the_policy_by_name():
    cfg = config_lib.load_config("default", ["perf.remat=projections+norms"])
    assert cfg.perf.remat == "projections+norms"
    with pytest.raises(config_lib.ConfigError, match="projections\\+norms"):
        config_lib.load_config("default", ["perf.remat=norms"])
