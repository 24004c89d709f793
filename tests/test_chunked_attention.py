# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Memory-efficient (online-softmax, key-chunked) attention equals the plain kernels of `models.attention`, in values
and gradients, with padding, GQA, chunks that do not divide the key length, and queries that see no key. The cuDNN
kernel's masks and layout (`attention.attend_fused`) are checked the same way through `jax.nn.dot_product_attention`'s
XLA implementation (cuDNN itself needs a GPU: `benchmarks/gpu.py` compares it with the plain kernel there), and
`perf.resolve_perf` picks it only where it exists."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from model_helpers import rel_err

from jaxgrpo.models import attention, chunked


def _grads(fn, args):
    w = jax.random.normal(jax.random.key(9), jax.eval_shape(fn, *args).shape)
    return jax.grad(lambda *a: jnp.sum(fn(*a) * w), argnums=tuple(range(len(args))))(*args)


@pytest.mark.parametrize("chunk", [3, 4, 16])
def test_chunked_equals_plain_attention(chunk):
    B, T, K, R, H = 3, 7, 2, 2, 8
    ks = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(ks[0], (B, T, K, R, H))
    k, v = jax.random.normal(ks[1], (B, T, K, H)), jax.random.normal(ks[2], (B, T, K, H))
    valid = np.ones((B, T), bool)
    valid[1, :3] = False  # left padding: queries 0..2 of row 1 see no key
    valid[2, 5:] = False  # right padding
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    valid_j = jnp.asarray(valid)
    plain = lambda q, k, v: attention.attend(q, k, v, attention.causal_mask(valid_j))  # noqa: E731
    fast = lambda q, k, v: chunked.attend_chunked(q, k, v, valid_j, pos, pos, chunk)  # noqa: E731
    out, ref = jax.jit(fast)(q, k, v), plain(q, k, v)
    chex.assert_shape(out, (B, T, K, R, H))
    np.testing.assert_array_equal(out[1, :3], 0.0)
    assert rel_err(out, ref) < 1e-5
    for a, b in zip(jax.jit(lambda *x: _grads(fast, x))(q, k, v), _grads(plain, (q, k, v))):
        chex.assert_tree_all_finite(a)
        assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("chunk", [2, 5])
def test_shared_prefix_chunked_equals_plain(chunk):
    P, G, T, K, R, H, Tp = 2, 3, 4, 2, 2, 8, 5
    ks = jax.random.split(jax.random.key(1), 5)
    q = jax.random.normal(ks[0], (P * G, T, K, R, H))
    kp, vp = jax.random.normal(ks[1], (P, K, Tp, H)), jax.random.normal(ks[2], (P, K, H, Tp))
    ko, vo = jax.random.normal(ks[3], (P * G, K, T, H)), jax.random.normal(ks[4], (P * G, K, H, T))
    pmask = np.ones((P, Tp), bool)
    pmask[0, :2] = False
    pmask[1] = False  # prompt 1 has no prefix slot: its rows see only their own keys
    own = np.ones((P * G, T), bool)
    own[4, 0] = False  # row 4 (a prompt-1 row), query 0 sees no key at all
    own[5, 2:] = False
    own_j, pmask_j = jnp.asarray(own), jnp.asarray(pmask)
    plain = lambda q, kp, vp, ko, vo: attention.attend_shared_prefix(  # noqa: E731
        q, kp, vp, pmask_j, ko, vo, attention.causal_mask(own_j))
    fast = lambda q, kp, vp, ko, vo: chunked.attend_shared_prefix_chunked(  # noqa: E731
        q, kp, vp, pmask_j, ko, vo, own_j, chunk)
    args = (q, kp, vp, ko, vo)
    out, ref = jax.jit(fast)(*args), plain(*args)
    np.testing.assert_array_equal(out[4, 0], 0.0)
    assert rel_err(out, ref) < 1e-5
    for a, b in zip(jax.jit(lambda *x: _grads(fast, x))(*args), _grads(plain, args)):
        chex.assert_tree_all_finite(a)
        assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("prefix_sharing", [False, True])
def test_train_step_with_chunked_attention_equals_dense(prefix_sharing):
    from test_train_step import TEMP, make_batch_np, tiny_config, to_batch

    from jaxgrpo import models
    from jaxgrpo.config import AlgoConfig, PerfConfig
    from jaxgrpo.learner import train_step as ts

    config = tiny_config()
    params = models.init_params(config, jax.random.key(0))
    batch = to_batch(config, params, make_batch_np(3, 4, 3), noise=0.2)
    algo = AlgoConfig(grad_accum_steps=2)

    def run(kind):
        perf = PerfConfig(prefix_sharing=prefix_sharing, attention=kind, attention_chunk=3)
        lengths = np.asarray(batch.prompt_mask)[::3].sum(1)
        width = ts.packed_prompt_width(lengths, batch.prompt_mask.shape[1], algo, perf)
        return ts.policy_gradient(config, algo, params, batch, perf=perf, temperature=TEMP, packed_prompt_width=width)

    (l0, g0, _), (l1, g1, _) = run("dense"), run("chunked")
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        assert rel_err(a, b) < 1e-5
    assert float(jnp.abs(jax.tree.leaves(g0)[0]).max()) > 0


def test_train_step_with_chunked_attention_under_a_mesh_equals_dense_on_one_device():
    """Chunked attention inside the step with the batch and params sharded over data=2 x fsdp=2: the dense,
    single-device loss and gradient."""
    from test_train_step import TEMP, make_batch_np, tiny_config, to_batch

    from jaxgrpo import models, sharding
    from jaxgrpo.config import AlgoConfig, PerfConfig
    from jaxgrpo.learner import train_step as ts

    config = tiny_config()
    params = models.init_params(config, jax.random.key(0))
    batch = to_batch(config, params, make_batch_np(3, 4, 3), noise=0.2)
    algo = AlgoConfig()
    dense = PerfConfig(prefix_sharing=False, attention="dense")
    l0, g0, _ = ts.policy_gradient(config, algo, params, batch, perf=dense, temperature=TEMP)
    mesh = sharding.make_mesh(2, 2, 1, devices=jax.devices()[:4])
    chunked_perf = PerfConfig(prefix_sharing=False, attention="chunked", attention_chunk=3)
    sharded = sharding.shard_params(jax.tree.map(jnp.copy, params), config, mesh)
    l1, g1, _ = ts.policy_gradient(config, algo, sharded, ts.global_batch(batch, mesh), perf=chunked_perf,
                                   temperature=TEMP, mesh=mesh)  # fmt: skip
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        assert rel_err(a, b) < 1e-5


def test_fused_kernel_equals_plain_attention():
    """`attention.causal` and `attention.shared_prefix` with kind "cudnn" (its masks, GQA head layout, repeated prefix
    and zeroed key-less queries) through the XLA implementation of `jax.nn.dot_product_attention`."""
    from jaxgrpo.models.layers import LayerContext

    fused = attention.Kernel("cudnn", implementation="xla")
    B, T, K, R, H = 3, 7, 2, 2, 8
    ks = jax.random.split(jax.random.key(2), 3)
    q = jax.random.normal(ks[0], (B, T, K, R, H))
    k, v = jax.random.normal(ks[1], (B, T, K, H)), jax.random.normal(ks[2], (B, T, K, H))
    valid = np.ones((B, T), bool)
    valid[1, :3] = False
    valid[2, 5:] = False
    ctx = LayerContext(index=jnp.zeros((), jnp.int32), state=None, inputs=None, earlier=())
    plain = lambda q, k, v: attention.causal(jnp.asarray(valid))(q, k, v, ctx)[0]  # noqa: E731
    fast = lambda q, k, v: attention.causal(jnp.asarray(valid), fused)(q, k, v, ctx)[0]  # noqa: E731
    out = jax.jit(fast)(q, k, v)
    np.testing.assert_array_equal(out[1, :3], 0.0)
    assert rel_err(out, plain(q, k, v)) < 1e-5
    for a, b in zip(jax.jit(lambda *x: _grads(fast, x))(q, k, v), _grads(plain, (q, k, v))):
        assert rel_err(a, b) < 1e-5

    P, Tp = 1, 4  # one prompt shared by the 3 rows
    kp, vp = jax.random.normal(ks[1], (P, K, Tp, H)), jax.random.normal(ks[2], (P, K, H, Tp))
    pmask = jnp.asarray([[False, True, True, True]])
    shared = lambda kernel: lambda q, k, v, kp, vp: attention.shared_prefix(  # noqa: E731
        pmask, jnp.asarray(valid), kernel)(q, k, v, ctx._replace(earlier=((kp, vp),)))[0]
    args = (q, k, v, kp, vp)
    assert rel_err(jax.jit(shared(fused))(*args), shared(attention.DENSE)(*args)) < 1e-5
    for a, b in zip(jax.jit(lambda *x: _grads(shared(fused), x))(*args), _grads(shared(attention.DENSE), args)):
        assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize(
    "platform, dtype, requested, expected",
    [("cpu", "float32", "auto", "dense"), ("gpu", "bfloat16", "auto", "cudnn"), ("gpu", "float32", "auto", "chunked"),
     ("tpu", "bfloat16", "auto", "chunked"), ("gpu", "float16", "cudnn", "cudnn"),
     ("tpu", "bfloat16", "cudnn", "chunked"), ("cpu", "float32", "chunked", "chunked")],
)  # fmt: skip
def test_resolve_attention_kernel(platform, dtype, requested, expected):
    from jaxgrpo.config import AlgoConfig, PerfConfig
    from jaxgrpo.learner.perf import resolve_perf

    perf, notes = resolve_perf(AlgoConfig(), PerfConfig(attention=requested), num_shards=1, platform=platform,
                               compute_dtype=dtype)  # fmt: skip
    assert perf.attention == expected
    assert any("perf.attention" in n for n in notes) == (requested == "cudnn" and expected != "cudnn")
