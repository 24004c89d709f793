# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Diversity of a step's sampled groups (host side): distinct completions per group and the sampling entropy.

* **distinct completions** of a group of G: the number of different token sequences among its G completions (each
  row's tokens where its mask is True; two rows are the same completion iff their masked token sequences are equal).
  ``diversity/distinct`` is its mean over groups, ``diversity/distinct_frac`` the mean over groups of distinct / G
  (1 = all G differ, 1/G = the G samples are one completion repeated: a group that can only be degenerate). With
  ``real`` rows (an adaptive schedule's groups of G_i < G rows, padded to G), only a group's G_i real rows count:
  distinct among them, / G_i.
* **entropy**: ``diversity/entropy`` is the mean, over every sampled completion token of the step, of the entropy
  (nats) of the distribution the token was drawn from -- after temperature, top-k and top-p (`jaxgrpo.token_sampling`,
  reported by the sampler as ``Completions.entropy``, no extra forward). It measures how spread the policy's sampling
  distribution still is, the quantity whose collapse (Cui et al. 2025, "The Entropy Mechanism of Reinforcement
  Learning for Reasoning Language Models", arXiv:2505.22617) comes with the loss of exploration in RL post-training.
"""

from __future__ import annotations

import numpy as np


def distinct_per_group(tokens: np.ndarray, mask: np.ndarray, group_size: int,
                       real: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """``[P]`` int: distinct completions in each group of `group_size` consecutive rows of ``tokens``/``mask [N, M]``
    (prompt-major rows, ``N = P * G``), among the group's ``real`` rows (``[N]`` bool; default all)."""
    tokens, mask = np.asarray(tokens), np.asarray(mask, bool)
    if tokens.shape != mask.shape or tokens.ndim != 2:
        raise ValueError(f"tokens and mask must be [N, M] arrays of one shape, got {tokens.shape} and {mask.shape}")
    if group_size < 1 or tokens.shape[0] % group_size:
        raise ValueError(f"{tokens.shape[0]} rows are not whole groups of group_size={group_size}")
    real = np.ones(len(tokens), bool) if real is None else np.asarray(real, bool).reshape(-1)
    rows = [tuple(t[m].tolist()) for t, m in zip(tokens, mask)]
    return np.asarray([len({rows[j] for j in range(i, i + group_size) if real[j]})
                       for i in range(0, len(rows), group_size)], np.int64)  # fmt: skip


def mean_entropy(entropy: np.ndarray, mask: np.ndarray) -> float:
    """Token-mean of ``entropy [N, M]`` over the positions where ``mask`` is True (nan when there are none)."""
    mask = np.asarray(mask, bool)
    count = int(mask.sum())
    return float(np.asarray(entropy, np.float64)[mask].sum() / count) if count else float("nan")


def diversity_metrics(tokens: np.ndarray, mask: np.ndarray, entropy: np.ndarray | None,
                      group_size: int, real: np.ndarray | None = None) -> dict[str, float]:
    """``diversity/distinct``, ``diversity/distinct_frac`` and (when `entropy` is given) ``diversity/entropy``, over
    the ``real`` rows (``[N]`` bool, default all: padding rows have no tokens, so the entropy never counts them)."""
    distinct = distinct_per_group(tokens, mask, group_size, real)
    sizes = (np.ones(len(distinct) * group_size, bool) if real is None else np.asarray(real, bool)).reshape(
        -1, group_size).sum(1)  # fmt: skip
    has = sizes > 0  # a group with no real row (none is sampled so) counts nowhere
    out = {"diversity/distinct": float(distinct[has].mean()),
           "diversity/distinct_frac": float((distinct[has] / sizes[has]).mean())}  # fmt: skip
    if entropy is not None:
        out["diversity/entropy"] = mean_entropy(entropy, mask)
    return out
