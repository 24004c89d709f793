# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Per-token log-probs and entropies of completion tokens, for the train step (and reference/eval passes).

``logp[b, t] = log_softmax(h[b, Tp-1+t] · W / temperature)[tokens[b, Tp+t]]`` with ``h`` the final-normed hidden
states — of the whole rows (`models.hidden_states`), or with prefix sharing of each group's prompt encoded once
(`jaxgrpo.models.prefix.prefix_shared_predictors`) — and only the states that predict completion tokens go through
the LM head, in sequence chunks under `lax.map` with a hand-written backward, in float32: no float32 ``[B, T, V]``
tensor exists and prompt positions cost no LM-head work. On an NVIDIA GPU (``lm_head="auto"``, lowered for CUDA) the
head is `jaxgrpo.learner.fused_head` instead: Pallas kernels with bf16 GEMMs and float32 accumulation, an online
log-sum-exp over vocabulary blocks and a bf16 ``dz`` in the backward, so no float32 ``[tokens, V]`` array reaches HBM
(the same values and gradients within bf16 rounding of ``dz``).

Top-k / top-p (``top_k > 0``, ``top_p < 1``): the log-prob is taken under the distribution the sampler drew from
(`jaxgrpo.token_sampling`: temperature, then top-k, then top-p, renormalised), ``logp = z_t − logsumexp_{v∈K} z_v``
with ``z = h W / temperature`` and the kept set ``K`` recomputed from these logits inside the LM-head chunk by the
sampler's own rule (`token_sampling.kept_mask`), the target token always in ``K``. At the sampling parameters ``K``
is the sampler's set and the importance ratio is 1; a full-softmax log-prob against the sampler's renormalised one
would put ``−log(kept mass)`` into every log-ratio (TRL #4772; vLLM's ``logprobs_mode="processed_logprobs"`` reports
the renormalised ones while verl's and TRL's learners recompute over the full vocabulary, the mismatch tracked in
vllm-project/vllm#42259). The set is recomputed rather than carried in the record because it is a function of the
policy's own logits (after an update the truncated policy is the new logits' truncation), and carrying it costs up
to ``V`` ids per token. The target is kept so that a token that left ``K`` after an update (or at the set's edge by
float rounding) gets a finite log-prob (``K ∪ {t}``) instead of ``−inf``. The gradient is that of the truncated
log-softmax, ``∂ logp / ∂ z = onehot(t) − p_K`` (``K`` is piecewise constant in ``z``); the entropy is of the same
truncated distribution.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, Protocol

import jax
import jax.numpy as jnp

from jaxgrpo import models, token_sampling
from jaxgrpo.learner import fused_head
from jaxgrpo.models import prefix as prefix_lib
from jaxgrpo.models.attention import DENSE, Kernel
from jaxgrpo.models.layers import LayerLoop, MatmulBackward, RematPolicy

# Elements of one float32 logits chunk [rows, chunk, V] when the chunk is chosen automatically (256 MiB).
_AUTO_CHUNK_ELEMENTS = 1 << 26
# Below this many bytes of float32 [B, Tc, V] probabilities the LM-head backward reuses the forward's (no recompute).
_KEEP_PROBS_BYTES = 1 << 29

Params = Any
LMHead = Literal["auto", "xla", "fused"]


class Rows(Protocol):
    """What `compute_logprobs` reads of a batch (`train_step.Batch` has it): tokens ``[B, Tp+Tc]`` (prompt left-padded,
    completion right-padded), prompt_mask ``[B, Tp]``, completion_mask ``[B, Tc]``."""

    tokens: jax.Array
    prompt_mask: jax.Array
    completion_mask: jax.Array


def _auto_chunk(rows: int, completion_len: int, vocab: int) -> int:
    return int(max(1, min(completion_len, _AUTO_CHUNK_ELEMENTS // max(rows * vocab, 1))))


def compute_logprobs(
    model_config: models.ModelConfig,
    params: Params,
    batch: Rows,
    temperature: float = 1.0,
    chunk: int = 0,
    *,
    remat: RematPolicy = "projections",
    matmul_backward: MatmulBackward = "auto",
    attention_kernel: Kernel = DENSE,
    constrain_rows: Callable[[jax.Array], jax.Array] | None = None,
    group_size: int = 0,
    packed_width: int = 0,
    pack_rows: int = 1,
    top_k: int = 0,
    top_p: float = 1.0,
    lm_head: LMHead = "auto",
    layer_loop: LayerLoop = "scan",
) -> tuple[jax.Array, jax.Array]:
    """Per-token log-probs and entropies ``([B, Tc], [B, Tc])`` float32 of the completion tokens of `batch`.

    ``logp[b, t] = log_softmax(h[b, Tp-1+t] · W / temperature)[tokens[b, Tp+t]]`` and
    ``entropy[b, t] = −Σ_v p_v log p_v`` of the same distribution. The LM head runs in sequence chunks of
    ``chunk`` completion positions (0 = automatic: as few equal chunks as keep float32 logits ≤ 256 MiB each), each
    with a hand-written backward that recomputes the chunk's logits instead of storing ``[B, Tc, V]``.
    Values at masked positions are meaningless (callers mask them). Entropy carries no gradient. ``remat``,
    ``matmul_backward``, ``attention_kernel``, ``constrain_rows``, ``layer_loop``: as for `models.hidden_states`
    (``remat="full"`` keeps about one ``[B, T, D]`` per layer for ~1/3 more compute). ``group_size = G > 1``:
    prefix sharing — rows ``p*G .. p*G+G-1`` must hold the same (left-padded) prompt, as in the train step's
    `Batch`; the prompt is taken from row ``p*G`` and encoded once per group (`jaxgrpo.models.prefix`); same values
    and gradients as 0 (plain).
    ``packed_width``, ``pack_rows`` (prefix sharing only): run the group prompts packed end to end in ``pack_rows``
    rows of ``packed_width`` tokens instead of left-padded (`jaxgrpo.models.prefix.prefix_shared_hidden`; same
    values, no work on prompt padding); size it with `packed_prompt_width`. ``pack_rows`` is the number of batch
    shards (one packed row each); the automatic LM-head chunk is sized for one shard's rows. ``top_k`` (0 = off),
    ``top_p`` (1 = off): the sampler's
    truncation; the log-probs and entropies are then of the truncated, renormalised distribution (module docstring).
    ``lm_head``: "xla" = the chunked head above; "fused" = `jaxgrpo.learner.fused_head` (Pallas kernels: Triton on an
    NVIDIA GPU, the Pallas interpreter elsewhere; no float32 ``[tokens, V]`` array; no truncation); "auto" = fused when
    the program is lowered for CUDA with no truncation and one batch shard (``pack_rows <= 1``: XLA does not partition
    the kernels' rows), the chunked XLA head otherwise (CPU, TPU).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (greedy rollouts have no log-probs to train on), got {temperature}")
    B, Tp = batch.prompt_mask.shape
    Tc = batch.completion_mask.shape[1]
    if batch.tokens.shape != (B, Tp + Tc):
        raise ValueError(
            f"tokens shape {batch.tokens.shape} != (B, Tp + Tc) = ({B}, {Tp} + {Tc}) from prompt_mask/completion_mask"
        )
    if Tp < 1 or Tc < 1:
        raise ValueError(f"need prompt width Tp >= 1 and completion width Tc >= 1, got Tp={Tp}, Tc={Tc}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = no top-k truncation), got {top_k!r}")
    if not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1 = no nucleus truncation), got {top_p!r}")
    if chunk < 0:
        raise ValueError(f"chunk must be >= 0 (0 = automatic), got {chunk}")
    if lm_head not in ("auto", "xla", "fused"):
        raise ValueError(f"lm_head must be 'auto', 'xla' or 'fused', got {lm_head!r}")
    if lm_head == "fused" and (top_k or top_p < 1.0):
        raise ValueError("lm_head='fused' has no top-k/top-p truncation; use lm_head='xla' (or 'auto')")
    if group_size < 0 or (group_size > 1 and B % group_size):
        raise ValueError(f"group_size={group_size} must be 0/1 (no prefix sharing) or divide the {B} rows (B = P*G)")
    if group_size > 1:
        h_BCD = prefix_lib.prefix_shared_predictors(
            model_config,
            params,
            batch.tokens,
            batch.prompt_mask,
            batch.completion_mask,
            group_size,
            remat=remat,
            matmul_backward=matmul_backward,
            attention_kernel=attention_kernel,
            constrain_rows=constrain_rows,
            packed_width=packed_width,
            pack_rows=pack_rows,
            layer_loop=layer_loop,
        )
    else:
        attention_mask = jnp.concatenate([batch.prompt_mask, batch.completion_mask], axis=1).astype(bool)
        h_BTD = models.hidden_states(model_config, params, batch.tokens, attention_mask=attention_mask, remat=remat,
                                     matmul_backward=matmul_backward, attention_kernel=attention_kernel,
                                     constrain_rows=constrain_rows, layer_loop=layer_loop)  # fmt: skip
        h_BCD = h_BTD[:, Tp - 1 : Tp + Tc - 1]  # the hidden state at position i predicts token i+1
    targets_BC = batch.tokens[:, Tp:]
    head = _head_param(model_config, params)
    vocab = head.shape[0 if model_config.tie_word_embeddings else 1]
    trunc = (int(top_k) if top_k < vocab else 0, float(top_p) if top_p < 1.0 else None)  # k >= V keeps all
    xla = functools.partial(_xla_head, temperature=temperature, chunk=chunk, pack_rows=pack_rows, trunc=trunc,
                            tied=model_config.tie_word_embeddings, dtype=model_config.dtype)  # fmt: skip
    if lm_head == "xla" or (lm_head == "auto" and (trunc != (0, None) or pack_rows > 1)):
        return xla(h_BCD, targets_BC, head)
    fused = functools.partial(_fused_head, temperature=temperature, tied=model_config.tie_word_embeddings)
    if lm_head == "fused":
        return fused(h_BCD, targets_BC, head)
    return jax.lax.platform_dependent(h_BCD, targets_BC, head, cuda=fused, default=xla)


def _head_param(model_config: models.ModelConfig, params: Params) -> jax.Array:
    """The LM head as stored: the embedding ``[V, D]`` when tied, else ``lm_head`` ``[D, V]``."""
    return params["embed"] if model_config.tie_word_embeddings else params["lm_head"]


def _fused_head(h_BCD: jax.Array, targets_BC: jax.Array, w: jax.Array, *, temperature: float, tied: bool
                ) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """`fused_head.fused_logprobs` of every completion position at once ``([B, Tc], [B, Tc])``."""
    B, Tc, D = h_BCD.shape
    logp, ent = fused_head.fused_logprobs(h_BCD.reshape(B * Tc, D), targets_BC.reshape(-1), w,
                                          temperature=temperature, vocab_major=tied)  # fmt: skip
    return logp.reshape(B, Tc), ent.reshape(B, Tc)


def _xla_head(h_BCD: jax.Array, targets_BC: jax.Array, w: jax.Array, *, temperature: float, chunk: int,
              pack_rows: int, trunc: Truncation, tied: bool, dtype: Any) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """The LM head in sequence chunks under `lax.map`, float32 logits per chunk (`_chunk_logprobs`)."""
    B, Tc = targets_BC.shape
    w_DV = (w.T if tied else w).astype(dtype)  # as `models.lm_head`
    # chunks sized for the rows one device holds (the batch is split over `pack_rows` shards)
    c = min(chunk or _auto_chunk(B // max(pack_rows, 1), Tc, w_DV.shape[1]), Tc)
    n = -(-Tc // c)
    if not chunk:  # automatic: the same number of chunks, balanced (64 positions -> 2 x 32, not 42 + 22 + 20 padding)
        c = -(-Tc // n)
    pad = n * c - Tc
    h_NBcD = jnp.pad(h_BCD, ((0, 0), (0, pad), (0, 0))).reshape(B, n, c, -1).swapaxes(0, 1)
    t_NBc = jnp.pad(targets_BC, ((0, 0), (0, pad))).reshape(B, n, c).swapaxes(0, 1)
    inv_temp = 1.0 / float(temperature)
    keep = n * B * c * w_DV.shape[1] * 4 <= _KEEP_PROBS_BYTES
    logp_NBc, ent_NBc = jax.lax.map(lambda xs: _chunk_logprobs(xs[0], xs[1], w_DV, inv_temp, keep, trunc),
                                    (h_NBcD, t_NBc))
    unchunk = lambda x: x.swapaxes(0, 1).reshape(B, n * c)[:, :Tc]
    return unchunk(logp_NBc), unchunk(ent_NBc)


def _chunk_logits(h_BcD: jax.Array, w_DV: jax.Array, inv_temp: float) -> jax.Array:
    """``z = h W · τ⁻¹`` ``[B, c, V]``, accumulated in float32."""
    return jnp.einsum("bcd,dv->bcv", h_BcD, w_DV, preferred_element_type=jnp.float32) * inv_temp


Truncation = tuple[int, float | None]  # (top_k, 0 = off; top_p, None = off): static


def _kept(logits: jax.Array, t_Bc: jax.Array, trunc: Truncation) -> jax.Array | None:
    """The kept set ``K ∪ {t}`` ``[B, c, V]`` bool of the sampler's top-k / top-p rule on ``logits`` (already
    divided by the temperature); None without truncation."""
    top_k, top_p = trunc
    if not top_k and top_p is None:
        return None
    b, c, v = logits.shape
    z = jax.lax.stop_gradient(logits).reshape(b * c, v)
    kept = token_sampling.kept_mask(z, top_k=top_k, top_p=top_p).reshape(b, c, v)
    return kept | (jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2) == t_Bc[..., None].astype(jnp.int32))


def _chunk_forward(h_BcD: jax.Array, t_Bc: jax.Array, w_DV: jax.Array, inv_temp: float, trunc: Truncation):
    """``(logp, entropy, logz, probs)`` of one chunk, with one pass of ``exp`` over the ``[B, c, V]`` logits:
    ``m = max z``, ``e = exp(z − m)``, ``S = Σ e``; ``logz = m + log S``, ``p = e / S``, ``H = logz − Σ p z``; with
    truncation the sums run over the kept set only (``e = 0`` outside it)."""
    logits = _chunk_logits(h_BcD, w_DV, inv_temp)
    kept = _kept(logits, t_Bc, trunc)
    z = logits if kept is None else jnp.where(kept, logits, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    e = jnp.exp(z - m)
    s = jnp.sum(e, axis=-1)
    logz = m[..., 0] + jnp.log(s)
    probs = e / s[..., None]
    entropy = logz - jnp.sum(probs * (logits if kept is None else jnp.where(kept, logits, 0.0)), axis=-1)
    logp = jnp.take_along_axis(logits, t_Bc[..., None].astype(jnp.int32), axis=-1)[..., 0] - logz
    return logp, entropy, logz, probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _chunk_logprobs(h_BcD: jax.Array, t_Bc: jax.Array, w_DV: jax.Array, inv_temp: float, keep_probs: bool,
                    trunc: Truncation):
    """One LM-head chunk: ``(logp, entropy)`` ``[B, c]`` float32 of ``log_softmax(h W · inv_temp)`` (with ``trunc``,
    restricted to the kept set ``K`` and renormalised: ``p`` below is then 0 outside ``K``).

    Hand-written backward (the entropy is a statistic: it gets no gradient). With ``z = h W · τ⁻¹`` and
    ``p = softmax(z)``, ``∂ logp_t / ∂ z = onehot(t) − p``, so for the cotangent ``g`` of logp::

        dz = g · (onehot(t) − p) · τ⁻¹;   dh = dz Wᵀ;   dW = hᵀ dz

    ``keep_probs``: keep ``p`` ``[B, c, V]`` from the forward (memory) instead of recomputing the logits in the
    backward (one more ``[B·c, D] × [D, V]`` matmul and ``exp``); `compute_logprobs` keeps them when all chunks
    together stay under `_KEEP_PROBS_BYTES`. ``dW`` is an explicit ``hᵀ dz`` contraction so that XLA transposes the
    small ``h`` rather than the ``[B·c, V]`` ``dz``.
    """
    return _chunk_logprobs_fwd(h_BcD, t_Bc, w_DV, inv_temp, keep_probs, trunc)[0]


def _chunk_logprobs_fwd(h_BcD, t_Bc, w_DV, inv_temp, keep_probs, trunc):
    logp, entropy, logz, probs = _chunk_forward(h_BcD, t_Bc, w_DV, inv_temp, trunc)
    return (logp, entropy), (h_BcD, t_Bc, w_DV, probs if keep_probs else logz)


def _chunk_logprobs_bwd(inv_temp, keep_probs, trunc, res, cotangents):
    h_BcD, t_Bc, w_DV, saved = res
    g_Bc = cotangents[0].astype(jnp.float32)
    if keep_probs:
        probs = saved
    else:  # the logits again (and the kept set: the same rule on the same values)
        logits = _chunk_logits(h_BcD, w_DV, inv_temp)
        probs = jnp.exp(logits - saved[..., None])
        kept = _kept(logits, t_Bc, trunc)
        probs = probs if kept is None else jnp.where(kept, probs, 0.0)
    onehot = jax.nn.one_hot(t_Bc, w_DV.shape[1], dtype=jnp.float32)
    dz_BcV = (g_Bc * inv_temp)[..., None] * (onehot - probs)
    dh = jnp.einsum("bcv,dv->bcd", dz_BcV, w_DV, preferred_element_type=jnp.float32).astype(h_BcD.dtype)
    h_ND = h_BcD.reshape(-1, h_BcD.shape[-1])
    dw = jnp.einsum("nd,nv->dv", h_ND, dz_BcV.reshape(h_ND.shape[0], -1), preferred_element_type=jnp.float32)
    return dh, None, dw.astype(w_DV.dtype)


_chunk_logprobs.defvjp(_chunk_logprobs_fwd, _chunk_logprobs_bwd)
