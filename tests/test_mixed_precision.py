# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Mixed precision: float32 master weights (``param_dtype``) with bfloat16 compute (``dtype``).

The update at an RL learning rate must reach the float32 masters (bfloat16 weights round it away: the check that this
test can fail), the real SmolLM2's bfloat16-compute log-probs stay close to float32, and a run with bfloat16 compute
resumes exactly from its float32 checkpoints.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_step import TEMP, make_batch_np, tiny_config, to_batch

from jaxgrpo import config as config_lib
from jaxgrpo import metrics_log, models, trainer
from jaxgrpo.config import AlgoConfig, OptimConfig
from jaxgrpo.learner import train_step as ts


def test_masters_in_param_dtype_forward_in_compute_dtype():
    config = tiny_config().replace(dtype="bfloat16", param_dtype="float32")
    params = models.init_params(config, jax.random.key(0))
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(models.compute_params(config, params))} == {jnp.dtype(jnp.bfloat16)}
    tokens = jnp.ones((2, 5), jnp.int32)
    h = models.hidden_states(config, params, tokens)
    assert h.dtype == jnp.bfloat16
    # the forward reads the masters in the compute dtype: same as running on the compute-dtype copy
    np.testing.assert_array_equal(h, models.hidden_states(config, models.compute_params(config, params), tokens))
    # the gradient reaches the masters in their own dtype
    g = jax.grad(lambda p: jnp.sum(models.forward(config, p, tokens)[..., 0]))(params)
    assert {x.dtype for x in jax.tree.leaves(g)} == {jnp.dtype(jnp.float32)}
    with pytest.raises(models.ModelConfigError, match="param_dtype"):
        tiny_config().replace(param_dtype="float16")


def _drift(dtype: str, param_dtype: str, steps: int = 10) -> float:
    """Norm of the layer-weight change after ``steps`` AdamW updates at lr 1e-6 on one fixed rollout."""
    config = tiny_config().replace(dtype=dtype, param_dtype=param_dtype)
    params = models.init_params(config, jax.random.key(3))
    f32 = tiny_config()
    batch = to_batch(f32, jax.tree.map(lambda x: x.astype(jnp.float32), params), make_batch_np(7, P=4, G=4))
    optim = OptimConfig(learning_rate=1e-6, max_grad_norm=0.0)
    init_fn, step_fn = ts.make_train_step(config, AlgoConfig(), optim, temperature=TEMP, total_steps=steps)
    start = jax.tree.map(lambda x: np.asarray(x, np.float64), params["layers"])
    state = init_fn(jax.tree.map(jnp.copy, params), jax.random.key(0))
    for _ in range(steps):
        state, _ = step_fn(state, batch)
    end = jax.tree.map(lambda x: np.asarray(x, np.float64), state.params["layers"])
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(param_dtype)}
    return float(np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(end), jax.tree.leaves(start)))))


def test_bf16_compute_update_moves_float32_masters_like_float32():
    full = _drift("float32", "float32")
    mixed = _drift("bfloat16", "float32")
    assert full > 0
    assert abs(mixed / full - 1.0) < 0.1, (mixed, full)
    # bfloat16 weights (no float32 master): the same updates are mostly rounded away
    rounded = _drift("bfloat16", "bfloat16")
    assert rounded < 0.5 * full, (rounded, full)


@pytest.mark.slow
def test_smollm2_bf16_compute_logprobs_close_to_float32(smollm2_gguf, smollm2):
    """The real model: bfloat16 compute over float32 masters vs all-float32, per-token log-probs of a sentence."""
    c32, p32 = smollm2  # float32, the load's default
    c16, p16 = models.load_pretrained(smollm2_gguf, dtype="bfloat16")
    assert c16.param_dtype == "float32" and jax.tree.leaves(p16)[0].dtype == jnp.float32
    tokens = jnp.asarray([[1, 504, 3458, 282, 4649, 314, 260, 4520, 30, 378, 3458, 282, 4649, 1437, 314, 2000]])

    def logp(config, params):
        logits = jax.jit(models.forward, static_argnums=0)(config, params, tokens)
        lp = jax.nn.log_softmax(logits[0, :-1].astype(jnp.float32))
        return np.asarray(jnp.take_along_axis(lp, tokens[0, 1:, None], axis=-1)[:, 0]), np.asarray(lp)

    t32, a32 = logp(c32, p32)
    t16, a16 = logp(c16, p16)
    chex.assert_tree_all_finite((t16, a16))
    # stated tolerance: bfloat16 has 8 significant bits; through 30 layers the per-token log-prob moves by < 0.25 nats
    # (mean < 0.1), and the top-1 next token agrees at >= 80% of positions
    assert np.max(np.abs(t16 - t32)) < 0.25 and np.mean(np.abs(t16 - t32)) < 0.1, np.abs(t16 - t32)
    assert np.mean(a16.argmax(-1) == a32.argmax(-1)) >= 0.8


@pytest.mark.slow
def test_bf16_compute_run_resumes_exactly_from_float32_masters(tmp_path):
    from test_train import SMALL, assert_records_close

    def cfg(steps: int) -> config_lib.Config:
        c = config_lib.load_config("default", [*SMALL, "model.dtype=bfloat16", "checkpoint.keep=10"])
        return dataclasses.replace(c, train=dataclasses.replace(c.train, steps=steps))

    trainer.run(cfg(4), tmp_path / "straight")
    trainer.run(cfg(2), tmp_path / "resumed")
    trainer.run(cfg(4), tmp_path / "resumed")  # resumes from the step-2 checkpoint (float32 masters)
    read = metrics_log.read_metrics
    assert_records_close(read(tmp_path / "resumed"), read(tmp_path / "straight"))
    from jaxgrpo import checkpoint as ckpt_lib

    for run in ("straight", "resumed"):
        with ckpt_lib.CheckpointManager(ckpt_lib.run_checkpoint_dir(tmp_path / run), keep=10, save_interval=0) as m:
            assert m.all_steps()[-1] == 4


@pytest.mark.slow
def test_default_demo_learns_with_bf16_compute(tmp_path):
    """The offline demo with bfloat16 compute (float32 masters, the default token-level correction) learns as the
    float32 demo does: mean reward from chance (1/60) past 0.8 over its last 20 steps."""
    cfg = config_lib.load_config("default", ["model.dtype=bfloat16", "log.progress=false", "checkpoint.every=0"])
    trainer.run(cfg, tmp_path / "run")
    recs = metrics_log.read_metrics(tmp_path / "run")
    assert np.mean([r["reward/mean"] for r in recs[:10]]) < 0.1
    assert np.mean([r["reward/mean"] for r in recs[-20:]]) > 0.8
    assert all("sampler/kl" in r and np.isfinite(r["sampler/kl"]) for r in recs)
