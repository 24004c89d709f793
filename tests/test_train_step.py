# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests of jaxgrpo.learner.train_step on one device: log-probs, gradient, optimizer, degenerate-group modes, μ > 1,
minibatches, gradient accumulation, no recompilation. Sharded / multi-process runs: test_train_step_sharded.py.

The references are independent of the step's code path: log-probs from `models.forward` (full ``[B, T, V]``
logits, `jax.nn.log_softmax`, gather), gradients from `jax.grad` of `losses.policy_loss` on those, AdamW written
out by hand, and the closed-form relations between the modes.
"""

from __future__ import annotations

import dataclasses
import math
from unittest import mock

import chex
import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgrpo import advantages, degeneracy, losses, models
from jaxgrpo.config import AlgoConfig, OptimConfig, PerfConfig
from jaxgrpo.learner import logprobs, optim
from jaxgrpo.learner import train_step as ts

V = 80  # distinct from every other dimension of the tiny model, so [.., V] shapes are logits
TP, TC = 6, 8
TEMP = 0.7


def tiny_config() -> models.ModelConfig:
    return models.ModelConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
        max_position_embeddings=64,
    )  # fmt: skip


def make_batch_np(
    seed: int,
    P: int,
    G: int,
    rewards: np.ndarray | None = None,
    valid: np.ndarray | None = None,
    clen: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """A random prompt-major rollout as numpy: prompts left-padded to TP, completions right-padded to TC."""
    rng = np.random.default_rng(seed)
    B = P * G
    plen = rng.integers(1, TP + 1, size=P).repeat(G)
    if clen is None:
        clen = rng.integers(1, TC + 1, size=B)
    prompt_mask = np.arange(TP)[None] >= (TP - plen)[:, None]
    completion_mask = np.arange(TC)[None] < np.asarray(clen)[:, None]
    prompts = rng.integers(1, V, size=(P, TP)).repeat(G, axis=0)
    completions = rng.integers(1, V, size=(B, TC))
    tokens = np.concatenate([np.where(prompt_mask, prompts, 0), np.where(completion_mask, completions, 0)], axis=1)
    if rewards is None:
        rewards = rng.integers(0, 2, size=(P, G)).astype(np.float32)
    if valid is None:
        valid = np.ones((P, G), bool)
    return dict(
        tokens=tokens.astype(np.int32), prompt_mask=prompt_mask, completion_mask=completion_mask,
        rewards=np.asarray(rewards, np.float32), valid=np.asarray(valid, bool),
        noise=rng.normal(size=(B, TC)).astype(np.float32), ref_noise=rng.normal(size=(B, TC)).astype(np.float32),
    )  # fmt: skip


def reference_logprobs(config, params, tokens, prompt_mask, completion_mask, temperature=TEMP):
    """Independent log-probs: full logits from models.forward, log_softmax over the vocabulary, gather."""
    attn = jnp.concatenate([prompt_mask, completion_mask], axis=1)
    logits = models.forward(config, params, jnp.asarray(tokens), attention_mask=attn)
    Tp = prompt_mask.shape[1]
    logp_all = jax.nn.log_softmax(logits[:, Tp - 1 : -1] / temperature, axis=-1)
    logp = jnp.take_along_axis(logp_all, jnp.asarray(tokens)[:, Tp:, None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return logp, entropy


def to_batch(config, params, raw: dict, *, kl: bool = False, noise: float = 0.05) -> ts.Batch:
    """Batch whose sampler log-probs are the true ones plus noise (a sampler/trainer mismatch), optional ref."""
    logp, _ = reference_logprobs(config, params, raw["tokens"], raw["prompt_mask"], raw["completion_mask"])
    cm = raw["completion_mask"]
    old = np.where(cm, np.asarray(logp) + noise * raw["noise"], 0.0).astype(np.float32)
    ref = np.where(cm, np.asarray(logp) + 0.1 * raw["ref_noise"], 0.0).astype(np.float32) if kl else None
    return ts.Batch(
        tokens=raw["tokens"], prompt_mask=raw["prompt_mask"], completion_mask=cm, rewards=raw["rewards"],
        valid=raw["valid"], old_logprobs=old, ref_logprobs=ref,
    )  # fmt: skip


@pytest.fixture(scope="module")
def config():
    return tiny_config()


@pytest.fixture(scope="module")
def params(config):
    return models.init_params(config, jax.random.key(0))


def reference_loss_fn(config, algo: AlgoConfig, batch: ts.Batch):
    """loss(params) from models.forward log-probs + advantages.grpo + losses.policy_loss, no train_step code."""
    adv = advantages.compute(algo.estimator, batch.rewards, batch.valid, **algo.estimator_args).reshape(-1)
    mask = np.asarray(batch.completion_mask) & np.asarray(batch.valid).reshape(-1)[:, None]
    if algo.degenerate_groups == "mask":
        deg = np.asarray(degeneracy.degenerate_mask(batch.rewards, batch.valid))
        mask = mask & ~np.repeat(deg, batch.rewards.shape[1])[:, None]

    def loss_fn(p):
        logp, _ = reference_logprobs(config, p, batch.tokens, batch.prompt_mask, batch.completion_mask)
        loss, _ = losses.policy_loss(
            logp, batch.old_logprobs, adv, mask, clip_low=algo.clip_low, clip_high=algo.clip_high,
            dual_clip=algo.dual_clip, ratio_level=algo.ratio_level, aggregation=algo.aggregation,
            ref_logp=batch.ref_logprobs, kl_coef=algo.kl_coef, kl_estimator=algo.kl_estimator,
        )  # fmt: skip
        return loss

    return jax.jit(loss_fn)


def fresh(params):
    """A copy: init_fn takes ownership of the params it is given (the step donates them)."""
    return jax.tree.map(jnp.copy, params)


def assert_trees_close(a, b, rtol=1e-5, atol=1e-7):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol), a, b)


# ----------------------------------------------------------------------------------------------- log-probs
class TestComputeLogprobs(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_matches_full_logits(self):
        config = tiny_config()
        params = models.init_params(config, jax.random.key(1))
        raw = make_batch_np(3, P=2, G=3)
        batch = to_batch(config, params, raw)
        ref_logp, ref_ent = reference_logprobs(
            config, params, raw["tokens"], raw["prompt_mask"], raw["completion_mask"]
        )
        cm = raw["completion_mask"]
        for chunk in (0, 3):  # automatic (one chunk here), a chunk that does not divide Tc (padding)
            fn = self.variant(lambda p, b, c=chunk: ts.compute_logprobs(config, p, b, TEMP, c))
            logp, ent = fn(params, batch)
            chex.assert_shape([logp, ent], (6, TC))
            chex.assert_type([logp, ent], jnp.float32)
            chex.assert_tree_all_finite((logp, ent))
            np.testing.assert_allclose(np.where(cm, logp, 0), np.where(cm, ref_logp, 0), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(np.where(cm, ent, 0), np.where(cm, ref_ent, 0), rtol=1e-5, atol=1e-5)
        # entropy of a V-way softmax is within (0, log 64]
        assert np.all(np.asarray(ent)[cm] > 0) and np.all(np.asarray(ent)[cm] <= math.log(V) + 1e-5)

    def test_no_float32_btv_tensor_and_no_prompt_head(self):
        """The jaxpr of the log-prob gradient never holds a [B, T, V] or [B, Tc, V] float32 array when chunked
        (above the size where the forward's probabilities are kept for the backward: forced here)."""
        self.enter_context(mock.patch.object(logprobs, "_KEEP_PROBS_BYTES", 0))
        config = tiny_config()
        params = models.init_params(config, jax.random.key(1))
        batch = to_batch(config, params, make_batch_np(3, P=2, G=3))
        f = lambda p: ts.compute_logprobs(config, p, batch, TEMP, 2)[0].sum()
        shapes = set()

        def walk(jaxpr):
            for eqn in jaxpr.eqns:
                for v in eqn.outvars:
                    shapes.add((tuple(v.aval.shape), str(v.aval.dtype)))
                for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                    walk(sub)

        walk(jax.make_jaxpr(jax.grad(f))(params).jaxpr)
        big = [s for s, d in shapes if len(s) >= 3 and s[-1] == V and int(np.prod(s[:-1])) > 6 * 2]
        assert not big, f"logits larger than one chunk [6, 2, {V}] materialised: {big}"
        assert ((6, 2, V), "float32") in shapes  # the chunk itself is there


# ----------------------------------------------------------------------------------------------- gradient
@pytest.mark.parametrize(
    "algo",
    [
        AlgoConfig(clip_high=0.28),
        AlgoConfig(aggregation="seq-mean-token-mean", kl_coef=0.1, dual_clip=3.0, estimator="rloo"),
        AlgoConfig(ratio_level="sequence", aggregation="seq-mean-token-sum-norm", degenerate_groups="mask"),
    ],
    ids=["token-mean-cliphigh", "seqmean-kl-rloo", "gspo-mask-remat"],
)
def test_gradient_matches_jax_grad_of_policy_loss(config, params, algo, monkeypatch):
    rewards = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0.5, 0, 1, 0]], np.float32)
    valid = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 1]], bool)
    batch = to_batch(config, params, make_batch_np(4, 3, 4, rewards, valid), kl=algo.kl_coef > 0, noise=0.2)
    remat = algo.ratio_level == "sequence"  # one case with per-layer rematerialisation
    if remat:  # ... and with the LM head's logits recomputed in the backward instead of kept
        monkeypatch.setattr(logprobs, "_KEEP_PROBS_BYTES", 0)
    perf = PerfConfig(remat="full" if remat else "projections")
    loss, grads, metrics = ts.policy_gradient(config, algo, params, batch, perf=perf, temperature=TEMP)
    ref_fn = reference_loss_fn(config, algo, batch)
    ref_loss, ref_grads = jax.jit(jax.value_and_grad(ref_fn))(params)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    assert float(optax_norm(ref_grads)) > 1e-4  # a real gradient, not zeros
    assert_trees_close(grads, ref_grads, rtol=1e-4, atol=1e-7)
    chex.assert_tree_all_finite(metrics)


def optax_norm(tree):
    return jnp.sqrt(sum(jnp.sum(x.astype(jnp.float32) ** 2) for x in jax.tree.leaves(tree)))


def manual_adamw(params, grads_list, lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, clip=0.0):
    """AdamW written out (Loshchilov & Hutter 2019), global-norm clipping first; decay skips norms."""
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    flat_keys = {jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
    assert flat_keys
    for t, g in enumerate(grads_list, start=1):
        if clip > 0:
            scale = jnp.minimum(1.0, clip / optax_norm(g))
            g = jax.tree.map(lambda x, s=scale: x * s, g)
        m = jax.tree.map(lambda a, b: b1 * a + (1 - b1) * b, m, g)
        v = jax.tree.map(lambda a, b: b2 * a + (1 - b2) * b * b, v, g)

        def upd(path, p, mm, vv, t=t):
            decay = 0.0 if ("norm" in jax.tree_util.keystr(path)) else wd
            mh, vh = mm / (1 - b1**t), vv / (1 - b2**t)
            return p - lr * (mh / (jnp.sqrt(vh) + eps) + decay * p)

        params = jax.tree_util.tree_map_with_path(upd, params, m, v)
    return params


def test_step_update_is_adamw_of_the_reference_gradient(config, params):
    algo = AlgoConfig()
    optim = OptimConfig(learning_rate=1e-3, max_grad_norm=0.05, weight_decay=0.1)
    batch = to_batch(config, params, make_batch_np(5, 2, 4))
    init_fn, step_fn = ts.make_train_step(config, algo, optim, temperature=TEMP, total_steps=10)
    state = init_fn(fresh(params), jax.random.key(7))
    new_state, metrics = step_fn(state, batch)
    ref_grads = jax.jit(jax.grad(reference_loss_fn(config, algo, batch)))(params)
    expected = manual_adamw(params, [ref_grads], 1e-3, wd=0.1, clip=0.05)
    assert float(optax_norm(ref_grads)) > 0.05  # clipping is active
    assert_trees_close(new_state.params, expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(metrics["grad_norm"], optax_norm(ref_grads), rtol=1e-4)
    assert int(new_state.step) == 1
    for k, v in metrics.items():
        chex.assert_shape(v, ())
        chex.assert_type(v, jnp.float32)
        assert np.isfinite(v), k
    expected_keys = {"loss", "pg_loss", "kl", "entropy", "clip/low_frac", "clip/high_frac", "clip/dual_frac",
                     "ratio/mean", "ratio/max", "ratio/min", "approx_kl_old", "mismatch/abs_diff_mean",
                     "mismatch/abs_diff_max", "mismatch/ratio_mean", "grad_norm", "lr", "tokens/prompt",
                     "tokens/completion", "tokens/loss", "degeneracy/masked_groups"}  # fmt: skip
    diag = degeneracy.diagnostics(batch.rewards, batch.valid, jnp.zeros((2, 4)))
    assert expected_keys | set(diag) <= set(metrics), (expected_keys | set(diag)) - set(metrics)
    np.testing.assert_allclose(metrics["lr"], 1e-3)
    # mismatch: the sampler log-probs were the true ones + 0.05 N(0, 1) noise on valid tokens
    cm = batch.completion_mask
    np.testing.assert_allclose(
        metrics["mismatch/abs_diff_mean"], np.abs(0.05 * make_batch_np(5, 2, 4)["noise"])[cm].mean(), rtol=1e-3
    )
    true_logp, true_ent = reference_logprobs(config, params, batch.tokens, batch.prompt_mask, cm)
    np.testing.assert_allclose(
        metrics["mismatch/ratio_mean"], np.exp(true_logp - batch.old_logprobs)[cm].mean(), rtol=1e-4
    )
    np.testing.assert_allclose(metrics["entropy"], np.asarray(true_ent)[cm].mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["tokens/completion"], cm.sum())
    np.testing.assert_allclose(metrics["reward/mean"], batch.rewards.mean(), rtol=1e-6)


# ----------------------------------------------------------------------------------------------- keep vs mask
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_mask_vs_keep_closed_form(config, params, aggregation):
    """grpo gives degenerate groups A = 0, so their tokens add 0 to the numerator; keep divides by all tokens
    (or sequences), mask only by the informative ones: loss_mask = loss_keep · N_all / N_informative, and the
    gradient scales by the same factor."""
    rewards = np.array([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0]], np.float32)  # groups 0, 2 degenerate
    raw = make_batch_np(6, 4, 4, rewards)
    batch = to_batch(config, params, raw, noise=0.2)
    out = {}
    for mode in ("keep", "mask", "resample") if aggregation == "token-mean" else ("keep", "mask"):
        algo = AlgoConfig(degenerate_groups=mode, aggregation=aggregation)
        out[mode] = ts.policy_gradient(config, algo, params, batch, temperature=TEMP)
    cm = raw["completion_mask"].reshape(4, 4, TC)
    informative = np.array([False, True, False, True])
    if aggregation == "token-mean":
        n_all, n_inf = cm.sum(), cm[informative].sum()
    else:
        n_all, n_inf = cm.any(-1).sum(), cm[informative].any(-1).sum()
    factor = n_all / n_inf
    assert factor > 1.5
    np.testing.assert_allclose(out["mask"][0], out["keep"][0] * factor, rtol=1e-5)
    assert_trees_close(out["mask"][1], jax.tree.map(lambda g: g * factor, out["keep"][1]), rtol=1e-4, atol=1e-8)
    if "resample" in out:  # resample treats leftover degenerate groups as mask does
        np.testing.assert_allclose(out["resample"][0], out["mask"][0], rtol=1e-6)


def test_pass_at_k_mask_drops_its_no_signal_groups_too(config, params):
    """pass@k (k = 2, G = 4) gives A = 0 to a group with fewer than k wrong answers ([1, 1, 1, 0]: every pair holds a
    success) although its rewards differ; mask takes it out of the denominators with the all-fail group, so
    loss_mask = loss_keep · N_all / N(groups 1 and 3)."""
    rewards = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0]], np.float32)
    assert not np.asarray(degeneracy.degenerate_mask(jnp.asarray(rewards)))[0]  # not degenerate by its rewards
    np.testing.assert_array_equal(advantages.pass_at_k(jnp.asarray(rewards), k=2)[0], 0.0)
    raw = make_batch_np(7, 4, 4, rewards)
    batch = to_batch(config, params, raw, noise=0.2)
    out = {mode: ts.policy_gradient(config, AlgoConfig(degenerate_groups=mode, estimator="pass_at_k",
                                                       estimator_args={"k": 2}), params, batch, temperature=TEMP)
           for mode in ("keep", "mask")}  # fmt: skip
    cm = raw["completion_mask"].reshape(4, 4, TC)
    factor = cm.sum() / cm[np.array([False, True, False, True])].sum()
    np.testing.assert_allclose(out["mask"][0], out["keep"][0] * factor, rtol=1e-5)
    assert_trees_close(out["mask"][1], jax.tree.map(lambda g: g * factor, out["keep"][1]), rtol=1e-4, atol=1e-8)


# ----------------------------------------------------------------------------------------------- accumulation
@pytest.mark.parametrize("aggregation,accums", [("token-mean", (4,)), ("seq-mean-token-mean", (2,))])
def test_grad_accumulation_equals_unsplit_batch(config, params, aggregation, accums):
    P, G = 8, 2
    # groups 0 and 4 are long, the rest short: the 4 micro-batches (group p -> p mod 4) hold unequal token counts
    clen = np.where(np.arange(P * G) // G % 4 == 0, TC, 1)
    raw = make_batch_np(9, P, G, clen=clen)
    raw["rewards"][:, 0], raw["rewards"][:, 1] = 1.0, 0.0  # every group informative...
    raw["valid"][0, 1] = False  # ...but group 0 lost a sample: micro-batch 0 holds fewer sequences too
    batch = to_batch(config, params, raw, noise=0.2)
    base = AlgoConfig(aggregation=aggregation, clip_high=0.3)
    loss1, g1, m1 = ts.policy_gradient(config, base, params, batch, temperature=TEMP)
    for accum in accums:
        algo = dataclasses.replace(base, grad_accum_steps=accum)
        loss, g, m = ts.policy_gradient(config, algo, params, batch, temperature=TEMP)
        np.testing.assert_allclose(loss, loss1, rtol=1e-5)
        assert_trees_close(g, g1, rtol=1e-4, atol=1e-8)
        for k in ("pg_loss", "clip/low_frac", "clip/high_frac", "ratio/mean", "ratio/max", "ratio/min"):
            np.testing.assert_allclose(m[k], m1[k], rtol=1e-5, atol=1e-7, err_msg=k)
    # The naive alternative (average of per-micro-batch losses) differs here, so the test can tell them apart.
    mask = raw["completion_mask"]
    split = np.arange(P).repeat(G) % 4
    ref_fn = lambda sel: reference_loss_fn(config, base, to_batch_rows(batch, sel))(params)
    naive = np.mean([ref_fn(split == s) for s in range(4)])
    assert abs(naive - float(loss1)) > 1e-3 * abs(float(loss1)), (naive, loss1, mask.sum())


def to_batch_rows(batch: ts.Batch, rows: np.ndarray) -> ts.Batch:
    G = batch.rewards.shape[1]
    groups = rows.reshape(-1, G)[:, 0]
    sel = lambda x: None if x is None else np.asarray(x)[rows]
    return ts.Batch(
        tokens=sel(batch.tokens), prompt_mask=sel(batch.prompt_mask), completion_mask=sel(batch.completion_mask),
        rewards=np.asarray(batch.rewards)[groups], valid=np.asarray(batch.valid)[groups],
        old_logprobs=sel(batch.old_logprobs), ref_logprobs=sel(batch.ref_logprobs),
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------- μ and minibatches
def test_mu_iterations_and_minibatches_equal_sequential_steps(config, params):
    """μ = 2 over one rollout = two μ = 1 steps on the same rollout (same sampler log-probs, constant lr);
    num_minibatches = 2 = one step on the even groups then one on the odd groups (group p -> minibatch p mod 2)."""
    raw = make_batch_np(10, 4, 2)
    raw["rewards"][:] = [[1, 0], [0, 1], [1, 0], [0, 1]]
    batch = to_batch(config, params, raw, noise=0.0)
    optim = OptimConfig(learning_rate=3e-3, max_grad_norm=0.0)

    def run(algo, batches):
        init_fn, step_fn = ts.make_train_step(config, algo, optim, temperature=TEMP, total_steps=4)
        state = init_fn(fresh(params), jax.random.key(0))
        ms = []
        for b in batches:
            state, m = step_fn(state, b)
            ms.append(m)
        return state.params, ms

    p_mu2, (m_mu2,) = run(AlgoConfig(num_iterations=2), [batch])
    p_seq, (m_a, m_b) = run(AlgoConfig(), [batch, batch])
    assert_trees_close(p_mu2, p_seq, rtol=1e-5, atol=1e-7)
    # sampler == trainer at the first iteration (noise 0): ratio 1; the second iteration moved away from it
    np.testing.assert_allclose(m_a["ratio/max"], 1.0, rtol=1e-5)
    assert float(m_b["ratio/max"]) > 1.0 + 1e-4 and float(m_b["approx_kl_old"]) > 0
    assert float(m_mu2["ratio/max"]) > 1.0 + 1e-4
    np.testing.assert_allclose(m_mu2["mismatch/abs_diff_mean"], 0.0, atol=1e-6)  # measured before any update

    even, odd = np.arange(8) // 2 % 2 == 0, np.arange(8) // 2 % 2 == 1
    p_mb2, _ = run(AlgoConfig(num_minibatches=2), [batch])
    p_halves, _ = run(AlgoConfig(), [to_batch_rows(batch, even), to_batch_rows(batch, odd)])
    # float32 rounding: the two paths sum the same gradients in another order, and AdamW's normalised update turns
    # a last-bit gradient difference on a near-zero entry into ~1e-7 of a parameter (a wrong split moves ~lr = 3e-3)
    assert_trees_close(p_mb2, p_halves, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------- compilation
def test_no_recompilation_across_completion_lengths(config, params):
    """Steps whose completion lengths (and rewards) differ reuse one compiled step; `mask` mode's metrics count
    the dropped degenerate group."""
    algo = AlgoConfig(degenerate_groups="mask")
    init_fn, step_fn = ts.make_train_step(config, algo, OptimConfig(), temperature=TEMP, total_steps=3)
    compiled_before = step_fn._cache_size()
    state = init_fn(fresh(params), jax.random.key(0))
    for seed, clen in ((0, 1), (1, TC), (2, 3)):
        rewards = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], np.float32) if seed == 1 else None
        raw = make_batch_np(seed, 2, 4, rewards, clen=np.full(8, clen))
        state, m = step_fn(state, to_batch(config, params, raw))
        np.testing.assert_allclose(m["tokens/completion"], 8 * clen)
        if seed == 1:  # group 0 is degenerate: dropped from the loss and its token count
            assert float(m["degeneracy/masked_groups"]) == 1.0
            assert float(m["degeneracy/collapse_rate"]) == 0.5
            np.testing.assert_allclose(m["tokens/loss"], 4 * TC)
    # make_train_step is memoized, so an earlier test may have compiled this program for another batch shape already
    assert step_fn._cache_size() - compiled_before <= 1
    assert int(state.step) == 3


def test_one_program_for_runs_that_differ_in_schedule_numbers(config, params):
    """The learning rate, warmup, min_lr_ratio and run length are runtime values: `make_train_step` hands every run
    that differs only in them the same jitted program, compiled once; each run's ``lr`` is its own closed form
    (constant ``lr``; warmup from ``lr/W``; cosine ``½(1 + cos(π·t/T))``). A static field (AdamW's b1) is another
    program."""
    base = dict(max_grad_norm=0.05, weight_decay=0.1)  # the static fields of the AdamW test above: its program
    runs = [  # (optimizer, total_steps, lr at steps 0 and 1)
        (OptimConfig(learning_rate=1e-3, **base), 10, [1e-3, 1e-3]),
        (OptimConfig(learning_rate=2e-3, warmup_steps=2, **base), 7, [1e-3, 2e-3]),
        (OptimConfig(learning_rate=4e-3, warmup_steps=1, **base), 3, [4e-3, 4e-3]),
    ]
    batch = to_batch(config, params, make_batch_np(5, 2, 4))
    before = ts.make_train_step(config, AlgoConfig(), runs[0][0], temperature=TEMP, total_steps=1)[1]._cache_size()
    fns, params_after_1 = [], []
    for optim_cfg, total, lrs in runs:
        init_fn, step_fn = ts.make_train_step(config, AlgoConfig(), optim_cfg, temperature=TEMP, total_steps=total)
        fns.append(step_fn)
        state = init_fn(fresh(params), jax.random.key(7))
        for t in range(2):
            state, m = step_fn(state, batch)
            np.testing.assert_allclose(m["lr"], lrs[t], rtol=1e-6)
            if t == 0:
                params_after_1.append(jax.tree.map(np.asarray, state.params))
    assert fns[0].jitted is fns[1].jitted is fns[2].jitted
    assert fns[0]._cache_size() - before <= 1  # one batch shape: at most one compile for the three runs
    # the first two runs take their first step at the same rate (1e-3): the same update, bit for bit
    chex.assert_trees_all_equal(params_after_1[0], params_after_1[1])
    cos = [ts.make_train_step(config, AlgoConfig(), OptimConfig(learning_rate=1.0, schedule="cosine", min_lr_ratio=0.0,
                                                                **base), temperature=TEMP, total_steps=T)[1]
           for T in (2, 4)]  # fmt: skip
    assert cos[0].jitted is cos[1].jitted is not fns[0].jitted  # the schedule's kind is part of the program
    other = ts.make_train_step(config, AlgoConfig(), OptimConfig(learning_rate=1e-3, b1=0.8, **base),
                               temperature=TEMP, total_steps=10)[1]  # fmt: skip
    assert other.jitted is not fns[0].jitted
    # the KL reference pass is memoized on the model and the sampling settings the same way
    perf = PerfConfig(attention="dense")
    ref = ts.reference_logprobs_fn(config, TEMP, perf, 0, 1.0)
    assert ts.reference_logprobs_fn(config, TEMP, perf, 0, 1.0) is ref is not ts.reference_logprobs_fn(config, TEMP,
                                                                                                        perf, 5, 1.0)
    assert ts.reference_logprobs_fn(config, TEMP, PerfConfig(attention="chunked"), 0, 1.0) is not ref
    ts.release_programs()
    assert ts.reference_logprobs_fn(config, TEMP, perf, 0, 1.0) is not ref
    for step_fn, T in zip(cos, (2, 4)):
        want = 0.5 * (1 + math.cos(math.pi / T))
        np.testing.assert_allclose(optim.schedule_value("cosine", step_fn.hparams, 1), want, rtol=1e-6)


# ----------------------------------------------------------------------------------------------- optimizer
def test_schedule_closed_form():
    cos = OptimConfig(learning_rate=1.0, schedule="cosine", warmup_steps=4, min_lr_ratio=0.1)
    s = optim.make_schedule(cos, total_steps=14)
    np.testing.assert_allclose([s(i) for i in range(4)], [0.25, 0.5, 0.75, 1.0], rtol=1e-6)
    for i in (4, 7, 9, 14, 20):
        prog = min((i - 4) / 10, 1.0)
        np.testing.assert_allclose(s(i), 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)), rtol=1e-5)
    const = optim.make_schedule(OptimConfig(learning_rate=2.0, warmup_steps=2), total_steps=5)
    np.testing.assert_allclose([const(i) for i in range(5)], [1.0, 2.0, 2.0, 2.0, 2.0])
    np.testing.assert_allclose(optim.make_schedule(OptimConfig(learning_rate=3.0), 5)(0), 3.0)
    # the optimizer sees schedule(update_count // updates_per_step)
    tx, sched = optim.make_optimizer(OptimConfig(learning_rate=1.0, warmup_steps=4, max_grad_norm=0.0), 10,
                                  updates_per_step=2)  # fmt: skip
    p = {"w": jnp.ones(())}
    st = tx.init(p)
    lrs = []
    for _ in range(4):  # sgd-like magnitude: first Adam step moves by lr exactly (|m̂/√v̂| = 1)
        u, st = tx.update({"w": jnp.ones(())}, st, p)
        lrs.append(-float(u["w"]))
    np.testing.assert_allclose(lrs, [0.25, 0.25, 0.5, 0.5], rtol=1e-4)


def test_bad_inputs_raise_clear_errors(config, params):
    with pytest.raises(ValueError, match="degenerate_groups"):
        ts.make_train_step(config, AlgoConfig(degenerate_groups="drop"), OptimConfig(), total_steps=1)
    with pytest.raises(ValueError, match="temperature"):
        ts.make_train_step(config, AlgoConfig(), OptimConfig(), temperature=0.0, total_steps=1)
    with pytest.raises(ValueError, match="schedule"):
        optim.make_optimizer(OptimConfig(schedule="linear"), 10)
    batch = to_batch(config, params, make_batch_np(0, 2, 2))
    with pytest.raises(ValueError, match="ref_logprobs"):
        ts.policy_gradient(config, AlgoConfig(kl_coef=0.1), params, batch, temperature=TEMP)
    with pytest.raises(ValueError, match="skip the reference forward"):  # kl_coef = 0: no reference log-probs
        with_ref = to_batch(config, params, make_batch_np(0, 2, 2), kl=True)
        ts.policy_gradient(config, AlgoConfig(), params, with_ref, temperature=TEMP)
    with pytest.raises(ValueError, match="multiple of 4"):
        ts.policy_gradient(config, AlgoConfig(grad_accum_steps=4), params, batch, temperature=TEMP)
