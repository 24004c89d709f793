# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Group-relative advantage estimators: rewards ``[..., G]`` -> advantages ``[..., G]`` (float32).

The last axis is the group (the G rollouts of one prompt); any leading axes are batch axes. ``valid`` (bool
``[..., G]``, optional) marks real members so that groups of unequal size share one padded array: padding never
changes a real member's advantage and padded entries get exactly 0. Every estimator is pure JAX (jit / vmap / grad
safe, no host sync, no Python loop over groups).

Notation for one group: n valid members with rewards r_i, mean m = (1/n) sum_i r_i, std with ``ddof`` d:
s = sqrt(sum_i (r_i - m)^2 / (n - d)).

- ``grpo``: A_i = (r_i - m) / (s + eps) (Shao et al., 2024, DeepSeekMath, arXiv:2402.03300).
  ``scale="batch"``: s is the std of *all* valid rewards in the batch (Lite-PPO, Liu et al., 2025,
  arXiv:2508.08221; TRL's ``scale_rewards="batch"``); ``scale="none"``: A_i = r_i - m (Dr. GRPO).
- ``dr_grpo``: A_i = r_i - m (Liu et al., 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783).
- ``rloo``: A_i = r_i - (1/(n-1)) sum_{j != i} r_j = n/(n-1) (r_i - m) (Ahmadian et al., 2024, arXiv:2402.14740).
- ``sign``: A_i = sign(r_i - reference). For binary rewards and reference 0.5 this is the fixed-reference
  A = 2r - 1 of "Gradient Starvation in Binary-Reward GRPO" (arXiv:2605.07689): it carries a signal in every group,
  including all-pass / all-fail ones, and performs descent on the pass@G failure probability.
- ``pass_at_k``: Pass@k training (Chen et al., 2025, arXiv:2508.10751) for binary rewards: with n samples, c correct,
  rho = 1 - C(n-c, k)/C(n, k), sigma = sqrt(rho (1 - rho)): correct -> (1 - rho)/(sigma + eps),
  wrong -> (1 - rho - C(n-c-1, k-1)/C(n-1, k-1))/(sigma + eps). The binomial ratios are evaluated as products
  C(a, k)/C(b, k) = prod_{i<k} (a - i)/(b - i), which is exact in structure and jit-safe.
- ``max_rl``: A_i = (r_i - m)/m, 0 where m <= 0 (mean-normalised advantage: for success indicators, the gradient of
  log pass-rate, the maximum-likelihood objective; defined for rewards >= 0).
- ``avspo``: GRPO plus virtual reward samples in the statistics of degenerate groups (see its docstring).

Degenerate groups (see :func:`jaxgrpo.degeneracy.degenerate_mask`: rewards equal within ``atol + rtol*max|r|`` or
fewer than 2 valid members) get **exactly 0** from every std- or mean-centred estimator (grpo, dr_grpo, rloo,
max_rl), even when the float mean of the rewards is not exactly representable; ``pass_at_k`` gives 0 to groups whose
members are all correct or all wrong. ``sign`` and ``avspo`` exist precisely to give such groups a signal.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp

from jaxgrpo import degeneracy

Array = jax.Array

__all__ = ["grpo", "dr_grpo", "rloo", "sign", "pass_at_k", "max_rl", "avspo", "compute", "estimator_args",
           "degenerate_for", "Estimator", "ESTIMATORS", "Scale", "SCALES"]

# The estimators by name (the config's algo.estimator); each is the function of that name below.
Estimator = Literal["grpo", "dr_grpo", "rloo", "sign", "pass_at_k", "max_rl", "avspo"]
ESTIMATORS: tuple[str, ...] = typing.get_args(Estimator)
# grpo's std: per group, over the whole batch, or none (Dr. GRPO).
Scale = Literal["group", "batch", "none"]
SCALES: tuple[str, ...] = typing.get_args(Scale)


def _check_ddof(ddof: int) -> None:
    if ddof not in (0, 1):
        raise ValueError(f"ddof must be 0 (population std) or 1 (sample std); got {ddof!r}")


def _check_eps(eps: float) -> None:
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0; got {eps!r}")


def _psum(x: Array, axis_name: str | None) -> Array:
    return x if axis_name is None else jax.lax.psum(x, axis_name)


def _centre(rewards: Array, valid: Array) -> tuple[Array, Array, Array]:
    """(n [...], group mean [...], r - mean on valid members else 0 [..., G])."""
    n = jnp.sum(valid, axis=-1).astype(jnp.float32)
    mean = jnp.sum(rewards, axis=-1) / jnp.maximum(n, 1.0)
    return n, mean, jnp.where(valid, rewards - mean[..., None], 0.0)


def _safe_sqrt(x: Array) -> Array:
    """sqrt with a finite gradient at 0 (the double-where trick); returns 0 for x <= 0."""
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def _finish(adv: Array, valid: Array, degenerate: Array) -> Array:
    return jnp.where(valid & ~degenerate[..., None], adv, 0.0).astype(jnp.float32)


def grpo(
    rewards: Array,
    valid: Array | None = None,
    *,
    eps: float = 1e-6,
    ddof: int = 1,
    scale: Scale = "group",
    atol: float = 1e-6,
    rtol: float = 1e-6,
    axis_name: str | None = None,
) -> Array:
    """GRPO advantages ``(r - group mean) / (std + eps)``; degenerate groups get exactly 0.

    Args:
      rewards: ``[..., G]``; valid: optional bool ``[..., G]``.
      eps: added to the std. ddof: 0 or 1 (torch/TRL use 1).
      scale: ``"group"`` (std of the group), ``"batch"`` (std of all valid rewards in the batch, with ``ddof``;
        group mean still subtracted), ``"none"`` (no division: Dr. GRPO).
      atol, rtol: degenerate-group tolerance (see :func:`jaxgrpo.degeneracy.degenerate_mask`).
      axis_name: for ``scale="batch"`` inside ``shard_map``: the batch statistics are psum-ed over this axis.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}; got {scale!r}")
    _check_ddof(ddof)
    _check_eps(eps)
    rewards, valid = degeneracy.prepare(rewards, valid)
    deg = degeneracy.degenerate_mask(rewards, valid, atol, rtol)
    n, _, centred = _centre(rewards, valid)
    if scale == "none":
        return _finish(centred, valid, deg)
    if scale == "group":
        var = jnp.sum(centred**2, axis=-1) / jnp.maximum(n - ddof, 1.0)
        std = _safe_sqrt(var)[..., None]
    else:
        total = _psum(jnp.sum(valid).astype(jnp.float32), axis_name)
        batch_mean = _psum(jnp.sum(rewards), axis_name) / jnp.maximum(total, 1.0)
        ss = _psum(jnp.sum(jnp.where(valid, (rewards - batch_mean) ** 2, 0.0)), axis_name)
        std = _safe_sqrt(ss / jnp.maximum(total - ddof, 1.0))
    return _finish(centred / (std + eps), valid, deg)


def dr_grpo(
    rewards: Array, valid: Array | None = None, *, atol: float = 1e-6, rtol: float = 1e-6
) -> Array:
    """Dr. GRPO advantages ``r - group mean``; degenerate groups get exactly 0."""
    rewards, valid = degeneracy.prepare(rewards, valid)
    deg = degeneracy.degenerate_mask(rewards, valid, atol, rtol)
    _, _, centred = _centre(rewards, valid)
    return _finish(centred, valid, deg)


def rloo(rewards: Array, valid: Array | None = None, *, atol: float = 1e-6, rtol: float = 1e-6) -> Array:
    """RLOO advantages ``r_i - mean of the other valid members = n/(n-1) (r_i - mean)``; degenerate groups -> 0."""
    rewards, valid = degeneracy.prepare(rewards, valid)
    deg = degeneracy.degenerate_mask(rewards, valid, atol, rtol)
    n, _, centred = _centre(rewards, valid)
    factor = n / jnp.maximum(n - 1.0, 1.0)
    return _finish(centred * factor[..., None], valid, deg)


def sign(rewards: Array, valid: Array | None = None, *, reference: float = 0.5) -> Array:
    """Fixed-reference advantages ``sign(r - reference)`` (``2r - 1`` for binary rewards at reference 0.5).

    Nonzero for degenerate groups by design; 0 where r == reference and on invalid members.
    """
    rewards, valid = degeneracy.prepare(rewards, valid)
    return jnp.where(valid, jnp.sign(rewards - reference), 0.0).astype(jnp.float32)


def _binom_ratio(top: Array, bottom: Array, k: int) -> Array:
    """C(top, k) / C(bottom, k) = prod_{i<k} (top - i) / (bottom - i), with C(a, k) = 0 for a < k.

    Requires bottom >= k where the result is used (the caller masks other groups); 1 for k = 0.
    """
    i = jnp.arange(k, dtype=jnp.float32)
    num = jnp.maximum(top[..., None] - i, 0.0)
    den = jnp.maximum(bottom[..., None] - i, 1.0)
    return jnp.prod(num / den, axis=-1)


def pass_at_k(
    rewards: Array,
    valid: Array | None = None,
    *,
    k: int,
    eps: float = 1e-6,
    success_threshold: float = 0.5,
) -> Array:
    """Pass@k-training advantages (Chen et al., 2025, arXiv:2508.10751) for binary rewards.

    A member is correct when ``r >= success_threshold`` (0.5: rewards in {0, 1}). Per group, n = number of valid
    members, c = number of correct ones, rho = 1 - C(n-c, k)/C(n, k) (the group's pass@k), sigma = sqrt(rho(1-rho)):
    correct -> (1 - rho)/(sigma + eps); wrong -> (1 - rho - C(n-c-1, k-1)/C(n-1, k-1))/(sigma + eps).

    Edge cases: c = 0, c = n and k > n - c (every k-subset holds a correct answer) give sigma = 0 and advantage 0;
    a group with fewer than k valid members has no pass@k estimate and gets 0. k = 1 is GRPO with the population std.

    Args:
      k: static Python int, 1 <= k <= G.
    """
    if isinstance(k, bool) or not isinstance(k, int):
        raise ValueError(f"k must be a Python int (a static value); got {k!r}")
    _check_eps(eps)
    rewards, valid = degeneracy.prepare(rewards, valid)
    group = rewards.shape[-1]
    if not 1 <= k <= group:
        raise ValueError(f"pass_at_k needs 1 <= k <= G (the group size {group}); got k={k}")
    correct, n, c, rho, sigma, informative = _pass_at_k_groups(rewards, valid, k, success_threshold)
    wrong_term = _binom_ratio(n - c - 1.0, n - 1.0, k - 1)
    a_pos = (1.0 - rho) / (sigma + eps)
    a_neg = (1.0 - rho - wrong_term) / (sigma + eps)
    adv = jnp.where(correct, a_pos[..., None], a_neg[..., None])
    return jnp.where(valid & informative[..., None], adv, 0.0).astype(jnp.float32)


def _pass_at_k_groups(rewards: Array, valid: Array, k: int, success_threshold: float) -> tuple[Array, ...]:
    """``(correct, n, c, rho, sigma, informative)`` of `pass_at_k`'s groups: informative where its advantages can be
    nonzero (n >= k and 0 < rho < 1, as float32 computes rho); `degenerate_for` masks the others."""
    correct = valid & (rewards >= success_threshold)
    n = jnp.sum(valid, axis=-1).astype(jnp.float32)
    c = jnp.sum(correct, axis=-1).astype(jnp.float32)
    rho = 1.0 - _binom_ratio(n - c, n, k)
    sigma = _safe_sqrt(rho * (1.0 - rho))
    return correct, n, c, rho, sigma, (n >= k) & (sigma > 0)


def max_rl(rewards: Array, valid: Array | None = None, *, atol: float = 1e-6, rtol: float = 1e-6) -> Array:
    """Mean-normalised advantages ``(r - m)/m``; 0 where the group mean m <= 0 and for degenerate groups.

    Meant for rewards >= 0 (success indicators), where m <= 0 happens only for the all-zero group.
    """
    rewards, valid = degeneracy.prepare(rewards, valid)
    deg = degeneracy.degenerate_mask(rewards, valid, atol, rtol)
    _, mean, centred = _centre(rewards, valid)
    positive = mean > 0
    adv = centred / jnp.where(positive, mean, 1.0)[..., None]
    return _finish(jnp.where(positive[..., None], adv, 0.0), valid, deg)


def avspo(
    rewards: Array,
    valid: Array | None = None,
    *,
    eps: float = 1e-6,
    ddof: int = 1,
    virtual_rewards: tuple[float, ...] = (0.0, 1.0),
    virtual_weight: float = 1.0,
    collapse_rate: Array | float | None = None,
    atol: float = 1e-6,
    rtol: float = 1e-6,
    axis_name: str | None = None,
) -> Array:
    """AVSPO-style advantages: GRPO, with virtual reward samples in the statistics of degenerate groups.

    Source: He et al., 2026, "Advantage Collapse in Group Relative Policy Optimization: Diagnosis and Mitigation"
    (arXiv:2605.21125, ICML 2026). The public abstract and project page say: AVSPO injects virtual reward samples,
    guided by the real-time advantage collapse rate (ACR), into homogeneous groups; the virtual samples enter the
    normalisation statistics only and contribute no policy gradient. The exact rule is not public; this is our reading,
    with every assumption below.

    Assumptions / definitions:

    1. Which groups: exactly the degenerate ones (:func:`jaxgrpo.degeneracy.degenerate_mask` with ``atol``/``rtol``,
       which includes groups with a single valid member). Non-degenerate groups get GRPO's advantages
       (``grpo(..., scale="group")`` with the same ``eps``/``ddof``), bit for bit. Empty groups get 0.
    2. What is injected: each value v_k of ``virtual_rewards`` (default ``(0.0, 1.0)``: one virtual failure and one
       virtual success of a binary task) is added to the group as a sample with frequency weight lambda.
    3. The weight is driven by the collapse rate: ``lambda = virtual_weight * ACR``, ACR the fraction of degenerate
       groups in the batch (psum-ed over ``axis_name`` inside shard_map), or the ``collapse_rate`` you pass (e.g. a
       running average kept by the trainer). ACR = 0 gives plain GRPO; the more of the batch has collapsed, the more
       the virtual samples weigh. lambda carries no gradient.
    4. Statistics over real + virtual samples: with the group's n real members all at r-bar (they are equal within
       tolerance; r-bar is their mean), N = n + lambda*K, mean' = (n r-bar + lambda sum_k v_k)/N,
       var' = (n (r-bar - mean')^2 + lambda sum_k (v_k - mean')^2)/(N - ddof), and every real member gets
       A = (r-bar - mean')/(sqrt(var') + eps). (Computed in offsets from r-bar, so lambda = 0 gives exactly 0.)
    5. The virtual samples have no tokens: they get no advantage and produce no gradient; the output has the
       shape of ``rewards``.

    Consequences (tested): with the default virtual rewards, all-pass groups (r-bar = 1) get positive advantages
    and all-fail groups (r-bar = 0) negative ones; for ddof = 0 and eps = 0 their magnitude is
    sqrt(lambda / (n + lambda)). A degenerate group whose r-bar is the mean of ``virtual_rewards`` gets 0.
    ``virtual_rewards=(0.5,)`` is the "reference reward" reading: A = sign(r-bar - 0.5) * const.
    """
    _check_ddof(ddof)
    _check_eps(eps)
    virtual = tuple(float(v) for v in virtual_rewards)
    if not virtual:
        raise ValueError("virtual_rewards must hold at least one reward value, e.g. (0.0, 1.0)")
    if not virtual_weight >= 0:
        raise ValueError(f"virtual_weight must be >= 0; got {virtual_weight!r}")
    rewards, valid = degeneracy.prepare(rewards, valid)
    base = grpo(rewards, valid, eps=eps, ddof=ddof, scale="group", atol=atol, rtol=rtol)
    deg = degeneracy.degenerate_mask(rewards, valid, atol, rtol)
    if collapse_rate is None:
        acr = degeneracy.collapse_rate(rewards, valid, atol, rtol, axis_name=axis_name)
    else:
        acr = jnp.asarray(collapse_rate, jnp.float32)
    lam = jax.lax.stop_gradient(virtual_weight * acr)

    n, r_bar, _ = _centre(rewards, valid)
    offsets = jnp.asarray(virtual, jnp.float32) - r_bar[..., None]  # [..., K]: v_k - r_bar
    total = n + lam * len(virtual)
    mean_off = lam * jnp.sum(offsets, axis=-1) / jnp.maximum(total, 1e-30)  # mean' - r_bar
    ss = n * mean_off**2 + lam * jnp.sum((offsets - mean_off[..., None]) ** 2, axis=-1)
    denom = total - ddof
    var = jnp.where(denom > 0, ss / jnp.where(denom > 0, denom, 1.0), 0.0)
    std = _safe_sqrt(var)
    virtual_adv = jnp.where(std > 0, -mean_off / (std + eps), 0.0)
    adv = jnp.where(deg[..., None], virtual_adv[..., None], base)
    return jnp.where(valid, adv, 0.0).astype(jnp.float32)


_ESTIMATOR_FNS: dict[str, Callable[..., Array]] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "sign": sign,
    "pass_at_k": pass_at_k,
    "max_rl": max_rl,
    "avspo": avspo,
}


_ROUTED = ("axis_name", "atol", "rtol")  # passed by `compute` itself, to the estimators that take them


def estimator_args(name: Estimator) -> tuple[str, ...]:
    """The keyword arguments of estimator `name` that `compute` accepts in ``**kwargs`` (the config's
    ``algo.estimator_args``): its keyword-only parameters, less the ones `compute` routes itself."""
    params = inspect.signature(_ESTIMATOR_FNS[name]).parameters.items()
    return tuple(p for p, spec in params if spec.kind is inspect.Parameter.KEYWORD_ONLY and p not in _ROUTED)


def degenerate_for(name: Estimator, rewards: Array, valid: Array | None = None, *, atol: float = 1e-6,
                   rtol: float = 1e-6, **kwargs) -> Array:
    """``[...]`` bool: the groups that ``algo.degenerate_groups=mask`` takes out of the loss and ``resample``
    replaces under estimator ``name`` (``kwargs`` its arguments, as `compute` takes them). The degenerate groups
    (`jaxgrpo.degeneracy.degenerate_mask`), and for ``pass_at_k`` also every group its estimator gives no signal by
    construction although the rewards differ: fewer than k valid members, or fewer than k wrong ones (every k-subset
    then holds a correct answer: rho = 1, sigma = 0; with G = 8, k = 4, every group of 5-7 successes). Kept, such a
    group would add only zeros to the loss's sums and its tokens to the denominators, and a resampling step would
    count it as informative. jit-safe."""
    rewards, valid = degeneracy.prepare(rewards, valid)
    deg = degeneracy.degenerate_mask(rewards, valid, atol, rtol)
    if name != "pass_at_k":
        return deg
    *_, informative = _pass_at_k_groups(rewards, valid, kwargs["k"], kwargs.get("success_threshold", 0.5))
    return deg | ~informative


def compute(
    name: Estimator,
    rewards: Array,
    valid: Array | None = None,
    *,
    axis_name: str | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    **kwargs,
) -> Array:
    """Dispatches to the estimator called ``name`` (one of :data:`ESTIMATORS`) with keyword arguments ``kwargs``.

    ``axis_name`` is forwarded only to the estimators with batch-wide statistics (grpo, avspo); ``atol``/``rtol``
    (the degenerate-group tolerance; None = the estimator's default) only to those that use it (all but sign and
    pass_at_k). Others ignore them, so a trainer can pass the same three to every estimator. Unknown names or
    keyword arguments raise ValueError listing the valid ones.
    """
    if name not in _ESTIMATOR_FNS:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {', '.join(ESTIMATORS)}")
    fn = _ESTIMATOR_FNS[name]
    params = inspect.signature(fn).parameters
    allowed = list(estimator_args(name))
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"estimator {name!r} got unknown argument(s) {unknown}; valid: {allowed}")
    routed = {"axis_name": axis_name, "atol": atol, "rtol": rtol}
    for key, value in routed.items():
        if key in params and value is not None:
            kwargs[key] = value
    return fn(rewards, valid, **kwargs)
