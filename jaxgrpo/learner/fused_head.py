# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Fused LM-head log-probs: ``logp_n = z_{n, t_n} − logsumexp_v z_{n, v}`` and the entropy ``H_n = logsumexp z_n −
Σ_v p_{n, v} z_{n, v}`` with ``z = h W / τ``, without a float32 ``[tokens, vocab]`` array in HBM.

Forward: one Pallas kernel (Triton on NVIDIA GPUs, the Pallas interpreter elsewhere) per block of ``bm`` token rows
loops over the vocabulary in blocks of ``bv`` columns, each block's logits a bf16 × bf16 GEMM accumulated in float32
in registers (over ``D`` in steps of ``bk``), and keeps the online log-sum-exp (Milakov & Gimelshein 2018,
arXiv:1805.02867: ``m' = max(m, max z)``, ``s' = s·e^{m−m'} + Σ e^{z−m'}``), the running ``Σ e^{z−m'} z`` for the
entropy and the target's logit; it writes three float32 numbers per token.

Backward (custom VJP; the entropy is a statistic and carries no gradient): with ``p = softmax(z)``,
``∂ logp_t / ∂ z = onehot(t) − p``, so for the cotangent ``g`` of logp::

    dz = g · (onehot(t) − p) · τ⁻¹;   dh = dz Wᵀ;   dW = hᵀ dz

A second Pallas kernel recomputes each ``[bm, bv]`` logits tile from ``h`` and ``W`` and the saved log-sum-exp and
writes ``dz`` in the compute dtype (bf16); the two GEMMs are XLA's (cuBLAS: bf16 operands, float32 accumulation and
output for ``dW``, so no float32 copy of the head), in row chunks of at most ``_DZ_CHUNK_ELEMENTS`` elements of
``dz`` with ``dW`` accumulated in float32 across chunks. The same formulas as the chunked XLA path of
`jaxgrpo.learner.logprobs`; Liger-Kernel's fused linear cross-entropy likewise materialises the logits' gradient one row
chunk at a time, and cut-cross-entropy (Wijmans et al. 2024, arXiv:2411.09009) recomputes the logits tiles in the
backward as the ``dz`` kernel here does.

The head ``w`` is given as the parameter is stored: ``[V, D]`` (a tied embedding, ``vocab_major=True``) or ``[D, V]``,
in its master dtype; it is cast to ``h``'s dtype inside and its gradient comes back in the master dtype and layout
(no transposed copy of the head).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Elements of one bf16 dz chunk [rows, V] in the backward (2 GiB).
_DZ_CHUNK_ELEMENTS = 1 << 30


class Blocks(NamedTuple):
    """Static tiling: ``bm`` token rows, ``bv`` vocabulary columns, ``bk`` hidden units per GEMM step; Triton's warps
    and pipeline stages; ``rows_per_chunk`` of the backward's ``dz`` (0 = automatic)."""

    bm: int = 64
    bv: int = 128
    bk: int = 64
    num_warps: int = 4
    num_stages: int = 2
    rows_per_chunk: int = 0


DEFAULT_BLOCKS = Blocks(bm=128, num_warps=8, num_stages=3)
"""The tiling `fused_logprobs` uses when given none (its ``bv``/``bk`` fitted to the head's shape): the fastest of six
on an H200 at the Qwen2.5-0.5B train step's shape (43,008 rows, ``benchmarks/head_tiles.py``,
``benchmarks/results/gpu/head_tiles_h200.json``): forward 31.6 ms against 37.6 ms for ``Blocks()``, forward +
backward 102.4 against 109.5 ms. A module value, so a benchmark can set another (``benchmarks/gpu.py --head-tiles``)."""


def _divisor(n: int, sizes: tuple[int, ...]) -> int:
    """The largest of ``sizes`` dividing ``n`` (no padding copy), else the smallest (``n`` is padded)."""
    return next((s for s in sizes if n % s == 0), sizes[-1])


def _tile_logits(h_ref, w_ref, k_steps: int, bk: int, shape: tuple[int, int], cols, vocab_major: bool) -> jax.Array:
    """``h_ref · W[:, cols]`` of ``shape`` ``[rows, len(cols)]``, accumulated in float32 over ``k_steps`` steps of
    ``bk`` hidden units."""

    def step(k, acc):
        h = h_ref[:, pl.ds(k * bk, bk)]
        if vocab_major:
            return acc + plgpu.dot(h, w_ref[cols, pl.ds(k * bk, bk)], trans_b=True)
        return acc + plgpu.dot(h, w_ref[pl.ds(k * bk, bk), cols])

    return jax.lax.fori_loop(0, k_steps, step, jnp.zeros(shape, jnp.float32))


def _fwd_kernel(h_ref, w_ref, t_ref, lse_ref, zt_ref, ent_ref, *, vocab: int, bv: int, bk: int, inv_temp: float,
                vocab_major: bool):  # fmt: skip
    bm, d = h_ref.shape
    v_pad = w_ref.shape[0 if vocab_major else 1]
    t = t_ref[...]
    iota = jax.lax.broadcasted_iota(jnp.int32, (bm, bv), 1)

    def block(j, carry):
        m, s, a, zt = carry
        z = _tile_logits(h_ref, w_ref, d // bk, bk, (bm, bv), pl.ds(j * bv, bv), vocab_major) * inv_temp
        cols = iota + j * bv
        real = cols < vocab
        z = jnp.where(real, z, -jnp.inf)
        zt = zt + jnp.sum(jnp.where(cols == t[:, None], z, 0.0), axis=1)
        m_new = jnp.maximum(m, jnp.max(z, axis=1))
        scale = jnp.exp(m - m_new)
        e = jnp.exp(z - m_new[:, None])
        s = s * scale + jnp.sum(e, axis=1)
        a = a * scale + jnp.sum(jnp.where(real, e * z, 0.0), axis=1)
        return m_new, s, a, zt

    zeros = jnp.zeros((bm,), jnp.float32)
    m, s, a, zt = jax.lax.fori_loop(0, v_pad // bv, block, (zeros - jnp.inf, zeros, zeros, zeros))
    lse = m + jnp.log(s)
    lse_ref[...] = lse
    zt_ref[...] = zt
    ent_ref[...] = lse - a / s


def _dz_kernel(h_ref, w_ref, t_ref, lse_ref, g_ref, dz_ref, *, vocab: int, bk: int, inv_temp: float,
               vocab_major: bool):  # fmt: skip
    bm, d = h_ref.shape
    bv = dz_ref.shape[1]
    z = _tile_logits(h_ref, w_ref, d // bk, bk, (bm, bv), slice(None), vocab_major) * inv_temp
    cols = jax.lax.broadcasted_iota(jnp.int32, (bm, bv), 1) + pl.program_id(1) * bv
    p = jnp.where(cols < vocab, jnp.exp(z - lse_ref[...][:, None]), 0.0)
    onehot = (cols == t_ref[...][:, None]).astype(jnp.float32)
    dz_ref[...] = ((g_ref[...] * inv_temp)[:, None] * (onehot - p)).astype(dz_ref.dtype)


def _on_platform(call):
    """``call(interpret)`` compiled by Triton on an NVIDIA GPU, run by the Pallas interpreter on any other platform
    (chosen when the program is lowered: `jax.lax.platform_dependent`)."""
    return jax.lax.platform_dependent(cuda=lambda: call(False), default=lambda: call(True))


def _forward(h_ND, t_N, w_c, inv_temp: float, vocab: int, vocab_major: bool, blocks: Blocks):
    """``(lse, target logit, entropy)`` ``[N]`` float32 of rows already padded to ``bm`` and a head padded to ``bv``."""
    n, d = h_ND.shape
    bm, bv, bk = blocks.bm, blocks.bv, blocks.bk
    kernel = functools.partial(_fwd_kernel, vocab=vocab, bv=bv, bk=bk, inv_temp=inv_temp, vocab_major=vocab_major)
    row = pl.BlockSpec((bm,), lambda i: (i,))

    def call(interpret: bool):
        return pl.pallas_call(
            kernel,
            out_shape=[jax.ShapeDtypeStruct((n,), jnp.float32)] * 3,
            grid=(n // bm,),
            in_specs=[pl.BlockSpec((bm, d), lambda i: (i, 0)), pl.BlockSpec(w_c.shape, lambda i: (0, 0)), row],
            out_specs=[row, row, row],
            compiler_params=plgpu.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages),
            interpret=interpret,
            name="fused_logprobs_fwd",
        )(h_ND, w_c, t_N)

    return _on_platform(call)


def _dz(h_ND, t_N, w_c, lse_N, g_N, inv_temp: float, vocab: int, vocab_major: bool, blocks: Blocks):
    """``dz`` ``[N, V_pad]`` in ``h``'s dtype (module docstring) of rows padded to ``bm``, a head padded to ``bv``."""
    n, d = h_ND.shape
    bm, bv, bk = blocks.bm, blocks.bv, blocks.bk
    v_pad = w_c.shape[0 if vocab_major else 1]
    kernel = functools.partial(_dz_kernel, vocab=vocab, bk=bk, inv_temp=inv_temp, vocab_major=vocab_major)
    row = pl.BlockSpec((bm,), lambda i, j: (i,))
    w_spec = pl.BlockSpec((bv, d), lambda i, j: (j, 0)) if vocab_major else pl.BlockSpec((d, bv), lambda i, j: (0, j))

    def call(interpret: bool):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((n, v_pad), h_ND.dtype),
            grid=(n // bm, v_pad // bv),
            in_specs=[pl.BlockSpec((bm, d), lambda i, j: (i, 0)), w_spec, row, row, row],
            out_specs=pl.BlockSpec((bm, bv), lambda i, j: (i, j)),
            compiler_params=plgpu.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages),
            interpret=interpret,
            name="fused_logprobs_dz",
        )(h_ND, w_c, t_N, lse_N, g_N)

    return _on_platform(call)


class _Static(NamedTuple):
    inv_temp: float
    vocab_major: bool
    blocks: Blocks
    vocab: int
    hidden: int
    w_dtype: str  # the head's master dtype: its gradient's


def _pad_head(w: jax.Array, static: _Static) -> jax.Array:
    """``w`` in the compute dtype, padded with zero columns to a multiple of ``bv`` and zero rows of ``D`` to ``bk``
    (a copy only when the sizes do not divide)."""
    b = static.blocks
    v_axis = 0 if static.vocab_major else 1
    pads = [(0, 0), (0, 0)]
    pads[v_axis] = (0, -w.shape[v_axis] % b.bv)
    pads[1 - v_axis] = (0, -w.shape[1 - v_axis] % b.bk)
    return jnp.pad(w, pads) if any(p[1] for p in pads) else w


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused(h_ND: jax.Array, t_N: jax.Array, w: jax.Array, static: _Static) -> tuple[jax.Array, jax.Array]:
    return _fused_fwd(h_ND, t_N, w, static)[0]


def _fused_fwd(h_ND, t_N, w, static):
    w_c = _pad_head(w.astype(h_ND.dtype), static)
    lse, zt, ent = _forward(h_ND, t_N, w_c, static.inv_temp, static.vocab, static.vocab_major, static.blocks)
    return (zt - lse, ent), (h_ND, t_N, w_c, lse)


def _fused_bwd(static, res, cotangents):
    h_ND, t_N, w_c, lse = res
    vocab_major, b = static.vocab_major, static.blocks
    n, d = h_ND.shape
    v_pad = w_c.shape[0 if vocab_major else 1]
    rows = min(b.rows_per_chunk or max(b.bm, _DZ_CHUNK_ELEMENTS // v_pad // b.bm * b.bm), n)
    chunks = -(-n // rows)
    pad = chunks * rows - n
    split = lambda x: jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1)).reshape(chunks, rows, *x.shape[1:])  # noqa: E731
    g_N = cotangents[0].astype(jnp.float32)  # padded rows: g = 0, so dz = 0

    def chunk(dw, xs):
        h, t, lse_r, g = xs
        dz = _dz(h, t, w_c, lse_r, g, static.inv_temp, static.vocab, vocab_major, b)
        if vocab_major:  # w [V, D]: dh = dz W, dW = dzᵀ h
            dh = jnp.einsum("nv,vd->nd", dz, w_c, preferred_element_type=jnp.float32)
            dw = dw + jnp.einsum("nv,nd->vd", dz, h, preferred_element_type=jnp.float32)
        else:  # w [D, V]: dh = dz Wᵀ, dW = hᵀ dz
            dh = jnp.einsum("nv,dv->nd", dz, w_c, preferred_element_type=jnp.float32)
            dw = dw + jnp.einsum("nd,nv->dv", h, dz, preferred_element_type=jnp.float32)
        return dw, dh.astype(h_ND.dtype)

    dw, dh = jax.lax.scan(chunk, jnp.zeros(w_c.shape, jnp.float32), tuple(map(split, (h_ND, t_N, lse, g_N))))
    dh = dh.reshape(chunks * rows, d)[:n]
    v, hd = static.vocab, static.hidden
    dw = dw[:v, :hd] if vocab_major else dw[:hd, :v]
    return dh, None, dw.astype(static.w_dtype)


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_logprobs(h_ND: jax.Array, targets_N: jax.Array, w: jax.Array, *, temperature: float = 1.0,
                   vocab_major: bool = True, blocks: Blocks | None = None) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    """Log-probs and entropies ``([N], [N])`` float32 of ``targets_N`` under ``softmax(h W / temperature)``.

    ``h_ND``: the final-normed hidden states in the compute dtype; ``w``: the head as stored, ``[V, D]`` with
    ``vocab_major`` (a tied embedding) or ``[D, V]``, in any dtype (cast to ``h``'s inside; its gradient is in
    ``w``'s dtype). Differentiable in ``h`` and ``w`` (module docstring); the entropy carries no gradient.
    ``blocks``: the kernels' tiling (default: `DEFAULT_BLOCKS`, its ``bv``/``bk`` where they divide ``V``/``D``, else
    the largest of 128/64/32/16 that does; other sizes are padded)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if h_ND.ndim != 2 or targets_N.shape != h_ND.shape[:1] or w.ndim != 2:
        raise ValueError(f"need h [N, D], targets [N] and a 2-d head; got {h_ND.shape}, {targets_N.shape}, {w.shape}")
    vocab, hidden = w.shape if vocab_major else w.shape[::-1]
    if hidden != h_ND.shape[1]:
        raise ValueError(f"head {w.shape} (vocab_major={vocab_major}) does not match hidden size {h_ND.shape[1]}")
    if blocks is None:
        b = DEFAULT_BLOCKS
        blocks = b._replace(bv=_divisor(vocab, (b.bv, 128, 64, 32, 16)), bk=_divisor(hidden, (b.bk, 64, 32, 16)))
    static = _Static(1.0 / float(temperature), vocab_major, blocks, vocab, hidden, jnp.dtype(w.dtype).name)
    n = h_ND.shape[0]
    pad, pad_d = -n % blocks.bm, -hidden % blocks.bk
    h = jnp.pad(h_ND, ((0, pad), (0, pad_d))) if pad or pad_d else h_ND  # zero hidden units add nothing to z
    t = (jnp.pad(targets_N, (0, pad)) if pad else targets_N).astype(jnp.int32)
    logp, ent = _fused(h, t, w, static)
    return logp[:n], jax.lax.stop_gradient(ent[:n])
