# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The fused LM head (`jaxgrpo.learner.fused_head`, Pallas kernels run by the interpreter on CPU) against a float64
NumPy log-softmax / gather / entropy and its closed-form gradient computed by hand (``dz = g (onehot − p) / τ``,
``dh = dz Wᵀ``, ``dW = hᵀ dz``), against autodiff of a plain jnp log-softmax, and through `compute_logprobs`
against its chunked XLA head: values and gradients of a policy loss, with LoRA, and on the 8-device mesh."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from jaxgrpo import losses, models, sharding
from jaxgrpo.learner import fused_head
from jaxgrpo.learner import train_step as ts
from jaxgrpo.learner.fused_head import Blocks
from tests.model_helpers import random_params
from tests.test_train_step import TC, TEMP, make_batch_np, tiny_config

SMALL = Blocks(bm=16, bv=16, bk=16, rows_per_chunk=16)  # several row, vocabulary and D blocks at the tiny sizes


def numpy_reference(h, w_VD, t, g, temperature):
    """float64: logp, entropy, and the gradients of ``Σ g · logp`` in ``h`` and ``W [V, D]``, by hand."""
    h, w = np.asarray(h, np.float64), np.asarray(w_VD, np.float64)
    z = h @ w.T / temperature
    m = z.max(1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(1, keepdims=True)))[:, 0]
    p = np.exp(z - lse[:, None])
    n = np.arange(len(t))
    onehot = np.zeros_like(z)
    onehot[n, t] = 1.0
    dz = np.asarray(g, np.float64)[:, None] * (onehot - p) / temperature
    return z[n, t] - lse, lse - (p * z).sum(1), dz @ w, dz.T @ h


def draw(n, d, v, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(n, d)).astype(dtype)
    w = (0.5 * rng.normal(size=(v, d))).astype(dtype)
    return h, w, rng.integers(0, v, n).astype(np.int32), rng.normal(size=n).astype(np.float32)


@pytest.mark.parametrize("vocab_major,n,d,v,use_jit", [
    (True, 37, 40, 75, True),  # rows, D and V padded to the blocks
    (False, 37, 40, 75, True),  # a [D, V] head
    (True, 32, 32, 96, False),  # sizes that divide, without jit
])  # fmt: skip
def test_float32_values_and_gradients_against_float64(vocab_major, n, d, v, use_jit):
    h, w_VD, t, g = draw(n, d, v)
    w = w_VD if vocab_major else w_VD.T.copy()

    def objective(h, w):
        logp, ent = fused_head.fused_logprobs(h, t, w, temperature=0.7, vocab_major=vocab_major, blocks=SMALL)
        return jnp.sum(g * logp), (logp, ent)

    fn = jax.value_and_grad(objective, (0, 1), has_aux=True)
    (_, (logp, ent)), (dh, dw) = (jax.jit(fn) if use_jit else fn)(h, w)
    want_logp, want_ent, want_dh, want_dw = numpy_reference(h, w_VD, t, g, 0.7)
    np.testing.assert_allclose(logp, want_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, want_ent, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dh, want_dh, rtol=1e-4, atol=1e-5 * np.abs(want_dh).max())
    np.testing.assert_allclose(dw if vocab_major else dw.T, want_dw, rtol=1e-4, atol=1e-5 * np.abs(want_dw).max())
    assert dw.shape == w.shape and dw.dtype == jnp.float32


def test_gradients_match_autodiff_of_a_plain_log_softmax_and_entropy_is_constant():
    h, w, t, g = draw(24, 32, 48, seed=1)

    def plain(h, w):
        logp = jax.nn.log_softmax(h @ w.T / 1.3, axis=-1)
        return jnp.sum(g * jnp.take_along_axis(logp, t[:, None], axis=1)[:, 0])

    def fused(h, w):
        return jnp.sum(g * fused_head.fused_logprobs(h, t, w, temperature=1.3, blocks=SMALL)[0])

    for got, want in zip(jax.grad(fused, (0, 1))(h, w), jax.grad(plain, (0, 1))(h, w)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(jnp.abs(want).max()))
    ent_grad = jax.grad(lambda h: jnp.sum(fused_head.fused_logprobs(h, t, w, blocks=SMALL)[1]))(h)
    assert float(jnp.abs(ent_grad).max()) == 0.0  # a statistic, as in the XLA head


def test_bfloat16_within_stated_tolerance():
    """bf16 ``h`` and float32 master ``W`` (cast to bf16 inside): the forward accumulates bf16 products in float32,
    so logp/entropy are within 1e-4 of float64 on the bf16-rounded inputs; the backward rounds ``dz`` to bf16
    (relative 2⁻⁸), so the gradients are within 1% (max-normalised) of the float64 ones."""
    h, w, t, g = draw(40, 64, 112, seed=2)
    h16 = jnp.asarray(h, jnp.bfloat16)
    w16 = np.asarray(jnp.asarray(w, jnp.bfloat16).astype(jnp.float32))

    def objective(h, w):
        logp, ent = fused_head.fused_logprobs(h, t, w, temperature=0.9, blocks=SMALL)
        return jnp.sum(g * logp), (logp, ent)

    (_, (logp, ent)), (dh, dw) = jax.jit(jax.value_and_grad(objective, (0, 1), has_aux=True))(h16, w)
    want_logp, want_ent, want_dh, want_dw = numpy_reference(np.asarray(h16.astype(jnp.float32)), w16, t, g, 0.9)
    np.testing.assert_allclose(logp, want_logp, atol=1e-4)
    np.testing.assert_allclose(ent, want_ent, atol=1e-4)
    assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
    for got, want in ((dh, want_dh), (dw, want_dw)):
        assert np.abs(np.asarray(got, np.float64) - want).max() <= 1e-2 * np.abs(want).max()


def test_bad_shapes_and_temperature_are_one_line_errors():
    h, w, t, _ = draw(8, 16, 32)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        fused_head.fused_logprobs(h, t, w, temperature=0.0)
    with pytest.raises(ValueError, match="does not match hidden size"):
        fused_head.fused_logprobs(h, t, w, vocab_major=False)


# -- through compute_logprobs: the fused head against the chunked XLA head of the same batch


def policy_objective(config, lm_head):
    def f(params, batch):
        logp, ent = ts.compute_logprobs(config, params, batch, TEMP, lm_head=lm_head)
        adv = jnp.linspace(-1.0, 1.0, logp.shape[0])[:, None] * jnp.ones_like(logp)
        loss, _ = losses.policy_loss(logp, jax.lax.stop_gradient(logp) - 0.05, adv, batch.completion_mask)
        return loss, (logp, ent)

    return jax.value_and_grad(f, has_aux=True)


def rows(raw):
    return ts.Batch(tokens=jnp.asarray(raw["tokens"]), prompt_mask=jnp.asarray(raw["prompt_mask"]),
                    completion_mask=jnp.asarray(raw["completion_mask"]), rewards=jnp.asarray(raw["rewards"]),
                    valid=jnp.asarray(raw["valid"]), old_logprobs=jnp.zeros(raw["noise"].shape))  # fmt: skip


def assert_same(got, want, tol):
    (loss, (logp, ent)), grads = got
    (loss0, (logp0, ent0)), grads0 = want
    np.testing.assert_allclose(loss, loss0, rtol=tol, atol=tol)
    np.testing.assert_allclose(logp, logp0, atol=tol)
    np.testing.assert_allclose(ent, ent0, atol=tol)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads0)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, atol=tol * max(float(jnp.abs(b).max()), 1e-6), rtol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_compute_logprobs_fused_equals_xla_head(lora):
    config = tiny_config()
    params = random_params(config, scale=0.3)
    if lora:
        from jaxgrpo.models import lora as lora_lib

        config = config.replace(lora=models.LoraSpec(rank=4, alpha=8.0))
        params = lora_lib.add_adapters(config, params, jax.random.key(0))
    batch = rows(make_batch_np(3, 2, 4))
    fused = jax.jit(policy_objective(config, "fused"))(params, batch)
    xla = jax.jit(policy_objective(config, "xla"))(params, batch)
    assert_same(fused, xla, 2e-5)
    # on CPU "auto" lowers the XLA head: the same numbers bit for bit
    auto = jax.jit(policy_objective(config, "auto"))(params, batch)
    assert all(bool(jnp.all(a == b)) for a, b in zip(jax.tree.leaves(auto), jax.tree.leaves(xla)))


def test_compute_logprobs_fused_on_the_8_device_mesh():
    """Rows sharded over the 8 CPU devices (GSPMD), parameters replicated: the fused head (interpreted) gives the
    single-device XLA head's loss, log-probs and gradients."""
    config = tiny_config()
    params = random_params(config, scale=0.3)
    batch = rows(make_batch_np(4, 2, 4))
    mesh = sharding.make_mesh(8, 1, 1)
    spread = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, PartitionSpec(
        sharding.BATCH_AXES, *[None] * (x.ndim - 1)))) if x.ndim and x.shape[0] == 8 else x, batch)  # fmt: skip
    fused = jax.jit(policy_objective(config, "fused"))(params, spread)
    want = jax.jit(policy_objective(config, "xla"))(params, batch)
    assert_same(fused, want, 2e-5)
    assert TC == batch.completion_mask.shape[1] and fused[0][1][0].sharding.spec[0] is not None


def test_fused_refuses_truncation_and_auto_keeps_it():
    config = tiny_config()
    params = random_params(config, scale=0.3)
    batch = rows(make_batch_np(5, 1, 2))
    with pytest.raises(ValueError, match="no top-k/top-p truncation"):
        ts.compute_logprobs(config, params, batch, TEMP, lm_head="fused", top_k=5)
    with pytest.raises(ValueError, match="lm_head must be"):
        ts.compute_logprobs(config, params, batch, TEMP, lm_head="pallas")
    auto = ts.compute_logprobs(config, params, batch, TEMP, top_k=5)
    xla = ts.compute_logprobs(config, params, batch, TEMP, lm_head="xla", top_k=5)
    np.testing.assert_array_equal(auto[0], xla[0])


@pytest.mark.slow
def test_policy_gradient_through_the_fused_head(monkeypatch):
    """The train step's loss and gradients (`train_step.policy_gradient`: prefix sharing, the clipped loss, grouped
    advantages, a degenerate group masked) with the fused head in place of the XLA one, against jax.grad of the
    independent full-logits reference loss that `tests/test_train_step.py` holds the XLA head's step to."""
    from jaxgrpo.config import AlgoConfig
    from jaxgrpo.learner import minibatch
    from tests.test_train_step import reference_loss_fn, to_batch

    config = tiny_config()
    params = random_params(config, scale=0.3)
    rewards = np.array([[1, 0, 0, 1], [1, 1, 1, 1]], np.float32)
    batch = to_batch(config, params, make_batch_np(6, 2, 4, rewards), noise=0.2)
    algo = AlgoConfig()
    fused = functools.partial(ts.compute_logprobs, lm_head="fused")
    monkeypatch.setattr(minibatch, "compute_logprobs", fused)
    loss, grads, metrics = ts.policy_gradient(config, algo, params, batch, temperature=TEMP)
    ref_loss, ref_grads = jax.jit(jax.value_and_grad(reference_loss_fn(config, algo, batch)))(params)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        # float32 sums over the batch's tokens in two orders: a small entry's error is relative to the leaf's largest
        # (1.3e-6 seen on a -9e-4 entry of a leaf whose largest is 0.35; 1e-6 flaked under load)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(float(jnp.abs(b).max()), 0.1))
    assert all(bool(jnp.isfinite(v).all()) for v in jax.tree.leaves(metrics))




def test_head_tiles_benchmark_times_every_tiling_and_they_agree(tmp_path, capsys):
    """benchmarks/head_tiles.py (the GPU session's tiling A/B) at a tiny shape in the Pallas interpreter: one row per
    tiling plus the XLA head, their log-probs equal to the first tiling's up to float32 summation order (the XLA head
    is an independent implementation), the JSON written; a tile of fewer than five numbers is refused in one line."""
    import benchmark_module

    head_tiles = benchmark_module.load("head_tiles")
    out = head_tiles.main(["--tokens", "40", "--hidden", "32", "--vocab", "200", "--tiles", "16,128,32,4,2",
                           "32,64,16,4,3", "--repeats", "1", "--out", str(tmp_path / "h.json")])  # fmt: skip
    rows = out["results"]
    assert list(rows) == ["fused bm=16 bv=128 bk=32 warps=4 stages=2", "fused bm=32 bv=64 bk=16 warps=4 stages=3",
                          "xla chunked"]  # fmt: skip
    for r in rows.values():
        assert r["forward_s"] > 0 and r["forward_backward_s"] > 0
        assert r["max_abs_diff_logp"] < 1e-4
    assert rows["fused bm=16 bv=128 bk=32 warps=4 stages=2"]["max_abs_diff_logp"] == 0.0
    assert (tmp_path / "h.json").exists()
    for bad in ("64,128", "64,128,64,4,x", "0,128,64,4,2"):
        with pytest.raises(SystemExit):
            head_tiles.main(["--tiles", bad])
        assert "is not bm,bv,bk,num_warps,num_stages" in capsys.readouterr().err
