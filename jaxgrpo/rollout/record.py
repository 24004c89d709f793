# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""What the rollout half hands over: `Completions` (the sampler's arrays, `sampling.generate`'s public result) and
`RolloutRecord` (the per-row record a learner trains on: full token rows, sampler log-probs, a context mask and a
separate action mask, the policy version and the group id of every row).

Log-probs: ``logprobs[r, j]`` is the log-probability of completion token ``j`` of row ``r`` under the distribution it
was drawn from: the model's logits divided by the temperature, restricted to the top-k / top-p set and renormalised
(`jaxgrpo.token_sampling`); greedy (temperature 0) reports the untempered, untruncated ``log_softmax``. A learner's
importance ratio ``exp(logp_new - logp_sampler)`` is consistent only if ``logp_new`` is taken under the same
truncated, renormalised distribution: a full-softmax ``logp_new`` against these adds ``-log(kept mass)`` to every
token's log-ratio (TRL issue #4772). jaxgrpo's learner does (`jaxgrpo.learner.logprobs`, ``top_k``/``top_p``: the kept
set recomputed from the learner's logits by the same rule, the sampled token always in it).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import numpy as np


@flax.struct.dataclass
class Completions:
    """Sampled completions, ``N = len(prompts) * num_samples`` rows in prompt-major order.

    tokens: ``[N, M]`` int32, 0 after the end of a row.  logprobs: ``[N, M]`` float32 log-probabilities of the
    sampled tokens under the sampling distribution (0 where ``mask`` is False; see the module docstring).  mask:
    ``[N, M]`` bool, True up to and including the EOS token.  lengths: ``[N]`` int32 = ``mask.sum(-1)``.  truncated:
    ``[N]`` bool, True when the row ended without emitting an EOS id (it hit ``max_new_tokens``; always True when
    ``eos_token_ids`` is empty).  entropy: ``[N, M]`` float32 entropy (nats) of the sampling distribution each token
    was drawn from (0 where ``mask`` is False; greedy: of the untempered model distribution, like the log-probs).
    """

    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array
    lengths: jax.Array
    truncated: jax.Array
    entropy: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class RolloutRecord:
    """Rows ``[N, T]`` (host NumPy), ``T = Tp + M``: each row's prompt left-padded to ``Tp`` then its completion.

    tokens: int32 (pad id outside both masks).  context_mask: bool, the tokens the policy conditions on (the prompt,
    and any environment or tool tokens of a multi-turn row).  action_mask: bool, the tokens the policy produced and
    the loss may train (the sampled completion up to and including EOS).  logprobs: float32 sampler log-probs at the
    action positions (0 elsewhere; the distribution is the module docstring's).  policy_version: int, the parameter
    version that sampled each row.  group_id: int, the prompt each row answers (rows of a group are contiguous).
    """

    tokens: np.ndarray
    context_mask: np.ndarray
    action_mask: np.ndarray
    logprobs: np.ndarray
    policy_version: np.ndarray
    group_id: np.ndarray

    @classmethod
    def from_completions(cls, prompts: list[list[int]], comp: Completions, num_samples: int, pad_id: int = 0,
                         prompt_width: int | None = None, policy_version: int = 0,
                         group_ids: list[int] | None = None) -> RolloutRecord:  # fmt: skip
        """The record of ``comp`` (prompt-major, ``num_samples`` rows per prompt) for ``prompts``."""
        g, ctok = num_samples, np.asarray(comp.tokens)
        n, m = ctok.shape
        if n != len(prompts) * g:
            raise ValueError(f"{n} completion rows != {len(prompts)} prompts x {g} samples")
        width = max(len(p) for p in prompts) if prompt_width is None else prompt_width
        tokens = np.full((n, width + m), pad_id, np.int32)
        context = np.zeros((n, width + m), bool)
        for r in range(n):
            p = prompts[r // g]
            tokens[r, width - len(p):width], context[r, width - len(p):width] = p, True
        action = np.zeros((n, width + m), bool)
        action[:, width:] = np.asarray(comp.mask)
        tokens[:, width:] = np.where(action[:, width:], ctok, pad_id)
        logprobs = np.zeros((n, width + m), np.float32)
        logprobs[:, width:] = np.where(action[:, width:], np.asarray(comp.logprobs), 0.0)
        gid = np.repeat(np.arange(len(prompts)) if group_ids is None else np.asarray(group_ids), g)
        return cls(tokens, context, action, logprobs, np.full(n, policy_version, np.int64), gid.astype(np.int64))
