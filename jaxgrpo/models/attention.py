# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Attention: the one part of a decoder layer that differs between the model's forwards.

Two kernels::

    attend                 softmax(q k^T / sqrt(H) + mask) v over one key set per row           (the reference)
    attend_shared_prefix   one softmax over [the keys of the row's prompt (shared by its G rows) ; the row's own keys]

and, for the train step on accelerators, the same through `jaxgrpo.models.chunked` (online softmax, any backend) or
`attend_fused` (cuDNN flash attention on a GPU), chosen by a `Kernel`.

and the attention functions built on them, each with `jaxgrpo.models.layers`' calling convention
``(q [B,T,K,R,H], k [B,T,K,H], v [B,T,K,H], ctx) -> (a [B,T,K,R,H], state, out)``:

    causal(mask)                        full sequences (`transformer.hidden_states`)
    cached(mask, start)                 a chunk against a KV cache it writes (`transformer.forward_with_cache`)
    per_prompt(prompt_mask, pack)       prompts, padded or packed end to end; out = their keys/values, kv-head-major
                                        (the sampler's prefill and the prompt rows of the prefix-shared train step)
    shared_prefix(prefix_mask, mask)    completion rows over their prompt's keys (from the prompt stream in the same
                                        layer) and their own (the prefix-shared train step, `prefix.py`)

Scores and softmax are float32; a masked score is a finite ``-1e30`` (exp underflows to exactly 0; no inf - inf =
NaN) and a query with no visible key gets output 0, not NaN. Keys and values of the shared-prefix kernel come
kv-head-major with the key axis of the values minor (``k [B, K, S, H]``, ``v [B, K, H, S]``, `kv_major`): each product
then contracts the minor axis of both operands, the form XLA:CPU's matmul reads in place, so caches stored this way
are never transposed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp

from jaxgrpo.models.chunked import attend_chunked, attend_shared_prefix_chunked
from jaxgrpo.models.layers import Attention, LayerContext

# Which kernel the training attention uses: "dense" materializes each row's [T, S] scores (fastest on XLA:CPU at the
# sizes jaxgrpo trains there); "chunked" never does (`jaxgrpo.models.chunked`: online softmax over key chunks, XLA on
# any backend); "cudnn" is cuDNN's fused flash attention through `jax.nn.dot_product_attention` (GPU, bfloat16 or
# float16 compute); "auto" = dense on CPU, cudnn on a GPU computing in 16 bits, chunked otherwise (resolved by
# `jaxgrpo.learner.perf.resolve_perf`).
AttentionKind = Literal["auto", "dense", "chunked", "cudnn"]
ATTENTION_KINDS: tuple[str, ...] = AttentionKind.__args__


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A resolved attention kernel: ``kind`` "dense", "chunked" or "cudnn"; ``chunk`` keys per chunk (chunked only);
    ``implementation`` the `jax.nn.dot_product_attention` implementation of kind "cudnn" ("xla" runs the same masks
    and layout through XLA on any backend: how its tests check them on CPU)."""

    kind: str = "dense"
    chunk: int = 512
    implementation: str = "cudnn"

    def __post_init__(self) -> None:
        if self.kind not in ("dense", "chunked", "cudnn") or self.chunk < 1 or self.implementation not in ("cudnn",
                                                                                                           "xla"):
            raise ValueError(f"attention kernel {self!r}: kind must be 'dense', 'chunked' or 'cudnn', chunk >= 1, "
                             "implementation 'cudnn' or 'xla'")


DENSE = Kernel()

_NEG = -1e30


class KVCache(NamedTuple):
    """Per-layer keys (after RoPE) and values, layers stacked on axis 0 (layout: see the function that makes it)."""

    k: jax.Array
    v: jax.Array


# --------------------------------------------------------------------------------------------------- kernels
def attend(q_BTKRH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, mask_BTS: jax.Array) -> jax.Array:
    """Masked softmax attention -> ``[B, T, K, R, H]`` (scores and softmax in float32)."""
    scale = q_BTKRH.shape[-1] ** -0.5
    s_BKRTS = jnp.einsum("btkrh,bskh->bkrts", q_BTKRH, k_BSKH, preferred_element_type=jnp.float32) * scale
    m_B11TS = mask_BTS[:, None, None, :, :]
    s_BKRTS = jnp.where(m_B11TS, s_BKRTS, _NEG)
    p_BKRTS = jax.nn.softmax(s_BKRTS, axis=-1)
    p_BKRTS = jnp.where(jnp.any(m_B11TS, axis=-1, keepdims=True), p_BKRTS, 0.0)  # fully masked row -> 0, not NaN
    return jnp.einsum("bkrts,bskh->btkrh", p_BKRTS.astype(v_BSKH.dtype), v_BSKH)


def attend_fused(q_BTKRH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, mask_BTS: jax.Array, *,
                 causal: bool, implementation: str = "cudnn") -> jax.Array:
    """`attend` through `jax.nn.dot_product_attention` (cuDNN's flash attention with ``implementation="cudnn"``):
    ``causal`` adds the mask ``key <= query`` (and lets cuDNN skip the blocks above the diagonal) to ``mask_BTS``.

    cuDNN takes the mask as an additive bias ``[B, 1, T, S]`` in the compute dtype (one score-sized array per row, not
    per head; no float32 scores) and gives a query with no visible key the mean of the values: those outputs are set
    to 0 here, as `attend` does. Query heads ``k * R + r`` read kv head ``k``, jax's grouped-query convention."""
    B, T, K, R, H = q_BTKRH.shape
    S = k_BSKH.shape[1]
    # cuDNN trains with a bias only at even lengths: pad queries and keys by one (masked) where odd
    pt, ps = T % 2, S % 2
    q, k, v = (jnp.pad(x, ((0, 0), (0, p), (0, 0), (0, 0))) for x, p in ((q_BTKRH.reshape(B, T, K * R, H), pt),
                                                                         (k_BSKH, ps), (v_BSKH, ps)))  # fmt: skip
    mask = jnp.pad(mask_BTS, ((0, 0), (0, pt), (0, ps)))
    a = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None], is_causal=causal, implementation=implementation)
    a = a[:, :T]
    if causal:  # only keys s <= t count (an iota comparison fused into the reduction: nothing [T, S] is stored)
        mask_BTS = mask_BTS & (jnp.arange(mask_BTS.shape[2])[None, None, :] <= jnp.arange(T)[None, :, None])
    visible = jnp.any(mask_BTS, axis=-1)
    return jnp.where(visible[:, :, None, None], a, 0).reshape(B, T, K, R, H)


def kv_major(k_BSKH: jax.Array, v_BSKH: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Keys ``[B, S, K, H]`` -> ``[B, K, S, H]`` and values ``[B, S, K, H]`` -> ``[B, K, H, S]``."""
    return k_BSKH.transpose(0, 2, 1, 3), v_BSKH.transpose(0, 2, 3, 1)


def attend_shared_prefix(
    q_BTKRH: jax.Array,
    kp_PKSH: jax.Array,
    vp_PKHS: jax.Array,
    prefix_mask_PS: jax.Array,
    ko_BKMH: jax.Array,
    vo_BKHM: jax.Array,
    mask_BTM: jax.Array,
) -> jax.Array:
    """Attention of ``q [B, T, K, R, H]`` (``B = P * G`` prompt-major rows) over the keys of its prompt ``b // G``
    (``[P, K, Tp, H]``, values ``[P, K, H, Tp]``, shared by the prompt's G rows, masked by ``prefix_mask [P, Tp]``)
    and its own keys and values (``[B, K, M, H]``, ``[B, K, H, M]``, masked by ``mask_BTM``), one softmax over both.

    Equals `attend` over the concatenated keys ``[prefix_p ; own_b]`` without repeating the prefix G times: the prefix
    scores of a prompt's rows are one ``[G * T * R, H] x [H, Tp]`` product per (prompt, kv head), and the softmax is
    taken part by part (``exp(s - m) / sum over both parts`` with ``m`` the joint max), so no concatenated score
    tensor exists."""
    B, T, K, R, H = q_BTKRH.shape
    P = prefix_mask_PS.shape[0]
    G = B // P
    M = ko_BKMH.shape[2]
    scale = H**-0.5
    # Every score tensor stays in one layout [P, K, G, T, R, keys]: none is transposed.
    q_PGTKRH = q_BTKRH.reshape(P, G, T, K, R, H)
    sp = jnp.einsum("pgtkrh,pksh->pkgtrs", q_PGTKRH, kp_PKSH, preferred_element_type=jnp.float32) * scale
    ko_PGKMH = ko_BKMH.reshape(P, G, K, M, H)
    so = jnp.einsum("pgtkrh,pgkmh->pkgtrm", q_PGTKRH, ko_PGKMH, preferred_element_type=jnp.float32) * scale
    mp = prefix_mask_PS.astype(bool)[:, None, None, None, None, :]  # [P, 1, 1, 1, 1, Tp]
    mo = mask_BTM.astype(bool).reshape(P, G, T, M)[:, None, :, :, None, :]  # [P, 1, G, T, 1, M]
    sp, so = jnp.where(mp, sp, _NEG), jnp.where(mo, so, _NEG)
    m = jax.lax.stop_gradient(jnp.maximum(jnp.max(sp, axis=-1, keepdims=True), jnp.max(so, axis=-1, keepdims=True)))
    ep, eo = jnp.exp(sp - m), jnp.exp(so - m)
    visible = jnp.any(mp, axis=-1, keepdims=True) | jnp.any(mo, axis=-1, keepdims=True)
    inv = jnp.where(visible, 1.0 / (jnp.sum(ep, axis=-1, keepdims=True) + jnp.sum(eo, axis=-1, keepdims=True)), 0.0)
    out = jnp.einsum("pkgtrs,pkhs->pgtkrh", (ep * inv).astype(vp_PKHS.dtype), vp_PKHS)
    out = out + jnp.einsum("pkgtrm,pgkhm->pgtkrh", (eo * inv).astype(vo_BKHM.dtype), vo_BKHM.reshape(P, G, K, H, M))
    return out.reshape(B, T, K, R, H)


def take_rows(x_SX: jax.Array, idx_SY: jax.Array) -> jax.Array:
    """``out[s, y] = x[s, idx[s, y]]`` for ``x [S, X, ...]`` and ``idx [S, Y]`` (a gather within each row)."""
    S, X = x_SX.shape[:2]
    flat = x_SX.reshape(S, X, -1)
    return jnp.take_along_axis(flat, idx_SY[..., None], axis=1).reshape(S, idx_SY.shape[1], *x_SX.shape[2:])


def causal_mask(mask_BT: jax.Array) -> jax.Array:
    """``[B, T, T]``: query t sees key s iff s <= t and s is a real token."""
    T = mask_BT.shape[1]
    return jnp.tril(jnp.ones((T, T), bool))[None] & mask_BT.astype(bool)[:, None, :]


def _write(cache: jax.Array, new: jax.Array, index: jax.Array, start: jax.Array, axis: int) -> jax.Array:
    """``cache[index]`` with ``new`` written at ``start`` along ``axis`` of the layer slice (in place when donated)."""
    idx = [jnp.zeros((), jnp.int32)] * cache.ndim
    idx[0], idx[axis + 1] = index, start
    return jax.lax.dynamic_update_slice(cache, new[None].astype(cache.dtype), tuple(idx))


def _layer(cache: jax.Array, index: jax.Array, dtype: Any) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(cache, index, 0, keepdims=False).astype(dtype)


# ------------------------------------------------------------------------------------------- attention functions
def _causal_attend(q, k, v, mask_BT: jax.Array, kernel: Kernel) -> jax.Array:
    """Causal attention of each row over its own real keys (``mask [B, T]``) with ``kernel``."""
    if kernel.kind == "dense":
        return attend(q, k, v, causal_mask(mask_BT))
    if kernel.kind == "cudnn":
        keys = jnp.broadcast_to(mask_BT.astype(bool)[:, None, :], (*mask_BT.shape, mask_BT.shape[1]))
        return attend_fused(q, k, v, keys, causal=True, implementation=kernel.implementation)
    pos = jnp.broadcast_to(jnp.arange(mask_BT.shape[1], dtype=jnp.int32), mask_BT.shape)
    return attend_chunked(q, k, v, mask_BT.astype(bool), pos, pos, kernel.chunk)


def causal(mask_BT: jax.Array, kernel: Kernel = DENSE) -> Attention:
    """Every row attends causally over its own real keys (``mask [B, T]``)."""
    return lambda q, k, v, ctx: (_causal_attend(q, k, v, mask_BT, kernel), ctx.state, None)


def cached(mask_BTS: jax.Array, start: jax.Array) -> Attention:
    """The chunk's keys/values are written into ``ctx.state`` (a `KVCache` ``[L, B, S, K, H]``) at slots
    ``[start, start + T)``; the chunk then attends over the layer's whole cache with ``mask [B, T, S]``."""

    def fn(q, k, v, ctx: LayerContext):
        ck, cv = _write(ctx.state.k, k, ctx.index, start, 1), _write(ctx.state.v, v, ctx.index, start, 1)
        a = attend(q, _layer(ck, ctx.index, q.dtype), _layer(cv, ctx.index, q.dtype), mask_BTS)
        return a, KVCache(ck, cv), None

    return fn


def per_prompt(
    prompt_mask_PT: jax.Array, pack: dict[str, jax.Array] | None = None, kernel: Kernel = DENSE
) -> Attention:
    """Causal attention within each prompt; ``out`` = the prompts' keys and values kv-head-major (``[P, K, Tp, H]``,
    ``[P, K, H, Tp]``), the prefix the prompt's completions read.

    ``pack`` None: the rows are the left-padded prompts ``[P, Tp]``. Otherwise the rows are ``J`` packed rows of
    width ``W`` (`jaxgrpo.padding.pack_layout`): queries, keys and values are gathered into the padded per-prompt
    layout for the attention (``slot_index``), the outputs gathered back (``token_slot``)."""
    P, Tp = prompt_mask_PT.shape

    def fn(q, k, v, ctx: LayerContext):
        if pack is None:
            return _causal_attend(q, k, v, prompt_mask_PT, kernel), ctx.state, kv_major(k, v)
        q_P, k_P, v_P = (take_rows(x, pack["slot_index"]).reshape(P, Tp, *x.shape[2:]) for x in (q, k, v))
        a_PTKRH = _causal_attend(q_P, k_P, v_P, prompt_mask_PT, kernel)
        a = take_rows(a_PTKRH.reshape(q.shape[0], -1, *a_PTKRH.shape[2:]), pack["token_slot"])
        return a, ctx.state, kv_major(k_P, v_P)

    return fn


def shared_prefix(prefix_mask_PS: jax.Array, mask_BT: jax.Array, kernel: Kernel = DENSE) -> Attention:
    """Completion rows (``B = P * G``) over the keys of their prompt, emitted in this layer by the stream before them
    (`per_prompt`'s ``out``), and causally over their own real keys (``mask [B, T]``)."""

    def fn(q, k, v, ctx: LayerContext):
        kp, vp = ctx.earlier[0]
        if kernel.kind == "dense":
            a = attend_shared_prefix(q, kp, vp, prefix_mask_PS, *kv_major(k, v), causal_mask(mask_BT))
        elif kernel.kind == "cudnn":
            a = _shared_prefix_fused(q, k, v, kp, vp, prefix_mask_PS, mask_BT, kernel.implementation)
        else:
            a = attend_shared_prefix_chunked(q, kp, vp, prefix_mask_PS, *kv_major(k, v), mask_BT, kernel.chunk)
        return a, ctx.state, None

    return fn


def _shared_prefix_fused(q, k, v, kp_PKSH, vp_PKHS, prefix_mask_PS, mask_BT, implementation: str) -> jax.Array:
    """`shared_prefix`'s attention through `attend_fused`: the prompt's keys/values are repeated for its G rows and put
    before the row's own (``[B, Tp + T, K, H]``: keys and values only, not scores), one mask over both parts."""
    B, T = mask_BT.shape
    P, Tp = prefix_mask_PS.shape
    kp = jnp.repeat(kp_PKSH.transpose(0, 2, 1, 3), B // P, axis=0).astype(k.dtype)  # [B, Tp, K, H]
    vp = jnp.repeat(vp_PKHS.transpose(0, 3, 1, 2), B // P, axis=0).astype(v.dtype)
    prefix = jnp.broadcast_to(jnp.repeat(prefix_mask_PS.astype(bool), B // P, axis=0)[:, None, :], (B, T, Tp))
    mask = jnp.concatenate([prefix, causal_mask(mask_BT)], axis=-1)
    return attend_fused(q, jnp.concatenate([kp, k], axis=1), jnp.concatenate([vp, v], axis=1), mask, causal=False,
                        implementation=implementation)
