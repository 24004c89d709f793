# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for jaxgrpo.degeneracy: masks (tolerances, padding, non-representable rewards), rates, the Jensen bound,
diagnostics against hand-computed values, jit, and sharded == unsharded."""

import functools
import itertools
from math import comb

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from jax.sharding import Mesh, PartitionSpec

from jaxgrpo import advantages, degeneracy


class MaskTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_degenerate_mask_cases(self):
        r = jnp.array(
            [
                [1.0, 1.0, 1.0, 1.0],  # all pass
                [0.1, 0.1, 0.1, 0.1],  # mean not representable
                [1e6 + 0.1] * 4,  # large and not representable
                [1.0, 1.0 + 1e-7, 1.0, 1.0],  # within atol
                [1.0, 1.001, 1.0, 1.0],  # real variance
                [1e6, 1e6, 1e6 + 0.5, 1e6],  # within rtol * max|r| = 1
                [1e6, 1e6, 1e6 + 4.0, 1e6],  # outside
                [1.0, 0.0, 0.0, 0.0],
            ]
        )
        out = self.variant(degeneracy.degenerate_mask)(r)
        chex.assert_shape(out, (8,))
        chex.assert_type(out, bool)
        np.testing.assert_array_equal(out, [True, True, True, True, False, True, False, False])

    @chex.variants(with_jit=True, without_jit=True)
    def test_valid_and_small_groups(self):
        r = jnp.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [5.0, 5.0, 5.0]])
        valid = jnp.array([[1, 0, 0], [1, 1, 0], [1, 1, 1], [0, 0, 0]], bool)
        out = self.variant(degeneracy.degenerate_mask)(r, valid)
        # one valid member; two equal valid members (padding ignored); real variance; empty group
        np.testing.assert_array_equal(out, [True, True, False, True])

    @chex.variants(with_jit=True, without_jit=True)
    def test_rates(self):
        r = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.5, 0.5, 0.5], [1.0, 0.0, 1.0], [7.0, 7.0, 7.0]])
        valid = jnp.ones(r.shape, bool).at[4].set(False)  # an all-padding filler group counts nowhere
        acr = self.variant(degeneracy.collapse_rate)(r, valid)
        chex.assert_shape(acr, ())
        chex.assert_type(acr, jnp.float32)
        np.testing.assert_allclose(acr, 3 / 4)
        np.testing.assert_allclose(self.variant(degeneracy.all_pass_rate)(r, valid), 1 / 4)
        np.testing.assert_allclose(self.variant(degeneracy.all_fail_rate)(r, valid), 1 / 4)
        # with a threshold every member is classified: 0.5 >= 0.5 passes
        thr = functools.partial(degeneracy.all_pass_rate, success_threshold=0.5)
        np.testing.assert_allclose(self.variant(thr)(r, valid), 2 / 4)
        thr = functools.partial(degeneracy.all_fail_rate, success_threshold=0.75)
        np.testing.assert_allclose(self.variant(thr)(r, valid), 2 / 4)


def test_iid_and_expected_rate_values():
    np.testing.assert_allclose(degeneracy.iid_rate(0.5, 4), 0.125)
    np.testing.assert_allclose(
        degeneracy.iid_rate(jnp.array([0.0, 1.0, 0.1]), 3), [1.0, 1.0, 0.1**3 + 0.9**3], rtol=1e-6
    )
    np.testing.assert_allclose(degeneracy.expected_rate(jnp.array([0.0, 1.0, 0.5]), 4), (1 + 1 + 0.125) / 3)
    with pytest.raises(ValueError, match="group_size"):
        degeneracy.iid_rate(0.5, 0)
    with pytest.raises(ValueError, match="empty"):
        degeneracy.expected_rate(jnp.zeros((0,)), 4)


@settings(max_examples=60, deadline=None)
@given(
    probs=st.lists(st.floats(0.0, 1.0, width=32), min_size=1, max_size=16),
    g=st.integers(1, 16),
)
def test_expected_rate_is_at_least_iid_rate(probs, g):
    p = np.asarray(probs, np.float64)
    expected = float(np.mean(p**g + (1 - p) ** g))
    got = float(degeneracy.expected_rate(jnp.asarray(p, jnp.float32), g))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    assert got >= float(degeneracy.iid_rate(float(p.mean()), g)) - 1e-5


def test_pooled_iid_rate_hand_values_and_bound():
    np.testing.assert_allclose(degeneracy.pooled_iid_rate(8, 16, 4, 4), 2 * comb(8, 4) / comb(16, 4), rtol=1e-6)
    np.testing.assert_allclose(degeneracy.pooled_iid_rate(jnp.array([0, 16, 3]), 16, jnp.array([4, 4, 2]), 4),
                               [1.0, 1.0, (comb(3, 2) + comb(13, 2)) / comb(16, 2)], rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose(degeneracy.pooled_iid_rate(1, 1, 1, 4), 1.0)  # a group of one always agrees
    with pytest.raises(ValueError, match="max_group_size"):
        degeneracy.pooled_iid_rate(1, 4, 2, 0)


@pytest.mark.parametrize("p, prompts, g", [(0.5, 2, 3), (0.3, 4, 4), (0.9, 2, 8)])
def test_excess_over_iid_has_expectation_zero_for_equally_hard_prompts(p, prompts, g):
    """Every prompt at the same success probability p: the measured collapse has expectation p^G + (1-p)^G, and so
    must the i.i.d. rate, or the excess reads a Jensen gap where there is none. Exact expectation over all
    2^(P*G) outcomes, weighted by their probabilities (the plug-in p-bar^G + (1-p-bar)^G is biased: at p = 0.5,
    P = 2, G = 3 its expectation is 0.375, not 0.25)."""
    n = prompts * g
    outcomes = np.array(list(itertools.product([0.0, 1.0], repeat=n)), np.float32).reshape(-1, prompts, g)
    weight = np.prod(np.where(outcomes == 1, p, 1 - p), axis=(1, 2))
    out = jax.vmap(degeneracy.diagnostics)(jnp.asarray(outcomes))
    for key, want in (("degeneracy/iid_rate", p**g + (1 - p) ** g), ("degeneracy/excess_over_iid", 0.0),
                      ("degeneracy/collapse_rate", p**g + (1 - p) ** g)):  # fmt: skip
        np.testing.assert_allclose(float(np.sum(weight * np.asarray(out[key], np.float64))), want, atol=2e-6,
                                   err_msg=key)  # fmt: skip


def test_excess_over_iid_is_positive_when_prompts_differ():
    """One prompt always solved, one never: every group collapses, while the step's 8 of 16 successes dealt into
    groups of 4 at random agree with probability 2 C(8,4) / C(16,4)."""
    r = jnp.asarray([[1.0] * 4, [0.0] * 4] * 2)
    out = degeneracy.diagnostics(r)
    np.testing.assert_allclose(out["degeneracy/excess_over_iid"], 1 - 2 * comb(8, 4) / comb(16, 4), rtol=1e-6)


def test_diagnostics_hand_values():
    r = np.array(
        [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]], np.float32
    )
    a = advantages.grpo(jnp.asarray(r))
    out = jax.jit(degeneracy.diagnostics)(jnp.asarray(r), None, a)
    for v in out.values():
        chex.assert_shape(v, ())
        chex.assert_type(v, jnp.float32)
    p = r.mean()  # 7/16 successes
    expected = {
        "degeneracy/collapse_rate": 0.5,
        "degeneracy/all_pass": 0.25,
        "degeneracy/all_fail": 0.25,
        "degeneracy/success_rate": p,
        "degeneracy/iid_rate": (comb(7, 4) + comb(9, 4)) / comb(16, 4),  # 4 of the 16 drawn: all agree
        "degeneracy/excess_over_iid": 0.5 - (comb(7, 4) + comb(9, 4)) / comb(16, 4),
        "degeneracy/spurious_amplification": 1.499997,  # the lone success of [1, 0, 0, 0]
        "reward/mean": p,
        "reward/std": r.std(),
        "advantage/abs_max": 1.499997,
        "advantage/mean": 0.0,
        "groups/num": 4.0,
        "groups/informative": 2.0,
    }
    assert set(out) == set(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(out[key], value, atol=2e-6, err_msg=key)

    # without advantages the advantage keys are absent; no lone outlier -> spurious amplification 0
    assert "advantage/abs_max" not in degeneracy.diagnostics(jnp.asarray(r))
    r2 = jnp.array([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(
        degeneracy.diagnostics(r2, advantages=advantages.grpo(r2))["degeneracy/spurious_amplification"], 0.0
    )
    # a flat group of non-binary rewards collapses but is neither all-pass nor all-fail: the excess over the i.i.d.
    # rate (a binary notion) counts the all-pass and all-fail groups only, as the README's metrics table says
    r3 = jnp.array([[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 1.0, 0.0]])
    out3 = degeneracy.diagnostics(r3)
    p3 = 2 / 8  # success iff r == 1 (no threshold): the two 1s of the eight members
    iid3 = (comb(2, 4) + comb(6, 4)) / comb(8, 4)
    np.testing.assert_allclose(out3["degeneracy/success_rate"], p3)
    np.testing.assert_allclose(out3["degeneracy/collapse_rate"], 0.5)
    np.testing.assert_allclose(out3["degeneracy/all_pass"] + out3["degeneracy/all_fail"], 0.0)
    np.testing.assert_allclose(out3["degeneracy/excess_over_iid"], -iid3, atol=2e-6)


def test_diagnostics_with_padding_and_threshold():
    r = jnp.array([[0.9, 0.2, 0.0, 0.0], [0.8, 0.9, 0.7, 0.0]])
    valid = jnp.array([[1, 1, 0, 0], [1, 1, 1, 0]], bool)
    out = degeneracy.diagnostics(r, valid, advantages.grpo(r, valid), success_threshold=0.5)
    # successes: 0.9 | 0.8, 0.9, 0.7 -> p = 4/5; group sizes 2 and 3
    p = 4 / 5
    np.testing.assert_allclose(out["degeneracy/success_rate"], p, rtol=1e-6)
    np.testing.assert_allclose(out["degeneracy/iid_rate"], ((comb(4, 2) + comb(1, 2)) / comb(5, 2)
                                                            + (comb(4, 3) + comb(1, 3)) / comb(5, 3)) / 2)
    np.testing.assert_allclose(out["degeneracy/all_pass"], 0.5)
    np.testing.assert_allclose(out["degeneracy/collapse_rate"], 0.0)
    np.testing.assert_allclose(out["reward/mean"], (0.9 + 0.2 + 0.8 + 0.9 + 0.7) / 5, rtol=1e-6)
    # [0.9, 0.2] is one success and one failure: its |advantage| (1/sqrt(2) with ddof=1) is "spurious"
    np.testing.assert_allclose(out["degeneracy/spurious_amplification"], 1 / np.sqrt(2), rtol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="same shape"):
        degeneracy.degenerate_mask(jnp.zeros((2, 3)), jnp.ones((2, 4), bool))
    with pytest.raises(ValueError, match="atol and rtol"):
        degeneracy.degenerate_mask(jnp.zeros((2, 3)), atol=-1.0)
    with pytest.raises(ValueError, match="advantages must have"):
        degeneracy.diagnostics(jnp.zeros((2, 3)), advantages=jnp.zeros((2, 4)))


def test_sharded_equals_unsharded():
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    rng = np.random.default_rng(0)
    r = rng.integers(0, 2, (16, 4)).astype(np.float32)
    r[:3] = 1.0
    r = jnp.asarray(r)
    valid = jnp.asarray(rng.random((16, 4)) > 0.15)
    a = advantages.grpo(r, valid)

    def local(r, v, a):
        d = degeneracy.diagnostics(r, v, a, axis_name="data")
        d["acr"] = degeneracy.collapse_rate(r, v, axis_name="data")
        d["pass"] = degeneracy.all_pass_rate(r, v, axis_name="data")
        return d

    rows, replicated = PartitionSpec("data"), PartitionSpec()
    sharded = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(rows,) * 3, out_specs=replicated))(r, valid, a)
    full = degeneracy.diagnostics(r, valid, a)
    full["acr"] = degeneracy.collapse_rate(r, valid)
    full["pass"] = degeneracy.all_pass_rate(r, valid)
    assert set(sharded) == set(full)
    for key in full:
        np.testing.assert_allclose(sharded[key], full[key], rtol=1e-6, atol=1e-7, err_msg=key)
