# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""benchmarks/study_stats.py against closed forms and hand counts: Student-t tails at df = 1 (Cauchy) and df = 2,
Welch's t and degrees of freedom worked by hand, exact permutation p by enumeration, Holm by hand, t quantiles from
tables, Cohen's (1988) sample sizes; scipy (when installed) as a second, independent reference."""

from __future__ import annotations

import math

import benchmark_module
import pytest


@pytest.fixture(scope="module")
def st():
    return benchmark_module.load("study_stats")


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 12.0])
def test_t_tails_closed_forms(st, t):
    assert st.t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-12)  # Cauchy
    assert st.t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)
    assert st.t_two_sided_p(-t, 2) == st.t_two_sided_p(t, 2)


def test_t_quantiles_from_tables(st):
    assert st.t_quantile(0.975, 2) == pytest.approx(4.302652729911275, abs=1e-9)
    assert st.t_quantile(0.975, 10) == pytest.approx(2.228138851986273, abs=1e-9)
    assert st.t_quantile(0.025, 1) == pytest.approx(-math.tan(math.pi * 0.475), rel=1e-9)  # Cauchy quantile
    lo, hi = st.t_interval([0.2, 0.3, 0.7])
    half = 4.302652729911275 * 0.26457513110645906 / math.sqrt(3)
    assert (lo, hi) == pytest.approx((0.4 - half, 0.4 + half))


def test_welch_by_hand(st):
    # a: mean 2, s^2 = 1, n 3 -> 1/3; b: mean 5, s^2 = 20/3, n 4 -> 5/3; t = -3/sqrt(2); df = 4 / (1/18 + 25/27)
    r = st.welch([1, 2, 3], [2, 4, 6, 8])
    assert r["t"] == pytest.approx(-3 / math.sqrt(2)) and r["df"] == pytest.approx(216 / 53)
    # equal variances, n = 2 each: df = 2 exactly, so the df = 2 closed form gives p
    r = st.welch([0, 2], [3, 5])
    assert r["df"] == pytest.approx(2.0) and r["p"] == pytest.approx(1 - 3 / math.sqrt(2) / math.sqrt(6.5))
    assert st.welch([1, 1], [2, 2])["p"] == 0.0 and st.welch([1, 1], [1, 1])["p"] == 1.0
    with pytest.raises(ValueError, match="need a 1-d sequence of >= 2 finite values"):
        st.welch([1.0], [2.0, 3.0])


def test_welch_against_scipy(st):
    from scipy import stats  # scipy is a dependency of jax itself
    a, b = [0.917, 0.945, 0.912], [0.963, 0.978, 0.973, 0.95]
    ref = stats.ttest_ind(a, b, equal_var=False)
    r = st.welch(a, b)
    assert (r["t"], r["p"]) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-9)


def test_one_sample_by_hand(st):
    # x = 1, 2, 6: mean 3, s^2 = 7, se = sqrt(7/3); df = 2 closed form
    r = st.one_sample([1, 2, 6])
    t = 3 / math.sqrt(7 / 3)
    assert (r["t"], r["df"], r["mean"]) == pytest.approx((t, 2.0, 3.0))
    assert r["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t))
    assert st.one_sample([1, 2, 6], mu=3)["p"] == pytest.approx(1.0)


def test_permutation_by_enumeration(st):
    # 20 relabelings of 6 values into 3 + 3; only {1,2,3} | {4,5,6} and its mirror reach |diff| = 3
    assert st.permutation_p([1, 2, 3], [4, 5, 6]) == pytest.approx(2 / 20)
    # 6 relabelings of {0,2,3,5} into 2 + 2: |diffs| 3, 1, 0, 0, 1, 3 -> 2 of 6 reach the observed 3
    assert st.permutation_p([0, 2], [3, 5]) == pytest.approx(2 / 6)
    assert st.permutation_p([1, 1, 1], [1, 1, 1]) == 1.0
    with pytest.raises(ValueError, match="exceed max_perms"):
        st.permutation_p(list(range(10)), list(range(10)), max_perms=1000)


def test_holm_by_hand(st):
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01, 2 x 0.03, 1 x 0.04 = 0.03, 0.06, 0.04 -> monotone 0.03, 0.06, 0.06
    assert st.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert st.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="p-values in"):
        st.holm([0.1, 1.5])


def test_seeds_needed_matches_cohen(st):
    # Cohen (1988) Table 2.4.1, two-tailed alpha 0.05, power 0.80: d = 1.0 -> 17 per group, d = 0.5 -> 64
    assert st.seeds_needed(1.0, 1.0) == 17 and st.seeds_needed(0.5, 1.0) == 64
    assert st.seeds_needed(0.1, 0.05, alpha=0.01) > st.seeds_needed(0.1, 0.05, alpha=0.05)
    # one-sample, d = 1: n >= (t_{0.975, n-1} + t_{0.8, n-1})^2 first holds at n = 10 (t's 2.262 + 0.883 = 3.145 at
    # df 9: 9.9 <= 10; at n = 9, df 8: 2.306 + 0.889 = 3.195 -> 10.2 > 9)
    assert st.seeds_needed(1.0, 1.0, samples=1) == 10
    assert st.detectable(17, 1.0) <= 1.0 < st.detectable(16, 1.0)  # the inverse of seeds_needed
    with pytest.raises(ValueError, match="more than max_n=50 seeds"):  # d = 0.5 needs 64: not a silent 50
        st.seeds_needed(0.5, 1.0, max_n=50)
