# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Memory-efficient attention: the softmax taken over key chunks with a running max and sum (online softmax).

For each query, with keys visited in chunks ``c = 1..n``::

    m_c = max(m_{c-1}, max_j s_j)                 s_j = q . k_j / sqrt(H) over the visible keys j of chunk c
    l_c = l_{c-1} exp(m_{c-1} - m_c) + sum_j exp(s_j - m_c)
    a_c = a_{c-1} exp(m_{c-1} - m_c) + sum_j exp(s_j - m_c) v_j            out = a_n / l_n  (0 when no key is visible)

(Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"; Rabe & Staats 2021, "Self-attention does not
need O(n^2) memory"; Dao et al. 2022, FlashAttention). The chunk loop is a `lax.scan` whose body is rematerialized
in the backward (`jax.checkpoint`), so neither pass holds more than one ``[queries, chunk]`` score block per kv head:
the full ``[T, S]`` score tensor of a row never exists. Masks come factored (which keys are real, and each query's
and key's position for causality), never as a dense ``[T, S]`` array. Scores and sums are float32, as in
`attention.attend`, and the results equal it up to float rounding (tested in values and gradients).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG = -1e30


def _chunks(x: jax.Array, axis: int, chunk: int, fill) -> jax.Array:
    """``x`` padded along ``axis`` to a multiple of ``chunk`` and split: the chunk index moved to axis 0."""
    n = -(-x.shape[axis] // chunk)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n * chunk - x.shape[axis])
    x = jnp.pad(x, pad, constant_values=fill)
    x = x.reshape(*x.shape[:axis], n, chunk, *x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)


def _online(carry, scores: jax.Array, visible: jax.Array):
    """One chunk of the online softmax (module docstring): ``scores``/``visible`` ``[..., C]``, ``carry = (m, total,
    acc)`` with ``m``, ``total`` ``[...]``. Returns the new max and sum, the factor ``exp(m_old - m_new)`` that rescales
    the accumulated values, and the chunk's unnormalized probabilities ``[..., C]``."""
    m, total, _ = carry
    s = jnp.where(visible, scores, _NEG)
    m_new = jax.lax.stop_gradient(jnp.maximum(m, jnp.max(s, axis=-1)))
    p = jnp.where(visible, jnp.exp(s - m_new[..., None]), 0.0)
    corr = jnp.exp(m - m_new)
    return m_new, total * corr + jnp.sum(p, axis=-1), corr, p


def _finish(total: jax.Array, acc: jax.Array) -> jax.Array:
    """``acc / total``; 0 for a query that saw no key (``total = 0``)."""
    return jnp.where(total[..., None] > 0, acc / jnp.maximum(total, 1e-30)[..., None], 0.0)


def attend_chunked(
    q_BTKRH: jax.Array,
    k_BSKH: jax.Array,
    v_BSKH: jax.Array,
    key_valid_BS: jax.Array,
    q_pos_BT: jax.Array,
    k_pos_BS: jax.Array,
    chunk: int,
) -> jax.Array:
    """`attention.attend` with the mask ``key_valid[b, s] & (k_pos[b, s] <= q_pos[b, t])``, over key chunks."""
    B, T, K, R, H = q_BTKRH.shape
    scale = H**-0.5
    xs = (_chunks(k_BSKH, 1, chunk, 0), _chunks(v_BSKH, 1, chunk, 0), _chunks(key_valid_BS, 1, chunk, False),
          _chunks(k_pos_BS, 1, chunk, 0))  # fmt: skip

    @jax.checkpoint
    def body(carry, x):
        k, v, valid, kpos = x  # [B, C, K, H], [B, C, K, H], [B, C], [B, C]
        s = jnp.einsum("btkrh,bckh->bkrtc", q_BTKRH, k, preferred_element_type=jnp.float32) * scale
        vis = (valid[:, None, :] & (kpos[:, None, :] <= q_pos_BT[:, :, None]))[:, None, None]  # [B, 1, 1, T, C]
        m, total, corr, p = _online(carry, s, vis)
        acc = carry[2] * corr[..., None] + jnp.einsum("bkrtc,bckh->bkrth", p, v.astype(jnp.float32))
        return (m, total, acc), None

    init = (jnp.full((B, K, R, T), _NEG, jnp.float32), jnp.zeros((B, K, R, T), jnp.float32),
            jnp.zeros((B, K, R, T, H), jnp.float32))  # fmt: skip
    (_, total, acc), _ = jax.lax.scan(body, init, xs)
    return _finish(total, acc).transpose(0, 3, 1, 2, 4).astype(v_BSKH.dtype)


def attend_shared_prefix_chunked(
    q_BTKRH: jax.Array,
    kp_PKSH: jax.Array,
    vp_PKHS: jax.Array,
    prefix_mask_PS: jax.Array,
    ko_BKMH: jax.Array,
    vo_BKHM: jax.Array,
    own_valid_BM: jax.Array,
    chunk: int,
) -> jax.Array:
    """`attention.attend_shared_prefix` over key chunks: the prompt's keys (shared by its G rows, read once per
    prompt and chunk) then each row's own keys, causal (own key ``m`` visible to query ``t`` iff ``m <= t`` and
    ``own_valid[b, m]``; the own keys are the queries' own tokens, as in the prefix-shared train step)."""
    B, T, K, R, H = q_BTKRH.shape
    P = prefix_mask_PS.shape[0]
    G = B // P
    scale = H**-0.5
    q = q_BTKRH.reshape(P, G, T, K, R, H)
    t_pos = jnp.arange(T, dtype=jnp.int32)
    init = (jnp.full((P, K, G, T, R), _NEG, jnp.float32), jnp.zeros((P, K, G, T, R), jnp.float32),
            jnp.zeros((P, K, G, T, R, H), jnp.float32))  # fmt: skip

    @jax.checkpoint
    def prefix_body(carry, x):
        k, v, valid = x  # [P, K, C, H], [P, K, H, C], [P, C]
        s = jnp.einsum("pgtkrh,pkch->pkgtrc", q, k, preferred_element_type=jnp.float32) * scale
        m, total, corr, p = _online(carry, s, valid[:, None, None, None, None, :])
        acc = carry[2] * corr[..., None] + jnp.einsum("pkgtrc,pkhc->pkgtrh", p, v.astype(jnp.float32))
        return (m, total, acc), None

    @jax.checkpoint
    def own_body(carry, x):
        k, v, valid, pos = x  # [P, G, K, C, H], [P, G, K, H, C], [P, G, C], [C]
        s = jnp.einsum("pgtkrh,pgkch->pkgtrc", q, k, preferred_element_type=jnp.float32) * scale
        vis = (valid[:, :, None, :] & (pos[None, None, None, :] <= t_pos[None, None, :, None]))  # [P, G, T, C]
        m, total, corr, p = _online(carry, s, vis[:, None, :, :, None, :])
        acc = carry[2] * corr[..., None] + jnp.einsum("pkgtrc,pgkhc->pkgtrh", p, v.astype(jnp.float32))
        return (m, total, acc), None

    prefix_xs = (_chunks(kp_PKSH, 2, chunk, 0), _chunks(vp_PKHS, 3, chunk, 0),
                 _chunks(prefix_mask_PS.astype(bool), 1, chunk, False))
    carry, _ = jax.lax.scan(prefix_body, init, prefix_xs)
    M = ko_BKMH.shape[2]
    own_xs = (_chunks(ko_BKMH.reshape(P, G, K, M, H), 3, chunk, 0),
              _chunks(vo_BKHM.reshape(P, G, K, H, M), 4, chunk, 0),
              _chunks(own_valid_BM.astype(bool).reshape(P, G, M), 2, chunk, False),
              _chunks(jnp.arange(M, dtype=jnp.int32), 0, chunk, M))  # fmt: skip
    (_, total, acc), _ = jax.lax.scan(own_body, carry, own_xs)
    return _finish(total, acc).transpose(0, 2, 3, 1, 4, 5).reshape(B, T, K, R, H).astype(vo_BKHM.dtype)
