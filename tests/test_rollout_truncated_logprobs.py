# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The learner's log-probs under the sampler's top-k / top-p truncation (`jaxgrpo.learner.logprobs`,
``top_k``/``top_p``): values and entropies against a float64 NumPy truncated softmax of `models.forward`'s logits (the
kept set by the nucleus rule written out by hand, the target always kept), gradients against jax autodiff of that
formula (both LM-head backward paths), the importance ratio 1 at the sampling parameters with top_p=0.9 / top_k=20 (and
the full-softmax log-probs off by log(kept mass), the leak these guard), and the trainer training with truncation."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import rel_err
from test_sampling import PROMPTS, tiny_model
from test_train import small_config

from jaxgrpo import models, sampling, trainer
from jaxgrpo.learner import logprobs as logprobs_lib
from jaxgrpo.rollout.record import RolloutRecord

T = 0.7
TP, TC = 4, 5  # prompt and completion widths of the hand-made rows


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


def _kept_np(z: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """The kept set of tempered logits ``z [V]`` (float64): sort by (-z, id), first top_k, then keep token j of them
    iff the renormalised mass strictly before it is < top_p (Holtzman et al. 2020; HF's warper order)."""
    order = sorted(range(len(z)), key=lambda j: (-z[j], j))
    if top_k > 0:
        order = order[:top_k]
    q = np.exp(z[order] - z[order].max())
    q /= q.sum()
    before = np.cumsum(q) - q
    kept = np.zeros(len(z), bool)
    kept[[j for j, b in zip(order, before) if b < top_p]] = True
    kept[order[0]] = True
    return kept


def _rows(seed: int) -> types.SimpleNamespace:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 64, size=(3, TP + TC)).astype(np.int32)
    prompt_mask = np.ones((3, TP), bool)
    prompt_mask[1, :2] = False  # a left-padded prompt
    completion_mask = np.ones((3, TC), bool)
    completion_mask[2, 3:] = False
    return types.SimpleNamespace(tokens=jnp.asarray(tokens), prompt_mask=jnp.asarray(prompt_mask),
                                 completion_mask=jnp.asarray(completion_mask))  # fmt: skip


def _logits(config, params, rows) -> jax.Array:
    """``[B, Tc, V]`` logits / T predicting each completion token, from the full-sequence `models.forward`."""
    mask = jnp.concatenate([rows.prompt_mask, rows.completion_mask], axis=1)
    logits = models.forward(config, params, rows.tokens, attention_mask=mask)
    return logits[:, TP - 1 : TP + TC - 1].astype(jnp.float32) / T


def _reference(z: np.ndarray, targets: np.ndarray, top_k: int, top_p: float):
    """float64 ``(logp, entropy, kept)`` of the truncated softmax over ``K ∪ {t}``."""
    b, c, v = z.shape
    logp, ent, kept = np.zeros((b, c)), np.zeros((b, c)), np.zeros((b, c, v), bool)
    for i in range(b):
        for j in range(c):
            k = _kept_np(z[i, j], top_k, top_p)
            k[targets[i, j]] = True
            zk = z[i, j][k]
            lse = zk.max() + np.log(np.exp(zk - zk.max()).sum())
            q = np.exp(zk - lse)
            logp[i, j], ent[i, j], kept[i, j] = z[i, j, targets[i, j]] - lse, -(q * np.log(q)).sum(), k
    return logp, ent, kept


@pytest.mark.parametrize("top_k, top_p", [(20, 1.0), (0, 0.9), (20, 0.8)])
def test_truncated_logprobs_equal_numpy(tiny, top_k, top_p):
    config, params = tiny
    rows = _rows(top_k + int(top_p * 10))
    targets = np.asarray(rows.tokens)[:, TP:]
    z = np.asarray(_logits(config, params, rows), np.float64)
    want_logp, want_ent, kept = _reference(z, targets, top_k, top_p)
    assert (kept.sum(-1) < z.shape[-1]).all()  # every position truncates something
    logp, ent = logprobs_lib.compute_logprobs(config, params, rows, T, top_k=top_k, top_p=top_p)
    valid = np.asarray(rows.completion_mask)
    np.testing.assert_allclose(np.asarray(logp)[valid], want_logp[valid], atol=2e-5)
    np.testing.assert_allclose(np.asarray(ent)[valid], want_ent[valid], atol=2e-5)
    full, _ = logprobs_lib.compute_logprobs(config, params, rows, T)  # the full softmax is lower by -log(kept mass)
    leak = want_logp[valid] - np.asarray(full)[valid]
    assert leak.min() > -2e-5 and leak.max() > 1e-3, leak


@pytest.mark.slow
@pytest.mark.parametrize("keep_probs", [True, False])
def test_truncated_logprob_gradient_equals_autodiff(tiny, monkeypatch, keep_probs):
    """The hand-written LM-head backward (probs kept, or logits and kept set recomputed) against jax autodiff of
    ``z_t − logsumexp(z over K ∪ {t})`` with the set from NumPy, through the whole model."""
    config, params = tiny
    top_k, top_p = 20, 0.9
    rows = _rows(5)
    targets = np.asarray(rows.tokens)[:, TP:]
    _, _, kept = _reference(np.asarray(_logits(config, params, rows), np.float64), targets, top_k, top_p)
    w = jnp.asarray(np.random.default_rng(1).normal(size=targets.shape) * np.asarray(rows.completion_mask))
    if not keep_probs:
        monkeypatch.setattr(logprobs_lib, "_KEEP_PROBS_BYTES", 0)

    def ours(p):
        return jnp.sum(w * logprobs_lib.compute_logprobs(config, p, rows, T, top_k=top_k, top_p=top_p)[0])

    def reference(p):
        z = _logits(config, p, rows)
        lse = jax.nn.logsumexp(jnp.where(jnp.asarray(kept), z, -jnp.inf), axis=-1)
        return jnp.sum(w * (jnp.take_along_axis(z, jnp.asarray(targets)[..., None], axis=-1)[..., 0] - lse))

    got, want = jax.grad(ours)(params), jax.grad(reference)(params)
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        ref = dict(jax.tree_util.tree_leaves_with_path(want))[path]
        assert rel_err(g, np.asarray(ref)) < 1e-4, jax.tree_util.keystr(path)


@pytest.mark.slow
@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (20, 1.0)])
def test_policy_ratio_is_one_at_the_sampling_params(tiny, top_k, top_p):
    config, params = tiny
    g, m = 4, 6
    comp = sampling.generate(config, params, PROMPTS, num_samples=g, max_new_tokens=m, temperature=T, top_k=top_k,
                             top_p=top_p, key=jax.random.key(11))  # fmt: skip
    rec = RolloutRecord.from_completions(PROMPTS, comp, g)
    tp = rec.tokens.shape[1] - m
    rows = types.SimpleNamespace(tokens=jnp.asarray(rec.tokens), prompt_mask=jnp.asarray(rec.context_mask[:, :tp]),
                                 completion_mask=jnp.asarray(rec.action_mask[:, tp:]))  # fmt: skip
    valid = rec.action_mask[:, tp:]
    learner, _ = logprobs_lib.compute_logprobs(config, params, rows, T, top_k=top_k, top_p=top_p)
    log_ratio = (np.asarray(learner) - rec.logprobs[:, tp:])[valid]
    np.testing.assert_allclose(np.exp(log_ratio), 1.0, atol=2e-5)
    full, _ = logprobs_lib.compute_logprobs(config, params, rows, T)
    assert np.max(np.abs(np.asarray(full) - rec.logprobs[:, tp:])[valid]) > 1e-3  # what truncation would leak


@pytest.mark.slow
def test_trainer_trains_with_top_p_and_top_k(tmp_path):
    """The trainer no longer refuses top_p < 1 / top_k > 0: at the first step (params = the sampling params) the
    learner's log-probs equal the sampler's (ratio 1), and the run trains."""
    cfg = small_config("rollout.top_p=0.9", "rollout.top_k=20", "train.steps=2", "checkpoint.every=0",
                       "checkpoint.export_final=false")  # fmt: skip
    history = trainer.run(cfg, tmp_path / "run")
    first = history[0]
    assert abs(first["mismatch/ratio_mean"] - 1.0) < 1e-5 and first["mismatch/abs_diff_max"] < 1e-4, first
    assert all(np.isfinite(v) for rec in history for v in rec.values())
