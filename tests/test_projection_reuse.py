# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Reusing the sampler's dense-projection outputs in the train step (`sampling.generate(record_projections=True)`
-> `train_step.Batch.projections`): the loss and the gradient equal those of the step that recomputes every
product (within float rounding: the decode computes one token per step, the train step all at once), and the
step refuses them where they would be stale or misplaced.

The reference is the existing prefix-shared train step with ``projections=None`` (itself tested against the plain
path and an independent reference in test_train_step_prefix.py / test_train_step.py).
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgrpo import models, sampling
from jaxgrpo import train_step as ts
from jaxgrpo.config import AlgoConfig, OptimConfig, PerfConfig

P, G, M, TEMP = 4, 3, 7, 0.9
EOS = 5


def _config(qkv_bias: bool) -> models.ModelConfig:
    return models.ModelConfig(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
        max_position_embeddings=64, qkv_bias=qkv_bias,
    )  # fmt: skip


def _rollout(config, params, seed: int = 0):
    """A real rollout (EOS stops included) and its train-step batch with the recorded projections."""
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(6, config.vocab_size, n)) for n in (3, 9, 5, 7)]
    comp = sampling.generate(config, params, prompts, num_samples=G, max_new_tokens=M, temperature=TEMP,
                             eos_token_ids=(EOS,), key=jax.random.key(seed), record_projections=True)  # fmt: skip
    Tp = 10
    n = P * G
    prompt = np.zeros((n, Tp), np.int32)
    pmask = np.zeros((n, Tp), bool)
    for p, ids in enumerate(prompts):
        prompt[p * G : (p + 1) * G, Tp - len(ids) :] = ids
        pmask[p * G : (p + 1) * G, Tp - len(ids) :] = True
    cmask = np.asarray(comp.mask)
    batch = ts.Batch(
        tokens=jnp.asarray(np.concatenate([prompt, np.where(cmask, np.asarray(comp.tokens), 0)], axis=1)),
        prompt_mask=jnp.asarray(pmask),
        completion_mask=jnp.asarray(cmask),
        rewards=jnp.asarray(rng.integers(0, 2, (P, G)).astype(np.float32)),
        valid=jnp.ones((P, G), bool),
        old_logprobs=jnp.asarray(np.where(cmask, np.asarray(comp.logprobs), 0.0), jnp.float32),
        projections=comp.projections,
    )
    return comp, batch, sum(map(len, prompts))


def test_recorded_projections_give_the_recomputed_gradient():
    config = _config(qkv_bias=True)  # (the update test below runs without bias)
    params = models.init_params(config, jax.random.key(1))
    # non-zero biases: the record must hold the products before the bias, as the train step takes them
    params["layers"] = {k: (v + 0.1 if k.endswith("bias") else v) for k, v in params["layers"].items()}
    comp, batch, width = _rollout(config, params)
    widths = models.projection_widths(config)
    for name, x in comp.projections.items():
        chex.assert_shape(x, (config.num_layers, P * G, M - 1, widths[name]))
        chex.assert_tree_all_finite(x)
    assert not np.asarray(comp.mask).all(), "the rollout should contain EOS-stopped rows (masked positions)"
    algo = AlgoConfig()
    loss_ref, grads_ref, m_ref = ts.policy_gradient(
        config, algo, params, batch.replace(projections=None), temperature=TEMP, packed_prompt_width=width
    )
    loss, grads, m = ts.policy_gradient(config, algo, params, batch, temperature=TEMP, packed_prompt_width=width)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5, atol=1e-7)
    for g, g_ref in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
        scale = float(np.max(np.abs(g_ref))) or 1.0
        np.testing.assert_allclose(np.asarray(g) / scale, np.asarray(g_ref) / scale, atol=1e-5)
    # Sensitivity: the record of the wrong decode step (shifted by one token) gives another gradient.
    shifted = {k: jnp.roll(v, 1, axis=2) for k, v in comp.projections.items()}
    _, grads_bad, _ = ts.policy_gradient(
        config, algo, params, batch.replace(projections=shifted), temperature=TEMP, packed_prompt_width=width
    )
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(grads_bad), jax.tree.leaves(grads_ref)))
    assert diff > 1e-3


def test_train_step_with_recorded_projections_gives_the_same_update():
    config = _config(False)
    params = models.init_params(config, jax.random.key(2))
    _, batch, width = _rollout(config, params, seed=3)
    optim = OptimConfig(learning_rate=1e-3)
    init_fn, step_fn = ts.make_train_step(config, AlgoConfig(), optim, temperature=TEMP, total_steps=4)
    s_ref, m_ref = step_fn(init_fn(jax.tree.map(jnp.copy, params), jax.random.key(0)),
                           batch.replace(projections=None), packed_prompt_width=width)  # fmt: skip
    s_new, m_new = step_fn(init_fn(jax.tree.map(jnp.copy, params), jax.random.key(0)), batch,
                           packed_prompt_width=width)  # fmt: skip
    np.testing.assert_allclose(m_new["loss"], m_ref["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m_new["grad_norm"], m_ref["grad_norm"], rtol=1e-4)
    # Adam divides each gradient component by its own magnitude, so float-rounding noise in a near-zero component
    # becomes update noise: params get an absolute slack of 1% of one lr step (as in test_train_step_prefix).
    for a, b in zip(jax.tree.leaves(s_new.params), jax.tree.leaves(s_ref.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-2 * optim.learning_rate)


@pytest.mark.parametrize(
    "change", [dict(num_iterations=2), dict(grad_accum_steps=2, num_minibatches=1), dict(prefix_sharing=False)]
)
def test_recorded_projections_are_refused_where_they_would_be_stale(change):
    config = _config(False)
    params = models.init_params(config, jax.random.key(1))
    _, batch, width = _rollout(config, params)
    perf_change = {k: v for k, v in change.items() if k == "prefix_sharing"}
    algo = dataclasses.replace(AlgoConfig(), **{k: v for k, v in change.items() if k not in perf_change})
    with pytest.raises(ValueError, match="projections"):
        ts.policy_gradient(config, algo, params, batch, perf=PerfConfig(**perf_change), temperature=TEMP,
                           packed_prompt_width=width if not perf_change else 0)  # fmt: skip


def test_generate_record_rejects_a_mesh_and_records_nothing_by_default():
    config = _config(False)
    params = models.init_params(config, jax.random.key(1))
    comp = sampling.generate(config, params, [[7, 8, 9]], num_samples=2, max_new_tokens=4, key=jax.random.key(0))
    assert comp.projections is None
    mesh = jax.make_mesh((1,), ("data",))
    with pytest.raises(ValueError, match="record_projections"):
        sampling.generate(config, params, [[7, 8, 9]], num_samples=2, max_new_tokens=4, key=jax.random.key(0),
                          mesh=mesh, record_projections=True)  # fmt: skip
