# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Degenerate groups: masks, collapse rates and the diagnostics jaxgrpo logs every step.

A *group* is the last axis of a reward array ``rewards[..., G]`` (the G rollouts of one prompt); ``valid[..., G]``
(bool, optional) marks the real members when groups of unequal size share one padded array. Every function here is
pure JAX (jit / vmap / grad safe, no host sync, no Python loop over groups) and works on any leading batch axes.

Definitions (all counts are over *non-empty* groups, i.e. groups with at least one valid member; an all-padding
group is a filler row and is counted nowhere):

- **degenerate group**: its valid rewards are all equal within ``atol + rtol * max|r|`` (max over the group's valid
  members), i.e. ``max(r) - min(r) <= atol + rtol * max|r|``, or it has fewer than 2 valid members. The tolerance is
  there because float rounding of a large or non-representable reward (``[0.1] * 3``, ``[1e6 + 0.1] * G``) is not
  variance: the group mean of such rewards is not exactly one of them, so ``r - mean`` is a few ulp that a std
  division would blow up. Every std/mean-centred estimator in :mod:`jaxgrpo.advantages` gives such groups exactly 0.
- **collapse rate** (ACR, the "advantage collapse rate" of He et al., 2026, arXiv:2605.21125): the fraction of
  non-empty groups that are degenerate.
- **binary rewards / success**: by default a member is a *success* when its reward is exactly 1 and a *failure* when
  it is exactly 0 (rewards in {0, 1}); any other value is neither, so a group holding one is neither all-pass nor
  all-fail. With ``success_threshold=t`` every member is classified: success iff ``r >= t``, failure otherwise.
- **all-pass / all-fail rate**: fraction of non-empty groups whose valid members are all successes / all failures.
- **i.i.d. rate**: if every rollout of a prompt succeeded independently with probability p, a group of G would be
  degenerate (all pass or all fail) with probability ``iid_rate(p, G) = p**G + (1 - p)**G``.
- **expected rate**: with per-prompt success probabilities ``p_j`` the expected degenerate fraction is
  ``expected_rate(p, G) = mean_j(p_j**G + (1 - p_j)**G)``; since x -> x**G + (1-x)**G is convex, Jensen gives
  ``expected_rate(p, G) >= iid_rate(mean(p), G)``: heterogeneous prompt difficulty makes collapse more frequent than
  the batch-average success rate predicts.

``diagnostics`` returns these as float32 scalars for logging. It does *not* report an ``expected_rate`` estimated
from the rewards alone: plugging the per-prompt empirical success rate c/G into ``p**G + (1-p)**G`` is biased, and
the unbiased estimator of ``p**G + (1-p)**G`` from the group's own G samples (``[C(c,G) + C(G-c,G)] / C(G,G)``) is
exactly the observed all-pass + all-fail indicator, i.e. nothing beyond the measured rate. Instead it reports
``degeneracy/excess_over_iid`` = (all-pass + all-fail rate) - i.i.d. rate: the Jensen gap as measured on the batch.
The same convexity biases the i.i.d. rate if it plugs the batch's p-bar into ``p**G + (1-p)**G`` (up by about
``G(G-1) p(1-p) (p**(G-2) + (1-p)**(G-2)) / 2N`` for N pooled samples: +0.048 at p = 0.5, G = 4, N = 16, as large as
the gap it is compared with), so the i.i.d. rate is ``pooled_iid_rate`` of the batch's S successes among its N valid
members, ``[C(S,G) + C(N-S,G)] / C(N,G)``: the collapse rate the batch would have if its N rewards were dealt into
groups at random (the permutation null), whose expectation is ``p**G + (1-p)**G`` exactly when all N are i.i.d.
Bernoulli(p). The measured rate's excess over it then has expectation 0 when every prompt of the batch is equally
hard and is positive otherwise (a product of G success probabilities is at most their mean G-th power: AM-GM); it is
the finite batch's Jensen gap, which tends to ``expected_rate - iid_rate`` at the prompts' mean as P grows.

What training does with degenerate groups (`DegenerateMode`, the config's ``algo.degenerate_groups``): ``keep`` them
in the loss with the estimator's advantage; ``mask`` their tokens out of the loss and its denominators; ``resample``
them away before the step (DAPO's dynamic sampling, in the trainer), masking any that remain.

With ``axis_name`` (inside ``shard_map`` with whole groups on each shard along that named axis) every batch-wide sum,
max and count is reduced over the axis with ``jax.lax.psum`` / ``pmax``, so each shard returns the global value.
"""

from __future__ import annotations

import typing
from typing import Literal

import jax
import jax.numpy as jnp

Array = jax.Array

DegenerateMode = Literal["keep", "mask", "resample"]
DEGENERATE_MODES: tuple[str, ...] = typing.get_args(DegenerateMode)

__all__ = [
    "DegenerateMode",
    "DEGENERATE_MODES",
    "degenerate_mask",
    "collapse_rate",
    "all_pass_rate",
    "all_fail_rate",
    "success_mask",
    "iid_rate",
    "pooled_iid_rate",
    "expected_rate",
    "diagnostics",
    "prepare",
]


def prepare(rewards: Array, valid: Array | None = None) -> tuple[Array, Array]:
    """Validates and returns ``(rewards float32 [..., G], valid bool [..., G])``; invalid rewards are zeroed.

    Raises ValueError for a scalar reward array, an empty group axis or a ``valid`` of another shape.
    """
    rewards = jnp.asarray(rewards)
    if rewards.ndim < 1:
        raise ValueError(f"rewards must have a group axis [..., G]; got a scalar (shape {rewards.shape})")
    if rewards.shape[-1] < 1:
        raise ValueError(f"rewards has an empty group axis (shape {rewards.shape}); G must be >= 1")
    if not (jnp.issubdtype(rewards.dtype, jnp.floating) or jnp.issubdtype(rewards.dtype, jnp.integer)
            or rewards.dtype == jnp.bool_):
        raise ValueError(f"rewards must be numeric; got dtype {rewards.dtype}")
    rewards = rewards.astype(jnp.float32)
    if valid is None:
        valid = jnp.ones(rewards.shape, dtype=bool)
    else:
        valid = jnp.asarray(valid)
        if valid.shape != rewards.shape:
            raise ValueError(
                f"valid must have the same shape as rewards [..., G]; got valid {valid.shape} vs rewards "
                f"{rewards.shape} (pass valid=None when every member is real)"
            )
        valid = valid.astype(bool)
    rewards = jnp.where(valid, rewards, 0.0)
    return rewards, valid


def _psum(x: Array, axis_name: str | None) -> Array:
    return x if axis_name is None else jax.lax.psum(x, axis_name)


def _pmax(x: Array, axis_name: str | None) -> Array:
    return x if axis_name is None else jax.lax.pmax(x, axis_name)


def _group_range(rewards: Array, valid: Array) -> tuple[Array, Array]:
    """(max - min, max |r|) over each group's valid members; 0 for empty groups."""
    hi = jnp.max(jnp.where(valid, rewards, -jnp.inf), axis=-1)
    lo = jnp.min(jnp.where(valid, rewards, jnp.inf), axis=-1)
    nonempty = jnp.any(valid, axis=-1)
    spread = jnp.where(nonempty, hi - lo, 0.0)
    scale = jnp.max(jnp.where(valid, jnp.abs(rewards), 0.0), axis=-1)
    return spread, scale


def degenerate_mask(rewards: Array, valid: Array | None = None, atol: float = 1e-6, rtol: float = 1e-6) -> Array:
    """bool ``[...]``: True where a group's valid rewards are all equal within ``atol + rtol * max|r|`` or where the
    group has fewer than 2 valid members (empty groups included).

    Args:
      rewards: ``[..., G]`` rewards (any real dtype).
      valid: optional bool ``[..., G]``; False marks padding.
      atol, rtol: absolute and relative tolerance on the group's reward spread ``max - min``.
    """
    if atol < 0 or rtol < 0:
        raise ValueError(f"atol and rtol must be >= 0; got atol={atol}, rtol={rtol}")
    rewards, valid = prepare(rewards, valid)
    spread, scale = _group_range(rewards, valid)
    n = jnp.sum(valid, axis=-1)
    return (spread <= atol + rtol * scale) | (n < 2)


def _fraction(indicator: Array, nonempty: Array, axis_name: str | None) -> Array:
    num = _psum(jnp.sum(indicator & nonempty).astype(jnp.float32), axis_name)
    den = _psum(jnp.sum(nonempty).astype(jnp.float32), axis_name)
    return jnp.where(den > 0, num / jnp.maximum(den, 1.0), 0.0)


def collapse_rate(
    rewards: Array,
    valid: Array | None = None,
    atol: float = 1e-6,
    rtol: float = 1e-6,
    *,
    axis_name: str | None = None,
) -> Array:
    """ACR: float32 scalar, the fraction of non-empty groups that are degenerate (see :func:`degenerate_mask`).

    0 when there is no non-empty group. With ``axis_name`` the counts are psum-ed over that named axis.
    """
    deg = degenerate_mask(rewards, valid, atol, rtol)
    _, valid = prepare(rewards, valid)
    return _fraction(deg, jnp.any(valid, axis=-1), axis_name)


def success_mask(
    rewards: Array, valid: Array | None = None, success_threshold: float | None = None
) -> tuple[Array, Array]:
    """``(success, failure)`` bool ``[..., G]`` masks over valid members.

    ``success_threshold=None``: success iff r == 1, failure iff r == 0 (other values are neither).
    ``success_threshold=t``: success iff r >= t, failure iff r < t.
    """
    rewards, valid = prepare(rewards, valid)
    if success_threshold is None:
        success = valid & (rewards == 1.0)
        failure = valid & (rewards == 0.0)
    else:
        success = valid & (rewards >= success_threshold)
        failure = valid & (rewards < success_threshold)
    return success, failure


def _all_pass_fail(rewards, valid, success_threshold):
    success, failure = success_mask(rewards, valid, success_threshold)
    nonempty = jnp.any(valid, axis=-1)
    all_pass = nonempty & jnp.all(success | ~valid, axis=-1)
    all_fail = nonempty & jnp.all(failure | ~valid, axis=-1)
    return all_pass, all_fail, success, failure, nonempty


def all_pass_rate(
    rewards: Array,
    valid: Array | None = None,
    *,
    success_threshold: float | None = None,
    axis_name: str | None = None,
) -> Array:
    """float32 scalar: fraction of non-empty groups whose valid members are all successes (see module docstring)."""
    rewards, valid = prepare(rewards, valid)
    all_pass, _, _, _, nonempty = _all_pass_fail(rewards, valid, success_threshold)
    return _fraction(all_pass, nonempty, axis_name)


def all_fail_rate(
    rewards: Array,
    valid: Array | None = None,
    *,
    success_threshold: float | None = None,
    axis_name: str | None = None,
) -> Array:
    """float32 scalar: fraction of non-empty groups whose valid members are all failures (see module docstring)."""
    rewards, valid = prepare(rewards, valid)
    _, all_fail, _, _, nonempty = _all_pass_fail(rewards, valid, success_threshold)
    return _fraction(all_fail, nonempty, axis_name)


def iid_rate(p: Array | float, group_size: Array | int) -> Array:
    """``p**G + (1 - p)**G``: probability that G i.i.d. Bernoulli(p) rollouts all agree. Elementwise, float32."""
    if isinstance(group_size, int) and group_size < 1:
        raise ValueError(f"group_size must be >= 1; got {group_size}")
    p = jnp.asarray(p, jnp.float32)
    g = jnp.asarray(group_size, jnp.float32)
    return p**g + (1.0 - p) ** g


def pooled_iid_rate(successes: Array | float, members: Array | float, group_size: Array | int,
                    max_group_size: int) -> Array:
    """The unbiased estimate of ``iid_rate(p, G)`` from ``successes`` S among ``members`` N i.i.d. Bernoulli(p)
    draws: ``[C(S,G) + C(N-S,G)] / C(N,G)``, the chance that G of the N drawn without replacement all agree
    (hypergeometric; a U-statistic, so its expectation is ``p**G + (1-p)**G`` for every N >= G; plugging S/N into
    ``iid_rate`` is biased up by the curve's convexity). Elementwise over broadcast ``successes``, ``members`` and
    ``group_size`` (counts, float or int; needs ``group_size <= members``); ``max_group_size``: a static bound on
    ``group_size`` (the product's length). float32; jit-safe."""
    if max_group_size < 1:
        raise ValueError(f"max_group_size must be >= 1; got {max_group_size}")
    s, m = jnp.asarray(successes, jnp.float32), jnp.asarray(members, jnp.float32)
    g = jnp.asarray(group_size, jnp.int32)
    s, m, g = jnp.broadcast_arrays(s, m, g)
    all_pass = all_fail = jnp.ones(s.shape, jnp.float32)
    for i in range(max_group_size):  # C(S,G)/C(N,G) = prod_{i<G} (S-i)/(N-i)
        use, denom = i < g, jnp.maximum(m - i, 1.0)
        all_pass = jnp.where(use, all_pass * jnp.maximum(s - i, 0.0) / denom, all_pass)
        all_fail = jnp.where(use, all_fail * jnp.maximum(m - s - i, 0.0) / denom, all_fail)
    return all_pass + all_fail


def expected_rate(success_probs: Array, group_size: Array | int) -> Array:
    """``mean_j(p_j**G + (1 - p_j)**G)`` over all entries of ``success_probs`` (per-prompt success probabilities).

    The expected fraction of degenerate groups when prompt j's rollouts succeed i.i.d. with probability p_j;
    ``>= iid_rate(mean(p), G)`` by Jensen. float32 scalar.
    """
    success_probs = jnp.asarray(success_probs, jnp.float32)
    if success_probs.size == 0:
        raise ValueError("success_probs is empty; pass at least one per-prompt success probability")
    return jnp.mean(iid_rate(success_probs, group_size))


def diagnostics(
    rewards: Array,
    valid: Array | None = None,
    advantages: Array | None = None,
    *,
    atol: float = 1e-6,
    rtol: float = 1e-6,
    success_threshold: float | None = None,
    axis_name: str | None = None,
) -> dict[str, Array]:
    """Degeneracy and reward/advantage statistics of one batch, as a dict of float32 scalars ready for logging.

    Keys (fractions are over non-empty groups, means over valid members; see the module docstring):

    - ``degeneracy/collapse_rate``: ACR, fraction of degenerate groups (``atol``/``rtol`` as in degenerate_mask).
    - ``degeneracy/all_pass``, ``degeneracy/all_fail``: fractions of all-success / all-failure groups
      (binary = rewards in {0, 1} unless ``success_threshold`` is given).
    - ``degeneracy/success_rate``: p-bar, the fraction of valid members that are successes.
    - ``degeneracy/iid_rate``: the i.i.d. prediction at the batch's success rate, estimated without bias
      (``pooled_iid_rate`` of the batch's successes among its valid members, averaged over groups at n_g, the
      group's number of valid members; the plug-in ``iid_rate(p-bar, G)`` is biased up by O(1/N)).
    - ``degeneracy/excess_over_iid``: all_pass + all_fail - iid_rate (the measured Jensen gap).
    - ``reward/mean``, ``reward/std``: over all valid rewards (std with ddof=0).
    - ``groups/num``: number of non-empty groups; ``groups/informative``: non-empty groups that are not degenerate.

    Only when ``advantages`` ``[..., G]`` is given:

    - ``advantage/abs_max``, ``advantage/mean``: over valid members.
    - ``degeneracy/spurious_amplification``: the largest |advantage| in groups with >= 2 valid members, all of
      them success or failure, and exactly one success or exactly one failure (the lone outlier a std division
      amplifies); 0 if there is no such group.
    """
    rewards, valid = prepare(rewards, valid)
    deg = degenerate_mask(rewards, valid, atol, rtol)
    all_pass, all_fail, success, failure, nonempty = _all_pass_fail(rewards, valid, success_threshold)
    n = jnp.sum(valid, axis=-1)

    n_groups = _psum(jnp.sum(nonempty).astype(jnp.float32), axis_name)
    n_members = _psum(jnp.sum(valid).astype(jnp.float32), axis_name)
    safe_groups = jnp.maximum(n_groups, 1.0)
    safe_members = jnp.maximum(n_members, 1.0)

    def frac(ind):
        return _psum(jnp.sum(ind & nonempty).astype(jnp.float32), axis_name) / safe_groups

    successes = _psum(jnp.sum(success).astype(jnp.float32), axis_name)
    p_bar = successes / safe_members
    iid_per_group = jnp.where(nonempty, pooled_iid_rate(successes, safe_members, n, rewards.shape[-1]), 0.0)
    iid = _psum(jnp.sum(iid_per_group), axis_name) / safe_groups

    r_mean = _psum(jnp.sum(rewards), axis_name) / safe_members
    r_var = _psum(jnp.sum(jnp.where(valid, (rewards - r_mean) ** 2, 0.0)), axis_name) / safe_members

    out = {
        "degeneracy/collapse_rate": frac(deg),
        "degeneracy/all_pass": frac(all_pass),
        "degeneracy/all_fail": frac(all_fail),
        "degeneracy/success_rate": p_bar,
        "degeneracy/iid_rate": iid,
        "reward/mean": r_mean,
        "reward/std": jnp.sqrt(r_var),
        "groups/num": n_groups,
        "groups/informative": _psum(jnp.sum(nonempty & ~deg).astype(jnp.float32), axis_name),
    }
    out["degeneracy/excess_over_iid"] = out["degeneracy/all_pass"] + out["degeneracy/all_fail"] - iid

    if advantages is not None:
        advantages = jnp.asarray(advantages, jnp.float32)
        if advantages.shape != rewards.shape:
            raise ValueError(f"advantages must have the rewards' shape {rewards.shape}; got {advantages.shape}")
        abs_adv = jnp.where(valid, jnp.abs(advantages), 0.0)
        n_success = jnp.sum(success, axis=-1)
        n_failure = jnp.sum(failure, axis=-1)
        binary = (n_success + n_failure) == n
        lone = binary & (n >= 2) & ((n_success == 1) | (n_failure == 1))
        spurious = jnp.max(jnp.where(lone[..., None], abs_adv, 0.0), initial=0.0)
        out["degeneracy/spurious_amplification"] = _pmax(spurious, axis_name)
        out["advantage/abs_max"] = _pmax(jnp.max(abs_adv, initial=0.0), axis_name)
        out["advantage/mean"] = _psum(jnp.sum(jnp.where(valid, advantages, 0.0)), axis_name) / safe_members
    return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}
