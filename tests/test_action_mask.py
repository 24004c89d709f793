# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The learner trains on the action mask only: in a multi-turn rollout, tool and environment tokens inside the
completion region (``Batch.action_mask`` False) are context — no loss, no KL, not in the aggregation's token or
sequence counts — while the policy still attends to them.

References, independent of the step's code: log-probs from `models.forward` (full logits, log_softmax, gather);
GRPO advantages, the PPO clipped loss, the k3 KL and the two aggregations written out in NumPy float64 from their
published formulas (Shao et al. 2024 arXiv:2402.03300 for GRPO's (r - mean) / (std + eps); Schulman et al. 2017
for the clipped ratio; Schulman 2020 "Approximating KL divergence" for k3). The gradient with respect to each
position's log-prob is taken through the step's own loss function (`minibatch.StepParts.micro_loss`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_step import V, tiny_config  # noqa: E402  the tiny model of tests/test_train_step.py

from jaxgrpo import models
from jaxgrpo.config import AlgoConfig, PerfConfig
from jaxgrpo.learner import minibatch
from jaxgrpo.learner import train_step as ts

# its shapes too (already compiled by the suite)
TP, TC, TEMP = 6, 8, 0.7
P, G = 2, 4


@pytest.fixture(scope="module")
def config():
    return tiny_config()


@pytest.fixture(scope="module")
def params(config):
    return models.init_params(config, jax.random.key(0))


def reference_logprobs(config, params, tokens, prompt_mask, completion_mask):
    attn = jnp.concatenate([prompt_mask, completion_mask], axis=1)
    logits = models.forward(config, params, jnp.asarray(tokens), attention_mask=attn)
    logp_all = jax.nn.log_softmax(logits[:, TP - 1 : -1] / TEMP, axis=-1)
    return np.asarray(jnp.take_along_axis(logp_all, jnp.asarray(tokens)[:, TP:, None], axis=-1)[..., 0], np.float64)


def multiturn_rollout(config, params, seed: int = 0) -> dict:
    """Groups of G rows sharing a prompt, each ``policy turn, tool reply, policy turn`` (lengths vary); one row's
    completion is all context."""
    rng = np.random.default_rng(seed)
    B = P * G
    plen = rng.integers(2, TP + 1, size=P).repeat(G)
    prompt_mask = np.arange(TP)[None] >= (TP - plen)[:, None]
    clen = rng.integers(5, TC + 1, size=B)
    completion_mask = np.arange(TC)[None] < clen[:, None]
    action = completion_mask.copy()
    for b in range(B):  # a tool reply of 1-3 tokens after the first 1-2 policy tokens
        start = rng.integers(1, 3)
        action[b, start : start + rng.integers(1, 4)] = False
    action[5] = False  # a trajectory with no policy token in the completion region: leaves S and the counts
    tokens = np.concatenate([np.where(prompt_mask, rng.integers(1, V, (P, TP)).repeat(G, 0), 0),
                             np.where(completion_mask, rng.integers(1, V, (B, TC)), 0)], axis=1).astype(np.int32)
    rewards = np.array([[1, 0, 0, 1], [0.5, 1, 0, 0]], np.float32)
    logp = reference_logprobs(config, params, tokens, prompt_mask, completion_mask)
    noise = rng.normal(size=(B, TC))
    old = np.where(action, logp + 0.2 * noise, 0.0)
    ref = np.where(action, logp + 0.1 * rng.normal(size=(B, TC)), 0.0)
    return dict(tokens=tokens, prompt_mask=prompt_mask, completion_mask=completion_mask, action_mask=action,
                rewards=rewards, valid=np.ones((P, G), bool), old=old, ref=ref, logp=logp)  # fmt: skip


def to_batch(raw: dict, kl: bool, garbage: float | None = None) -> ts.Batch:
    """``garbage``: the value of the sampler and reference log-probs at context positions (the learner ignores it)."""
    ctx = raw["completion_mask"] & ~raw["action_mask"]
    fill = lambda x: np.where(ctx, garbage, x) if garbage is not None else x  # noqa: E731
    return ts.Batch(tokens=raw["tokens"], prompt_mask=raw["prompt_mask"], completion_mask=raw["completion_mask"],
                    rewards=raw["rewards"], valid=raw["valid"], old_logprobs=fill(raw["old"]).astype(np.float32),
                    ref_logprobs=fill(raw["ref"]).astype(np.float32) if kl else None,
                    action_mask=raw["action_mask"])  # fmt: skip


def hand_loss(raw: dict, aggregation: str, kl_coef: float, clip: float = 0.2) -> float:
    r = raw["rewards"].astype(np.float64)
    adv = ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-6)).reshape(-1, 1)
    m = raw["action_mask"].astype(np.float64)
    logp = raw["logp"]
    ratio = np.exp(logp - raw["old"])
    per_tok = -np.minimum(ratio * adv, np.clip(ratio, 1 - clip, 1 + clip) * adv)
    x = raw["ref"] - logp
    kl_tok = np.exp(x) - x - 1
    n = m.sum(1)
    seqs = n > 0

    def agg(t):
        if aggregation == "token-mean":
            return (t * m).sum() / m.sum()
        return ((t * m).sum(1)[seqs] / n[seqs]).sum() / seqs.sum()

    return float(agg(per_tok) + kl_coef * agg(kl_tok))


CASES = [("token-mean", 0.0), ("seq-mean-token-mean", 0.1)]


@pytest.mark.slow
@pytest.mark.parametrize("aggregation,kl_coef", CASES)
def test_loss_is_the_hand_computed_one_over_action_tokens_only(config, params, aggregation, kl_coef):
    raw = multiturn_rollout(config, params)
    algo = AlgoConfig(aggregation=aggregation, kl_coef=kl_coef, sampler_correction="none")
    step = minibatch.StepParts(config, algo, None, TEMP, PerfConfig())
    grad_fn = jax.jit(lambda p, b: minibatch.first_minibatch_gradient(step, p, b)[:2])  # what policy_gradient runs
    loss, grads = grad_fn(params, to_batch(raw, kl_coef > 0))
    np.testing.assert_allclose(float(loss), hand_loss(raw, aggregation, kl_coef), rtol=2e-5)
    # with every completion token an action the same rollout gives another loss: the mask makes the difference
    plain = dataclasses.replace(to_batch(raw, kl_coef > 0), action_mask=raw["completion_mask"])
    assert abs(float(grad_fn(params, plain)[0]) - float(loss)) > 1e-4
    # garbage sampler/reference log-probs at context positions change nothing, bit for bit
    loss_g, grads_g = grad_fn(params, to_batch(raw, kl_coef > 0, garbage=1e4))
    assert float(loss_g) == float(loss)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), grads, grads_g)


@pytest.mark.slow
@pytest.mark.parametrize("aggregation,kl_coef", CASES)
def test_gradient_wrt_context_positions_is_exactly_zero(config, params, aggregation, kl_coef):
    """d loss / d logp[b, t] through the step's loss function: exactly 0 on tool tokens, nonzero on actions."""
    raw = multiturn_rollout(config, params, seed=1)
    algo = AlgoConfig(aggregation=aggregation, kl_coef=kl_coef, sampler_correction="none")
    parts = minibatch.StepParts(config, algo, None, TEMP, PerfConfig())
    batch = to_batch(raw, kl_coef > 0)
    prep = parts.prepare(batch)
    mb = jax.tree.map(lambda x: x[0, 0], parts.split_batch(batch, prep))  # one minibatch, one micro-batch
    step_logprobs = parts.logprobs

    def with_delta(params, mb, *args):  # the step's own log-probs plus a probe per position
        logp, ent = step_logprobs(params, mb, *args)
        return logp + mb["delta"], ent

    parts.logprobs = with_delta
    loss_of = lambda d: parts.micro_loss(params, dict(mb, delta=d), G)[0]  # noqa: E731
    g = np.asarray(jax.jit(jax.grad(loss_of))(jnp.zeros((P * G, TC), jnp.float32)))
    context = raw["completion_mask"] & ~raw["action_mask"]
    assert np.all(g[context] == 0.0) and np.all(g[~raw["completion_mask"]] == 0.0)
    # every action token whose ratio is inside the clip range (or that has a KL term) has a gradient
    inside = np.abs(np.exp(raw["logp"] - raw["old"]) - 1) < 0.2 - 1e-3
    live = raw["action_mask"] & (inside | (kl_coef > 0))
    assert live.sum() > 10 and np.all(np.abs(g[live]) > 0)
    # and the step's counts are of action tokens and of sequences with an action token
    np.testing.assert_array_equal(np.asarray(prep["loss_mask"]), raw["action_mask"])
    assert float(prep["tok"].sum()) == raw["action_mask"].sum()
    assert float(prep["seq"].sum()) == raw["action_mask"].any(1).sum() == P * G - 1


def test_action_mask_shape_is_checked(config, params):
    raw = multiturn_rollout(config, params)
    bad = dataclasses.replace(to_batch(raw, False), action_mask=raw["action_mask"][:, :-1])
    with pytest.raises(ValueError, match="action_mask has shape"):
        ts.policy_gradient(config, AlgoConfig(), params, bad, temperature=TEMP)
