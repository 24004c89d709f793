# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The multi-turn engine's device side: per-row linear KV caches, so a row can leave the decode batch while its tools
run and come back with its cache.

Layout: ``S`` groups of ``G`` rows, ``B = S * G`` rows group-major (row ``b`` reads group ``b // G``'s prefix). Each
group's shared prompt prefix is prefilled once into the prefix cache (per layer ``k [S, K, Tp, H]``,
``v [S, K, H, Tp]``, `prefill_prefix`). Every row owns a LINEAR cache of ``W`` slots (per layer ``k [B, K, W, H]``,
``v [B, K, H, W]``) and a token buffer ``seq [B, W]``: everything the row reads after its group's prefix (the rest
of its own prompt, its policy turns, the template and tool tokens between them), in order. Slot ``j`` of the cache
holds the key/value of ``seq[j]`` at RoPE position ``base + j`` (``base``: the prefix length), written by the row
itself at its own position (``pos``, tokens fed so far), so a paused row's keys are never overwritten.

A decode step (`decode_block` runs ``k`` of them, state and caches donated), for each ACTIVE row: feed ``seq[pos]``
at slot ``pos``; if that was the last known token (``pos + 1 == known``) sample the next one (appended to ``seq``
with its log-prob; the turn ends on an EOS id or at the turn's token limit, and the row leaves the batch:
``active = False``); else the next token is already known and nothing is sampled (prefill by forcing). An inactive
row's step writes nothing (its slot index is past the cache: the write is dropped) and changes none of its state.
The host appends the tool messages' template tokens to ``seq`` and re-activates the row (`resume`): the next steps
feed the turn's last sampled token and the appended ones, one a step, and the step that feeds the last of them
samples the next turn's first token. Forcing reuses the one decode program (no extend program per delta length, no
recompile per turn) and runs the same math as decode, in the batch that is decoding anyway; its cost is one batched
step per appended token (counted: ``forced_steps``).

Randomness: row ``b`` (trajectory ``p * G + g``) draws its ``n``-th sampled token with
``fold_in(fold_in(key, b), n)``, whatever the turn, the timing of the tools or the other rows. The recorded log-probs
are of the sampling distribution (`jaxgrpo.token_sampling`: temperature, then top-k, then top-p, renormalised).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import models
from jaxgrpo.models.attention import DENSE, Kernel, KVCache
from jaxgrpo.models.decode import DecodeWeights, decode_step
from jaxgrpo.token_sampling import sample_from_logits


@dataclasses.dataclass(frozen=True)
class TurnSpec:
    """Static shapes and sampling switches of one multi-turn engine (hashable: programs compile once per spec)."""

    groups: int  # S
    group_size: int  # G
    width: int  # W, per-row cache and token-buffer slots (`engine.cache_slots`: a multiple of 128)
    prompt_width: int  # Tp, prefix cache slots
    block: int  # decode steps per block
    greedy: bool
    top_k: int
    use_top_p: bool
    eos_token_ids: tuple[int, ...]
    attention: Kernel = DENSE  # the prefix prefill's attention kernel (the run's `perf.attention`, resolved)

    @property
    def rows(self) -> int:
        return self.groups * self.group_size


@flax.struct.dataclass
class TurnState:
    """Per-row state, ``B`` rows. ``seq``/``logprobs [B, W]``: the row's tokens after its prefix and the sampler
    log-probs of the sampled ones; ``pos``: tokens fed (cache slots written); ``known``: tokens in ``seq``;
    ``active``: in the decode batch; ``turn_len``: tokens sampled this turn; ``limit``: the turn's token limit;
    ``sampled``: tokens sampled so far (the key index); ``base``: RoPE position of ``seq[0]``; ``row_key``;
    ``active_steps``/``forced_steps``: row-steps run on active rows, and of them those that fed a known token."""

    seq: jax.Array
    logprobs: jax.Array
    pos: jax.Array
    known: jax.Array
    active: jax.Array
    turn_len: jax.Array
    limit: jax.Array
    sampled: jax.Array
    base: jax.Array
    row_key: jax.Array
    active_steps: jax.Array
    forced_steps: jax.Array


@flax.struct.dataclass
class TurnCaches:
    """The prefix cache (per layer, S groups), its mask ``[S, Tp]`` and the rows' linear caches (per layer, B rows)."""

    prefix: list[KVCache]
    prefix_mask: jax.Array
    rows: list[KVCache]


def init_state(spec: TurnSpec, key: jax.Array, seq: np.ndarray, known: np.ndarray, base: np.ndarray,
               limit: np.ndarray, active: np.ndarray, row_offset: int = 0) -> TurnState:  # fmt: skip
    """The rows' first state: ``seq [B, W]`` each row's first known tokens (``known`` of them), ``base`` its prefix
    length, ``limit`` its first turn's token limit, ``active`` whether it decodes at all. Row ``b`` draws with the
    keys of row ``row_offset + b`` (a share of a rollout split over hosts draws what the whole would)."""
    B = spec.rows
    ids = jnp.arange(row_offset, row_offset + B, dtype=jnp.uint32)
    row_key = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)
    i32 = lambda x: jnp.array(x, jnp.int32)  # noqa: E731  (a copy: the host keeps writing its own buffers)
    return TurnState(i32(seq), jnp.zeros(seq.shape, jnp.float32), jnp.zeros(B, jnp.int32), i32(known),
                     jnp.asarray(active, bool), jnp.zeros(B, jnp.int32), i32(limit), jnp.zeros(B, jnp.int32),
                     i32(base), row_key, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))  # fmt: skip


@functools.partial(jax.jit, static_argnames=("config", "spec"))
def prefill_prefix(config: models.ModelConfig, spec: TurnSpec, params: Any, prefix_SxT: jax.Array,
                   mask_SxT: jax.Array, real_SxT: jax.Array) -> TurnCaches:  # fmt: skip
    """The caches of a run: each group's prefix (left-padded ``[S, Tp]``; ``mask_SxT`` the tokens encoded, at least
    one; ``real_SxT`` those attended: an empty prefix encodes one dummy token that no row attends), encoded with
    ``spec.attention``, and zero row caches."""
    _, kv = models.prefill(config, params, prefix_SxT, mask_SxT, attention_kernel=spec.attention)
    dt = jnp.dtype(config.dtype)
    prefix = [KVCache(kv.k[i].astype(dt), kv.v[i].astype(dt)) for i in range(config.num_layers)]
    B, K, W, H = spec.rows, config.num_kv_heads, spec.width, config.head_dim
    rows = [KVCache(jnp.zeros((B, K, W, H), dt), jnp.zeros((B, K, H, W), dt)) for _ in range(config.num_layers)]
    return TurnCaches(prefix, real_SxT.astype(bool), rows)


def _step(config: models.ModelConfig, spec: TurnSpec, weights: DecodeWeights, caches: TurnCaches, st: TurnState,
          temperature: jax.Array, top_p: jax.Array) -> tuple[TurnCaches, TurnState]:  # fmt: skip
    """One token step of every row (inactive rows write nothing and keep their state)."""
    B, W = spec.rows, spec.width
    rows = jnp.arange(B)
    active = st.active
    fed = st.seq[rows, jnp.minimum(st.pos, W - 1)]
    slot = jnp.where(active, st.pos, W)  # past the cache: an inactive row's write is dropped
    mask_BW = jnp.arange(W, dtype=jnp.int32)[None, :] <= st.pos[:, None]
    hidden, cache = decode_step(config, weights, fed, st.base + st.pos, caches.prefix, caches.prefix_mask,
                                caches.rows, slot, mask_BW)  # fmt: skip
    keys = jax.vmap(jax.random.fold_in)(st.row_key, st.sampled.astype(jnp.uint32))
    logits = jnp.einsum("bd,dv->bv", hidden, weights["lm_head"], preferred_element_type=jnp.float32)
    tok, logp = sample_from_logits(keys, logits, temperature, greedy=spec.greedy, top_k=spec.top_k,
                                   top_p=top_p if spec.use_top_p else None)  # fmt: skip
    pos = st.pos + active.astype(jnp.int32)
    draw = active & (pos == st.known)  # fed the last known token: sample the next one
    col = jnp.where(draw, st.known, W)
    eos = jnp.isin(tok, jnp.asarray(spec.eos_token_ids, jnp.int32)) if spec.eos_token_ids else jnp.zeros(B, bool)
    turn_len = st.turn_len + draw.astype(jnp.int32)
    known = st.known + draw.astype(jnp.int32)
    stop = draw & (eos | (turn_len >= st.limit) | (known >= W))
    st = st.replace(seq=st.seq.at[rows, col].set(tok, mode="drop"),
                    logprobs=st.logprobs.at[rows, col].set(logp, mode="drop"), pos=pos, known=known,
                    active=active & ~stop, turn_len=turn_len, sampled=st.sampled + draw.astype(jnp.int32),
                    active_steps=st.active_steps + jnp.sum(active, dtype=jnp.int32),
                    forced_steps=st.forced_steps + jnp.sum(active & ~draw, dtype=jnp.int32))  # fmt: skip
    return TurnCaches(caches.prefix, caches.prefix_mask, cache), st


@functools.partial(jax.jit, static_argnames=("config", "spec"), donate_argnames=("caches", "state"))
def decode_block(config: models.ModelConfig, spec: TurnSpec, weights: DecodeWeights, caches: TurnCaches,
                 state: TurnState, temperature: jax.Array,
                 top_p: jax.Array) -> tuple[TurnCaches, TurnState]:  # fmt: skip
    """``spec.block`` token steps (a `lax.fori_loop`; caches and state donated, updated in place)."""

    def body(_, carry):
        return _step(config, spec, weights, *carry, temperature, top_p)

    return jax.lax.fori_loop(0, spec.block, body, (caches, state))


@functools.partial(jax.jit, donate_argnames=("state",))
def resume(state: TurnState, rows_B: jax.Array, seq_BxW: jax.Array, known_B: jax.Array,
           limit_B: jax.Array) -> TurnState:  # fmt: skip
    """Put the rows ``rows_B`` (bool) back in the batch with their token buffers ``seq_BxW`` (the old tokens and the
    appended ones, ``known_B`` in all) and their next turn's token limit ``limit_B``; other rows are unchanged."""
    on = rows_B.astype(bool)
    return state.replace(seq=jnp.where(on[:, None], seq_BxW, state.seq), known=jnp.where(on, known_B, state.known),
                         limit=jnp.where(on, limit_B, state.limit), turn_len=jnp.where(on, 0, state.turn_len),
                         active=state.active | on)  # fmt: skip
