# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for jaxgrpo.advantages: hand-computed values (numpy from the published formulas), edge cases, padding,
jit / vmap / grad safety, sharded == unsharded batch statistics, and hypothesis properties."""

import functools
import itertools
import math
import typing

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from jax.sharding import Mesh, PartitionSpec

from jaxgrpo import advantages as adv

HYP = settings(max_examples=50, deadline=None)


def np_grpo(r, eps=1e-6, ddof=1):
    r = np.asarray(r, np.float64)
    return (r - r.mean()) / (r.std(ddof=ddof) + eps)


# ----------------------------------------------------------------------------------------------- hand values


class HandValuesTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_grpo_issue_example(self):
        out = self.variant(adv.grpo)(jnp.array([1.0, 0.0, 0.0, 0.0]))
        chex.assert_shape(out, (4,))
        chex.assert_type(out, jnp.float32)
        np.testing.assert_allclose(out, [1.499997, -0.499999, -0.499999, -0.499999], atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_grpo_ddof0_and_none(self):
        r = np.array([[3.0, 1.0, 2.0, 2.0], [1.0, 0.0, 0.0, 1.0]])
        out0 = self.variant(functools.partial(adv.grpo, ddof=0))(jnp.asarray(r))
        np.testing.assert_allclose(out0, np.stack([np_grpo(x, ddof=0) for x in r]), rtol=1e-5)
        # [3,1,2,2]: mean 2, population std sqrt(0.5)
        np.testing.assert_allclose(out0[0], np.array([1, -1, 0, 0]) / (math.sqrt(0.5) + 1e-6), rtol=1e-6)
        none = self.variant(functools.partial(adv.grpo, scale="none"))(jnp.asarray(r))
        np.testing.assert_allclose(none, [[1, -1, 0, 0], [0.5, -0.5, -0.5, 0.5]], atol=1e-7)

    @chex.variants(with_jit=True, without_jit=True)
    def test_grpo_batch_scale(self):
        r = np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]])
        # batch: 8 values, mean 0.5, sum of squares 2, ddof=1 -> std sqrt(2/7); group means 0.25 and 0.75
        std = math.sqrt(2.0 / 7.0)
        expected = (r - np.array([[0.25], [0.75]])) / (std + 1e-6)
        out = self.variant(functools.partial(adv.grpo, scale="batch"))(jnp.asarray(r))
        np.testing.assert_allclose(out, expected, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_dr_grpo_and_rloo(self):
        r = jnp.array([[3.0, 1.0, 2.0, 2.0], [1.0, 0.0, 0.0, 0.0]])
        np.testing.assert_allclose(self.variant(adv.dr_grpo)(r), [[1, -1, 0, 0], [0.75, -0.25, -0.25, -0.25]])
        # leave-one-out: 3 - (1+2+2)/3 = 4/3, 1 - 7/3 = -4/3, 2 - 2 = 0; 1 - 0 = 1, 0 - 1/3
        np.testing.assert_allclose(
            self.variant(adv.rloo)(r), [[4 / 3, -4 / 3, 0, 0], [1, -1 / 3, -1 / 3, -1 / 3]], rtol=1e-6
        )

    @chex.variants(with_jit=True, without_jit=True)
    def test_sign(self):
        r = jnp.array([[1.0, 0.0, 0.5, 0.7], [1.0, 1.0, 1.0, 1.0]])
        np.testing.assert_array_equal(self.variant(adv.sign)(r), [[1, -1, 0, 1], [1, 1, 1, 1]])
        out = self.variant(functools.partial(adv.sign, reference=0.0))(jnp.array([0.0, 2.0, -1.0]))
        np.testing.assert_array_equal(out, [0, 1, -1])

    @chex.variants(with_jit=True, without_jit=True)
    def test_max_rl(self):
        r = jnp.array([[1.0, 0.0, 0.0, 0.0], [2.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
        # (r - m)/m with m = 0.25, 1, 0 (-> 0)
        np.testing.assert_allclose(self.variant(adv.max_rl)(r), [[3, -1, -1, -1], [1, 0, 0, -1], [0, 0, 0, 0]])

    @chex.variants(with_jit=True, without_jit=True)
    def test_pass_at_k_issue_example(self):
        out = self.variant(functools.partial(adv.pass_at_k, k=2))(jnp.array([1.0, 1.0, 0.0, 0.0]))
        # n=4, c=2: rho = 1 - C(2,2)/C(4,2) = 5/6, sigma = sqrt(5/36); wrong: 1 - 5/6 - C(1,1)/C(3,1) = -1/6
        sigma = math.sqrt(5 / 36)
        np.testing.assert_allclose(out, [1 / 6 / (sigma + 1e-6)] * 2 + [-1 / 6 / (sigma + 1e-6)] * 2, atol=1e-6)
        np.testing.assert_allclose(out, [0.447212, 0.447212, -0.447212, -0.447212], atol=2e-6)


def brute_pass_at_k(r, k, eps=1e-6):
    """Pass@k advantages by enumerating subsets (no binomial formulas)."""
    r = [bool(x) for x in r]
    n = len(r)
    subsets = list(itertools.combinations(range(n), k))
    rho = np.mean([any(r[i] for i in s) for s in subsets])
    sigma = math.sqrt(rho * (1 - rho))
    out = []
    for i in range(n):
        if r[i]:
            out.append((1 - rho) / (sigma + eps) if sigma > 0 else 0.0)
        else:
            others = [j for j in range(n) if j != i]
            # P(the other k-1 members of a k-subset holding i are all wrong)
            p_all_wrong = np.mean([not any(r[j] for j in s) for s in itertools.combinations(others, k - 1)])
            out.append((1 - rho - p_all_wrong) / (sigma + eps) if sigma > 0 else 0.0)
    return np.array(out)


@pytest.mark.parametrize("n,k", [(4, 1), (4, 3), (6, 2), (6, 4), (5, 5)])
def test_pass_at_k_vs_enumeration(n, k):
    rows = [np.array(bits, np.float32) for bits in itertools.product([0.0, 1.0], repeat=n)]
    r = np.stack(rows)
    out = np.asarray(adv.pass_at_k(jnp.asarray(r), k=k))
    expected = np.stack([brute_pass_at_k(x, k) for x in r])
    np.testing.assert_allclose(out, expected, atol=2e-5)


def test_pass_at_k_edge_cases():
    r = jnp.array([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    # c=0, c=n, and k=2 > n-c=1 (every pair holds a correct answer): no signal, exactly 0
    np.testing.assert_array_equal(adv.pass_at_k(r, k=2), np.zeros((3, 4)))
    # k=1 is GRPO with the population std: [1,1,1,0] -> rho=3/4, sigma=sqrt(3/16)
    out = adv.pass_at_k(jnp.array([1.0, 1.0, 1.0, 0.0]), k=1)
    np.testing.assert_allclose(out, np_grpo([1, 1, 1, 0], ddof=0), rtol=1e-5)


def test_pass_at_k_valid_uses_group_n():
    r = jnp.array([[1.0, 0.0, 0.0, 9.0, 9.0], [1.0, 0.0, 9.0, 9.0, 9.0]])
    valid = jnp.array([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], bool)
    out = adv.pass_at_k(r, valid, k=2)
    np.testing.assert_allclose(out[0, :3], brute_pass_at_k([1, 0, 0], 2), atol=1e-5)
    np.testing.assert_array_equal(out[0, 3:], 0.0)
    # n=2, c=1, k=2: every pair holds the correct answer -> 0
    np.testing.assert_array_equal(out[1], 0.0)
    # a group with fewer valid members than k gets 0
    np.testing.assert_array_equal(adv.pass_at_k(r, valid, k=3)[1], 0.0)


def test_pass_at_k_bad_k():
    with pytest.raises(ValueError, match="k <= G"):
        adv.pass_at_k(jnp.zeros((2, 4)), k=5)
    with pytest.raises(ValueError, match="1 <= k"):
        adv.pass_at_k(jnp.zeros((2, 4)), k=0)
    with pytest.raises(ValueError, match="Python int"):
        adv.pass_at_k(jnp.zeros((2, 4)), k=2.0)


# ----------------------------------------------------------------------------------------------------- AVSPO


def test_avspo_closed_form_matches_augmented_grpo():
    # lambda = virtual_weight * ACR = 2 * 0.5 = 1: the same as appending one real 0 and one real 1 to the group.
    r = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.3, 0.3, 0.3, 0.3]], np.float32)
    out = adv.avspo(jnp.asarray(r), collapse_rate=0.5, virtual_weight=2.0)
    for row, got in zip(r, np.asarray(out)):
        augmented = np.concatenate([row, [0.0, 1.0]])
        np.testing.assert_allclose(got, np_grpo(augmented)[:4], rtol=1e-5)
    # ddof=0, eps=0: |A| = sqrt(lambda / (n + lambda))
    lam = 0.3
    out = adv.avspo(jnp.asarray(r[:2]), collapse_rate=1.0, virtual_weight=lam, ddof=0, eps=0.0)
    np.testing.assert_allclose(out[0], math.sqrt(lam / (4 + lam)), rtol=1e-5)
    np.testing.assert_allclose(out[1], -math.sqrt(lam / (4 + lam)), rtol=1e-5)
    # reference-reward reading: one virtual sample at 0.5, ddof=0, eps=0 -> sign(r - 0.5) sqrt(lambda / n)
    out = adv.avspo(jnp.asarray(r[:2]), collapse_rate=1.0, virtual_rewards=(0.5,), ddof=0, eps=0.0)
    np.testing.assert_allclose(out, [[0.5] * 4, [-0.5] * 4], rtol=1e-5)


def test_avspo_three_claims_on_a_synthetic_batch():
    rng = np.random.default_rng(0)
    groups = []
    for i in range(16):
        kind = i % 4
        if kind == 0:
            groups.append(np.ones(8))
        elif kind == 1:
            groups.append(np.zeros(8))
        else:
            g = rng.integers(0, 2, 8).astype(np.float32)
            g[0], g[1] = 1.0, 0.0  # mixed
            groups.append(g)
    r = jnp.asarray(np.stack(groups), jnp.float32)
    out = np.asarray(adv.avspo(r))
    base = np.asarray(adv.grpo(r))
    kinds = np.arange(16) % 4
    assert (out[kinds == 0] > 0).all()
    assert (out[kinds == 1] < 0).all()
    np.testing.assert_array_equal(out[kinds >= 2], base[kinds >= 2])
    # measured ACR is 0.5 here: lambda = 0.5; with ddof=1: |A| = (lam/N) / sqrt(lam (n+lam) / (N (N-1)))
    n, lam = 8, 0.5
    big_n = n + 2 * lam
    expected = (lam / big_n) / (math.sqrt(lam * (n + lam) / (big_n * (big_n - 1))) + 1e-6)
    np.testing.assert_allclose(out[kinds == 0], expected, rtol=1e-5)
    # no collapse measured -> plain GRPO (degenerate groups exactly 0)
    np.testing.assert_array_equal(adv.avspo(r, collapse_rate=0.0), base)


# ------------------------------------------------------------------------------------------ shapes and safety

ALL = {
    "grpo": {},
    "grpo_batch": {"scale": "batch"},
    "dr_grpo": {},
    "rloo": {},
    "sign": {},
    "pass_at_k": {"k": 2},
    "max_rl": {},
    "avspo": {},
}


def _fn(key):
    name = "grpo" if key.startswith("grpo") else key
    return functools.partial(adv.compute, name, **ALL[key])


@pytest.mark.parametrize("key", list(ALL))
def test_leading_axes_vmap_jit_and_grad(key):
    fn = _fn(key)
    rng = np.random.default_rng(1)
    r = jnp.asarray(rng.integers(0, 2, (2, 3, 4)).astype(np.float32)).at[0, 0].set(1.0)
    out = fn(r)
    chex.assert_shape(out, (2, 3, 4))
    chex.assert_type(out, jnp.float32)
    chex.assert_tree_all_finite(out)
    flat = jax.jit(fn)(r.reshape(6, 4)).reshape(2, 3, 4)
    np.testing.assert_allclose(out, flat, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(jax.jit(fn)(r), out, rtol=1e-6, atol=1e-7)
    if key not in ("grpo_batch", "avspo"):  # batch-wide statistics differ per vmapped slice by design
        np.testing.assert_allclose(jax.jit(jax.vmap(fn))(r), out, rtol=1e-6, atol=1e-7)
    grads = jax.jit(jax.grad(lambda x: jnp.sum(fn(x) * jnp.arange(4.0))))(r)
    chex.assert_tree_all_finite(grads)


def test_compute_dispatch_and_errors():
    r = jnp.array([[1.0, 0.0, 1.0, 1.0]])
    np.testing.assert_array_equal(adv.compute("rloo", r), adv.rloo(r))
    np.testing.assert_array_equal(adv.compute("pass_at_k", r, k=3), adv.pass_at_k(r, k=3))
    assert set(adv.ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "sign", "pass_at_k", "max_rl", "avspo"}
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'.*grpo, dr_grpo"):
        adv.compute("ppo", r)
    with pytest.raises(ValueError, match=r"unknown argument\(s\) \['kk'\]"):
        adv.compute("pass_at_k", r, kk=2)
    # the degenerate tolerance and axis_name are routed only to the estimators that take them
    loose = jnp.array([[1.0, 1.01, 1.0, 1.0]])
    np.testing.assert_array_equal(adv.compute("grpo", loose, atol=0.1), 0.0)
    assert float(jnp.abs(adv.compute("grpo", loose)).max()) > 1.0
    np.testing.assert_array_equal(adv.compute("sign", loose, atol=0.1, rtol=0.0, axis_name=None), 1.0)
    with pytest.raises(ValueError, match="scale must be one of"):
        adv.grpo(r, scale="global")
    with pytest.raises(ValueError, match="ddof"):
        adv.grpo(r, ddof=2)
    with pytest.raises(ValueError, match="valid must have the same shape"):
        adv.grpo(r, jnp.ones((1, 3), bool))
    with pytest.raises(ValueError, match="group axis"):
        adv.grpo(jnp.float32(1.0))


def test_estimator_names_and_arguments():
    """`Estimator` names exactly the module's estimator functions; `estimator_args` lists what `compute` passes on
    (not axis_name, atol, rtol, which it routes itself), and `compute` accepts exactly those."""
    assert adv.ESTIMATORS == typing.get_args(adv.Estimator)
    r = jnp.array([[1.0, 0.0, 1.0, 1.0]])
    for name in adv.ESTIMATORS:
        fn = getattr(adv, name)
        kw = {"k": 2} if name == "pass_at_k" else {}
        np.testing.assert_array_equal(adv.compute(name, r, **kw), fn(r, **kw))
        assert not {"axis_name", "atol", "rtol"} & set(adv.estimator_args(name))
    assert adv.estimator_args("grpo") == ("eps", "ddof", "scale")
    assert adv.estimator_args("pass_at_k") == ("k", "eps", "success_threshold")
    assert adv.estimator_args("rloo") == ()
    assert adv.SCALES == ("group", "batch", "none")


def test_sharded_batch_statistics_equal_unsharded():
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rng = np.random.default_rng(2)
    r = rng.integers(0, 2, (16, 4)).astype(np.float32)
    r[:5] = 1.0  # several all-pass groups so that ACR matters
    r = jnp.asarray(r)
    valid = jnp.asarray(rng.random((16, 4)) > 0.2)
    rows = PartitionSpec("data")
    for name, kw in (("grpo", {"scale": "batch"}), ("avspo", {})):
        f = functools.partial(adv.compute, name, **kw)
        sharded = jax.jit(
            jax.shard_map(
                lambda x, v, f=f: f(x, v, axis_name="data"), mesh=mesh, in_specs=(rows, rows), out_specs=rows,
            )
        )
        np.testing.assert_allclose(sharded(r, valid), f(r, valid), rtol=1e-6, atol=1e-7)


# -------------------------------------------------------------------------------------- hypothesis properties
# Each property runs one jitted function over a few fixed shapes, so hypothesis examples cost no recompilation.

_CENTRED = ("grpo", "grpo_batch", "dr_grpo", "rloo", "max_rl")


@jax.jit
def _all_estimators(r, v):
    # pass_at_k needs k=2 <= G
    return {key: _fn(key)(r, v) for key in ALL if key != "pass_at_k" or r.shape[-1] >= 2}


def _sized_lists(elements, sizes):
    return st.sampled_from(sizes).flatmap(lambda n: st.lists(elements, min_size=n, max_size=n))


constants = st.one_of(
    st.sampled_from([0.0, 1.0, 0.1, 1.0 / 3.0, 1e6 + 0.1, -7.3, 123456.789, 1e-3]),
    st.floats(-1e6, 1e6, allow_nan=False, width=32),
)


@HYP
@given(value=constants, g=st.sampled_from([1, 2, 3, 8]), other=st.lists(st.integers(0, 5), min_size=8, max_size=8))
def test_degenerate_groups_get_exactly_zero(value, g, other):
    r = jnp.asarray(np.stack([np.full(g, value, np.float32), np.asarray(other[:g], np.float32)]))
    out = _all_estimators(r, jnp.ones(r.shape, bool))
    for key in _CENTRED:
        assert (np.asarray(out[key])[0] == 0.0).all(), (key, out[key])


_grpo_jit = jax.jit(adv.grpo)
_rloo_jit = jax.jit(adv.rloo)


@HYP
@given(vals=_sized_lists(st.integers(0, 10), [2, 5, 8]), shift=st.floats(-100, 100), scale=st.floats(0.1, 100))
def test_grpo_shift_and_scale_invariance(vals, shift, scale):
    r = jnp.asarray(vals, jnp.float32)
    base = _grpo_jit(r)
    np.testing.assert_allclose(_grpo_jit(r + shift), base, atol=1e-3)
    np.testing.assert_allclose(_grpo_jit(r * scale), base, atol=1e-3)


@HYP
@given(vals=_sized_lists(st.floats(-100, 100, width=32), [1, 2, 5, 8]))
def test_rloo_sums_to_zero(vals):
    out = _rloo_jit(jnp.asarray(vals, jnp.float32))
    assert abs(float(jnp.sum(out))) <= 1e-3 * (1 + max(abs(v) for v in vals))


@HYP
@given(
    vals=_sized_lists(st.integers(0, 4), [2, 3, 5]),
    pad_positions=st.permutations(list(range(8))),
    pad_value=st.floats(-1e3, 1e3, width=32),
)
def test_padding_changes_nothing(vals, pad_positions, pad_value):
    n = len(vals)
    slots = sorted(pad_positions[:n])
    padded = np.full(8, pad_value, np.float32)
    padded[slots] = vals
    valid = np.zeros(8, bool)
    valid[slots] = True
    out_padded = _all_estimators(jnp.asarray(padded)[None], jnp.asarray(valid)[None])
    out_compact = _all_estimators(jnp.asarray(vals, jnp.float32)[None], jnp.ones((1, n), bool))
    assert set(out_padded) == set(ALL)
    for key in ALL:
        got = np.asarray(out_padded[key])[0]
        np.testing.assert_allclose(got[slots], np.asarray(out_compact[key])[0], rtol=1e-5, atol=1e-6, err_msg=key)
        assert (got[~valid] == 0.0).all(), key


def test_degenerate_for_pass_at_k_is_where_its_estimator_gives_no_signal():
    """G = 8: every count of successes c = 0..8, padded groups of 3 too. pass_at_k's groups with no signal (c = 0, or
    fewer than k wrong: all-zero advantages) are `degenerate_for`'s; the other estimators' are the degenerate ones."""
    c = np.arange(9)
    rewards = (np.arange(8)[None] < c[:, None]).astype(np.float32)
    valid = np.ones_like(rewards, bool)
    rewards3, valid3 = rewards.copy(), valid.copy()
    valid3[:, 3:] = False  # groups of 3 valid members: c clipped to 3
    for r, v, n in ((rewards, valid, 8), (rewards3, valid3, 3)):
        for k in (1, 2, 4, 8):
            got = np.asarray(adv.degenerate_for("pass_at_k", jnp.asarray(r), jnp.asarray(v), k=k))
            cv = np.minimum(c, n)
            want = (n < k) | (cv == 0) | (n - cv < k)  # by hand: rho = 0 or 1, or no k-subset
            np.testing.assert_array_equal(got, want, err_msg=f"n={n} k={k}")
            a = np.asarray(adv.pass_at_k(jnp.asarray(r), jnp.asarray(v), k=k))
            np.testing.assert_array_equal(got, np.all(a == 0, axis=-1), err_msg=f"n={n} k={k}")
    np.testing.assert_array_equal(adv.degenerate_for("grpo", jnp.asarray(rewards)), (c == 0) | (c == 8))
    np.testing.assert_array_equal(adv.degenerate_for("sign", jnp.asarray(rewards)), (c == 0) | (c == 8))
