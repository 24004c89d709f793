# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Rollout sampler: jitted prefill + decode over a preallocated KV cache, G samples per prompt, exact logprobs.

``generate(config, params, prompts, num_samples=G, max_new_tokens=M, ...)`` turns a ragged list of prompts
(token-id lists) into ``Completions`` of shape ``[len(prompts) * G, M]`` in prompt-major order (rows
``p*G .. p*G+G-1`` belong to prompt ``p``).

Without ``record_projections``, ``generate`` is a thin call of the rollout engine in static mode
(`jaxgrpo.rollout.driver.run` with one group slot per prompt: `jaxgrpo.rollout.engine`'s jitted prefill and donated
k-step decode blocks, per-layer caches, the stop test once per block; with a mesh the slots and their rows split over
its batch axes, and on several processes every process gets the whole result); same keys, same tokens, same log-probs
as the path below (tests/test_engine.py checks it against a golden file of that path). With ``record_projections``
the path below runs.

How it runs (with ``record_projections``)
---------------------------------------------------
1. Host side (`jaxgrpo.padding`): each prompt is left-padded to a static width ``Tp`` (`padding.prompt_bucket`: four
   buckets per octave, so at most 25% padding and O(log length) buckets -- or the smallest of the caller's
   ``prompt_buckets`` that fits) and the number of prompts ``P`` is padded to a power of two (and to a multiple of
   the mesh's data-parallel size ``J``); pad rows are dropped from the result. So the two jitted functions below
   compile once per (``Tp``, packed width ``W``, ``P``, G, M, sampling mode) bucket, not once per call.
2. ``_prefill`` (jit): one forward over the prompts packed end to end, ``P / J`` per row of width ``W``
   (`models.prefill`: the token-wise matmuls run on real tokens only, attention per prompt) writes the shared prefix
   cache -- one copy per prompt, never G -- and gives each prompt's last hidden state, whose logits are broadcast to
   its G samples to sample the first token. The rows' own decode cache is allocated empty.
3. ``_decode`` (jit, cache and loop buffers donated): a ``lax.while_loop`` that feeds the previous token at decode
   slot ``i - 1`` (RoPE position ``len(prompt) + i - 1``) through `models.forward_with_prefix_cache` (each row
   attends to its prompt's shared prefix slots and its own decode slots, one softmax over both), samples token
   ``i``, and stops as soon as every row has emitted one of ``eos_token_ids`` or ``M`` tokens exist. ``mask`` is
   True up to and including the EOS token; later tokens are 0 and their logprobs 0.

Sampling distribution: `jaxgrpo.token_sampling` (temperature, top-k, top-p, inversion sampling; the reported
log-prob is under the distribution actually sampled from: the tempered logits restricted to the top-k / top-p set and
renormalised, as the trainer's old-policy log-prob; a learner log-prob of the full softmax against it leaks
``log(kept mass)`` into the importance ratio whenever top_p < 1 or top_k > 0, see `jaxgrpo.rollout.record`).
The entropy of that same distribution at every sampled position (after temperature, top-k and top-p) comes out
of the decode loop too (``Completions.entropy``), from the probabilities the draw computes anyway: no extra forward.

Randomness: row ``r`` (= ``p*G + g``) at step ``i`` uses ``fold_in(fold_in(key, r), i)``, so a row's samples
depend only on the key, its row index and the step -- not on the batch padding, the bucket or the sharding. The
same key gives the same samples; a sharded run gives the same tokens as an unsharded one.

Sharding: with ``mesh`` given, prompts, cache and outputs are sharded over the mesh's batch axes
(``jaxgrpo.sharding.BATCH_AXES``, as the training batch; the cache's other axes are left to the partitioner);
``params`` are used as given (shard them with ``jaxgrpo.sharding.shard_params``). Host inputs are built with
``jax.make_array_from_callback`` from the (identical on every host) prompt list, so the same code runs multi-host;
the outputs are then global arrays.

Cost notes: the decode cache is preallocated once, donated to ``_decode`` and returned from it, so the while loop
updates it in place (the compiled loop aliases input and output; no per-step cache copy); the prompt's keys and
values are stored and read once per group (`models.forward_with_prefix_cache`: the G rows' prefix scores are one
matrix product per prompt and kv head); the prefill skips the prompt padding; the LM head is one einsum accumulating
in float32 on one position per row; with top-k and top-p off nothing is sorted (one exp over the vocabulary, two
short cumulative sums and one uniform draw per row); top-k uses ``lax.top_k`` and top-p alone a 256-candidate
``lax.top_k`` with the exact sort only as a fallback.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgrpo import models, padding
from jaxgrpo.rollout import driver, engine
from jaxgrpo.rollout.params import SamplingParams
from jaxgrpo.rollout.record import Completions
from jaxgrpo.token_sampling import sample_from_logits, truncated_logits

__all__ = [
    "Completions",
    "generate",
    "sample_from_logits",
    "truncated_logits",
]



# ----------------------------------------------------------------------------------------------------------------------
# Validation (host side)


def _validate(config: Any, prompts: Any, sp: SamplingParams, prompt_buckets: Sequence[int] | None) -> None:
    """The prompts, EOS ids and buckets against the model (the sampling values were checked by `SamplingParams`)."""
    if prompt_buckets is not None and (len(prompt_buckets) == 0 or min(prompt_buckets) < 1):
        raise ValueError(f"prompt_buckets must be positive lengths (got {prompt_buckets!r})")
    sp.check(config.vocab_size, config.max_position_embeddings, prompts)


# ----------------------------------------------------------------------------------------------------------------------
# Jitted prefill / decode


@dataclasses.dataclass(frozen=True)
class _Mode:
    """Static per-compile settings (hashable)."""

    num_samples: int
    max_new_tokens: int
    greedy: bool
    top_k: int
    use_top_p: bool
    eos_token_ids: tuple[int, ...]
    batch_sharding: NamedSharding | None  # for [N, ...] arrays (batch on axis 0)
    cache_sharding: NamedSharding | None  # for [L, N, ...] cache leaves (batch on axis 1)
    record_projections: bool = False


def _constrain(x: jax.Array, sharding: NamedSharding | None) -> jax.Array:
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


def _logits(config: Any, params: Any, hidden_BxD: jax.Array) -> jax.Array:
    """The LM head as one einsum, accumulated in float32."""
    return jnp.einsum("bd,dv->bv", hidden_BxD, models.lm_head(config, params), preferred_element_type=jnp.float32)


def _step_keys(row_keys: jax.Array, step: jax.Array) -> jax.Array:
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, step)


def _sample(mode: _Mode, keys: jax.Array, logits: jax.Array, temperature: jax.Array, top_p: jax.Array):
    return sample_from_logits(
        keys, logits, temperature, greedy=mode.greedy, top_k=mode.top_k, top_p=top_p if mode.use_top_p else None,
        return_entropy=True,
    )


def _is_eos(mode: _Mode, tokens: jax.Array) -> jax.Array:
    if not mode.eos_token_ids:
        return jnp.zeros(tokens.shape, bool)
    return jnp.isin(tokens, jnp.asarray(mode.eos_token_ids, jnp.int32))


_ROW0 = np.uint32(0)  # `_prefill`'s row_offset for a whole batch (as `generate` passes it: lowerings must match)


@functools.partial(jax.jit, static_argnames=("config", "mode", "packing"))
def _prefill(config, mode: _Mode, packing, params, prompt_PxT, mask_PxT, row_active_N, key, temperature, top_p,
             row_offset):
    """Prefill the P prompts once (packed end to end, ``packing = (W, J)``: rows of width W, one per batch shard;
    `models.prefill`) into the shared prefix cache, sample every row's first token from its prompt's last logits,
    and allocate the rows' decode cache. Row i's key is ``fold_in(key, row_offset + i)``."""
    num_prompts = mask_PxT.shape[0]
    g, m = mode.num_samples, mode.max_new_tokens
    n = num_prompts * g
    last_PxD, prefix = models.prefill(config, params, prompt_PxT, mask_PxT, packed_width=packing[0],
                                      pack_rows=packing[1])  # fmt: skip
    prefix = jax.tree.map(lambda c: _constrain(c, mode.cache_sharding), prefix)
    logits_PxV = _logits(config, params, last_PxD)
    logits_NxV = _constrain(jnp.repeat(logits_PxV, g, axis=0), mode.batch_sharding)
    # decode slot j holds generated token j; token M-1 is never fed back, so M-1 slots suffice
    cache = models.init_decode_cache(config, n, max(m - 1, 1))
    cache = jax.tree.map(lambda c: _constrain(c, mode.cache_sharding), cache)
    row_ids = row_offset + jnp.arange(n, dtype=jnp.uint32)
    row_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, row_ids)
    tok, logp, ent = _sample(mode, _step_keys(row_keys, jnp.uint32(0)), logits_NxV, temperature, top_p)
    active = row_active_N
    tokens_NxM = jnp.zeros((n, m), jnp.int32).at[:, 0].set(jnp.where(active, tok, 0))
    logprobs_NxM = jnp.zeros((n, m), jnp.float32).at[:, 0].set(jnp.where(active, logp, 0.0))
    entropy_NxM = jnp.zeros((n, m), jnp.float32).at[:, 0].set(jnp.where(active, ent, 0.0))
    mask_NxM = jnp.zeros((n, m), bool).at[:, 0].set(active)
    done = ~active | _is_eos(mode, tok)
    lengths = jnp.repeat(jnp.sum(mask_PxT, axis=-1, dtype=jnp.int32), g)
    state = dict(
        tokens=tokens_NxM, logprobs=logprobs_NxM, mask=mask_NxM, done=done, last=tok, eos=active & _is_eos(mode, tok),
        entropy=entropy_NxM,
    )
    if mode.record_projections:  # [L, N, M-1, out] per projection, written one decode step at a time
        widths = models.projection_widths(config)
        dt = jnp.dtype(config.dtype)
        state["projections"] = {k: jnp.zeros((config.num_layers, n, max(m - 1, 1), w), dt) for k, w in widths.items()}
    consts = dict(prefix=prefix, prefix_mask=mask_PxT, lengths=lengths, row_keys=row_keys)
    return cache, state, consts


@functools.partial(jax.jit, static_argnames=("config", "mode"), donate_argnames=("cache", "state"))
def _decode(config, mode: _Mode, params, cache, state, consts, temperature, top_p):
    """Decode steps 1..M-1 in a while loop; stops early once every row is done. Returns (cache, final state).

    The cache is returned (and dropped by the caller) so that its donated input buffer is aliased to the output and
    the loop updates it in place instead of copying it into a fresh loop buffer.
    """
    m = mode.max_new_tokens
    # every decode slot is a real token once written (causal by slot); cache k is [L, N, K, M, H]
    kv_mask = jnp.ones((cache.k.shape[1], cache.k.shape[3]), bool)

    def cond(carry):
        i, _, st = carry
        return (i < m) & ~jnp.all(st["done"])

    def body(carry):
        i, cache, st = carry
        positions = (consts["lengths"] + i - 1)[:, None]
        prefix, prefix_mask = consts["prefix"], consts["prefix_mask"]
        out = models.forward_with_prefix_cache(
            config, params, st["last"][:, None], positions, prefix, prefix_mask, cache, i - 1, kv_mask,
            record=mode.record_projections,
        )  # fmt: skip
        hidden, cache = out[:2]
        record = st.get("projections")
        logits = _constrain(_logits(config, params, hidden[:, 0]), mode.batch_sharding)
        tok, logp, ent = _sample(mode, _step_keys(consts["row_keys"], i.astype(jnp.uint32)), logits, temperature,
                                 top_p)
        active = ~st["done"]
        eos = active & _is_eos(mode, tok)
        st = dict(
            tokens=jax.lax.dynamic_update_index_in_dim(st["tokens"], jnp.where(active, tok, 0), i, axis=1),
            logprobs=jax.lax.dynamic_update_index_in_dim(st["logprobs"], jnp.where(active, logp, 0.0), i, axis=1),
            mask=jax.lax.dynamic_update_index_in_dim(st["mask"], active, i, axis=1),
            done=st["done"] | eos,
            last=tok,
            eos=st["eos"] | eos,
            entropy=jax.lax.dynamic_update_index_in_dim(st["entropy"], jnp.where(active, ent, 0.0), i, axis=1),
        )
        if mode.record_projections:  # this step's outputs [L, N, 1, out] go to decode slot i - 1
            zero = jnp.zeros((), jnp.int32)
            at = (zero, zero, i - 1, zero)
            st["projections"] = {k: jax.lax.dynamic_update_slice(buf, out[2][k].astype(buf.dtype), at)
                                 for k, buf in record.items()}  # fmt: skip
        return i + 1, cache, st

    _, cache, state = jax.lax.while_loop(cond, body, (jnp.int32(1), cache, state))
    return cache, state


# ----------------------------------------------------------------------------------------------------------------------
# Public entry point


def sampler_mode(config: models.ModelConfig, mesh: Mesh | None, num_samples: int, max_new_tokens: int,
                 temperature: float, top_p: float, top_k: int, eos_token_ids: Sequence[int],
                 record_projections: bool = False) -> tuple[_Mode, int]:  # fmt: skip
    """The static mode `generate` compiles its mesh path with (the rows split over the mesh's batch axes, the cache
    leaves ``[L, B, ...]`` split like them on axis 1, the other axes left to the partitioner; the sampling switches),
    and its number of batch shards. `jaxgrpo.aot` and `jaxgrpo.precompile` lower the same programs from it."""
    batch_sharding, cache_sharding = engine.row_sharding(mesh), None  # the engine's split of the rows
    if batch_sharding is not None:
        rows = batch_sharding.spec[0]
        cache_sharding = NamedSharding(mesh, PartitionSpec(None, rows, *([PartitionSpec.UNCONSTRAINED] * 3)))
    greedy = temperature == 0.0
    use_top_k, use_top_p = engine.truncation(config, greedy, top_k, top_p)
    mode = _Mode(int(num_samples), int(max_new_tokens), greedy, use_top_k, use_top_p,
                 tuple(int(e) for e in eos_token_ids), batch_sharding, cache_sharding, bool(record_projections))
    return mode, engine.row_shards(mesh)


def _put(x: np.ndarray, sharding: NamedSharding | None) -> jax.Array:
    if sharding is None:
        return jnp.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def generate(
    config: models.ModelConfig,
    params: Any,
    prompts: Sequence[Sequence[int]],
    *,
    num_samples: int = 1,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_ids: Sequence[int] = (),
    key: jax.Array,
    mesh: Mesh | None = None,
    prompt_buckets: Sequence[int] | None = None,
    record_projections: bool = False,
    packed_ladder: tuple[int, int] | None = None,
    row_offset: int = 0,
) -> Completions:
    """Sample ``num_samples`` completions of up to ``max_new_tokens`` tokens for each prompt.

    Args:
      config: the model's ``ModelConfig``.  params: its parameter pytree (sharded by the caller when ``mesh``).
      prompts: ragged list of token-id lists (each non-empty).  num_samples: G completions per prompt.
      max_new_tokens: M, the output width.  temperature: > 0 samples, 0 is greedy.  top_p: nucleus mass in (0, 1]
      (1 = off).  top_k: keep the k most likely tokens (0 = off).  eos_token_ids: ids that end a completion.
      key: a PRNG key.  mesh: optional mesh; the rollout batch is split over its ``BATCH_AXES``.
      prompt_buckets: optional static prompt lengths; default 16, 20, 24, 28, 32, 40, ... (see
      ``jaxgrpo.padding.prompt_bucket``).
      record_projections: also return every dense projection's output at each decode step (``Completions.
      projections``, ``L * N * (M-1) * (4D + 2F + 2KH)`` values in the model dtype), so that a train step on this
      rollout with the same parameters can skip those products (`train_step.Batch.projections`). No mesh.
      packed_ladder: the caller's run's ``(floor, cap)`` (`jaxgrpo.perf.shape_ladders`): the packed width climbs
      `padding.ladder_bucket` from ``floor`` to ``cap`` (one program for nearly every step of a run), not 4 buckets
      per octave.
      row_offset: the rows' place in a larger batch: row i samples with the key of row ``row_offset + i`` (a share
      of a batch sampled on several hosts draws what the whole batch's rows would). Mesh path only.

    Returns:
      ``Completions`` with ``[len(prompts) * num_samples, M]`` arrays in prompt-major order (see the class).

    Raises:
      ValueError: on an empty prompt list or prompt, out-of-vocabulary ids, a prompt + ``max_new_tokens`` beyond
      ``config.max_position_embeddings``, ``top_p`` outside (0, 1], a negative temperature, ``num_samples < 1``,
      ``top_k < 0`` or ``max_new_tokens < 1``.
    """
    if isinstance(prompts, np.ndarray) and prompts.ndim == 2:  # a rectangular batch of prompts is fine too
        prompts = [list(row) for row in prompts]
    temperature, top_p = float(temperature), float(top_p)
    eos_token_ids = (
        tuple(int(e) for e in eos_token_ids)
        if not isinstance(eos_token_ids, (int, np.integer))
        else (int(eos_token_ids),)
    )
    sp = SamplingParams(max_new_tokens, num_samples, temperature, top_p, top_k, eos_token_ids)
    _validate(config, prompts, sp, prompt_buckets)
    g, m = int(num_samples), int(max_new_tokens)
    num_prompts = len(prompts)
    if row_offset < 0 or row_offset % g:
        raise ValueError(f"row_offset ({row_offset}) must be a non-negative multiple of num_samples ({g}): the first "
                         "row of a whole prompt's group")  # fmt: skip
    if not record_projections:  # the engine, static mode: one slot per prompt (padded to 2^n and to the mesh)
        groups, _ = driver.run(config, params, prompts, sp, key, prompt_buckets=prompt_buckets,
                               packed_ladder=packed_ladder, mesh=mesh, prompt_offset=row_offset // g)
        return jax.tree.map(jnp.asarray, driver.completions(groups, range(num_prompts)))
    if row_offset:
        raise ValueError("row_offset does not apply with record_projections=True")
    if record_projections and mesh is not None:
        raise ValueError("record_projections=True is not supported with a mesh (the train step reuses them only "
                         "unsharded); pass mesh=None or record_projections=False")  # fmt: skip
    mode, shards = sampler_mode(config, mesh, g, m, temperature, top_p, top_k, eos_token_ids, record_projections)
    batch_sharding = mode.batch_sharding
    pad_prompts = padding.batch_bucket(num_prompts, shards)
    prompt_len = padding.prompt_bucket(max(len(p) for p in prompts), prompt_buckets)
    # pad prompts: one dummy token (never sampled from); each prompt left-padded to prompt_len
    padded = [np.asarray(p, np.int32) for p in prompts] + [np.zeros(1, np.int32)] * (pad_prompts - num_prompts)
    prompt_PxT = np.zeros((pad_prompts, prompt_len), np.int32)
    mask_PxT = np.zeros((pad_prompts, prompt_len), bool)
    for i, p in enumerate(padded):
        prompt_PxT[i, prompt_len - len(p) :], mask_PxT[i, prompt_len - len(p) :] = p, True
    width = padding.sampler_packed_width([len(p) for p in padded], shards, ladder=packed_ladder)
    active = np.repeat(np.arange(pad_prompts) < num_prompts, g)

    temp = jnp.float32(temperature if temperature > 0 else 1.0)
    top_p_arr = jnp.float32(top_p)
    prompt_arrays = [_put(x, batch_sharding) for x in (prompt_PxT, mask_PxT, active)]
    cache, state, consts = _prefill(config, mode, (width, shards), params, *prompt_arrays, key, temp, top_p_arr,
                                    np.uint32(row_offset))
    if m > 1:
        _, state = _decode(config, mode, params, cache, state, consts, temp, top_p_arr)
    n = num_prompts * g
    out_mask = state["mask"][:n]
    return Completions(
        tokens=state["tokens"][:n],
        logprobs=state["logprobs"][:n],
        mask=out_mask,
        lengths=jnp.sum(out_mask, axis=-1, dtype=jnp.int32),
        truncated=~state["eos"][:n],
        entropy=state["entropy"][:n],
        projections=None if not (record_projections and m > 1) else _first_rows(state["projections"], n),
    )


def _first_rows(record: dict[str, jax.Array], n: int) -> dict[str, jax.Array]:
    """The recorded projections ``[L, N, ...]`` of the first ``n`` rows (the real prompts', not the padding's)."""
    return {k: v if v.shape[1] == n else v[:, :n] for k, v in record.items()}
