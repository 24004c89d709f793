# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Token selections and per-token terms of the policy objectives beside PPO, and DAPO's overlong reward shaping.

`losses.policy_loss(..., objective=...)` composes them; docs/objectives.md says what each does to degenerate groups.
Shapes as in `losses`: ``[..., T]`` per token, ``valid`` True on the tokens that count. With ``axis_name`` (inside
``shard_map``, rows sharded along it) every statistic and every selection is taken over the whole batch of all
shards: means and counts are psum-ed, and a ranking sees the all-gathered ``[rows, T]`` scores (each shard then keeps
its own rows), so a sharded call selects exactly the tokens the unsharded call would.

**CISPO** (MiniMax-M1, Chen et al. 2025, arXiv:2506.13585, eq. 4-5): per token
``l_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * logp_t`` with ``r_t = exp(logp_t - old_logp_t)`` and
sg = stop-gradient: no token's gradient is ever zeroed, the weight is only bounded. The paper imposes no lower bound
(``eps_low`` "set to a large value") and tunes ``eps_high`` only: here ``cispo_clip_low=None`` = no lower bound and
``cispo_clip_high=None`` = the PPO ``clip_high``. Peers: verl (``policy_loss.loss_mode=cispo``) clamps to
``[1 - clip_ratio_low, 1 + clip_ratio_high]``, the PPO clip range (0.2 each by default, so a lower bound 0.8 the
paper does not have); TRL (``loss_type="cispo"``) clamps to ``max=epsilon_high`` -- an absolute cap on the weight,
not ``1 + epsilon_high``, and no lower bound. Both aggregate with their usual loss modes (verl ``loss_agg_mode``,
TRL global token mean); the paper normalises by the total token count (our ``token-mean``).

**High-entropy-token training** (Wang et al. 2025, "Beyond the 80/20 rule", arXiv:2506.01939): the policy gradient on
the top ``rho`` fraction of tokens by entropy only (rho = 0.2), the quantile taken over the whole batch (the paper's
batch-level choice, not per sequence): ``k = ceil(rho * N)`` of the ``N`` valid tokens with the highest entropy,
ties broken by position (row-major), so exactly k are kept. The others leave the loss mask, hence every denominator
of the aggregation.

**Clip-Cov / KL-Cov** (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv:2505.22617, §4-5;
verl ``compute_policy_loss_clip_cov`` / ``_kl_cov``): the centred covariance per token
``cov_t = (logp_t - mean(logp)) * (A_t - mean(A))``, means over the valid tokens of the batch, logp stop-gradient.
Clip-Cov: of the tokens with ``omega_low < cov_t < omega_high`` (1, 5) that the PPO clip has not already clipped,
``min(max(floor(r * N), 1), #candidates)`` drawn uniformly at random (r = 2e-4; randomness from an explicit key)
have their gradient detached. KL-Cov: the ``max(floor(k * N), 1)`` tokens with the largest ``cov_t`` (k = 2e-3, the
paper's Qwen2.5-7B value; verl's code default is 2e-4) get ``+ beta * |logp_t - old_logp_t|`` (beta = 1) on the
unclipped surrogate ``-r_t A_t``.

**Overlong reward shaping** (DAPO, Yu et al. 2025, arXiv:2503.14476, §3.4, eq. 13), counted in tokens:
``R_len(y) = 0`` if ``|y| <= L_max - L_cache``; ``((L_max - L_cache) - |y|) / L_cache`` if
``L_max - L_cache < |y| <= L_max``; ``-1`` if ``|y| > L_max``. ``L_max`` = ``rollout.max_new_tokens``, ``L_cache`` =
``algo.overlong_buffer``; it is added to the rule reward. Overlong filtering drops truncated completions from the loss.
"""

from __future__ import annotations

import typing
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

__all__ = ["Objective", "OBJECTIVES", "cispo_weight", "entropy_selection", "token_covariance", "clip_cov_selection",
           "kl_cov_selection", "overlong_penalty", "overlong_metrics", "validate_objective"]

Objective = Literal["ppo", "cispo", "clip_cov", "kl_cov"]
OBJECTIVES: tuple[str, ...] = typing.get_args(Objective)
_REL = 1e-6  # float32 slack of the counts ceil(rho N) / floor(r N): 0.2 * 10 must be 2, not 3 (0.2f * 10 > 2)


def validate_objective(objective: str, entropy_top_frac: float | None, clip_cov_ratio: float, clip_cov_lb: float,
                       clip_cov_ub: float, kl_cov_ratio: float, kl_cov_coef: float,
                       cispo_clip_low: float | None, cispo_clip_high: float | None) -> None:
    """One-line ValueErrors for out-of-range objective hyper-parameters (shared by `policy_loss` and the step)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}; got {objective!r}")
    if entropy_top_frac is not None and not 0.0 < entropy_top_frac <= 1.0:
        raise ValueError(f"entropy_top_frac must be in (0, 1] (0.2 in the paper) or None; got {entropy_top_frac!r}")
    if not 0.0 < clip_cov_ratio <= 1.0:
        raise ValueError(f"clip_cov_ratio must be in (0, 1] (2e-4 in the paper); got {clip_cov_ratio!r}")
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(f"clip_cov_lb must be < clip_cov_ub (1 and 5 in the paper); got {clip_cov_lb}, {clip_cov_ub}")
    if not 0.0 < kl_cov_ratio <= 1.0:
        raise ValueError(f"kl_cov_ratio must be in (0, 1] (2e-3 in the paper); got {kl_cov_ratio!r}")
    if not kl_cov_coef >= 0.0:
        raise ValueError(f"kl_cov_coef must be >= 0 (1 in the paper); got {kl_cov_coef!r}")
    if cispo_clip_low is not None and not 0.0 <= cispo_clip_low < 1.0:
        raise ValueError(f"cispo_clip_low must be in [0, 1) or None (no lower bound); got {cispo_clip_low!r}")
    if cispo_clip_high is not None and not cispo_clip_high >= 0.0:
        raise ValueError(f"cispo_clip_high must be >= 0 or None (= clip_high); got {cispo_clip_high!r}")


def _psum(x: Array, axis_name: str | tuple[str, ...] | None) -> Array:
    return x if axis_name is None else jax.lax.psum(x, axis_name)


def _gather_rows(x: Array, axis_name: str | tuple[str, ...] | None) -> tuple[Array, Array]:
    """``x [rows, T]`` of the whole batch (all-gathered over ``axis_name``) and this shard's first global row."""
    if axis_name is None:
        return x, jnp.zeros((), jnp.int32)
    full = jax.lax.all_gather(x, axis_name, axis=0, tiled=True)
    return full, jax.lax.axis_index(axis_name) * x.shape[0]


def _top_count(score: Array | None, eligible: Array, count: Array, axis_name: str | tuple[str, ...] | None,
               key: Array | None = None) -> Array:
    """Bool mask of the ``count`` eligible tokens of the whole batch with the highest ``score`` (ties: the earlier
    position, row-major); ``score``/``eligible`` ``[..., T]`` local, ``count`` a replicated int32 scalar. With
    ``score=None`` the score is ``-U`` for one uniform draw from ``key`` over the whole batch's ``[rows, T]`` (a random
    subset: the same draw on every shard, each keeping its own rows)."""
    shape = eligible.shape
    e2 = eligible.reshape(-1, shape[-1])
    e_all, start = _gather_rows(e2, axis_name)
    if score is None:
        s_all = -jax.random.uniform(key, e_all.shape)
    else:
        s_all, _ = _gather_rows(score.reshape(-1, shape[-1]), axis_name)
    n = e_all.size
    # primary key: ineligible last; secondary: score descending; lexsort is stable, so ties keep position order
    order = jnp.lexsort((-s_all.reshape(-1), ~e_all.reshape(-1)))
    rank = jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32)).reshape(e_all.shape)
    local = jax.lax.dynamic_slice_in_dim(rank, start, e2.shape[0], axis=0)
    return (e2 & (local < count)).reshape(shape)


def _count(valid: Array, axis_name: str | tuple[str, ...] | None) -> Array:
    return _psum(jnp.sum(valid).astype(jnp.float32), axis_name)


def cispo_weight(ratio: Array, clip_low: float | None, clip_high: float) -> Array:
    """``sg(clip(ratio, 1 - clip_low, 1 + clip_high))``; ``clip_low=None``: no lower bound (MiniMax-M1)."""
    lo = 0.0 if clip_low is None else 1.0 - clip_low
    return jax.lax.stop_gradient(jnp.clip(ratio, lo, 1.0 + clip_high))


def entropy_selection(entropy: Array, valid: Array, top_frac: float,
                      axis_name: str | tuple[str, ...] | None = None) -> Array:
    """The ``ceil(top_frac * N)`` valid tokens of the batch with the highest entropy (ties by position), bool."""
    n = _count(valid, axis_name)
    k = jnp.ceil(top_frac * n * (1.0 - _REL)).astype(jnp.int32)
    ent = jax.lax.stop_gradient(jnp.asarray(entropy, jnp.float32))
    return _top_count(ent, valid, k, axis_name)


def token_covariance(logp: Array, advantages: Array, valid: Array,
                     axis_name: str | tuple[str, ...] | None = None) -> Array:
    """``(logp - mean logp) * (A - mean A)`` per token (stop-gradient), means over the batch's valid tokens; 0 on
    padding. ``advantages`` broadcast to ``logp``'s shape."""
    validf = valid.astype(jnp.float32)
    n = jnp.maximum(_count(valid, axis_name), 1.0)
    lp = jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(logp, jnp.float32), 0.0))
    adv = jnp.where(valid, jnp.broadcast_to(jax.lax.stop_gradient(advantages), lp.shape), 0.0)
    mean_lp = _psum(jnp.sum(lp * validf), axis_name) / n
    mean_a = _psum(jnp.sum(adv * validf), axis_name) / n
    return jnp.where(valid, (lp - mean_lp) * (adv - mean_a), 0.0)


def clip_cov_selection(cov: Array, valid: Array, ppo_clipped: Array, ratio_frac: float, lb: float, ub: float,
                       key: Array, axis_name: str | tuple[str, ...] | None = None) -> Array:
    """Clip-Cov's detached tokens: ``min(max(floor(r N), 1), #candidates)`` drawn uniformly (from ``key``, the same on
    every shard) among the valid tokens not clipped by PPO with ``lb < cov < ub``; bool ``[..., T]``."""
    candidate = valid & ~ppo_clipped & (cov > lb) & (cov < ub)
    n = _count(valid, axis_name)
    k = jnp.maximum(jnp.floor(ratio_frac * n * (1.0 + _REL)), 1.0).astype(jnp.int32)
    return _top_count(None, candidate, k, axis_name, key=key)


def kl_cov_selection(cov: Array, valid: Array, ratio_frac: float,
                     axis_name: str | tuple[str, ...] | None = None) -> Array:
    """KL-Cov's penalised tokens: the ``max(floor(k N), 1)`` valid tokens with the largest covariance; bool."""
    n = _count(valid, axis_name)
    k = jnp.maximum(jnp.floor(ratio_frac * n * (1.0 + _REL)), 1.0).astype(jnp.int32)
    return _top_count(cov, valid, k, axis_name)


def overlong_penalty(lengths: np.ndarray | Array, max_len: int, buffer: int) -> np.ndarray:
    """DAPO's soft overlong punishment (module docstring) of completion lengths in tokens; float32, host NumPy."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be a positive int (rollout.max_new_tokens); got {max_len!r}")
    if isinstance(buffer, bool) or not isinstance(buffer, int) or not 0 < buffer <= max_len:
        raise ValueError(f"buffer must be an int in [1, max_len={max_len}] (algo.overlong_buffer); got {buffer!r}")
    y = np.asarray(lengths, np.float64)
    free = max_len - buffer
    pen = np.where(y <= free, 0.0, np.where(y <= max_len, (free - y) / buffer, -1.0))
    return pen.astype(np.float32)


def overlong_metrics(lengths: np.ndarray, truncated: np.ndarray, valid: np.ndarray, max_len: int, filtered: bool,
                     buffer: int | None) -> dict[str, float]:
    """Host metrics of a rollout's overlong shaping: ``overlong/filtered_frac`` (valid samples left out of the loss as
    truncated; with ``filtered``) and ``overlong/penalty_mean`` (mean punishment added to the rewards; with
    ``buffer``; over the valid samples). ``lengths``, ``truncated``: per sample; ``valid``: any shape holding the
    same samples."""
    out = {}
    v = np.asarray(valid, bool).reshape(-1)
    if filtered:
        out["overlong/filtered_frac"] = float((np.asarray(truncated, bool).reshape(-1) & v).sum() / max(v.sum(), 1))
    if buffer is not None:  # over the valid samples (a padding row or an unscored sample has no reward to shape)
        pen = overlong_penalty(lengths, max_len, buffer).reshape(-1)
        out["overlong/penalty_mean"] = float(pen[v].sum() / max(v.sum(), 1))
    return out
