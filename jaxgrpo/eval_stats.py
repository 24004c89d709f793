# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The per-prompt statistics of `jaxgrpo.eval` from c successes of n samples: unbiased pass@k (Chen et al. 2021)
and the probability that a group of G drawn without replacement is degenerate (all-pass or all-fail)."""

from __future__ import annotations

import fractions
from collections.abc import Sequence
from math import comb

import numpy as np


def _check_counts(n: int, c: np.ndarray, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"{what}: n={n!r} must be an integer >= 1 (samples per prompt)")
    if c.size and (c.min() < 0 or c.max() > n):
        raise ValueError(f"{what}: success counts must lie in [0, n={n}], got min {c.min()} max {c.max()}")


def pass_at_k_unbiased(n: int, c: int | Sequence[int] | np.ndarray, k: int) -> float | np.ndarray:
    """Unbiased pass@k of Chen et al. (2021): ``1 - C(n-c, k) / C(n, k)`` per prompt (c successes of n samples).

    Product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` (no huge binomials); 1.0 when ``n - c < k``. `c` may be an
    int (→ float) or an array of per-prompt counts (→ float64 array of the same shape).
    """
    c_arr = np.asarray(c)
    if not np.issubdtype(c_arr.dtype, np.integer):
        raise ValueError(f"pass_at_k_unbiased: c must be integer success counts, got dtype {c_arr.dtype}")
    _check_counts(n, c_arr, "pass_at_k_unbiased")
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= n:
        raise ValueError(f"pass_at_k_unbiased: k={k!r} must be an integer in [1, n={n}]")

    def one(ci: int) -> float:
        if n - ci < k:
            return 1.0
        i = np.arange(n - ci + 1, n + 1, dtype=np.float64)
        return float(1.0 - np.prod(1.0 - k / i))

    out = np.asarray([one(int(ci)) for ci in c_arr.reshape(-1)], np.float64).reshape(c_arr.shape)
    return float(out) if c_arr.ndim == 0 else out


def degenerate_probability(n: int, c: int | Sequence[int] | np.ndarray, group_size: int) -> float | np.ndarray:
    """``[C(c, G) + C(n-c, G)] / C(n, G)``: probability that G of the n samples, drawn without replacement, all
    succeed or all fail (exact rational arithmetic, then float64). Same shape conventions as `pass_at_k_unbiased`."""
    c_arr = np.asarray(c)
    _check_counts(n, c_arr, "degenerate_probability")
    g = group_size
    if isinstance(g, bool) or not isinstance(g, int | np.integer) or not 1 <= g <= n:
        raise ValueError(
            f"group size G={g!r} must be an integer in [1, n={n}]: draw at least G samples per prompt "
            "(raise --num-samples)"
        )
    total = comb(n, int(g))
    out = np.asarray(
        [float(fractions.Fraction(comb(int(ci), int(g)) + comb(n - int(ci), int(g)), total)) for ci in c_arr.ravel()],
        np.float64,
    ).reshape(c_arr.shape)
    return float(out) if c_arr.ndim == 0 else out
