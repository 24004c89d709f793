# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Clipped policy-gradient loss (PPO/GRPO, DAPO clip-higher, dual-clip, GSPO) and KL estimators.

Shapes: ``logp``, ``old_logp``, ``mask``: ``[..., T]`` (one row per sequence; usually ``[B, T]``); advantages per
sequence ``[...]`` or per token ``[..., T]``. ``mask`` is True (or nonzero) on the completion tokens that count.

Per-token loss (PPO, Schulman et al., 2017, arXiv:1707.06347), with rho = exp(logp - old_logp):

    l_t = -min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)

``clip_high=None`` means ``clip_low``; ``clip_high > clip_low`` is DAPO's clip-higher (Yu et al., 2025,
arXiv:2503.14476). ``dual_clip=c`` (c > 1; Ye et al., 2020, arXiv:1912.09729) caps the loss of negative-advantage
tokens: for A < 0, ``l_t = min(max(-rho A, -clip(rho) A), -c A)``.

``ratio_level="sequence"`` is GSPO (Zheng et al., 2025, "Group Sequence Policy Optimization", arXiv:2507.18071):
the sequence ratio s_i = exp((1/|y_i|) sum_t (logp_t - old_logp_t)) over the sequence's valid tokens replaces rho,
in its token-level form s_{i,t} = sg[s_i] * exp(logp_t - sg[logp_t]) (sg = stop-gradient): the value of s_{i,t} is
s_i and its gradient is s_i * grad logp_t, so the per-token loss above (clipped on the sequence ratio) gives, for a
sequence-level advantage and the seq-mean-token-mean aggregation, exactly GSPO's sequence objective and gradient
(GSPO-token, eq. for s_{i,t} in the paper).

Aggregations (sums over valid tokens; "sequences" = sequences with at least one valid token, n_i their valid-token
counts, S their number):

- ``token-mean``: sum_{i,t} l / sum_i n_i
- ``seq-mean-token-mean``: (1/S) sum_i (1/n_i) sum_t l
- ``seq-mean-token-sum``: (1/S) sum_i sum_t l
- ``seq-mean-token-sum-norm``: sum_{i,t} l / (S * max_tokens)  (Dr. GRPO; ``max_tokens=None`` -> T)

KL to a reference policy (Schulman, "Approximating KL divergence", 2020), per token with x = ref_logp - logp:
k1 = -x = logp - ref, k2 = x^2 / 2, k3 = exp(x) - x - 1 (unbiased, >= 0). It is aggregated like the policy loss and
added as ``kl_coef * kl`` when ``ref_logp`` is given.

Numerical safety: log-ratios are clamped to [-20, 20] before ``exp`` (a ratio beyond e^20 ~ 4.9e8 is already far
outside any trust region), so the loss and its gradient stay finite for extreme or garbage log-probabilities;
padding positions are zeroed before any arithmetic.

``objective`` (formulas and sources in `jaxgrpo.objectives`, docs/objectives.md): ``"ppo"`` is the clipped loss
above; ``"cispo"`` replaces it with ``-sg(clip(rho, 1 - cispo_clip_low, 1 + cispo_clip_high)) A logp`` (MiniMax-M1);
``"clip_cov"`` is the PPO loss with the gradient of a random ``clip_cov_ratio`` fraction of the tokens whose
covariance lies in (``clip_cov_lb``, ``clip_cov_ub``) detached (Cui et al. 2025; needs ``key``); ``"kl_cov"`` is the
unclipped ``-rho A`` plus ``kl_cov_coef * |logp - old_logp|`` on the top ``kl_cov_ratio`` fraction by covariance.
``entropy_top_frac=rho`` (with ``entropy``) keeps the policy-gradient term of the ``ceil(rho N)`` highest-entropy
tokens only (Wang et al. 2025); the others leave the policy term's mask and so its denominators (the KL term keeps
every token).

With ``axis_name`` (inside ``shard_map``, sequences sharded along that named axis) the numerators and the global
normalisers (token counts, sequence counts) are psum-ed, so every shard returns the loss and metrics of the whole
batch. Differentiate it inside ``shard_map`` (``check_vma=True``, the default): the transpose of psum then gives each
shard the gradient of the global loss with respect to its local inputs.
"""

from __future__ import annotations

import math
import typing
from typing import Literal

import jax
import jax.numpy as jnp

from jaxgrpo import objectives as obj
from jaxgrpo.objectives import OBJECTIVES, Objective

Array = jax.Array

__all__ = ["policy_loss", "kl_divergence", "sampler_correction", "resolve_sampler_correction", "Aggregation",
           "AGGREGATIONS", "RatioLevel", "RATIO_LEVELS", "KLEstimator", "KL_ESTIMATORS", "SamplerCorrection",
           "SAMPLER_CORRECTIONS", "Objective", "OBJECTIVES"]

# The choices of `policy_loss` (and the config's algo.aggregation / ratio_level / kl_estimator); module docstring.
Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
RatioLevel = Literal["token", "sequence"]
KLEstimator = Literal["k1", "k2", "k3"]
AGGREGATIONS: tuple[str, ...] = typing.get_args(Aggregation)
RATIO_LEVELS: tuple[str, ...] = typing.get_args(RatioLevel)
KL_ESTIMATORS: tuple[str, ...] = typing.get_args(KLEstimator)
# How the sampler/trainer log-prob mismatch is corrected (`sampler_correction`); "auto" resolves by compute dtype.
SamplerCorrection = Literal["auto", "none", "token_tis", "seq_tis", "token_mask", "seq_mask"]
SAMPLER_CORRECTIONS: tuple[str, ...] = typing.get_args(SamplerCorrection)
_LOG_RATIO_LIMIT = 20.0


def _clamp(x: Array) -> Array:
    return jnp.clip(x, -_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)


def kl_divergence(logp: Array, ref_logp: Array, estimator: KLEstimator = "k3") -> Array:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi: k1, k2 or k3 (see the module docstring).

    float32, same shape as ``logp``; for k3 the log-ratio is clamped to [-20, 20].
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}; got {estimator!r}")
    logp = jnp.asarray(logp, jnp.float32)
    ref_logp = jnp.asarray(ref_logp, jnp.float32)
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp and ref_logp must have the same shape; got {logp.shape} vs {ref_logp.shape}")
    x = ref_logp - logp
    if estimator == "k1":
        return -x
    if estimator == "k2":
        return 0.5 * x**2
    x = _clamp(x)
    return jnp.exp(x) - x - 1.0


def _psum(x: Array, axis_name: str | None) -> Array:
    return x if axis_name is None else jax.lax.psum(x, axis_name)


def _aggregate(
    values: Array, maskf: Array, aggregation: Aggregation, max_tokens: float, axis_name: str | None
) -> Array:
    """Aggregates masked per-token values [..., T] into a scalar (see module docstring)."""
    tok = jnp.sum(values * maskf, axis=-1)  # per-sequence token sums
    n_i = jnp.sum(maskf, axis=-1)
    has = n_i > 0
    seqs = _psum(jnp.sum(has).astype(jnp.float32), axis_name)
    if aggregation == "token-mean":
        num = _psum(jnp.sum(tok), axis_name)
        den = _psum(jnp.sum(n_i), axis_name)
    elif aggregation == "seq-mean-token-mean":
        per_seq = jnp.where(has, tok / jnp.maximum(n_i, 1.0), 0.0)
        num = _psum(jnp.sum(per_seq), axis_name)
        den = seqs
    elif aggregation == "seq-mean-token-sum":
        num = _psum(jnp.sum(tok), axis_name)
        den = seqs
    else:
        num = _psum(jnp.sum(tok), axis_name)
        den = seqs * max_tokens
    return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


def policy_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    ratio_level: RatioLevel = "token",
    aggregation: Aggregation = "token-mean",
    max_tokens: int | None = None,
    ref_logp: Array | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    axis_name: str | None = None,
    is_weights: Array | None = None,
    objective: Objective = "ppo",
    entropy: Array | None = None,
    entropy_top_frac: float | None = None,
    cispo_clip_low: float | None = None,
    cispo_clip_high: float | None = None,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    kl_cov_ratio: float = 2e-3,
    kl_cov_coef: float = 1.0,
    key: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Clipped policy-gradient loss and its metrics (formulas in the module docstring).

    Args:
      logp: ``[..., T]`` log-probabilities of the sampled tokens under the current policy (differentiated).
      old_logp: ``[..., T]`` under the policy that sampled them (constants).
      advantages: ``[...]`` per sequence or ``[..., T]`` per token.
      mask: ``[..., T]``, True / nonzero on the tokens that count.
      clip_low, clip_high: ratio clip range [1 - clip_low, 1 + clip_high]; ``clip_high=None`` -> clip_low.
      dual_clip: None or c > 1: the loss of a negative-advantage token is capped at -c A.
      ratio_level: ``"token"`` (PPO/GRPO) or ``"sequence"`` (GSPO).
      aggregation: one of :data:`AGGREGATIONS`.
      max_tokens: the constant of ``seq-mean-token-sum-norm``; None -> T (the padded completion length).
      ref_logp, kl_coef, kl_estimator: KL penalty ``kl_coef * kl`` to the reference policy (needs ``ref_logp``
        when kl_coef > 0); the ``kl`` metric is reported whenever ``ref_logp`` is given (else 0).
      axis_name: psum the numerators and normalisers over this named axis (inside shard_map).
      is_weights: ``[..., T]`` constants multiplying each token's policy-gradient term (not the KL term): the
        sampler-mismatch correction of `sampler_correction`; None = 1.
      objective: one of :data:`OBJECTIVES` (module docstring); its hyper-parameters (paper defaults):
        ``cispo_clip_low`` (None = no lower bound), ``cispo_clip_high`` (None = clip_high); ``clip_cov_ratio``,
        ``clip_cov_lb``, ``clip_cov_ub`` and ``key`` (a PRNG key, the same on every shard) for clip_cov;
        ``kl_cov_ratio``, ``kl_cov_coef`` for kl_cov.
      entropy, entropy_top_frac: ``[..., T]`` per-token entropies (constants) and rho in (0, 1], or None (off).

    Returns:
      ``(loss, metrics)``: loss a float32 scalar; metrics float32 scalars over valid tokens:
      ``pg_loss``, ``kl``, ``clip/low_frac`` (A < 0 and ratio < 1 - clip_low), ``clip/high_frac``
      (A > 0 and ratio > 1 + clip_high), ``clip/dual_frac`` (A < 0 and ratio > c), ``ratio/mean``, ``ratio/max``,
      ``ratio/min`` (the ratio used: per token, or the sequence ratio for GSPO), ``approx_kl_old`` (k3 estimate of
      KL(pi_old || pi) from the old samples: mean of (rho - 1) - log rho), ``tokens`` (valid tokens), ``sequences``
      (sequences with a valid token); and, when on, ``loss/cispo_clipped_frac`` (cispo: weight clipped),
      ``loss/cov_selected_frac`` (clip_cov: detached; kl_cov: penalised), ``loss/entropy_selected_frac``.
    """
    clip_high = clip_low if clip_high is None else clip_high
    _check_hyper(clip_low, clip_high, dual_clip, ratio_level, aggregation, kl_estimator, kl_coef, objective, key,
                 ref_logp is not None, entropy is not None, entropy_top_frac)  # fmt: skip
    obj.validate_objective(objective, entropy_top_frac, clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio,
                           kl_cov_coef, cispo_clip_low, cispo_clip_high)
    logp, advantages, max_tokens = _check_arrays(logp, old_logp, advantages, mask, ref_logp, entropy, is_weights,
                                                 max_tokens)  # fmt: skip

    valid = jnp.asarray(mask) != 0
    maskf = valid.astype(jnp.float32)
    logp = jnp.where(valid, logp.astype(jnp.float32), 0.0)
    old_logp = jnp.where(valid, jnp.asarray(old_logp, jnp.float32), 0.0)
    ratio, log_ratio = _ratio(logp, old_logp, maskf, ratio_level)

    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    clipped = jnp.clip(ratio, lo, hi)
    per_token = jnp.maximum(-ratio * advantages, -clipped * advantages)
    if dual_clip is not None:
        per_token = jnp.where(advantages < 0, jnp.minimum(per_token, -dual_clip * advantages), per_token)
    extra: dict[str, Array] = {}
    if objective != "ppo":
        per_token, sel = _objective_terms(
            objective, per_token, ratio, clipped, logp, log_ratio, advantages, valid, axis_name, key,
            cispo_clip_low, clip_high if cispo_clip_high is None else cispo_clip_high,
            clip_cov_ratio, clip_cov_lb, clip_cov_ub, kl_cov_ratio, kl_cov_coef)  # fmt: skip
        extra["loss/cispo_clipped_frac" if objective == "cispo" else "loss/cov_selected_frac"] = sel
    if is_weights is not None:
        per_token = per_token * jax.lax.stop_gradient(jnp.asarray(is_weights, jnp.float32))
    per_token = jnp.where(valid, per_token, 0.0)

    pg_maskf = maskf
    if entropy_top_frac is not None:
        chosen = obj.entropy_selection(jnp.where(valid, jnp.asarray(entropy, jnp.float32), 0.0), valid,
                                       entropy_top_frac, axis_name)
        pg_maskf = chosen.astype(jnp.float32)
        extra["loss/entropy_selected_frac"] = chosen
    pg = _aggregate(per_token, pg_maskf, aggregation, float(max_tokens), axis_name)
    if ref_logp is not None:
        ref = jnp.where(valid, jnp.asarray(ref_logp, jnp.float32), 0.0)
        kl = _aggregate(kl_divergence(logp, ref, kl_estimator), maskf, aggregation, float(max_tokens), axis_name)
    else:
        kl = jnp.zeros((), jnp.float32)
    loss = pg + kl_coef * kl if ref_logp is not None else pg

    metrics = _metrics(ratio, log_ratio, advantages, valid, lo, hi, dual_clip, axis_name, pg, kl, extra)
    return loss.astype(jnp.float32), metrics


def _check_hyper(clip_low: float, clip_high: float, dual_clip: float | None, ratio_level: str, aggregation: str,
                 kl_estimator: str, kl_coef: float, objective: str, key: Array | None, has_ref: bool,
                 has_entropy: bool, entropy_top_frac: float | None) -> None:  # fmt: skip
    """`policy_loss`'s hyper-parameters: a ValueError naming the argument and what would be valid."""
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1) so that 1 - clip_low > 0; got {clip_low!r}")
    if not clip_high >= 0.0:
        raise ValueError(f"clip_high must be >= 0 (or None for clip_low); got {clip_high!r}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (e.g. 3.0) or None to disable it; got {dual_clip!r}")
    for name, value, valid in (("ratio_level", ratio_level, RATIO_LEVELS), ("aggregation", aggregation, AGGREGATIONS),
                               ("kl_estimator", kl_estimator, KL_ESTIMATORS)):  # fmt: skip
        if value not in valid:
            raise ValueError(f"{name} must be one of {valid}; got {value!r}")
    if not kl_coef >= 0.0:
        raise ValueError(f"kl_coef must be >= 0; got {kl_coef!r}")
    if dual_clip is not None and objective in ("cispo", "kl_cov"):
        raise ValueError(f"dual_clip applies to the clipped PPO loss only; set it to None for objective={objective!r}")
    if objective == "clip_cov" and key is None:
        raise ValueError("objective='clip_cov' draws a random subset of tokens: pass key=jax.random.key(...)")
    if entropy_top_frac is not None and not has_entropy:
        raise ValueError("entropy_top_frac needs entropy (the per-token entropies [..., T]); pass it or set None")
    if kl_coef > 0 and not has_ref:
        raise ValueError("kl_coef > 0 needs ref_logp (the reference policy's log-probabilities); pass it or set "
                         "kl_coef=0")


def _check_arrays(logp: Array, old_logp: Array, advantages: Array, mask: Array, ref_logp: Array | None,
                  entropy: Array | None, is_weights: Array | None,
                  max_tokens: int | None) -> tuple[Array, Array, int]:  # fmt: skip
    """`policy_loss`'s arrays against logp's ``[..., T]``: ``(logp, advantages [..., 1 or T] float32, max_tokens)``."""
    logp = jnp.asarray(logp)
    if logp.ndim < 1:
        raise ValueError(f"logp must be [..., T]; got a scalar (shape {logp.shape})")
    shape = logp.shape
    named = (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp), ("entropy", entropy),
             ("is_weights", is_weights))  # fmt: skip
    for name, arr in named:
        if arr is not None and jnp.shape(arr) != shape:
            raise ValueError(f"{name} must have logp's shape {shape}; got {jnp.shape(arr)}")
    advantages = jnp.asarray(advantages, jnp.float32)
    if advantages.shape == shape[:-1]:
        advantages = advantages[..., None]
    elif advantages.shape != shape:
        raise ValueError(f"advantages must be per sequence {shape[:-1]} or per token {shape}; got {advantages.shape}")
    if max_tokens is None:
        max_tokens = shape[-1]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive int (or None for T={shape[-1]}); got {max_tokens!r}")
    return logp, advantages, max_tokens


def _ratio(logp: Array, old_logp: Array, maskf: Array, ratio_level: str) -> tuple[Array, Array]:
    """``(ratio, log_ratio)``: per token, or GSPO's sequence ratio (the length-normalised sum of the token log-ratios,
    its value a constant and its gradient that of each token's log-prob)."""
    log_ratio = _clamp(logp - old_logp)
    if ratio_level == "token":
        return jnp.exp(log_ratio), log_ratio
    n_i = jnp.sum(maskf, axis=-1, keepdims=True)
    seq_log_ratio = _clamp(jnp.sum(log_ratio * maskf, axis=-1, keepdims=True) / jnp.maximum(n_i, 1.0))
    seq_ratio = jax.lax.stop_gradient(jnp.exp(seq_log_ratio))
    return seq_ratio * jnp.exp(logp - jax.lax.stop_gradient(logp)), log_ratio


def _metrics(ratio: Array, log_ratio: Array, advantages: Array, valid: Array, lo: float, hi: float,
             dual_clip: float | None, axis_name: str | None, pg: Array, kl: Array,
             extra: dict[str, Array]) -> dict[str, Array]:  # fmt: skip
    """`policy_loss`'s metrics (no gradient): token means over the valid tokens of the whole (psum-ed) batch."""
    maskf = valid.astype(jnp.float32)
    sg_ratio = jax.lax.stop_gradient(ratio)
    sg_adv = jax.lax.stop_gradient(advantages)
    tokens = _psum(jnp.sum(maskf), axis_name)
    safe_tokens = jnp.maximum(tokens, 1.0)

    def token_mean(x):
        return _psum(jnp.sum(jnp.where(valid, x, 0.0)), axis_name) / safe_tokens

    low = (sg_adv < 0) & (sg_ratio < lo)
    high = (sg_adv > 0) & (sg_ratio > hi)
    dual = (sg_adv < 0) & (sg_ratio > dual_clip) if dual_clip is not None else jnp.zeros(valid.shape, bool)
    r_max = jnp.max(jnp.where(valid, sg_ratio, -jnp.inf), initial=-jnp.inf)
    r_min = jnp.min(jnp.where(valid, sg_ratio, jnp.inf), initial=jnp.inf)
    if axis_name is not None:
        r_max = jax.lax.pmax(r_max, axis_name)
        r_min = jax.lax.pmin(r_min, axis_name)
    any_tokens = tokens > 0
    sg_log_ratio = jax.lax.stop_gradient(log_ratio)
    metrics = {
        "pg_loss": pg,
        "kl": kl,
        "clip/low_frac": token_mean(low.astype(jnp.float32)),
        "clip/high_frac": token_mean(high.astype(jnp.float32)),
        "clip/dual_frac": token_mean(dual.astype(jnp.float32)),
        "ratio/mean": token_mean(sg_ratio),
        "ratio/max": jnp.where(any_tokens, r_max, 0.0),
        "ratio/min": jnp.where(any_tokens, r_min, 0.0),
        "approx_kl_old": token_mean(jnp.exp(sg_log_ratio) - 1.0 - sg_log_ratio),
        "tokens": tokens,
        "sequences": _psum(jnp.sum(jnp.sum(maskf, axis=-1) > 0).astype(jnp.float32), axis_name),
    }
    metrics.update({k: token_mean(v.astype(jnp.float32)) for k, v in extra.items()})
    metrics = {k: jax.lax.stop_gradient(jnp.asarray(v, jnp.float32)) for k, v in metrics.items()}
    return metrics


def _objective_terms(
    objective: str, ppo: Array, ratio: Array, clipped: Array, logp: Array, log_ratio: Array, adv: Array,
    valid: Array, axis_name: str | None, key: Array | None, cispo_low: float | None, cispo_high: float,
    clip_cov_ratio: float, clip_cov_lb: float, clip_cov_ub: float, kl_cov_ratio: float, kl_cov_coef: float,
) -> tuple[Array, Array]:
    """Per-token loss of a non-PPO objective (``ppo``: the clipped PPO per-token loss) and its selection mask for
    the metrics (cispo: tokens whose weight is clipped; clip_cov / kl_cov: the detached / penalised tokens)."""
    adv = jnp.broadcast_to(adv, logp.shape)
    if objective == "cispo":
        weight = obj.cispo_weight(ratio, cispo_low, cispo_high)
        return -weight * adv * logp, valid & (jax.lax.stop_gradient(ratio) != weight)
    cov = obj.token_covariance(logp, adv, valid, axis_name)
    if objective == "clip_cov":
        ppo_clipped = (-clipped * adv) > (-ratio * adv)  # the clip branch is active: PPO already stops the gradient
        detach = obj.clip_cov_selection(cov, valid, jax.lax.stop_gradient(ppo_clipped), clip_cov_ratio, clip_cov_lb,
                                        clip_cov_ub, key, axis_name)
        return jnp.where(detach, jax.lax.stop_gradient(ppo), ppo), detach
    penal = obj.kl_cov_selection(cov, valid, kl_cov_ratio, axis_name)
    surrogate = -ratio * adv
    # |x| with gradient sign(x), 0 at x = 0 (as PyTorch's abs; jnp.abs's is 1 there)
    abs_log_ratio = log_ratio * jax.lax.stop_gradient(jnp.sign(log_ratio))
    return jnp.where(penal, surrogate + kl_cov_coef * abs_log_ratio, surrogate), penal


def resolve_sampler_correction(mode: SamplerCorrection, compute_dtype: str) -> SamplerCorrection:
    """``"auto"`` -> ``"token_tis"`` when the model computes in a dtype other than float32 (a bfloat16 sampler and a
    differently fused train step disagree on the same tokens' log-probs, Yao et al. 2025), else ``"none"`` (the
    float32 sampler and trainer agree to rounding, and the correction would only add variance)."""
    if mode not in SAMPLER_CORRECTIONS:
        raise ValueError(f"sampler_correction={mode!r}; choose one of {SAMPLER_CORRECTIONS}")
    if mode != "auto":
        return mode
    return "none" if compute_dtype == "float32" else "token_tis"


def sampler_correction(
    train_logp: Array, sampler_logp: Array, mask: Array, mode: SamplerCorrection, cap: float
) -> tuple[Array, Array]:
    """Importance weights and keep-masks that correct for sampling from a policy other than the one trained.

    The sampler (bfloat16, its own kernels) and the train step compute different log-probs for the same tokens at the
    same parameters, so the rollout is slightly off-policy. With ``log rho_t = train_logp_t - sampler_logp_t`` (both
    at the sampling parameters, treated as constants) and cap ``C > 1``:

    - ``token_tis``: ``w_t = min(rho_t, C)`` -- truncated importance sampling (Yao et al. 2025, "Your efficient RL
      framework secretly brings you off-policy RL training"; TRL's ``vllm_importance_sampling_correction``);
    - ``seq_tis``: ``w_t = min(prod_s rho_s, C)`` for every token of the sequence (the product over its valid tokens);
    - ``token_mask``: ``keep_t = [1/C <= rho_t <= C]`` -- tokens whose ratio leaves the band are dropped (masked
      importance sampling, as verl's rollout-correction rejection);
    - ``seq_mask``: ``keep_t = [1/C <= prod_s rho_s <= C]`` for the whole sequence;
    - ``none``: ``w = 1``, keep everything.

    The weight multiplies the per-token policy-gradient term (`policy_loss`'s ``is_weights``; the PPO ratio is then
    taken against ``train_logp``); a dropped token leaves the loss mask, hence every denominator, as a masked
    degenerate group does. Returns ``(weights float32, keep bool)``, both of ``train_logp``'s shape; padding (``mask``
    False) gets weight 1 and keep True. Log-ratios are clamped to [-20, 20] before ``exp``.
    """
    if mode not in SAMPLER_CORRECTIONS or mode == "auto":
        raise ValueError(f"mode={mode!r}; choose one of {SAMPLER_CORRECTIONS[1:]} (resolve 'auto' first)")
    if not cap > 1.0:
        raise ValueError(f"cap must be > 1 (e.g. 2.0); got {cap!r}")
    valid = jnp.asarray(mask) != 0
    diff = jnp.asarray(train_logp, jnp.float32) - jnp.asarray(sampler_logp, jnp.float32)
    log_rho = jax.lax.stop_gradient(jnp.where(valid, _clamp(diff), 0.0))
    if mode.startswith("seq"):
        log_rho = jnp.broadcast_to(_clamp(jnp.sum(log_rho, axis=-1, keepdims=True)), log_rho.shape)
    ones = jnp.ones(log_rho.shape, jnp.float32)
    if mode == "none":
        return ones, jnp.ones(log_rho.shape, bool)
    if mode.endswith("tis"):
        return jnp.where(valid, jnp.minimum(jnp.exp(log_rho), cap), 1.0), jnp.ones(log_rho.shape, bool)
    log_cap = math.log(cap)
    return ones, ~valid | ((log_rho >= -log_cap) & (log_rho <= log_cap))
