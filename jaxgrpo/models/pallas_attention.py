# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Decode attention through the Pallas kernels jax itself ships, with the calling convention of the XLA path.

`decode_attend_shared_prefix` computes what `attention.attend_shared_prefix` computes for one decode token per row
(``T = 1``): one softmax over ``[the row's prompt keys (shared by its G rows) ; the row's own decode keys]``, with
``jax.experimental.pallas.ops.gpu.decode_attention.mqa`` (a split-k flash-decoding kernel in Triton; Dao et al.,
"Flash-Decoding for long-context inference", 2023) run twice, each reading only the keys it is told are valid:

  * prefix part: per prompt and kv head, the ``G * R`` queries of its rows (``R`` query heads per kv head) against
    the prompt's ``Tp`` cached keys, valid from ``start = Tp - len`` (prompts are left-padded: the mask's True slots
    are its last ``len``);
  * own part: per row and kv head, its ``R`` queries against its decode cache, valid below ``sum(mask_BTM)``
    (slots ``0 .. slot`` are written);

each returns ``o = sum_j p_j v_j / l`` with its residuals ``m = max_j s_j`` and ``l = sum_j exp(s_j - m)``
(``s = q.k / sqrt(H)``), and the two are merged exactly as online softmax merges blocks (Milakov & Gimelshein 2018,
"Online normalizer calculation for softmax"): ``M = max(m1, m2)``, ``w_i = l_i exp(m_i - M)``,
``o = (w1 o1 + w2 o2) / (w1 + w2)``; a query with no valid key gets 0, as on the XLA path.

Layouts: the kernel reads keys and values as ``[batch, seq, H]``; the prefix and decode caches are kv-head-major
(``k [P, K, Tp, H]``, ``k [B, K, M, H]``), so keys are reshaped in place. Values on the XLA path are stored with the
key axis minor (``v [.., H, S]``, `attention.kv_major`) and are transposed here unless the caller stores them
``[.., S, H]`` (``values_key_minor=False``): a decode that selects this kernel should store its values that way.
``interpret=True`` runs the kernel's Pallas interpreter on any backend (the CPU tests).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import decode_attention


def _mqa(q_XQH, k_XSH, v_XSH, start_X, end_X, *, interpret: bool, block_k: int, k_splits: int):
    """Pallas ``mqa`` with its residuals; block sizes clipped to the key count (a split holds whole blocks)."""
    S = k_XSH.shape[1]
    block_k = min(block_k, S)
    k_splits = max(1, min(k_splits, S // block_k))
    o, (total, top) = decode_attention.mqa(q_XQH, k_XSH, v_XSH, start_idx=start_X, kv_seq_len=end_X, block_k=block_k,
                                     k_splits=k_splits, interpret=interpret, return_residuals=True)  # fmt: skip
    return o.astype(jnp.float32), total, top


def decode_attend_shared_prefix(
    q_BTKRH: jax.Array,
    kp_PKSH: jax.Array,
    vp_PKXX: jax.Array,
    prefix_mask_PS: jax.Array,
    k_BKMH: jax.Array,
    v_BKXX: jax.Array,
    mask_BTM: jax.Array,
    *,
    values_key_minor: bool = True,
    interpret: bool = False,
    block_k: int = 128,
    k_splits: int = 16,
) -> jax.Array:
    """`attention.attend_shared_prefix` for ``T = 1`` through Pallas' GPU decode kernel (module docstring).

    ``q [B, 1, K, R, H]`` (``B = P * G`` rows, prompt-major), prefix cache ``kp [P, K, Tp, H]`` and ``vp [P, K, H,
    Tp]`` (``[P, K, Tp, H]`` when ``values_key_minor=False``) masked by ``prefix_mask [P, Tp]`` (left-padded), decode
    cache ``k [B, K, M, H]`` and ``v [B, K, H, M]`` (or ``[B, K, M, H]``) whose valid slots are ``mask [B, 1, M]``
    (a prefix ``0 .. slot``). Returns ``a [B, 1, K, R, H]`` in ``q``'s dtype.
    """
    B, T, K, R, H = q_BTKRH.shape
    P, _, Tp, _ = kp_PKSH.shape
    G, M = B // P, k_BKMH.shape[2]
    if T != 1:
        raise ValueError(f"the Pallas decode kernel takes one token per row (got T = {T}); use the XLA path")
    if not values_key_minor:
        vp_PKSH, v_BKMH = vp_PKXX, v_BKXX
    else:
        vp_PKSH, v_BKMH = jnp.swapaxes(vp_PKXX, 2, 3), jnp.swapaxes(v_BKXX, 2, 3)
    dt = q_BTKRH.dtype
    kw = dict(interpret=interpret, block_k=block_k, k_splits=k_splits)
    # prefix: per (prompt, kv head) the G * R queries of its rows
    q_prefix = q_BTKRH[:, 0].reshape(P, G, K, R, H).transpose(0, 2, 1, 3, 4).reshape(P * K, G * R, H)
    start = Tp - jnp.sum(prefix_mask_PS, axis=-1, dtype=jnp.int32)
    o1, l1, m1 = _mqa(q_prefix, kp_PKSH.reshape(P * K, Tp, H).astype(dt), vp_PKSH.reshape(P * K, Tp, H).astype(dt),
                      jnp.repeat(start, K), jnp.full((P * K,), Tp, jnp.int32), **kw)  # fmt: skip
    o1 = o1.reshape(P, K, G, R, H).transpose(0, 2, 1, 3, 4).reshape(B, K, R, H)
    l1, m1 = (x.reshape(P, K, G, R).transpose(0, 2, 1, 3).reshape(B, K, R) for x in (l1, m1))
    # own decode slots: per (row, kv head) its R queries
    end = jnp.repeat(jnp.sum(mask_BTM[:, 0], axis=-1, dtype=jnp.int32), K)
    o2, l2, m2 = _mqa(q_BTKRH[:, 0].reshape(B * K, R, H), k_BKMH.reshape(B * K, M, H).astype(dt),
                      v_BKMH.reshape(B * K, M, H).astype(dt), jnp.zeros((B * K,), jnp.int32), end, **kw)  # fmt: skip
    o2, l2, m2 = o2.reshape(B, K, R, H), l2.reshape(B, K, R), m2.reshape(B, K, R)
    # merge the two partial softmaxes; an empty part has l = 0 (its m may be -inf)
    top = jnp.maximum(m1, m2)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    w1 = jnp.where(l1 > 0, l1 * jnp.exp(jnp.minimum(m1 - top, 0.0)), 0.0)
    w2 = jnp.where(l2 > 0, l2 * jnp.exp(jnp.minimum(m2 - top, 0.0)), 0.0)
    total = w1 + w2
    a = (w1[..., None] * o1 + w2[..., None] * o2) / jnp.where(total > 0, total, 1.0)[..., None]
    return a[:, None].astype(dt)
