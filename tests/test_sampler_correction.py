# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Sampler/trainer mismatch correction (`losses.sampler_correction`): closed forms, the loss and gradient with
importance weights, and the train step against an independent reference built from `models.forward` log-probs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_step import TEMP, make_batch_np, reference_logprobs, tiny_config, to_batch

from jaxgrpo import advantages, losses, models
from jaxgrpo.config import AlgoConfig
from jaxgrpo.learner import train_step as ts

TRAIN = np.array([[0.0, 0.0, -1.0, -2.0], [-0.5, -0.5, -0.5, 0.0]], np.float32)
SAMPLER = np.array([[0.0, -1.0, 0.0, -2.0], [-0.2, -0.2, -0.2, 0.0]], np.float32)
MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)  # log rho = [0, 1, -1, 0], [-0.3, -0.3, -0.3, pad]


def test_closed_forms():
    w, keep = losses.sampler_correction(TRAIN, SAMPLER, MASK, "token_tis", 2.0)
    np.testing.assert_allclose(w, [[1, 2, math.exp(-1), 1], [math.exp(-0.3)] * 3 + [1]], rtol=1e-6)
    assert keep.all()
    w, keep = losses.sampler_correction(TRAIN, SAMPLER, MASK, "seq_tis", 2.0)  # row sums of log rho: 0, -0.9
    np.testing.assert_allclose(w, [[1] * 4, [math.exp(-0.9)] * 3 + [1]], rtol=1e-6)
    w, keep = losses.sampler_correction(TRAIN, SAMPLER, MASK, "token_mask", 2.0)  # |log rho| <= log 2 = 0.693
    np.testing.assert_array_equal(keep, [[1, 0, 0, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(w, 1.0)
    _, keep = losses.sampler_correction(TRAIN, SAMPLER, MASK, "seq_mask", 2.0)
    np.testing.assert_array_equal(keep, [[1, 1, 1, 1], [0, 0, 0, 1]])  # exp(-0.9) < 1/2: the row leaves (pad stays)
    w, keep = losses.sampler_correction(TRAIN, SAMPLER, MASK, "none", 2.0)
    assert (np.asarray(w) == 1).all() and np.asarray(keep).all()
    assert losses.resolve_sampler_correction("auto", "bfloat16") == "token_tis"
    assert losses.resolve_sampler_correction("auto", "float32") == "none"
    with pytest.raises(ValueError, match="cap must be > 1"):
        losses.sampler_correction(TRAIN, SAMPLER, MASK, "token_tis", 1.0)
    with pytest.raises(ValueError, match="resolve 'auto' first"):
        losses.sampler_correction(TRAIN, SAMPLER, MASK, "auto", 2.0)


def test_weighted_loss_and_gradient_closed_form():
    """At logp = old_logp (ratio 1, inside the clip) the token-mean loss is -sum(A w) / n and d loss / d logp_t =
    -A_t w_t / n: the weight scales each token's gradient and gets none itself."""
    adv = np.array([1.0, -2.0], np.float32)
    w, _ = losses.sampler_correction(TRAIN, SAMPLER, MASK, "token_tis", 2.0)

    def loss(logp):
        return losses.policy_loss(logp, TRAIN, adv, MASK, is_weights=w)[0]

    value, grad = jax.value_and_grad(loss)(jnp.asarray(TRAIN))
    n = MASK.sum()
    a_t = np.where(MASK, adv[:, None], 0.0)
    np.testing.assert_allclose(value, -np.sum(a_t * np.asarray(w)) / n, rtol=1e-6)
    np.testing.assert_allclose(grad, -a_t * np.asarray(w) / n, rtol=1e-6, atol=1e-8)


def _reference_loss(config, params, batch, algo):
    """The corrected loss from scratch: trainer log-probs from models.forward at the sampling params, the PPO ratio
    against them, weights / keep from the closed form above."""
    adv = advantages.compute(algo.estimator, batch.rewards, batch.valid).reshape(-1)
    mask = np.asarray(batch.completion_mask) & np.asarray(batch.valid).reshape(-1)[:, None]
    old, _ = reference_logprobs(config, params, batch.tokens, batch.prompt_mask, batch.completion_mask)
    log_rho = np.where(mask, np.asarray(old) - np.asarray(batch.old_logprobs), 0.0)
    mode, cap = algo.sampler_correction, algo.sampler_correction_cap
    if mode.startswith("seq"):  # one ratio per sequence: the product over its tokens, on each of them
        log_rho = np.broadcast_to(np.clip(log_rho.sum(axis=1, keepdims=True), -20, 20), log_rho.shape)
    if mode.endswith("tis"):
        w, keep = np.where(mask, np.minimum(np.exp(log_rho), cap), 1.0), mask
    else:  # token_mask, seq_mask
        w, keep = np.ones_like(log_rho), mask & (np.abs(log_rho) <= math.log(cap))

    def loss_fn(p):
        logp, _ = reference_logprobs(config, p, batch.tokens, batch.prompt_mask, batch.completion_mask)
        return losses.policy_loss(logp, old, adv, keep, is_weights=jnp.asarray(w, jnp.float32))[0]

    return jax.jit(jax.value_and_grad(loss_fn))(params), keep


@pytest.mark.parametrize("mode", ["token_tis", "token_mask", "seq_tis", "seq_mask"])
def test_train_step_correction_equals_reference(mode):
    config = tiny_config()
    params = models.init_params(config, jax.random.key(0))
    # a large sampler/trainer mismatch: some tokens are truncated or masked
    batch = to_batch(config, params, make_batch_np(4, 3, 4), noise=1.0)
    algo = AlgoConfig(sampler_correction=mode, sampler_correction_cap=1.5)
    loss, grads, metrics = ts.policy_gradient(config, algo, params, batch, temperature=TEMP)
    (ref_loss, ref_grads), keep = _reference_loss(config, params, batch, algo)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    if mode.endswith("mask"):
        assert 0 < keep.sum() < np.asarray(batch.completion_mask).sum()  # the mask did drop tokens
    # without the correction the loss differs (the check that it can fail)
    plain, _, _ = ts.policy_gradient(config, AlgoConfig(sampler_correction="none"), params, batch, temperature=TEMP)
    assert abs(float(plain) - float(ref_loss)) > 1e-4


def test_correction_under_a_mesh_equals_one_device():
    """token_tis with the batch sharded by groups over data=2 x fsdp=2 (the ratios, weights and normalizers psum'ed
    in shard_map) gives the single-device loss and gradient."""
    from jaxgrpo import sharding

    config = tiny_config()
    params = models.init_params(config, jax.random.key(0))
    batch = to_batch(config, params, make_batch_np(4, 4, 4), noise=1.0)
    algo = AlgoConfig(sampler_correction="token_tis", sampler_correction_cap=1.5)
    loss, grads, _ = ts.policy_gradient(config, algo, params, batch, temperature=TEMP)
    mesh = sharding.make_mesh(2, 2, 1, devices=jax.devices()[:4])
    sharded = sharding.shard_params(jax.tree.map(jnp.copy, params), config, mesh)
    loss_m, grads_m, _ = ts.policy_gradient(config, algo, sharded, ts.global_batch(batch, mesh), temperature=TEMP,
                                            mesh=mesh)  # fmt: skip
    np.testing.assert_allclose(loss_m, loss, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads_m), jax.tree.leaves(grads)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_step_metrics_report_the_mismatch():
    config = tiny_config()
    params = models.init_params(config, jax.random.key(0))
    batch = to_batch(config, params, make_batch_np(5, 4, 4), noise=1.0)
    from jaxgrpo.config import OptimConfig

    init_fn, step_fn = ts.make_train_step(config, AlgoConfig(sampler_correction="token_tis"), OptimConfig(),
                                          temperature=TEMP, total_steps=2)  # fmt: skip
    _, m = step_fn(init_fn(jax.tree.map(jnp.copy, params), jax.random.key(0)), batch)
    old, _ = reference_logprobs(config, params, batch.tokens, batch.prompt_mask, batch.completion_mask)
    mask = np.asarray(batch.completion_mask)
    diff = np.where(mask, np.asarray(batch.old_logprobs) - np.asarray(old), 0.0)
    np.testing.assert_allclose(m["sampler/kl"], diff.sum() / mask.sum(), rtol=1e-4, atol=1e-6)
    want = np.sum(mask & (-diff >= math.log(2.0))) / mask.sum()  # weights truncated at the default cap 2
    np.testing.assert_allclose(m["sampler/corrected_frac"], want, rtol=1e-5)
    assert 0 < float(m["sampler/corrected_frac"]) < 1
