# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The objectives inside the train step and the trainer: `train_step.policy_gradient` with each ``algo.objective``,
``algo.entropy_top_frac`` and ``algo.overlong_filter`` equals `jax.grad` of `losses.policy_loss` on independent
log-probs and entropies (full logits from `models.forward`, the test_train_step reference); the step sharded over
data x fsdp equals the single-device step; and the default tiny demo trains with each switch on (loss finite,
params move, the switch's metrics logged)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_train import small_config
from test_train_step import TEMP, make_batch_np, reference_logprobs, tiny_config, to_batch

from jaxgrpo import advantages, losses, models, sharding, trainer
from jaxgrpo.config import AlgoConfig, OptimConfig
from jaxgrpo.learner import train_step as ts


@pytest.fixture(scope="module")
def setup():
    config = tiny_config()
    # weights x4: logits spread out, so the entropy and covariance rankings have gaps far above float rounding (at
    # initialisation every entropy is ~log V and the two log-prob paths could order near-ties differently)
    params = jax.tree.map(lambda x: 4.0 * x, models.init_params(config, jax.random.key(0)))
    rewards = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0.5, 0, 1, 0]], np.float32)
    batch = to_batch(config, params, make_batch_np(4, 3, 4, rewards), noise=0.3)
    truncated = np.array([1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 0], bool)
    return config, params, batch.replace(truncated=jnp.asarray(truncated))


def reference(config, algo: AlgoConfig, batch: ts.Batch):
    """loss(params): models.forward log-probs and entropies, advantages, policy_loss -- no train-step code."""
    adv = advantages.compute(algo.estimator, batch.rewards, batch.valid).reshape(-1)
    mask = np.asarray(batch.completion_mask) & np.asarray(batch.valid).reshape(-1)[:, None]
    if algo.overlong_filter:
        mask = mask & ~np.asarray(batch.truncated)[:, None]

    def loss_fn(p):
        logp, ent = reference_logprobs(config, p, batch.tokens, batch.prompt_mask, batch.completion_mask)
        return losses.policy_loss(
            logp, batch.old_logprobs, adv, mask, clip_low=algo.clip_low, clip_high=algo.clip_high,
            aggregation=algo.aggregation,
            objective=algo.objective, entropy=ent, entropy_top_frac=algo.entropy_top_frac,
            cispo_clip_low=algo.cispo_clip_low, cispo_clip_high=algo.cispo_clip_high,
            clip_cov_ratio=algo.clip_cov_ratio, clip_cov_lb=algo.clip_cov_lb, clip_cov_ub=algo.clip_cov_ub,
            kl_cov_ratio=algo.kl_cov_ratio, kl_cov_coef=algo.kl_cov_coef, key=jax.random.key(0),
        )  # fmt: skip

    return jax.jit(jax.value_and_grad(loss_fn, has_aux=True))


ALGOS = {  # three compiles cover every switch
    "cispo_entropy": AlgoConfig(objective="cispo", cispo_clip_high=0.1, entropy_top_frac=0.2,
                                aggregation="seq-mean-token-mean"),
    "clip_cov_filter": AlgoConfig(objective="clip_cov", clip_cov_ratio=0.1, clip_cov_lb=-1.0, clip_cov_ub=1.0,
                                  overlong_filter=True),
    "kl_cov": AlgoConfig(objective="kl_cov", kl_cov_ratio=0.1),
}


@pytest.mark.parametrize("name", list(ALGOS))
def test_step_gradient_matches_policy_loss_on_reference_logprobs(setup, name):
    config, params, batch = setup
    algo = ALGOS[name]
    loss, grads, metrics = ts.policy_gradient(config, algo, params, batch, temperature=TEMP)
    (ref_loss, ref_metrics), ref_grads = reference(config, algo, batch)(params)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    # relative error of the whole gradient (the x4 weights make single float32 entries of the two log-prob paths
    # differ by up to ~1e-5 absolute; a token selected differently would move the gradient by far more)
    diff = optax.tree_utils.tree_norm(jax.tree.map(lambda a, b: a - b, grads, ref_grads))
    ref = optax.tree_utils.tree_norm(ref_grads)
    assert float(diff) < 1e-4 * float(ref), (diff, ref)
    for k in [k for k in ref_metrics if k.startswith("loss/")]:
        np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=1e-5, err_msg=k)
        assert 0 < float(metrics[k]) < 1, (k, metrics[k])


def test_overlong_filter_needs_truncated(setup):
    config, params, batch = setup
    with pytest.raises(ValueError, match="overlong_filter needs batch.truncated"):
        ts.policy_gradient(config, AlgoConfig(overlong_filter=True), params, batch.replace(truncated=None),
                           temperature=TEMP)
    with pytest.raises(ValueError, match="algo.objective must be one of"):
        ts.policy_gradient(config, AlgoConfig(objective="dapo"), params, batch, temperature=TEMP)


@pytest.mark.slow
def test_sharded_step_equals_single_device():
    """One train step on data=4 x fsdp=2 equals the single-device step (params and metrics), with Clip-Cov's random
    subset (the step's key), batch-level entropy selection, the overlong filter and gradient accumulation."""
    P, G = 16, 2
    config = tiny_config()
    algo = AlgoConfig(objective="clip_cov", clip_cov_ratio=0.05, clip_cov_lb=-1.0, clip_cov_ub=1.0,
                      entropy_top_frac=0.5, overlong_filter=True, grad_accum_steps=2)
    optim = OptimConfig(learning_rate=1e-3, max_grad_norm=1.0)
    params0 = models.init_params(config, jax.random.key(0))
    batch = to_batch(config, params0, make_batch_np(11, P, G), noise=0.1)
    batch = batch.replace(truncated=np.arange(P * G) % 5 == 0)
    out = {}
    for sharded in (False, True):
        params = jax.tree.map(jnp.copy, params0)
        mesh = sharding.make_mesh(4, 2, 1) if sharded else None
        init_fn, step_fn = ts.make_train_step(config, algo, optim, mesh=mesh, temperature=TEMP, total_steps=4)
        state = init_fn(params, jax.random.key(1))
        state, metrics = step_fn(state, ts.global_batch(batch, mesh) if sharded else batch)
        out[sharded] = jax.device_get((metrics, state.params))
    (m1, p1), (m8, p8) = out[False], out[True]
    for k in m1:
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-5, atol=1e-7, err_msg=k)
    assert 0 < m1["loss/cov_selected_frac"] < 1 and 0 < m1["loss/entropy_selected_frac"] < 1
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), p8, p1)


SWITCHES = {
    "cispo": ["algo.objective=cispo"],
    "clip_cov": ["algo.objective=clip_cov"],
    "kl_cov": ["algo.objective=kl_cov"],
    # with `keep`, the 20% highest-entropy tokens of the nearly uniform initial policy can all sit in all-fail groups
    # (A = 0: no gradient, docs/objectives.md); `mask` takes those groups out before the ranking
    "entropy_top_frac": ["algo.entropy_top_frac=0.2", "algo.degenerate_groups=mask"],
    "overlong": ["algo.overlong_filter=true", "algo.overlong_buffer=1", "rollout.max_new_tokens=3"],
}
EXPECTED = {"cispo": ["loss/cispo_clipped_frac"], "clip_cov": ["loss/cov_selected_frac"],
            "kl_cov": ["loss/cov_selected_frac"], "entropy_top_frac": ["loss/entropy_selected_frac"],
            "overlong": ["overlong/filtered_frac", "overlong/penalty_mean"]}


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_default_demo_trains_with_each_switch(tmp_path, switch):
    cfg = small_config("train.steps=2", "checkpoint.every=0", "checkpoint.export_final=false",
                       "optim.warmup_steps=0", *SWITCHES[switch])
    t = trainer.Trainer(cfg, tmp_path / switch)
    before = jax.device_get(t.state.params)
    history = [t.step(i) for i in range(2)]
    after = jax.device_get(t.state.params)
    for rec in history:
        assert np.isfinite(rec["loss"]) and np.isfinite(rec["grad_norm"]), rec
        for k in EXPECTED[switch]:
            assert k in rec and np.isfinite(rec[k]), (k, rec.keys())
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
    assert moved > 0, switch
    if switch == "overlong":
        assert all(-1 <= rec["overlong/penalty_mean"] <= 0 for rec in history)
        assert all(0 <= rec["overlong/filtered_frac"] < 1 for rec in history), history


@pytest.mark.parametrize("override,match", [
    ("algo.objective=dapo", "algo.objective"),
    ("algo.entropy_top_frac=0", "algo.entropy_top_frac must be in"),
    ("algo.overlong_buffer=2", "algo.overlong_buffer must be in \\[1, rollout.max_new_tokens=1\\]"),
    ("algo.clip_cov_lb=6", "algo.clip_cov_lb must be < algo.clip_cov_ub=5.0"),
    ("algo.kl_cov_ratio=0", "algo.kl_cov_ratio must be in"),
])
def test_bad_objective_config_is_a_clean_error(override, match):
    from jaxgrpo import config as config_lib

    with pytest.raises(config_lib.ConfigError, match=match):
        config_lib.load_config("default", [override])
    extra = ["algo.objective=cispo", "algo.dual_clip=3"]
    with pytest.raises(config_lib.ConfigError, match="algo.dual_clip must be null with algo.objective=cispo"):
        config_lib.load_config("default", extra)
    extra = ["algo.entropy_top_frac=0.2", "algo.aggregation=seq-mean-token-sum", "algo.grad_accum_steps=2"]
    with pytest.raises(config_lib.ConfigError, match="algo.entropy_top_frac must be null with algo.aggregation=seq-mean"
                                                     "-token-sum and algo.grad_accum_steps=2 > 1"):  # fmt: skip
        config_lib.load_config("default", extra)
    config_lib.load_config("default", extra[:2])  # one micro-batch: the selection is the whole batch's


def test_step_refuses_entropy_selection_with_split_sequence_means():
    """The config check's rule holds for direct callers too: a seq-mean-* loss split into micro-batches is weighted
    by sequences counted before the top-ρ selection, so the accumulated loss would not be the batch's."""
    algo = AlgoConfig(entropy_top_frac=0.2, aggregation="seq-mean-token-mean", grad_accum_steps=2)
    with pytest.raises(ValueError, match="needs algo.grad_accum_steps=1"):
        ts.make_train_step(tiny_config(), algo, OptimConfig(), temperature=TEMP, total_steps=1)
    ts.make_train_step(tiny_config(), dataclasses.replace(algo, grad_accum_steps=1), OptimConfig(), temperature=TEMP,
                       total_steps=1)
