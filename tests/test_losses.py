# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for jaxgrpo.losses: hand values for every clip mode and aggregation (a loop-by-loop numpy reference of the
published formulas), GSPO value and gradient, KL estimators, metrics, errors, finite gradients at extreme ratios,
jit/vmap, and sharded == unsharded (loss, metrics and gradients)."""

import functools
import math

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from jax.sharding import Mesh, PartitionSpec

from jaxgrpo import losses

AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def ref_loss(ratio, adv, mask, clip_low=0.2, clip_high=None, dual=None, aggregation="token-mean", max_tokens=None):
    """Loop-by-loop numpy reference: per-token PPO loss with clip-higher / dual-clip, then the aggregation."""
    clip_high = clip_low if clip_high is None else clip_high
    rows, cols = mask.shape
    tok = np.zeros((rows, cols))
    for i in range(rows):
        for t in range(cols):
            a = adv[i] if np.ndim(adv) == 1 else adv[i, t]
            rho = ratio[i, t]
            clipped = min(max(rho, 1 - clip_low), 1 + clip_high)
            loss = -min(rho * a, clipped * a)
            if dual is not None and a < 0:
                loss = min(loss, -dual * a)
            tok[i, t] = loss
    seqs = [i for i in range(rows) if mask[i].sum() > 0]
    if aggregation == "token-mean":
        return sum(tok[i, t] for i in range(rows) for t in range(cols) if mask[i, t]) / mask.sum()
    sums = {i: sum(tok[i, t] for t in range(cols) if mask[i, t]) for i in seqs}
    if aggregation == "seq-mean-token-mean":
        return sum(sums[i] / mask[i].sum() for i in seqs) / len(seqs)
    if aggregation == "seq-mean-token-sum":
        return sum(sums.values()) / len(seqs)
    return sum(sums.values()) / (len(seqs) * (max_tokens or cols))


RATIO = np.array([[1.5, 0.5, 1.0], [1.1, 0.7, 2.0], [3.0, 1.0, 1.0]])
MASK = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 0]], bool)  # the third sequence has no valid token
ADV = np.array([1.0, -1.0, 5.0])


def _loss(ratio=RATIO, adv=ADV, mask=MASK, **kw):
    logp = jnp.log(jnp.asarray(ratio, jnp.float32)) - 1.0
    old = jnp.full(logp.shape, -1.0)
    return losses.policy_loss(logp, old, jnp.asarray(adv, jnp.float32), jnp.asarray(mask), **kw)


class PolicyLossTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_hand_values_token_mean(self):
        loss, metrics = self.variant(_loss)()
        # tokens: -min(1.5, 1.2) = -1.2, -min(0.5, 0.8) = -0.5, -1; A=-1: max(1.1, 1.1) = 1.1, max(0.7, 0.8) = 0.8
        np.testing.assert_allclose(loss, (-1.2 - 0.5 - 1.0 + 1.1 + 0.8) / 5, rtol=1e-5)
        chex.assert_shape(loss, ())
        chex.assert_type(loss, jnp.float32)
        for v in metrics.values():
            chex.assert_shape(v, ())
            chex.assert_type(v, jnp.float32)
        np.testing.assert_allclose(metrics["clip/high_frac"], 1 / 5)  # 1.5 > 1.2 with A > 0
        np.testing.assert_allclose(metrics["clip/low_frac"], 1 / 5)  # 0.7 < 0.8 with A < 0
        np.testing.assert_allclose(metrics["clip/dual_frac"], 0.0)
        np.testing.assert_allclose(metrics["ratio/mean"], (1.5 + 0.5 + 1.0 + 1.1 + 0.7) / 5, rtol=1e-6)
        np.testing.assert_allclose(metrics["ratio/max"], 1.5, rtol=1e-6)
        np.testing.assert_allclose(metrics["ratio/min"], 0.5, rtol=1e-6)
        r = np.array([1.5, 0.5, 1.0, 1.1, 0.7])
        np.testing.assert_allclose(metrics["approx_kl_old"], np.mean(r - 1 - np.log(r)), rtol=1e-5)
        np.testing.assert_allclose(metrics["tokens"], 5.0)
        np.testing.assert_allclose(metrics["sequences"], 2.0)
        np.testing.assert_allclose(metrics["kl"], 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_every_aggregation(self):
        hand = {
            "token-mean": -0.8 / 5,
            "seq-mean-token-mean": (-2.7 / 3 + 1.9 / 2) / 2,
            "seq-mean-token-sum": (-2.7 + 1.9) / 2,
            "seq-mean-token-sum-norm": -0.8 / (2 * 3),
        }
        for agg in AGGS:
            loss, _ = self.variant(functools.partial(_loss, aggregation=agg))()
            np.testing.assert_allclose(loss, hand[agg], rtol=1e-5, err_msg=agg)
            np.testing.assert_allclose(loss, ref_loss(RATIO, ADV, MASK, aggregation=agg), rtol=1e-5, err_msg=agg)
        loss, _ = self.variant(functools.partial(_loss, aggregation="seq-mean-token-sum-norm", max_tokens=4))()
        np.testing.assert_allclose(loss, -0.8 / (2 * 4), rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_dual_clip_issue_example(self):
        one = functools.partial(_loss, np.array([[5.0]]), np.array([-1.0]), np.array([[True]]))
        loss, metrics = self.variant(functools.partial(one, dual_clip=3.0))()
        np.testing.assert_allclose(loss, 3.0, rtol=1e-6)
        np.testing.assert_allclose(metrics["clip/dual_frac"], 1.0)
        loss, _ = self.variant(one)()
        np.testing.assert_allclose(loss, 5.0, rtol=1e-6)  # without the dual clip: max(5, 1.2)


def test_clip_higher_and_per_token_advantages():
    one = functools.partial(_loss, np.array([[1.25, 0.75]]), np.array([[1.0, -2.0]]), np.array([[True, True]]))
    # clip_high 0.28: 1.25 is inside [0.8, 1.28] -> -1.25; 0.75 with A=-2: max(1.5, 1.6) = 1.6
    loss, metrics = one(clip_high=0.28)
    np.testing.assert_allclose(loss, (-1.25 + 1.6) / 2, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip/high_frac"], 0.0)
    loss, metrics = one()  # symmetric 0.2: 1.25 is clipped to 1.2
    np.testing.assert_allclose(loss, (-1.2 + 1.6) / 2, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip/high_frac"], 0.5)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_against_reference(seed):
    rng = np.random.default_rng(seed)
    ratio = np.exp(rng.normal(0, 0.4, (5, 7)))
    adv = rng.normal(0, 1, (5, 7)) if seed else rng.normal(0, 1, 5)
    mask = rng.random((5, 7)) > 0.3
    mask[2] = False
    for agg in AGGS:
        for kw in ({}, {"clip_low": 0.1, "clip_high": 0.3}, {"dual_clip": 1.5}):
            got, _ = _loss(ratio, adv, mask, aggregation=agg, max_tokens=9, **kw)
            expected = ref_loss(ratio, adv, mask, kw.get("clip_low", 0.2), kw.get("clip_high"), kw.get("dual_clip"),
                                aggregation=agg, max_tokens=9)
            np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6, err_msg=f"{agg} {kw}")


def test_empty_sequences_are_left_out():
    for agg in AGGS:
        with_empty, _ = _loss(aggregation=agg)
        without, _ = _loss(RATIO[:2], ADV[:2], MASK[:2], aggregation=agg)
        np.testing.assert_allclose(with_empty, without, rtol=1e-6, err_msg=agg)
    loss, metrics = _loss(mask=np.zeros((3, 3), bool))
    assert float(loss) == 0.0 and float(metrics["tokens"]) == 0.0


def test_token_level_gradient():
    logp = jnp.log(jnp.asarray(RATIO, jnp.float32))
    grad = jax.grad(lambda lp: losses.policy_loss(lp, jnp.zeros_like(lp), jnp.asarray(ADV), jnp.asarray(MASK))[0])(
        logp
    )
    # d/dlogp of -rho A / N is -rho A / N where the unclipped branch is active, 0 where clipped or masked
    expected = np.zeros((3, 3))
    for i, t in [(0, 1), (0, 2), (1, 0)]:
        expected[i, t] = -RATIO[i, t] * ADV[i] / 5
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


def test_gspo_value_and_gradient():
    rng = np.random.default_rng(3)
    logp = jnp.asarray(rng.normal(-1.0, 0.3, (4, 6)), jnp.float32)
    old = logp - jnp.asarray(rng.normal(0.0, 0.15, (4, 6)), jnp.float32)
    mask = jnp.asarray(rng.random((4, 6)) > 0.25).at[:, 0].set(True)
    adv = jnp.asarray([1.0, -1.0, 0.5, -2.0])
    kw = {"ratio_level": "sequence", "aggregation": "seq-mean-token-mean", "clip_low": 0.1, "clip_high": 0.12}

    def gspo_sequence(lp):
        # GSPO (Zheng et al., 2025) objective written at the sequence level, without the token-level trick
        n = jnp.sum(mask, axis=1)
        s = jnp.exp(jnp.sum(jnp.where(mask, lp - old, 0.0), axis=1) / n)
        return jnp.mean(-jnp.minimum(s * adv, jnp.clip(s, 0.9, 1.12) * adv))

    loss, metrics = jax.jit(functools.partial(losses.policy_loss, **kw))(logp, old, adv, mask)
    np.testing.assert_allclose(loss, jax.jit(gspo_sequence)(logp), rtol=1e-5)
    g = jax.jit(jax.grad(lambda lp: losses.policy_loss(lp, old, adv, mask, **kw)[0]))(logp)
    np.testing.assert_allclose(g, jax.jit(jax.grad(gspo_sequence))(logp), rtol=1e-4, atol=1e-7)
    # closed form: -A_i s_i / (n_i S) on valid tokens of unclipped sequences
    m = np.asarray(mask)
    s = np.exp(((np.asarray(logp) - np.asarray(old)) * m).sum(1) / m.sum(1))
    a = np.asarray(adv)
    active = np.where(a > 0, s <= 1.12, s >= 0.9)
    expected = np.where(m, (-a * s * active / m.sum(1) / 4)[:, None], 0.0)
    np.testing.assert_allclose(g, expected, rtol=1e-4, atol=1e-7)
    # ratio metrics report the sequence ratios
    np.testing.assert_allclose(metrics["ratio/max"], s.max(), rtol=1e-5)


def test_kl_estimators_and_penalty():
    lp, ref = jnp.float32(-1.0), jnp.float32(-1.5)
    np.testing.assert_allclose(losses.kl_divergence(lp, ref, "k1"), 0.5)
    np.testing.assert_allclose(losses.kl_divergence(lp, ref, "k2"), 0.125)
    np.testing.assert_allclose(losses.kl_divergence(lp, ref, "k3"), math.exp(-0.5) + 0.5 - 1, rtol=1e-6)
    np.testing.assert_allclose(losses.kl_divergence(lp, ref, "k3"), 0.106531, atol=1e-6)

    logp = jnp.log(jnp.asarray(RATIO, jnp.float32)) - 1.0
    ref = logp - 0.5 * jnp.arange(3.0)[None, :]  # x = ref - logp = 0, -0.5, -1 per column
    k3_cols = np.array([0.0, math.exp(-0.5) + 0.5 - 1, math.exp(-1) + 1 - 1])
    for agg, expected_kl in (
        ("token-mean", (2 * k3_cols[0] + 2 * k3_cols[1] + k3_cols[2]) / 5),
        ("seq-mean-token-sum", (k3_cols.sum() + k3_cols[:2].sum()) / 2),
    ):
        base, _ = _loss(aggregation=agg)
        loss, metrics = _loss(aggregation=agg, ref_logp=ref, kl_coef=0.1)
        np.testing.assert_allclose(metrics["kl"], expected_kl, rtol=1e-5)
        np.testing.assert_allclose(loss, base + 0.1 * expected_kl, rtol=1e-5)
        np.testing.assert_allclose(metrics["pg_loss"], base, rtol=1e-6)


def test_errors():
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        _loss(dual_clip=1.0)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        _loss(dual_clip=0.5)
    with pytest.raises(ValueError, match="aggregation must be one of"):
        _loss(aggregation="sum")
    with pytest.raises(ValueError, match="ratio_level"):
        _loss(ratio_level="seq")
    with pytest.raises(ValueError, match="needs ref_logp"):
        _loss(kl_coef=0.1)
    with pytest.raises(ValueError, match="kl_estimator"):
        _loss(kl_estimator="k4")
    with pytest.raises(ValueError, match="advantages must be per sequence"):
        _loss(adv=np.ones(4))
    with pytest.raises(ValueError, match="mask must have"):
        _loss(mask=np.ones((3, 2), bool))
    with pytest.raises(ValueError, match="max_tokens"):
        _loss(aggregation="seq-mean-token-sum-norm", max_tokens=0)
    with pytest.raises(ValueError, match="clip_low"):
        _loss(clip_low=1.0)


def test_vmap_and_jit_over_a_leading_axis():
    rng = np.random.default_rng(4)
    logp = jnp.asarray(rng.normal(-1, 0.2, (3, 4, 5)), jnp.float32)
    old = logp + jnp.asarray(rng.normal(0, 0.1, (3, 4, 5)), jnp.float32)
    adv = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
    mask = jnp.asarray(rng.random((3, 4, 5)) > 0.2)
    f = functools.partial(losses.policy_loss, aggregation="seq-mean-token-mean", dual_clip=2.0)
    batched, metrics = jax.jit(jax.vmap(f))(logp, old, adv, mask)
    chex.assert_shape(batched, (3,))
    for i in range(3):
        np.testing.assert_allclose(batched[i], f(logp[i], old[i], adv[i], mask[i])[0], rtol=1e-6)
    chex.assert_tree_all_finite(metrics)


@settings(max_examples=50, deadline=None)
@given(
    log_ratio=st.lists(st.floats(-1e4, 1e4, width=32), min_size=8, max_size=8),
    adv=st.lists(st.floats(-1e3, 1e3, width=32), min_size=2, max_size=2),
    level=st.sampled_from(["token", "sequence"]),
    dual=st.sampled_from([None, 3.0]),
)
def test_gradient_finite_for_extreme_ratios(log_ratio, adv, level, dual):
    g, metrics = _extreme_grad(jnp.asarray(log_ratio).reshape(2, 4), jnp.asarray(adv), level, dual)
    chex.assert_tree_all_finite((g, metrics))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _extreme_grad(log_ratio, adv, level, dual):
    old = jnp.full((2, 4), -3.0)
    mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    garbage = jnp.where(mask, 0.0, jnp.nan)  # padding may hold anything, even NaN
    kw = {"ratio_level": level, "dual_clip": dual, "ref_logp": old, "kl_coef": 0.1}

    def f(lp):
        return losses.policy_loss(lp + garbage, old, adv, mask, **kw)

    (_, metrics), g = jax.value_and_grad(lambda lp: f(lp), has_aux=True)(old + log_ratio)
    return g, metrics


def test_sharded_equals_unsharded():
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rng = np.random.default_rng(5)
    shape = (16, 6)
    logp = jnp.asarray(rng.normal(-1, 0.3, shape), jnp.float32)
    old = logp + jnp.asarray(rng.normal(0, 0.3, shape), jnp.float32)
    ref = logp + jnp.asarray(rng.normal(0, 0.2, shape), jnp.float32)
    adv = jnp.asarray(rng.normal(size=16), jnp.float32)
    mask = jnp.asarray(rng.random(shape) > 0.3).at[3].set(False)
    for agg, level in zip(AGGS, ("token", "sequence", "token", "sequence")):
        kw = {"aggregation": agg, "ratio_level": level, "dual_clip": 2.0, "kl_coef": 0.05, "clip_high": 0.3}

        def local(lp, o, a, m, r, kw=kw):
            return jax.value_and_grad(
                lambda x: losses.policy_loss(x, o, a, m, ref_logp=r, axis_name="data", **kw), has_aux=True
            )(lp)

        spec = PartitionSpec("data")
        (loss_s, met_s), grad_s = jax.jit(
            jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 5, out_specs=((PartitionSpec(),) * 2, spec))
        )(logp, old, adv, mask, ref)
        (loss_u, met_u), grad_u = jax.jit(jax.value_and_grad(
            lambda x, kw=kw: losses.policy_loss(x, old, adv, mask, ref_logp=ref, **kw), has_aux=True
        ))(logp)
        np.testing.assert_allclose(loss_s, loss_u, rtol=1e-5, err_msg=f"{agg} {level}")
        np.testing.assert_allclose(grad_s, grad_u, rtol=1e-5, atol=1e-8, err_msg=f"{agg} {level}")
        for key in met_u:
            np.testing.assert_allclose(met_s[key], met_u[key], rtol=1e-5, atol=1e-7, err_msg=key)


def test_sharded_gradient_of_a_replicated_parameter_is_the_global_gradient():
    # What a data-parallel train step relies on: inside shard_map (check_vma=True), the gradient of the global loss
    # w.r.t. a replicated parameter already sums the shards' contributions; no extra psum is needed.
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.normal(size=(16, 6)), jnp.float32)
    adv = jnp.asarray(rng.normal(size=16), jnp.float32)
    mask = jnp.asarray(rng.random((16, 6)) > 0.3)
    w = jnp.float32(0.3)

    def loss(w, x, a, m, axis_name=None):
        lp = -jax.nn.softplus(w * x)
        old = jax.lax.stop_gradient(lp) - 0.05 * x
        return losses.policy_loss(lp, old, a, m, axis_name=axis_name, aggregation="seq-mean-token-mean")[0]

    unsharded = jax.jit(jax.grad(loss))(w, x, adv, mask)
    rows, replicated = PartitionSpec("data"), PartitionSpec()
    sharded = jax.jit(
        jax.shard_map(
            lambda w, x, a, m: jax.grad(loss)(w, x, a, m, "data"),
            mesh=mesh, in_specs=(replicated, rows, rows, rows), out_specs=replicated,
        )
    )(w, x, adv, mask)
    assert abs(float(unsharded)) > 1e-3
    np.testing.assert_allclose(sharded, unsharded, rtol=1e-5)
