# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Small exact statistics for the degeneracy study (numpy only): Welch's t-test, an exact permutation test, Holm's
step-down correction, Student-t intervals and the seeds a two-sample comparison needs.

* Student-t tail: ``P(|T_nu| > t) = I_x(nu/2, 1/2)`` with ``x = nu / (nu + t^2)`` (Abramowitz & Stegun 26.7.1 with
  26.5.27), ``I`` the regularized incomplete beta function, evaluated by its continued fraction (modified Lentz;
  Numerical Recipes 6.4, ``betacf``) — exact to ~1e-12, for non-integer ``nu`` too (Welch's degrees of freedom).
* Welch (1947): ``t = (mean_a - mean_b) / sqrt(s_a^2/n_a + s_b^2/n_b)``, ``nu`` by Welch–Satterthwaite
  ``(s_a^2/n_a + s_b^2/n_b)^2 / ((s_a^2/n_a)^2/(n_a-1) + (s_b^2/n_b)^2/(n_b-1))``; two-sided p.
* One-sample t: ``t = (mean - mu) / (s / sqrt(n))`` with ``n - 1`` df (paired differences, drops).
* Exact permutation test: every one of the ``C(n_a + n_b, n_a)`` relabelings, statistic ``|mean_a - mean_b|``,
  ``p = #{perm: stat >= observed} / C`` (the observed labeling counts, so ``p >= 1/C``).
* Holm (1979): with ``p_(1) <= ... <= p_(m)``, ``adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``.
* Seeds per arm (two-sample t, equal n, common SD ``s``, difference ``d``): the smallest ``n`` with
  ``n >= 2 s^2 (t_{1 - alpha/2, 2n-2} + t_{power, 2n-2})^2 / d^2`` (the usual t-quantile version of the normal
  formula; Cohen 1988 ch. 2), ``alpha`` the per-test level after Holm's first step (``alpha_family / m``); one-sample
  (per-seed differences): ``n >= s^2 (t_{1 - alpha/2, n-1} + t_{power, n-1})^2 / d^2``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc: x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """``P(|T| >= |t|)`` for Student's t with `df` (> 0, not necessarily integer) degrees of freedom."""
    if not df > 0:
        raise ValueError(f"t_two_sided_p: df must be > 0, got {df}")
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q: float, df: float) -> float:
    """The `q`-quantile of Student's t (0 < q < 1), by bisection on `t_two_sided_p`."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"t_quantile: q must be in (0, 1), got {q}")
    if q == 0.5:
        return 0.0
    target = 2.0 * min(q, 1.0 - q)  # two-sided tail of |t|
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > target:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > target else (lo, mid)
    return math.copysign(0.5 * (lo + hi), q - 0.5)


def _arr(x: Sequence[float], name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or len(a) < 2 or not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: need a 1-d sequence of >= 2 finite values, got {x!r}")
    return a


def welch(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Welch's two-sample t-test of mean(a) != mean(b): ``t``, ``df``, two-sided ``p`` (module docstring).

    Two samples without spread and with different means give p = 0; equal constant samples give p = 1.
    """
    x, y = _arr(a, "welch a"), _arr(b, "welch b")
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    diff = float(x.mean() - y.mean())
    if va + vb == 0.0:
        return {"t": math.copysign(math.inf, diff) if diff else 0.0, "df": float(len(x) + len(y) - 2),
                "p": 0.0 if diff else 1.0, "diff": diff}  # fmt: skip
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1))
    t = diff / math.sqrt(va + vb)
    return {"t": t, "df": float(df), "p": t_two_sided_p(t, float(df)), "diff": diff}


def one_sample(x: Sequence[float], mu: float = 0.0) -> dict[str, float]:
    """One-sample t-test of mean(x) != mu: ``t = (mean - mu) / (s / sqrt(n))``, ``n - 1`` df, two-sided ``p``."""
    a = _arr(x, "one_sample")
    mean, se = float(a.mean()), float(a.std(ddof=1) / math.sqrt(len(a)))
    if se == 0.0:
        return {"t": math.copysign(math.inf, mean - mu) if mean != mu else 0.0, "df": float(len(a) - 1),
                "p": 0.0 if mean != mu else 1.0, "mean": mean - mu}  # fmt: skip
    t = (mean - mu) / se
    return {"t": t, "df": float(len(a) - 1), "p": t_two_sided_p(t, len(a) - 1), "mean": mean - mu}


def permutation_p(a: Sequence[float], b: Sequence[float], max_perms: int = 2_000_000) -> float:
    """Exact two-sided permutation p of ``|mean(a) - mean(b)|`` over every relabeling (module docstring)."""
    x, y = _arr(a, "permutation a"), _arr(b, "permutation b")
    pooled, na = np.concatenate([x, y]), len(x)
    total = math.comb(len(pooled), na)
    if total > max_perms:
        raise ValueError(f"permutation_p: {total} relabelings exceed max_perms={max_perms}; use welch")
    idx = np.asarray(list(itertools.combinations(range(len(pooled)), na)), dtype=np.int64)
    sum_a = pooled[idx].sum(axis=1)
    stats = np.abs(sum_a / na - (pooled.sum() - sum_a) / len(y))
    observed = abs(x.mean() - y.mean())
    return float(np.mean(stats >= observed - 1e-12 * max(1.0, observed)))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (module docstring)."""
    p = np.asarray(pvalues, dtype=np.float64)
    if p.ndim != 1 or np.any((p < 0) | (p > 1)) or np.any(np.isnan(p)):
        raise ValueError(f"holm: need p-values in [0, 1], got {pvalues!r}")
    m, order = len(p), np.argsort(p, kind="stable")
    adj = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out.tolist()


def t_interval(x: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Student-t interval of the mean: ``mean -/+ t_{(1+level)/2, n-1} s / sqrt(n)``."""
    a = _arr(x, "t_interval")
    half = t_quantile(0.5 + level / 2, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a))
    return float(a.mean() - half), float(a.mean() + half)


def seeds_needed(diff: float, sd: float, alpha: float = 0.05, power: float = 0.8, max_n: int = 1000,
                 samples: int = 2) -> int:
    """Seeds per arm for a two-sided t-test at level `alpha` to detect `diff` with `power` when the per-seed values
    have SD `sd`: two-sample (``samples=2``, equal n, df 2n - 2) or one-sample (``samples=1``, df n - 1, ``n >=
    s^2 (t + t)^2 / d^2``) (module docstring)."""
    if diff <= 0 or sd < 0 or not 0 < alpha < 1 or not 0 < power < 1 or samples not in (1, 2):
        raise ValueError(f"seeds_needed: need diff > 0, sd >= 0, alpha and power in (0, 1), samples 1 or 2; got "
                         f"diff={diff}, sd={sd}, alpha={alpha}, power={power}, samples={samples}")  # fmt: skip
    for n in range(2, max_n + 1):
        if n >= samples * sd**2 * _t_sum(n, alpha, power, samples) ** 2 / diff**2:
            return n
    raise ValueError(f"seeds_needed: more than max_n={max_n} seeds per arm for diff={diff} at sd={sd}")


def _t_sum(n: int, alpha: float, power: float, samples: int) -> float:
    df = samples * n - samples
    return t_quantile(1 - alpha / 2, df) + t_quantile(power, df)


def detectable(n: int, sd: float, alpha: float = 0.05, power: float = 0.8, samples: int = 2) -> float:
    """The smallest difference `seeds_needed` would call detectable with `n` seeds:
    ``sqrt(samples / n) * s * (t_{1-alpha/2, df} + t_{power, df})``."""
    return math.sqrt(samples / n) * sd * _t_sum(n, alpha, power, samples)
