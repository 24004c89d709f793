# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Decode attention as Pallas GPU kernels, with the calling convention of the XLA path.

`decode_layer` (what the rollout engine's decode step runs on an NVIDIA GPU, `models.decode._write_attend`) computes
`models.decode.write_attend` in ONE Triton kernel per layer: a program per (row, kv head) reads the row's q|k|v of
that kv head where the projection wrote it, applies RoPE to its ``R`` queries and its new key, writes the key and
value into the decode cache in place, and runs one online softmax (Milakov & Gimelshein 2018; the running max, sum and
output of flash attention, Dao et al. 2022) over its prompt's cached keys, its own cached keys and the new key, each
masked as the XLA path masks them, and writes its output; the scores never reach HBM and no cache or query is copied.

`decode_attend_shared_prefix` (jax's own kernel, run twice and merged) computes what `attention.attend_shared_prefix`
computes for one decode token per row (``T = 1``): one softmax over ``[the row's prompt keys (shared by its G rows) ;
the row's own decode keys]``, with ``jax.experimental.pallas.ops.gpu.decode_attention.mqa`` (a split-k
flash-decoding kernel in Triton; Dao et al., "Flash-Decoding for long-context inference", 2023) run twice, each
reading only the keys it is told are valid:

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

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
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


# ----------------------------------------------- one kernel a layer: RoPE, the cache write, both key sets, no merge
_BLOCK_H = 16  # query heads per program, padded (the loads are masked): Triton's dot takes at least 16 rows
_NEG = -1e30


def _rotate(x1, x2, cos, sin, dtype):
    """The float32 rotate-half RoPE of the XLA path (`apply_rope`) on the two halves of the head axis, rounded to
    ``dtype``."""
    x1, x2 = x1.astype(jnp.float32), x2.astype(jnp.float32)
    return (x1 * cos - x2 * sin).astype(dtype), (x2 * cos + x1 * sin).astype(dtype)


def _norm_rope(x1, x2, w, eps, cos, sin, dtype):
    """The XLA path's qk-norm (`rms_norm`: ``w * x / sqrt(mean(x^2) + eps)`` in float32, rounded to ``dtype``; ``w``
    the halves of its weight, None: no norm) and then RoPE (`_rotate`), on the two halves of the head axis."""
    if w is not None:
        x1, x2 = x1.astype(jnp.float32), x2.astype(jnp.float32)
        total = jnp.sum(x1 * x1, axis=-1, keepdims=True) + jnp.sum(x2 * x2, axis=-1, keepdims=True)
        inv = jax.lax.rsqrt(total / (2 * x1.shape[-1]) + eps)
        x1, x2 = (x1 * inv * w[0]).astype(dtype), (x2 * inv * w[1]).astype(dtype)
    return _rotate(x1, x2, cos, sin, dtype)


def _layer_kernel(*refs, group: int, heads: int, blocks: tuple[int, int], scale: float, eps: float | None):
    """Program (row b, kv head k), reading the row's q|k|v ``[B, K, R + 2, H]`` of that kv head: with ``eps``, the
    qk-norm (weights ``qn``/``kn [H]``) on its ``heads`` (R) queries and its new key; RoPE on them (tables
    ``cos``/``sin [B, H/2]``); the new key and value written at decode slot ``slot [B]`` of the caches ``ko [B, K,
    W, H]`` / ``vo [B, K, H, W]`` (aliased in place; a slot past the cache writes nothing); then one online softmax
    (flash attention's running max and sum) over the prompt's keys (``kp [S, K, Tp, H]``, ``vp [S, K, H, Tp]``,
    masked by ``pm [S, Tp]``), the row's cached keys (masked by ``om [B, W]``, the slot being written excluded: this
    program's own store is not read back) and the new key from registers (visible where ``om`` has its slot), ``o
    [B, K, R, H]``. The head axis is handled as its two RoPE halves: each score is the sum of two half-width dots."""
    qkv_ref, cos_ref, sin_ref, kp_ref, vp_ref, pm_ref, _, _, om_ref, slot_ref = refs[:10]  # caches: aliased outputs
    o_ref, ko_ref, vo_ref = refs[-3:]
    b, k = pl.program_id(0), pl.program_id(1)
    p = b // group
    head = qkv_ref.shape[-1]
    half, width = head // 2, ko_ref.shape[2]
    lo, hi = pl.ds(0, half), pl.ds(half, half)
    dt = qkv_ref.dtype
    rows = (jnp.arange(_BLOCK_H) < heads)[:, None]
    cos, sin = cos_ref[b, :], sin_ref[b, :]
    qn = kn = None
    if eps is not None:
        qn_ref, kn_ref = refs[10:12]
        qn, kn = (qn_ref[lo][None, :], qn_ref[hi][None, :]), (kn_ref[lo], kn_ref[hi])
    q1, q2 = _norm_rope(plgpu.load(qkv_ref.at[b, k, pl.ds(0, _BLOCK_H), lo], mask=rows, other=0.0),
                        plgpu.load(qkv_ref.at[b, k, pl.ds(0, _BLOCK_H), hi], mask=rows, other=0.0), qn, eps,
                        cos[None, :], sin[None, :], dt)  # fmt: skip
    k1, k2 = _norm_rope(qkv_ref[b, k, heads, lo], qkv_ref[b, k, heads, hi], kn, eps, cos, sin, dt)
    vn = qkv_ref[b, k, heads + 1, :].astype(vo_ref.dtype)
    slot = slot_ref[b]
    writes = slot < width
    at = jnp.minimum(slot, width - 1)
    plgpu.store(ko_ref.at[b, k, at, lo], k1.astype(ko_ref.dtype), mask=jnp.full((half,), writes))
    plgpu.store(ko_ref.at[b, k, at, hi], k2.astype(ko_ref.dtype), mask=jnp.full((half,), writes))
    plgpu.store(vo_ref.at[b, k, :, at], vn, mask=jnp.full((head,), writes))

    def part(k_ref, v_ref, mask_ref, n, block_k, skip, carry):  # the key set of batch entry n of [*, K, S, H]
        def body(i, carry):  # (one indexer per load)
            acc, m, den = carry
            sl = pl.ds(i * block_k, block_k)
            s = (plgpu.dot(q1, k_ref[n, k, sl, lo].astype(dt), trans_b=True).astype(jnp.float32)
                 + plgpu.dot(q2, k_ref[n, k, sl, hi].astype(dt), trans_b=True).astype(jnp.float32)) * scale
            valid = (mask_ref[n, sl] & (i * block_k + jnp.arange(block_k) != skip))[None, :]
            s = jnp.where(valid, s, _NEG)
            m_next = jnp.maximum(m, jnp.max(s, axis=-1))
            e = jnp.where(valid, jnp.exp(s - m_next[:, None]), 0.0)
            c = jnp.exp(m - m_next)
            pv = plgpu.dot(e.astype(dt), v_ref[n, k, :, sl].astype(dt), trans_b=True).astype(jnp.float32)
            return acc * c[:, None] + pv, m_next, den * c + jnp.sum(e, axis=-1)

        return jax.lax.fori_loop(0, k_ref.shape[2] // block_k, body, carry)

    carry = (jnp.zeros((_BLOCK_H, head), jnp.float32), jnp.full((_BLOCK_H,), _NEG, jnp.float32),
             jnp.zeros((_BLOCK_H,), jnp.float32))  # fmt: skip
    carry = part(kp_ref, vp_ref, pm_ref, p, blocks[0], -1, carry)
    acc, m, den = part(ko_ref, vo_ref, om_ref, b, blocks[1], slot, carry)
    # the new key, as the cache holds it: scored in float32 like the dots, its weight rounded like theirs
    k1, k2 = (x.astype(ko_ref.dtype).astype(dt).astype(jnp.float32) for x in (k1, k2))
    s = (jnp.sum(q1.astype(jnp.float32) * k1[None, :], axis=-1)
         + jnp.sum(q2.astype(jnp.float32) * k2[None, :], axis=-1)) * scale
    seen = writes & om_ref[b, at]
    s = jnp.where(seen, s, _NEG)
    m_next = jnp.maximum(m, s)
    e = jnp.where(seen, jnp.exp(s - m_next), 0.0)
    c = jnp.exp(m - m_next)
    pv = e.astype(dt).astype(jnp.float32)[:, None] * vn.astype(dt).astype(jnp.float32)[None, :]
    acc, den = acc * c[:, None] + pv, den * c + e
    out = jnp.where(den[:, None] > 0, acc / jnp.where(den > 0, den, 1.0)[:, None], 0.0)
    plgpu.store(o_ref.at[b, k, pl.ds(0, _BLOCK_H), :], out.astype(o_ref.dtype), mask=rows)


def key_blocks(prefix_slots: int, decode_slots: int, block_k: int = 128) -> tuple[int, int]:
    """The keys `decode_layer` reads per iteration of its prompt part and of its own part: ``gcd(block_k, slots)``
    each, so that every block is whole (a window of 480 decode slots is read 32 at a time, a 384-slot prompt 128)."""
    return math.gcd(block_k, prefix_slots), math.gcd(block_k, decode_slots)


def decode_layer_fits(heads: int, head_dim: int, prefix_slots: int, decode_slots: int, block_k: int = 128) -> bool:
    """Whether `decode_layer` takes these shapes: at most `_BLOCK_H` query heads per kv head, a half head (each score
    is two half-width dots) and key blocks (`key_blocks`) that are powers of two of at least 16 (Triton's smallest
    dot)."""
    sizes = (*key_blocks(prefix_slots, decode_slots, block_k), head_dim // 2)
    return heads <= _BLOCK_H and head_dim % 2 == 0 and all(g >= 16 and g & (g - 1) == 0 for g in sizes)


def decode_layer(qkv_BKXH: jax.Array, cos_Bh: jax.Array, sin_Bh: jax.Array, kp_PKSH: jax.Array, vp_PKHS: jax.Array,
                 prefix_mask_PS: jax.Array, ko_BKMH: jax.Array, vo_BKHM: jax.Array, mask_BM: jax.Array,
                 slot_B: jax.Array, norms: tuple[jax.Array, jax.Array] | None = None, *, norm_eps: float = 1e-6,
                 interpret: bool = False, block_k: int = 128) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """A decode layer's attention step as ONE Pallas GPU kernel: what `models.decode.write_attend` computes with
    XLA (RoPE on the queries and the new key, the new key and value written into the decode cache at each row's slot,
    `models.decode.attend_decode` over the prompt's keys and the row's own), in one launch per layer instead of four
    (the queries' RoPE, the two cache scatters, attention) and with no copy of the q|k|v product: it is read where
    its GEMM wrote it, ``[B, K, R + 2, H]`` (per kv head its ``R`` queries, key and value: `decode_weights`' column
    order). A program per (row, kv head); the caches are updated in place (``input_output_aliases``: donate them)
    and read in their stored layouts (values ``[.., H, S]``); no score tensor. The ``R`` query heads of a kv head are
    padded to `_BLOCK_H` by masked loads. Keys are read ``gcd(block_k, Tp)`` per iteration of the prompt part and
    ``gcd(block_k, M)`` of the own part (`key_blocks`, `decode_layer_fits`). RoPE tables ``[B, H/2]`` (ones and
    zeros: no rotation, exactly); ``slot [B]`` (``>= M``: no write); ``norms``: the qk-norm weights ``(q [H], k
    [H])`` (Qwen3) applied before RoPE with ``norm_eps``, or None. Returns ``(o [B, K, R, H], k cache, v cache)``.
    A query with no visible key gets 0."""
    B, K, X, H = qkv_BKXH.shape
    R = X - 2
    P, _, Tp, _ = kp_PKSH.shape
    M = ko_BKMH.shape[2]
    if not decode_layer_fits(R, H, Tp, M, block_k):
        raise ValueError(f"the fused decode kernel needs key counts ({Tp}, {M}) and a half head ({H // 2}) each with a "
                         f"power-of-two divisor >= 16 and at most {_BLOCK_H} query heads per kv head (got {R}); use "
                         "the XLA path")  # fmt: skip
    kernel = functools.partial(_layer_kernel, group=B // P, heads=R, blocks=key_blocks(Tp, M, block_k),
                               scale=H**-0.5, eps=None if norms is None else float(norm_eps))  # fmt: skip
    extra = () if norms is None else tuple(w.astype(jnp.float32) for w in norms)
    dt = qkv_BKXH.dtype
    out_shape = (jax.ShapeDtypeStruct((B, K, R, H), dt), jax.ShapeDtypeStruct(ko_BKMH.shape, ko_BKMH.dtype),
                 jax.ShapeDtypeStruct(vo_BKHM.shape, vo_BKHM.dtype))  # fmt: skip
    return pl.pallas_call(kernel, grid=(B, K), out_shape=out_shape, interpret=interpret,
                          input_output_aliases={6: 1, 7: 2},
                          compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
                          name="decode_layer")(qkv_BKXH, cos_Bh.astype(jnp.float32), sin_Bh.astype(jnp.float32),
                                               kp_PKSH.astype(dt), vp_PKHS.astype(dt), prefix_mask_PS.astype(bool),
                                               ko_BKMH, vo_BKHM, mask_BM.astype(bool),
                                               jnp.broadcast_to(slot_B, (B,)).astype(jnp.int32), *extra)  # fmt: skip
