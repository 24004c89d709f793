# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The train step's data: `Batch` (one rollout, prompt-major), `TrainState`, their checks and global placement."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgrpo.config_sections import AlgoConfig
from jaxgrpo.rollout.history import to_rows
from jaxgrpo.rollout.multiturn import MultiTurnRollout
from jaxgrpo.sharding import BATCH_AXES

Params = Any


@flax.struct.dataclass
class TrainState:
    """Everything one train step reads and writes: params, optax state, rollout step counter, PRNG key."""

    params: Params
    opt_state: optax.OptState
    step: jax.Array  # int32 scalar: rollout steps done (drives the learning-rate schedule)
    rng: jax.Array  # advanced every step; for stochastic extensions of the step (none in the GRPO loss itself)


@flax.struct.dataclass
class Batch:
    """One rollout, prompt-major: rows ``p*G .. p*G+G-1`` are the G samples of prompt p (B = P*G).

    tokens ``[B, Tp+Tc]`` int32: the prompt left-padded to Tp, then the completion right-padded to Tc.
    prompt_mask ``[B, Tp]`` / completion_mask ``[B, Tc]`` bool: real tokens (completion: up to and including EOS).
    rewards ``[P, G]`` float32; valid ``[P, G]`` bool (False = sample dropped, e.g. a failed reward).
    old_logprobs ``[B, Tc]`` float32: the sampler's per-token log-probs (temperature-scaled), 0 where masked.
    ref_logprobs ``[B, Tc]`` float32 or None: reference-policy log-probs, required iff ``kl_coef > 0``.
    action_mask ``[B, Tc]`` bool or None: which completion tokens the policy sampled (multi-turn rollouts: tool and
    environment tokens inside the completion are False). They stay in the attention (``completion_mask``) but are
    context for the loss: no loss, no KL, not in the aggregation's token or sequence counts. None = all are actions.
    """

    tokens: jax.Array
    prompt_mask: jax.Array
    completion_mask: jax.Array
    rewards: jax.Array
    valid: jax.Array
    old_logprobs: jax.Array
    ref_logprobs: jax.Array | None = None
    truncated: jax.Array | None = None  # [B] bool: no EOS within max_new_tokens; required by algo.overlong_filter
    action_mask: jax.Array | None = None


def check_batch(batch: Batch, algo: AlgoConfig, num_shards: int) -> tuple[int, int]:
    """Static shape checks at trace time; returns (P, G)."""
    if batch.rewards.ndim != 2:
        raise ValueError(f"rewards must be [P, G], got shape {batch.rewards.shape}")
    Pn, G = batch.rewards.shape
    B, Tp = batch.prompt_mask.shape
    Tc = batch.completion_mask.shape[1]
    if B != Pn * G:
        raise ValueError(f"batch has {B} rows but rewards are [P={Pn}, G={G}]: rows must be P*G, prompt-major")
    expected = {"tokens": (B, Tp + Tc), "completion_mask": (B, Tc), "valid": (Pn, G), "old_logprobs": (B, Tc)}
    if batch.action_mask is not None:
        expected["action_mask"] = (B, Tc)
    for name, shape in expected.items():
        if getattr(batch, name).shape != shape:
            raise ValueError(f"batch.{name} has shape {getattr(batch, name).shape}, expected {shape}")
    if algo.kl_coef > 0:
        if batch.ref_logprobs is None:
            raise ValueError("algo.kl_coef > 0 needs batch.ref_logprobs (compute_logprobs with the reference params)")
        if batch.ref_logprobs.shape != (B, Tc):
            raise ValueError(f"batch.ref_logprobs has shape {batch.ref_logprobs.shape}, expected {(B, Tc)}")
    elif batch.ref_logprobs is not None:
        raise ValueError("batch.ref_logprobs given but algo.kl_coef == 0: skip the reference forward and pass None")
    if algo.overlong_filter and (batch.truncated is None or batch.truncated.shape != (B,)):
        got = None if batch.truncated is None else batch.truncated.shape
        raise ValueError(f"algo.overlong_filter needs batch.truncated [B={B}] bool (sampling.Completions.truncated); "
                         f"got {got}")
    splits = algo.num_minibatches * algo.grad_accum_steps
    if Pn % (splits * num_shards):
        raise ValueError(
            f"P={Pn} prompts cannot be split into num_minibatches*grad_accum_steps={splits} parts of whole groups "
            f"on {num_shards} batch shards (data*fsdp); make P a multiple of {splits * num_shards}"
        )
    return Pn, G


def global_batch(batch: Batch, mesh: Mesh) -> Batch:
    """Turn this process's rows of a rollout into global arrays sharded by groups over ``("data", "fsdp")``.

    Single process: the batch is simply placed on the mesh. Multi-process (after ``jax.distributed.initialize()``):
    each process passes its own whole groups (``P_local`` prompts × G rows, the same ``P_local`` everywhere); the
    global batch has ``P = P_local × process_count`` groups, ordered by the mesh's devices. Group order does not
    change the step's result.
    """

    def place(x: Any) -> jax.Array:
        x = np.asarray(x)
        sharding = NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (x.ndim - 1))))
        return jax.make_array_from_process_local_data(sharding, x)

    return jax.tree.map(place, batch)


def multiturn_batch(result: MultiTurnRollout, rewards: np.ndarray, valid: np.ndarray, prompt_width: int,
               completion_width: int, pad_id: int = 0) -> Batch:  # fmt: skip
    """The train step's `Batch` of a multi-turn rollout (`jaxgrpo.rollout.multiturn.rollout`): prompts left-padded
    to ``prompt_width``, the completion region (policy and context tokens) right-padded to ``completion_width``,
    ``action_mask`` = the policy's tokens."""
    P, G = np.shape(rewards)
    rows = to_rows(result.histories, completion_width)
    prompt, pmask = left_pad_prompts(result.prompt_ids, G, prompt_width, pad_id)
    cmask = rows["completion_mask"] & np.asarray(valid, bool).reshape(-1)[:, None]
    return Batch(tokens=jnp.asarray(np.concatenate([prompt, np.where(cmask, rows["completion"], pad_id)], 1)),
                 prompt_mask=jnp.asarray(pmask), completion_mask=jnp.asarray(cmask),
                 rewards=jnp.asarray(rewards, jnp.float32), valid=jnp.asarray(valid, bool),
                 old_logprobs=jnp.asarray(np.where(cmask, rows["old_logprobs"], 0.0), jnp.float32),
                 action_mask=jnp.asarray(rows["action_mask"] & cmask))  # fmt: skip


def left_pad_prompts(prompt_ids: list[list[int]], rows_per_prompt: int, width: int,
                     pad_id: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The prompt part of a prompt-major batch: ``(tokens [P*G, width] int32, mask [P*G, width] bool)``, each prompt
    left-padded to ``width`` and repeated for its ``G = rows_per_prompt`` rows."""
    g = rows_per_prompt
    prompt = np.full((len(prompt_ids) * g, width), pad_id, np.int32)
    mask = np.zeros((len(prompt_ids) * g, width), bool)
    for p, ids in enumerate(prompt_ids):
        if len(ids) > width:
            raise ValueError(f"prompt {p} has {len(ids)} tokens, more than the prompt width {width}")
        prompt[p * g:(p + 1) * g, width - len(ids):] = ids
        mask[p * g:(p + 1) * g, width - len(ids):] = True
    return prompt, mask
