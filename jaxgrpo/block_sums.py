# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The draw's per-block softmax sums over the logits in one read, as a Pallas TPU kernel.

The inverse-CDF draw over the vocabulary (`jaxgrpo.token_sampling`) needs, per row and per block of 128 tokens of
``z = logits / T``, the block's max ``m``, its mass ``s = sum exp(z - m)`` and first moment ``t = sum exp(z - m) z``.
XLA on TPU computes them from a ``[rows, blocks, 128]`` view of the logits, which its TPU layout (tiles of 8 x 128
over the last two dimensions) cannot take without a relayout: a copy of the float32 ``[rows, vocab]`` logits, and the
scaled logits written apart from the raw ones (about 1 GiB of the ~3.8 GiB a Qwen2.5-0.5B token step of 256 rows
moves on one v5p chip, docs/perf-log.md). This kernel reads the raw logits where the LM head wrote them, tile by
tile (``[rows_tile, 16,384]``: 128 blocks, one per 128 lanes, each a lane reduction), and writes the three
``[rows, blocks]`` arrays only: one read of the logits, no other write.

Tokens past ``vocab`` in the last tile are masked to ``-inf`` (an empty block: ``m = -inf``, ``s = t = 0``). The
combination of the blocks into the row's total (rescaling each to the row's max, online softmax: Milakov &
Gimelshein 2018) is the caller's, as for the XLA sums. ``interpret=True`` runs the kernel on any backend (tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = 128  # tokens per block: the draw's `_CDF_BLOCK`, one TPU lane row
TILE_BLOCKS = 128  # blocks per kernel tile: its outputs are one 128-lane row per row of the tile
ROW_TILE = 8  # rows per tile (one TPU sublane group)


def supported(rows: int, vocab: int) -> bool:
    """Whether `block_sums` takes ``[rows, vocab]`` logits: whole sublane groups of rows, at least one block."""
    return rows % ROW_TILE == 0 and vocab >= BLOCK


def _kernel(t_ref, x_ref, m_ref, s_ref, z_ref, *, vocab: int):
    tile = BLOCK * TILE_BLOCKS
    x = x_ref[...].astype(jnp.float32) / t_ref[0]
    col = pl.program_id(1) * tile + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
    x = jnp.where(col < vocab, x, -jnp.inf)
    lane = jax.lax.broadcasted_iota(jnp.int32, (x.shape[0], TILE_BLOCKS), 1)
    m_out = jnp.full(lane.shape, -jnp.inf, jnp.float32)
    s_out = jnp.zeros(lane.shape, jnp.float32)
    z_out = jnp.zeros(lane.shape, jnp.float32)
    for b in range(TILE_BLOCKS):  # one block per 128 lanes: lane reductions, each result put in lane b
        xb = x[:, b * BLOCK : (b + 1) * BLOCK]
        mb = jnp.max(xb, axis=1, keepdims=True)
        eb = jnp.where(xb > -jnp.inf, jnp.exp(xb - jnp.where(mb > -jnp.inf, mb, 0.0)), 0.0)
        sb = jnp.sum(eb, axis=1, keepdims=True)
        zb = jnp.sum(eb * jnp.where(eb > 0, xb, 0.0), axis=1, keepdims=True)
        here = lane == b
        m_out, s_out, z_out = jnp.where(here, mb, m_out), jnp.where(here, sb, s_out), jnp.where(here, zb, z_out)
    m_ref[...], s_ref[...], z_ref[...] = m_out, s_out, z_out


@functools.partial(jax.jit, static_argnames=("interpret",))
def block_sums(logits: jax.Array, temperature: jax.Array | float, interpret: bool = False
               ) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """Per row of ``logits [N, V]`` and per block of `BLOCK` tokens of ``z = logits / temperature``: the block's max
    ``m``, ``sum exp(z - m)`` and ``sum exp(z - m) z``, each ``[N, ceil(V / BLOCK)]`` float32 (a block with no token
    left: ``-inf``, 0, 0). ``N`` a multiple of `ROW_TILE` (`supported`)."""
    n, v = logits.shape
    if not supported(n, v):
        raise ValueError(f"block_sums takes rows in multiples of {ROW_TILE} and >= {BLOCK} tokens, got {n} x {v}")
    tile = BLOCK * TILE_BLOCKS
    tiles = -(-v // tile)
    t = jnp.asarray(temperature, jnp.float32).reshape(1)
    out = jax.ShapeDtypeStruct((n, tiles * TILE_BLOCKS), jnp.float32)
    spec_out = pl.BlockSpec((ROW_TILE, TILE_BLOCKS), lambda i, j: (i, j))
    m, s, z = pl.pallas_call(
        functools.partial(_kernel, vocab=v),
        grid=(n // ROW_TILE, tiles),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec((ROW_TILE, tile), lambda i, j: (i, j))],
        out_specs=(spec_out, spec_out, spec_out),
        out_shape=(out, out, out),
        interpret=interpret,
    )(t, logits)
    nb = -(-v // BLOCK)
    return m[:, :nb], s[:, :nb], z[:, :nb]
