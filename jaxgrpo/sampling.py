# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Rollout sampler: G samples per prompt with exact log-probs, on the rollout engine in static mode.

``generate(config, params, prompts, num_samples=G, max_new_tokens=M, ...)`` turns a ragged list of prompts
(token-id lists) into ``Completions`` of shape ``[len(prompts) * G, M]`` in prompt-major order (rows
``p*G .. p*G+G-1`` belong to prompt ``p``).

It is a thin call of `jaxgrpo.rollout.driver.run` with one group slot per prompt (padded to a power of two, and to a
multiple of the mesh's batch shards): `jaxgrpo.rollout.engine`'s jitted prefill (the prompts packed end to end, each
prompt's keys and values stored once for its G rows) and donated k-step decode blocks over per-layer caches, the
stop test once per block. Each prompt is left-padded to a static width (`padding.prompt_bucket`: four buckets per
octave, or the smallest of the caller's ``prompt_buckets`` that fits), so the programs compile once per bucket, not
once per call. ``mask`` is True up to and including the EOS token; later tokens are 0 and their logprobs 0. The
tokens and log-probs are those of the sampler the engine replaced, key for key (tests/test_engine.py checks them
against a golden file of it).

Sampling distribution: `jaxgrpo.token_sampling` (temperature, top-k, top-p, inversion sampling; the reported
log-prob is under the distribution actually sampled from: the tempered logits restricted to the top-k / top-p set and
renormalised, as the trainer's old-policy log-prob; a learner log-prob of the full softmax against it leaks
``log(kept mass)`` into the importance ratio whenever top_p < 1 or top_k > 0, see `jaxgrpo.rollout.record`).
The entropy of that same distribution at every sampled position (after temperature, top-k and top-p) comes out
of the decode loop too (``Completions.entropy``), from the probabilities the draw computes anyway: no extra forward.

Randomness: row ``r`` (= ``p*G + g``) at step ``i`` uses ``fold_in(fold_in(key, r), i)``, so a row's samples
depend only on the key, its row index and the step -- not on the batch padding, the bucket or the sharding. The
same key and layout give the same samples; another padding, bucket or sharding changes the logits in their last
float bits (XLA's reductions), which can move a draw that falls within ~1e-6 of a boundary of the cumulative
distribution to the neighbouring token: the same tokens almost always, not bit for bit by construction.

Sharding: with ``mesh`` given, the slots and their rows are split over the mesh's batch axes
(``jaxgrpo.sharding.BATCH_AXES``, as the training batch); ``params`` are used as given (shard them with
``jaxgrpo.sharding.shard_params``). On several processes every process makes the same calls and gets the whole
result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxgrpo import models
from jaxgrpo.models.attention import DENSE, Kernel
from jaxgrpo.rollout import driver
from jaxgrpo.rollout.params import SamplingParams
from jaxgrpo.rollout.record import Completions
from jaxgrpo.token_sampling import sample_from_logits, truncated_logits

__all__ = [
    "Completions",
    "generate",
    "sample_from_logits",
    "truncated_logits",
]


def _validate(config: Any, prompts: Any, sp: SamplingParams, prompt_buckets: Sequence[int] | None) -> None:
    """The prompts, EOS ids and buckets against the model (the sampling values were checked by `SamplingParams`)."""
    if prompt_buckets is not None and (len(prompt_buckets) == 0 or min(prompt_buckets) < 1):
        raise ValueError(f"prompt_buckets must be positive lengths (got {prompt_buckets!r})")
    sp.check(config.vocab_size, config.max_position_embeddings, prompts)


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
    packed_ladder: tuple[int, int] | None = None,
    attention: Kernel = DENSE,
    key_ids: Sequence[int] | None = None,
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
      packed_ladder: the caller's run's ``(floor, cap)`` (`jaxgrpo.learner.perf.shape_ladders`): the packed width climbs
      `padding.ladder_bucket` from ``floor`` to ``cap`` (one program for nearly every step of a run), not 4 buckets
      per octave.
      attention: the prefill's attention kernel (`models.attention.Kernel`: a run's resolved ``perf.attention``).
      key_ids: optional, one per prompt: prompt ``i`` draws with the keys of prompt ``key_ids[i]`` instead of ``i``
      (a caller sampling rows of a larger batch, each with its own id in it, draws what the whole batch would).

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
    groups, _ = driver.run(config, params, prompts, sp, key, prompt_buckets=prompt_buckets, packed_ladder=packed_ladder,
                           mesh=mesh, attention=attention, key_ids=key_ids)  # fmt: skip
    return jax.tree.map(jnp.asarray, driver.completions(groups, range(len(prompts))))
