# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for the objectives beside PPO (jaxgrpo.objectives through losses.policy_loss): CISPO, high-entropy-token
training, Clip-Cov, KL-Cov -- values and gradients written out by hand from each paper's formula, with and without
jit -- their sharded == unsharded equality on the 8-device mesh, and DAPO's overlong penalty."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from jaxgrpo import losses, objectives

# Two sequences of three tokens; the last token of the second is padding. Ratios exp(logp - old) written out.
RATIO = np.array([[1.5, 0.5, 1.0], [1.1, 0.7, 2.0]])
MASK = np.array([[1, 1, 1], [1, 1, 0]], bool)
ADV = np.array([1.0, -1.0])
LOGP = np.log(RATIO) - 1.0  # old_logp = -1 everywhere


def _value_and_grad(fn, logp, old, adv, mask, **kw):
    def f(lp):
        return losses.policy_loss(lp, old, adv, mask, **kw)

    (loss, metrics), grad = fn(jax.value_and_grad(f, has_aux=True))(jnp.asarray(logp, jnp.float32))
    return float(loss), metrics, np.asarray(grad)


class ObjectiveTest(chex.TestCase):
    def _run(self, **kw):
        return _value_and_grad(self.variant, LOGP, jnp.full(LOGP.shape, -1.0), jnp.asarray(ADV, jnp.float32),
                               jnp.asarray(MASK), **kw)

    @chex.variants(with_jit=True, without_jit=True)
    def test_cispo_hand_values(self):
        # MiniMax-M1 eq. 4-5: l = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp; token-mean over the 5 valid tokens.
        # No lower bound, eps_high = 0.28: weights [1.28, 0.5, 1.0], [1.1, 0.7].
        loss, met, grad = self._run(objective="cispo", cispo_clip_high=0.28)
        lp = [math.log(1.5) - 1, math.log(0.5) - 1, -1.0, math.log(1.1) - 1, math.log(0.7) - 1]
        want = -(1.28 * lp[0] + 0.5 * lp[1] + 1.0 * lp[2] - 1.1 * lp[3] - 0.7 * lp[4]) / 5
        self.assertAlmostEqual(loss, want, places=5)
        # d/dlogp = -w A / N: the weight is a constant, so every token keeps a gradient (the clipped one too)
        np.testing.assert_allclose(grad, [[-0.256, -0.1, -0.2], [0.22, 0.14, 0.0]], rtol=1e-5, atol=1e-7)
        self.assertAlmostEqual(float(met["loss/cispo_clipped_frac"]), 1 / 5, places=6)
        # with a lower bound 1 - 0.2: 0.5 and 0.7 are raised to 0.8, 3 of 5 weights clipped
        _, met, grad = self._run(objective="cispo", cispo_clip_high=0.28, cispo_clip_low=0.2)
        np.testing.assert_allclose(grad, [[-0.256, -0.16, -0.2], [0.22, 0.16, 0.0]], rtol=1e-5, atol=1e-7)
        self.assertAlmostEqual(float(met["loss/cispo_clipped_frac"]), 3 / 5, places=6)
        # cispo_clip_high=None reuses clip_high (here 0.3): the 1.5 weight is 1.3
        _, _, grad = self._run(objective="cispo", clip_high=0.3)
        self.assertAlmostEqual(float(grad[0, 0]), -1.3 / 5, places=6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_entropy_top_frac_hand_values(self):
        # Entropies; the padded token's 5.0 must not count. N = 5 valid tokens.
        ent = jnp.asarray([[0.1, 0.9, 0.5], [0.7, 0.2, 5.0]])
        # rho = 0.4: k = ceil(2.0) = 2 (float32 0.4 * 5 is 2.0000000298: still 2) -> tokens 0.9 and 0.7.
        # PPO per token: (0,1) r=0.5, A=1 -> -0.5 (unclipped); (1,0) r=1.1, A=-1 -> 1.1. Token-mean over the 2.
        loss, met, grad = self._run(entropy=ent, entropy_top_frac=0.4)
        self.assertAlmostEqual(loss, (-0.5 + 1.1) / 2, places=5)
        np.testing.assert_allclose(grad, [[0, -0.5 / 2, 0], [1.1 / 2, 0, 0]], rtol=1e-5, atol=1e-7)
        self.assertAlmostEqual(float(met["loss/entropy_selected_frac"]), 2 / 5, places=6)
        # rho = 0.5: k = ceil(2.5) = 3, adds (0,2) r=1, A=1 -> -1. Each aggregation's own denominator:
        loss, _, _ = self._run(entropy=ent, entropy_top_frac=0.5)
        self.assertAlmostEqual(loss, (-0.5 + 1.1 - 1.0) / 3, places=5)  # token-mean: 3 selected tokens
        loss, _, grad = self._run(entropy=ent, entropy_top_frac=0.5, aggregation="seq-mean-token-mean")
        self.assertAlmostEqual(loss, ((-0.5 - 1.0) / 2 + 1.1) / 2, places=5)
        np.testing.assert_allclose(grad, [[0, -0.5 / 4, -1 / 4], [1.1 / 2, 0, 0]], rtol=1e-5, atol=1e-7)
        # rho = 0.2: k = 1 -> only (0,1); the second sequence has no selected token and leaves the sequence count
        loss, _, _ = self._run(entropy=ent, entropy_top_frac=0.2, aggregation="seq-mean-token-sum")
        self.assertAlmostEqual(loss, -0.5, places=5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_kl_cov_hand_values(self):
        # logp and log-ratios d (old = logp - d); A = [1, -1] per sequence, all 4 tokens valid.
        logp = np.array([[-1.0, -2.0], [-0.5, -3.0]])
        d = np.array([[0.1, -0.2], [0.3, 0.05]])
        adv, mask = jnp.asarray([1.0, -1.0]), jnp.ones((2, 2), bool)
        # mean logp = -1.625, mean A = 0: cov = [[0.625, -0.375], [-1.125, 1.375]]
        np.testing.assert_allclose(objectives.token_covariance(jnp.asarray(logp), adv[:, None], mask),
                                   [[0.625, -0.375], [-1.125, 1.375]], rtol=1e-6)
        e = np.exp(d)
        # k = 0.25: floor(1.0) = 1 token, the largest covariance (1,1), gets + 1 * |d| on the unclipped -r A
        loss, met, grad = _value_and_grad(self.variant, logp, jnp.asarray(logp - d, jnp.float32), adv, mask,
                                          objective="kl_cov", kl_cov_ratio=0.25)
        self.assertAlmostEqual(loss, (-e[0, 0] - e[0, 1] + e[1, 0] + e[1, 1] + 0.05) / 4, places=5)
        np.testing.assert_allclose(grad, [[-e[0, 0], -e[0, 1]], [e[1, 0], e[1, 1] + 1.0]] / np.float32(4),
                                   rtol=1e-5)
        self.assertAlmostEqual(float(met["loss/cov_selected_frac"]), 1 / 4, places=6)
        # at logp = old_logp the penalty has no gradient (|x|' = sign(0) = 0, as verl's torch.abs)
        _, _, grad0 = _value_and_grad(self.variant, logp, jnp.asarray(logp, jnp.float32), adv, mask,
                                      objective="kl_cov", kl_cov_ratio=0.25)
        np.testing.assert_allclose(grad0, [[-1, -1], [1, 1]] / np.float32(4), rtol=1e-6)
        # k = 0.5: the top two, (1,1) and (0,0); beta = 2
        loss, _, grad = _value_and_grad(self.variant, logp, jnp.asarray(logp - d, jnp.float32), adv, mask,
                                        objective="kl_cov", kl_cov_ratio=0.5, kl_cov_coef=2.0)
        self.assertAlmostEqual(loss, (-e[0, 0] - e[0, 1] + e[1, 0] + e[1, 1] + 2 * 0.05 + 2 * 0.1) / 4, places=5)
        np.testing.assert_allclose(grad, [[-e[0, 0] + 2, -e[0, 1]], [e[1, 0], e[1, 1] + 2]] / np.float32(4),
                                   rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_clip_cov_hand_values(self):
        # A = [2, -1]: mean A = 0.5; logp mean = -1.55; cov = 1.5 (logp + 1.55) * sign:
        # [[2.025, -2.175], [-1.725, 1.575]] -> in (1, 5): (0,0) and (1,1). Ratio e^0.1 everywhere (unclipped).
        logp = np.array([[-0.2, -3.0], [-0.4, -2.6]])
        old = jnp.asarray(logp - 0.1, jnp.float32)
        adv, mask = jnp.asarray([2.0, -1.0]), jnp.ones((2, 2), bool)
        r = math.exp(0.1)
        ppo_grad = np.array([[-2 * r, -2 * r], [r, r]]) / 4
        # r = 0.5: floor(2) = 2 = both candidates detached: zero gradient there, the value is unchanged
        loss, met, grad = _value_and_grad(self.variant, logp, old, adv, mask, objective="clip_cov",
                                          clip_cov_ratio=0.5, key=jax.random.key(0))
        self.assertAlmostEqual(loss, r * (-2 - 2 + 1 + 1) / 4, places=5)
        np.testing.assert_allclose(grad, [[0, ppo_grad[0, 1]], [ppo_grad[1, 0], 0]], rtol=1e-5)
        self.assertAlmostEqual(float(met["loss/cov_selected_frac"]), 2 / 4, places=6)
        # default r = 2e-4: max(floor(8e-4), 1) = 1 of the 2 candidates, drawn by the key; both get drawn over keys
        seen = set()
        for i in range(6):
            _, met, grad = _value_and_grad(self.variant, logp, old, adv, mask, objective="clip_cov",
                                           key=jax.random.key(i))
            zero = {(a, b) for a in range(2) for b in range(2) if grad[a, b] == 0}
            assert len(zero) == 1 and zero <= {(0, 0), (1, 1)}, grad
            self.assertAlmostEqual(float(met["loss/cov_selected_frac"]), 1 / 4, places=6)
            seen |= zero
        assert seen == {(0, 0), (1, 1)}
        # a token the PPO clip already clips is no candidate: (0,0) at ratio 1.5 with A > 0 -> only (1,1) detached
        old2 = old.at[0, 0].set(logp[0, 0] - math.log(1.5))
        _, met, grad = _value_and_grad(self.variant, logp, old2, adv, mask, objective="clip_cov",
                                       clip_cov_ratio=0.5, key=jax.random.key(0))
        self.assertAlmostEqual(float(met["loss/cov_selected_frac"]), 1 / 4, places=6)
        assert grad[1, 1] == 0 and grad[0, 1] != 0


def test_same_key_same_subset_and_errors():
    rng = np.random.default_rng(0)
    logp = jnp.asarray(rng.normal(-1, 1, (8, 5)), jnp.float32)
    adv, mask = jnp.asarray(rng.normal(size=8), jnp.float32), jnp.ones((8, 5), bool)
    kw = dict(objective="clip_cov", clip_cov_ratio=0.2, clip_cov_lb=-10.0, clip_cov_ub=10.0)
    grad = jax.jit(jax.grad(lambda x, k: losses.policy_loss(x, logp - 0.01, adv, mask, key=k, **kw)[0]))
    g1, g2 = grad(logp, jax.random.key(3)), grad(logp, jax.random.key(3))
    np.testing.assert_array_equal(g1, g2)
    assert int(jnp.sum(g1 == 0)) == 8  # floor(0.2 * 40) tokens detached
    with pytest.raises(ValueError, match="pass key"):
        losses.policy_loss(logp, logp, adv, mask, objective="clip_cov")
    with pytest.raises(ValueError, match="objective must be one of"):
        losses.policy_loss(logp, logp, adv, mask, objective="grpo")
    with pytest.raises(ValueError, match="entropy_top_frac needs entropy"):
        losses.policy_loss(logp, logp, adv, mask, entropy_top_frac=0.2)
    with pytest.raises(ValueError, match="entropy_top_frac must be in"):
        losses.policy_loss(logp, logp, adv, mask, entropy=logp, entropy_top_frac=1.5)
    with pytest.raises(ValueError, match="dual_clip applies"):
        losses.policy_loss(logp, logp, adv, mask, objective="cispo", dual_clip=3.0)
    with pytest.raises(ValueError, match="clip_cov_lb must be <"):
        losses.policy_loss(logp, logp, adv, mask, objective="clip_cov", clip_cov_lb=5.0, key=jax.random.key(0))


@pytest.mark.parametrize("kw", [
    dict(objective="cispo", cispo_clip_high=0.1),
    dict(objective="clip_cov", clip_cov_ratio=0.1, clip_cov_lb=-1.0, clip_cov_ub=1.0, dual_clip=2.0),
    dict(objective="kl_cov", kl_cov_ratio=0.1, aggregation="seq-mean-token-mean"),
    dict(entropy_top_frac=0.3, aggregation="seq-mean-token-sum", kl_coef=0.05),
    dict(objective="cispo", cispo_clip_high=0.02, entropy_top_frac=0.5, ratio_level="sequence"),
], ids=["cispo", "clip_cov", "kl_cov", "entropy", "cispo_entropy_gspo"])
def test_sharded_equals_unsharded(kw):
    """Under the train step's batch axes (data x fsdp = 4 x 2, a tuple axis name): the same tokens are selected,
    the same random subset drawn, and loss, metrics and gradients equal the unsharded call's."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "fsdp"))
    axes = ("data", "fsdp")
    rng = np.random.default_rng(5)
    shape = (16, 6)
    logp = jnp.asarray(rng.normal(-1, 0.8, shape), jnp.float32)
    old = logp + jnp.asarray(rng.normal(0, 0.3, shape), jnp.float32)
    ref = logp + jnp.asarray(rng.normal(0, 0.2, shape), jnp.float32)
    ent = jnp.asarray(rng.gamma(2.0, 1.0, shape), jnp.float32)
    adv = jnp.asarray(rng.normal(size=16), jnp.float32)
    mask = jnp.asarray(rng.random(shape) > 0.3).at[3].set(False)
    key = jax.random.key(7)

    def call(x, o, a, m, r, e, k, axis_name=None):
        return losses.policy_loss(x, o, a, m, ref_logp=r, entropy=e, key=k, axis_name=axis_name, **kw)

    def local(lp, o, a, m, r, e, k):
        return jax.value_and_grad(lambda x: call(x, o, a, m, r, e, k, axes), has_aux=True)(lp)

    rows, rep = PartitionSpec(axes), PartitionSpec()
    (loss_s, met_s), grad_s = jax.jit(jax.shard_map(
        local, mesh=mesh, in_specs=(rows,) * 6 + (rep,), out_specs=((rep, rep), rows)))(logp, old, adv, mask, ref,
                                                                                         ent, key)
    (loss_u, met_u), grad_u = jax.jit(jax.value_and_grad(
        lambda x: call(x, old, adv, mask, ref, ent, key), has_aux=True))(logp)
    np.testing.assert_allclose(loss_s, loss_u, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad_s, grad_u, rtol=1e-5, atol=1e-8)
    assert met_s.keys() == met_u.keys()
    for k in met_u:
        np.testing.assert_allclose(met_s[k], met_u[k], rtol=1e-5, atol=1e-7, err_msg=k)
    sel = [k for k in met_u if k.startswith("loss/")]
    assert sel and all(0 < float(met_u[k]) < 1 for k in sel), {k: float(met_u[k]) for k in sel}


def test_overlong_penalty_closed_form():
    # DAPO eq. 13 with L_max = 16, L_cache = 4: free up to 12 tokens, then (12 - |y|) / 4, -1 beyond 16
    got = objectives.overlong_penalty(np.array([0, 12, 13, 14, 15, 16, 17]), 16, 4)
    np.testing.assert_allclose(got, [0, 0, -0.25, -0.5, -0.75, -1.0, -1.0])
    np.testing.assert_allclose(objectives.overlong_penalty(np.array([[1, 2]]), 2, 2), [[-0.5, -1.0]])
    with pytest.raises(ValueError, match="buffer must be"):
        objectives.overlong_penalty(np.array([1]), 16, 17)


def test_overlong_metrics_average_over_the_valid_samples():
    """DAPO's soft punishment (max 1000, buffer 200): 900 tokens -> -0.5; the invalid sample (a padding row of
    length 0) has no reward to shape and is not in the mean."""
    m = objectives.overlong_metrics(np.array([900, 0]), np.array([False, False]), np.array([True, False]), 1000,
                                    True, 200)  # fmt: skip
    assert m == {"overlong/filtered_frac": 0.0, "overlong/penalty_mean": -0.5}
