# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for jaxgrpo.sampling: exact logprobs (teacher forcing through `models.forward`), truncation kernels
(chi-square against a NumPy reimplementation of top-k / nucleus sampling), EOS handling, determinism, bucketing /
jit-cache bounds, sharded == unsharded on 8 fake CPU devices, input validation, and greedy parity with HF
transformers on SmolLM2-135M (slow)."""

from __future__ import annotations

import dataclasses
import functools
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from multihost import run_two_processes

from jaxgrpo import models, padding, sampling, sharding, token_sampling
from jaxgrpo.rollout import engine

# ----------------------------------------------------------------------------------------------------------------------
# helpers


def _np_truncated_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Reference sampling distribution over the vocabulary (float64): temperature, then top-k, then nucleus."""
    z = np.asarray(logits, np.float64) / temperature
    order = sorted(range(len(z)), key=lambda j: (-z[j], j))  # descending, ties: lower id first
    if top_k > 0:
        order = order[:top_k]
    w = np.exp(z[order] - z[order].max())
    w /= w.sum()
    kept, mass = [], 0.0
    for j, q in zip(order, w):
        if mass >= top_p:
            break
        kept.append(j)
        mass += q
    probs = np.zeros(len(z))
    e = np.exp(z[kept] - z[kept].max())
    probs[kept] = e / e.sum()
    return probs


def _teacher_forced_logits(config, params, prompts, comp: sampling.Completions, num_samples: int) -> np.ndarray:
    """Logits [N, M, V] predicting each completion token, from one full-sequence `models.forward` (no cache)."""
    m = comp.tokens.shape[1]
    width = max(len(p) for p in prompts)
    rows, masks = [], []
    for r in range(len(prompts) * num_samples):
        p = prompts[r // num_samples]
        toks = np.zeros(width + m, np.int32)
        mask = np.zeros(width + m, np.int32)
        toks[width - len(p) : width] = p
        mask[width - len(p) : width] = 1
        toks[width:] = np.asarray(comp.tokens[r])
        mask[width:] = np.asarray(comp.mask[r])
        rows.append(toks)
        masks.append(mask)
    logits = models.forward(config, params, jnp.asarray(np.stack(rows)), attention_mask=jnp.asarray(np.stack(masks)))
    return np.asarray(logits[:, width - 1 : width + m - 1], np.float64)


def _gather(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return np.take_along_axis(x, np.asarray(idx)[..., None], axis=-1)[..., 0]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


TINY = models.ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
    max_position_embeddings=64, rope_theta=10000.0,
)  # fmt: skip
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12], [13]]  # ragged
SHARDED_KW = dict(num_samples=2, max_new_tokens=5, top_p=0.9, eos_token_ids=(7,))  # the sharded / multi-host runs


def tiny_model():
    params = models.init_params(TINY, jax.random.key(0))
    # sharpen the output distribution (random init is nearly uniform) so that truncation and argmax matter
    params["lm_head"] = params["lm_head"] * (3.0 / jnp.std(params["lm_head"]) / np.sqrt(TINY.hidden_size))
    return TINY, params


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


def _check_completions(comp: sampling.Completions, n: int, m: int) -> None:
    chex.assert_shape([comp.tokens, comp.logprobs, comp.mask], (n, m))
    chex.assert_shape([comp.lengths, comp.truncated], (n,))
    chex.assert_type([comp.tokens, comp.logprobs, comp.mask, comp.lengths, comp.truncated],
                     [jnp.int32, jnp.float32, bool, jnp.int32, bool])  # fmt: skip
    chex.assert_tree_all_finite(comp.logprobs)
    np.testing.assert_array_equal(comp.lengths, np.asarray(comp.mask).sum(-1))
    assert np.all(np.asarray(comp.logprobs) <= 1e-6)


# ----------------------------------------------------------------------------------------------------------------------
# sampling kernels


class KernelTest(chex.TestCase):
    LOGITS = np.array([2.0, 1.1, 0.3, -0.2, 1.6, -1.0, 0.9, -3.0], np.float32)
    N = 30000

    def _draw(self, temperature, top_k, top_p):
        keys = jax.random.split(jax.random.key(1234), self.N)
        logits = jnp.broadcast_to(jnp.asarray(self.LOGITS), (self.N, len(self.LOGITS)))
        fn = self.variant(functools.partial(sampling.sample_from_logits, top_k=top_k,
                                            top_p=None if top_p == 1.0 else top_p))  # fmt: skip
        tokens, logp = fn(keys, logits, temperature)
        chex.assert_shape([tokens, logp], (self.N,))
        chex.assert_type([tokens, logp], [jnp.int32, jnp.float32])
        return np.asarray(tokens), np.asarray(logp)

    @chex.variants(with_jit=True, without_jit=True)
    def test_frequencies_match_truncated_distribution(self):
        cases = [(1.0, 0, 1.0, 256), (1.0, 3, 1.0, 256), (0.6, 4, 0.8, 256)]
        # top-p alone: the top-k fast path (8 <= 256 candidates) and, with 2 candidates, the full-sort fallback
        cases += [(t, 0, p, c) for t, p in [(1.0, 0.7), (1.7, 0.9)] for c in (256, 2)]
        for temperature, top_k, top_p, candidates in cases:
            expected = _np_truncated_probs(self.LOGITS, temperature, top_k, top_p)
            with mock.patch.object(token_sampling, "TOP_P_CANDIDATES", candidates):
                tokens, logp = self._draw(temperature, top_k, top_p)
            counts = np.bincount(tokens, minlength=len(self.LOGITS))
            kept = expected > 0
            case = (temperature, top_k, top_p, candidates, counts, self.N * expected)
            assert counts[~kept].sum() == 0, case
            if kept.sum() > 1:
                _, pval = scipy.stats.chisquare(counts[kept], self.N * expected[kept])
                # fixed key: deterministic; 1e-4 leaves room for any key while catching real bias at N = 30000
                assert pval > 1e-4, (case, pval)
            np.testing.assert_allclose(logp, np.log(expected[tokens]), atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_ties_are_broken_by_lower_token_id(self):
        keys = jax.random.split(jax.random.key(0), 4000)
        # top-k=2 on [2, 1, 1, 1, 0]: exactly tokens {0, 1} survive
        logits = jnp.broadcast_to(jnp.array([2.0, 1.0, 1.0, 1.0, 0.0]), (4000, 5))
        tokens, _ = self.variant(functools.partial(sampling.sample_from_logits, top_k=2))(keys, logits, 1.0)
        assert set(np.unique(tokens)) == {0, 1}
        # top-p=0.5 on a uniform distribution over 4: exactly ids {0, 1} (mass before id 2 is 0.5, not < 0.5)
        logits = jnp.zeros((4000, 4))
        tokens, logp = self.variant(functools.partial(sampling.sample_from_logits, top_p=0.5))(keys, logits, 1.0)
        assert set(np.unique(tokens)) == {0, 1}
        np.testing.assert_allclose(logp, np.log(0.5), atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_inverse_cdf_on_a_uniform_grid_hits_each_slot_in_proportion(self):
        """Inversion with u on the grid (i + 1/2) / n returns slot j for exactly n * q_j (+-1) of the n draws:
        a deterministic check of the two-level search over 300 slots (blocks of 128, the last one partial), with
        zero-mass slots at the start, inside, across a whole block and at the end, and an unnormalised q."""
        rng = np.random.default_rng(0)
        q = rng.uniform(0.5, 2.0, 300) * (rng.uniform(size=300) < 0.5)
        q[:3] = 0.0
        q[128:256] = 0.0  # an empty middle block
        q[-5:] = 0.0
        n = 20000
        u = (np.arange(n) + 0.5) / n
        slots = np.asarray(self.variant(token_sampling.invert_cdf)(jnp.asarray(np.tile(q, (n, 1)), jnp.float32),
                                                               jnp.asarray(u, jnp.float32)))  # fmt: skip
        counts = np.bincount(slots, minlength=300)
        assert counts[q == 0].sum() == 0
        np.testing.assert_allclose(counts, n * q / q.sum(), atol=1.01)
        edge = self.variant(token_sampling.invert_cdf)(jnp.asarray(np.tile(q, (2, 1)), jnp.float32),
                                                  jnp.asarray([0.0, np.nextafter(1.0, 0.0)], jnp.float32))  # fmt: skip
        np.testing.assert_array_equal(edge, [np.flatnonzero(q)[0], np.flatnonzero(q)[-1]])

    @chex.variants(with_jit=True, without_jit=True)
    def test_greedy(self):
        logits = jnp.array([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 0.0, 0.0]])
        keys = jax.random.split(jax.random.key(0), 2)
        fn = self.variant(functools.partial(sampling.sample_from_logits, greedy=True, top_k=1, top_p=0.1))
        tokens, logp = fn(keys, logits, 1.0)
        np.testing.assert_array_equal(tokens, [1, 0])  # tie 1 vs 2 -> lower id
        np.testing.assert_allclose(logp, _gather(_log_softmax(np.asarray(logits, np.float64)), np.array([1, 0])),
                                   atol=1e-6)  # fmt: skip


def test_buckets():
    assert [padding.prompt_bucket(n) for n in (1, 16, 17, 25, 32, 33, 49, 100, 137, 200)] == [
        16, 16, 20, 28, 32, 40, 56, 112, 160, 224
    ]  # fmt: skip
    assert len({padding.prompt_bucket(n) for n in range(1, 4097)}) == 33  # O(log) buckets: 16 .. 4096
    assert all(padding.prompt_bucket(n) <= 1.25 * n for n in range(16, 4097))  # at most 25% padding
    assert padding.prompt_bucket(5, (8, 24)) == 8 and padding.prompt_bucket(9, (24, 8)) == 24
    with pytest.raises(ValueError, match="largest prompt bucket"):
        padding.prompt_bucket(25, (8, 24))
    assert [padding.batch_bucket(n) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert [padding.batch_bucket(n, 8) for n in (1, 3, 9)] == [8, 8, 16]
    assert padding.batch_bucket(3, 6) == 6


# ----------------------------------------------------------------------------------------------------------------------
# generate on a tiny random model


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_teacher_forcing(tiny, temperature):
    config, params = tiny
    g, m = 3, 8  # same static settings as other tests: one compilation shared
    comp = sampling.generate(config, params, PROMPTS, num_samples=g, max_new_tokens=m, temperature=temperature,
                             key=jax.random.key(7))  # fmt: skip
    _check_completions(comp, len(PROMPTS) * g, m)
    assert np.all(np.asarray(comp.mask)) and np.all(np.asarray(comp.truncated))  # no EOS ids: full length
    ref = _gather(_log_softmax(_teacher_forced_logits(config, params, PROMPTS, comp, g) / temperature), comp.tokens)
    np.testing.assert_allclose(comp.logprobs, ref, atol=1e-5, rtol=0)
    # samples of one prompt differ (they are not copies) but share the prompt
    assert len({tuple(np.asarray(comp.tokens[r])) for r in range(g)}) > 1


def test_truncated_sampling_logprobs_and_support(tiny):
    config, params = tiny
    g, m, t, k, p = 4, 6, 0.8, 5, 0.8
    comp = sampling.generate(config, params, PROMPTS, num_samples=g, max_new_tokens=m, temperature=t, top_k=k,
                             top_p=p, key=jax.random.key(3))  # fmt: skip
    _check_completions(comp, len(PROMPTS) * g, m)
    logits = _teacher_forced_logits(config, params, PROMPTS, comp, g)
    tokens = np.asarray(comp.tokens)
    for r in range(tokens.shape[0]):
        for i in range(m):
            probs = _np_truncated_probs(logits[r, i], t, k, p)
            assert probs[tokens[r, i]] > 0, "sampled a truncated token"
            np.testing.assert_allclose(comp.logprobs[r, i], np.log(probs[tokens[r, i]]), atol=1e-5)


def test_greedy_matches_teacher_forcing_argmax(tiny):
    config, params = tiny
    comp = sampling.generate(config, params, PROMPTS, num_samples=2, max_new_tokens=6, temperature=0.0,
                             key=jax.random.key(0))  # fmt: skip
    logits = _teacher_forced_logits(config, params, PROMPTS, comp, 2)
    np.testing.assert_array_equal(comp.tokens, logits.argmax(-1))
    np.testing.assert_allclose(comp.logprobs, _gather(_log_softmax(logits), comp.tokens), atol=1e-5)
    np.testing.assert_array_equal(comp.tokens[0::2], comp.tokens[1::2])  # greedy: the G samples are identical


def test_same_key_same_samples(tiny):
    config, params = tiny
    kw = dict(num_samples=3, max_new_tokens=8, key=jax.random.key(11))
    a = sampling.generate(config, params, PROMPTS, **kw)
    b = sampling.generate(config, params, PROMPTS, **kw)
    chex.assert_trees_all_equal(a, b)
    c = sampling.generate(config, params, PROMPTS, **{**kw, "key": jax.random.key(12)})
    assert not np.array_equal(a.tokens, c.tokens)
    # a row's samples do not depend on the other prompts (nor on the batch bucket they pad to); the logprobs only up
    # to float rounding (a different batch size may change the matmul blocking)
    d = sampling.generate(config, params, PROMPTS + [[5, 6], [7], [8, 9, 10]], **kw)
    np.testing.assert_array_equal(d.tokens[: len(a.tokens)], a.tokens)
    np.testing.assert_allclose(d.logprobs[: len(a.tokens)], a.logprobs, atol=1e-5)
    # a rectangular numpy batch of prompts is accepted and means the same as the list of its rows
    rect = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], np.int32)
    chex.assert_trees_all_equal(sampling.generate(config, params, rect, **kw),
                                sampling.generate(config, params, rect.tolist(), **kw))  # fmt: skip


def test_eos_mask_lengths_truncated(tiny):
    config, params = tiny
    g, m = 3, 8
    kw = dict(num_samples=g, max_new_tokens=m, key=jax.random.key(5))
    free = np.asarray(sampling.generate(config, params, PROMPTS, **kw).tokens)
    eos = {int(free[0, 2]), int(free[4, m - 1])}
    comp = sampling.generate(config, params, PROMPTS, eos_token_ids=tuple(sorted(eos)), **kw)
    _check_completions(comp, len(PROMPTS) * g, m)
    hit_any = False
    for r in range(free.shape[0]):
        hits = [i for i in range(m) if free[r, i] in eos]
        length = hits[0] + 1 if hits else m
        hit_any |= bool(hits)
        assert int(comp.lengths[r]) == length
        assert bool(comp.truncated[r]) == (not hits)
        np.testing.assert_array_equal(comp.mask[r], np.arange(m) < length)
        np.testing.assert_array_equal(comp.tokens[r, :length], free[r, :length])  # same key: same prefix
        np.testing.assert_array_equal(comp.tokens[r, length:], 0)
        np.testing.assert_array_equal(comp.logprobs[r, length:], 0.0)
    assert hit_any
    # EOS first sampled at the very last step (row 4, this seed): the whole budget, not truncated
    assert next(i for i in range(m) if free[4, i] in eos) == m - 1
    assert not bool(comp.truncated[4]) and int(comp.lengths[4]) == m
    # every id is an EOS: all rows stop after one token
    every = sampling.generate(config, params, PROMPTS, eos_token_ids=range(config.vocab_size), **kw)
    np.testing.assert_array_equal(every.lengths, 1)
    assert not np.any(np.asarray(every.truncated))


def test_jit_cache_is_bounded_over_varying_prompts(tiny):
    """The engine's prefill compiles once per (prompt bucket, packed-width bucket, batch bucket), its decode block
    once per (prompt bucket, batch bucket): 14 calls (10 different prompt-length pairs, then 1-4 prompts) compile a
    handful of programs, and calling again with new prompts of the same buckets compiles nothing."""
    config, params = tiny
    config = dataclasses.replace(config, max_position_embeddings=config.max_position_embeddings + 1)  # fresh jit key
    prefill0, decode0 = engine.prefill._cache_size(), engine.decode_block._cache_size()
    rng = np.random.default_rng(0)
    calls = [(length, max(1, length // 2)) for length in range(1, 21, 2)] + [(3,) * n for n in (1, 2, 3, 4)]
    prefill_keys, decode_keys = set(), set()
    for lengths in calls:
        prompts = [list(rng.integers(1, 60, size=n)) for n in lengths]
        sampling.generate(config, params, prompts, max_new_tokens=3, key=jax.random.key(len(prompts)))
        # expected buckets from the documented rules: length buckets 16, 20, 24, ...; batch: next power of two;
        # packed width: the length bucket of the sum of the (batch-padded, 1-token pad prompts) lengths
        tp, pb = padding.prompt_bucket(max(lengths)), padding.batch_bucket(len(lengths))
        prefill_keys.add((tp, padding.prompt_bucket(sum(lengths) + pb - len(lengths)), pb))
        decode_keys.add((tp, pb))
    assert len(prefill_keys) <= 6 and len(decode_keys) <= 4  # 14 calls, few buckets
    assert engine.prefill._cache_size() - prefill0 == len(prefill_keys)
    assert engine.decode_block._cache_size() - decode0 == len(decode_keys)
    for lengths in calls:  # new prompts, same buckets: nothing recompiles
        prompts = [list(rng.integers(1, 60, size=n)) for n in lengths]
        sampling.generate(config, params, prompts, max_new_tokens=3, key=jax.random.key(1))
    assert engine.prefill._cache_size() - prefill0 == len(prefill_keys)
    assert engine.decode_block._cache_size() - decode0 == len(decode_keys)


def test_sharded_equals_unsharded(tiny):
    config, params = tiny
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)  # all 8 fake devices: batch over data x fsdp, heads on tensor
    kw = dict(**SHARDED_KW, key=jax.random.key(21))
    ref = sampling.generate(config, params, PROMPTS, **kw)
    out = sampling.generate(config, sharding.shard_params(params, config, mesh), PROMPTS, mesh=mesh, **kw)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.mask, ref.mask)
    np.testing.assert_array_equal(out.truncated, ref.truncated)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)


def test_a_share_driven_with_its_prompt_offset_samples_the_whole_batchs_rows(tiny):
    """Each host of an asynchronous multi-process run drives a block of the step's prompts through its share of the
    slots (`async_rollout.sample_across_processes`): with ``prompt_offset`` = the block's first prompt, its rows are
    those of the whole batch, on a mesh of another size, on one device and with fewer slots than prompts (refills)."""
    from jaxgrpo.rollout import driver
    from jaxgrpo.rollout.params import SamplingParams

    config, params = tiny
    g = SHARDED_KW["num_samples"]
    whole_mesh = sharding.make_mesh(4, 1, 1, jax.devices()[:4])
    share_mesh = sharding.make_mesh(2, 1, 1, jax.devices()[4:6])
    key = jax.random.key(21)
    whole = sampling.generate(config, params, PROMPTS, mesh=whole_mesh, **SHARDED_KW, key=key)
    sp = SamplingParams(SHARDED_KW["max_new_tokens"], g, 1.0, SHARDED_KW["top_p"], 0, SHARDED_KW["eos_token_ids"])

    def share(lo: int, hi: int, **kw) -> sampling.Completions:
        groups, _ = driver.run(config, params, PROMPTS[lo:hi], sp, key, prompt_offset=lo, **kw)
        return driver.completions(groups, range(hi - lo))

    for (lo, hi), kw in [((0, 1), dict(mesh=share_mesh)), ((1, 3), dict(mesh=share_mesh)), ((2, 3), {}),
                         ((1, 3), dict(slots=1))]:  # fmt: skip
        got, rows = share(lo, hi, **kw), slice(lo * g, hi * g)
        np.testing.assert_array_equal(got.tokens, whole.tokens[rows])
        np.testing.assert_array_equal(got.mask, whole.mask[rows])
        np.testing.assert_allclose(got.logprobs, whole.logprobs[rows], atol=1e-5)
    unshifted = driver.completions(driver.run(config, params, PROMPTS[1:3], sp, key)[0], range(2))
    assert not np.array_equal(unshifted.tokens, whole.tokens[g:]), "the offset must change the rows' keys"
    # key_ids: any prompts of the batch, each with its own id (the multi-turn loop's live rows), through generate
    picked = [2, 0]
    got = sampling.generate(config, params, [PROMPTS[i] for i in picked], mesh=share_mesh, **SHARDED_KW, key=key,
                            key_ids=picked)  # fmt: skip
    for j, i in enumerate(picked):
        np.testing.assert_array_equal(got.tokens[j * g:(j + 1) * g], whole.tokens[i * g:(i + 1) * g])
    with pytest.raises(ValueError, match="key_ids .1 ids. must give each of the 2 prompts an id"):
        driver.run(config, params, PROMPTS[:2], sp, key, key_ids=[0])


TWO_PROCESS_BODY = r"""
from jax.experimental import multihost_utils
from jaxgrpo import sampling, sharding
from test_sampling import PROMPTS, SHARDED_KW, tiny_model
config, params = tiny_model()
mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
comp = sampling.generate(config, sharding.shard_params(params, config, mesh), PROMPTS, mesh=mesh,
                         key=jax.random.key(21), **SHARDED_KW)
got = {k: np.asarray(getattr(comp, k)) for k in ("tokens", "logprobs", "mask", "truncated")}  # whole, on each
both = multihost_utils.process_allgather(got["tokens"])  # [2, N, M]: every process holds the same completions
assert both.shape == (2, *got["tokens"].shape) and (both[0] == both[1]).all(), both.shape
if pid == 0:
    np.savez(out, **got)
"""


@pytest.mark.slow
def test_two_process_generate_equals_single_process(tiny, tmp_path):
    """Multi-host: two jax.distributed CPU processes (4 devices each, gloo) sample what one process does, and each
    holds the whole result."""
    config, params = tiny
    got = run_two_processes(TWO_PROCESS_BODY, tmp_path)
    ref = sampling.generate(config, params, PROMPTS, key=jax.random.key(21), **SHARDED_KW)
    np.testing.assert_array_equal(got["tokens"], ref.tokens)
    np.testing.assert_array_equal(got["mask"], ref.mask)
    np.testing.assert_array_equal(got["truncated"], ref.truncated)
    np.testing.assert_allclose(got["logprobs"], ref.logprobs, atol=1e-5)


@pytest.mark.parametrize(
    "prompts,kwargs,match",
    [
        ([], {}, "non-empty list"),
        ([[1, 2], []], {}, "prompt 1 is empty"),
        ([[1, 2]], {"max_new_tokens": 63}, "max_position_embeddings"),
        ([[1, 2]], {"top_p": 0.0}, "top_p"),
        ([[1, 2]], {"top_p": 1.5}, "top_p"),
        ([[1, 2]], {"temperature": -0.5}, "temperature"),
        ([[1, 2]], {"num_samples": 0}, "num_samples"),
        ([[1, 2]], {"top_k": -1}, "top_k"),
        ([[1, 2]], {"max_new_tokens": 0}, "max_new_tokens"),
        ([[1, 64]], {}, "token ids outside"),
        ([[1, 2]], {"eos_token_ids": (64,)}, "eos_token_ids"),
        (["hello"], {}, "tokenize"),
        ([[1, 2]], {"prompt_buckets": (1,)}, "largest prompt bucket"),
    ],
)
def test_bad_input_raises(tiny, prompts, kwargs, match):
    config, params = tiny
    kw = {"max_new_tokens": 4, "key": jax.random.key(0), **kwargs}
    with pytest.raises(ValueError, match=match):
        sampling.generate(config, params, prompts, **kw)


# ----------------------------------------------------------------------------------------------------------------------
# greedy parity with HF transformers on the real SmolLM2-135M (GGUF)


@pytest.mark.slow
def test_greedy_matches_transformers_smollm2(smollm2, smollm2_hf_tokenizer, smollm2_hf_model):
    import torch

    (config, params), tok, hf = smollm2, smollm2_hf_tokenizer, smollm2_hf_model  # ours; transformers' GGUF reading
    questions = ["What is 7 times 8?", "Name a colour of the sky on a clear day, and explain briefly why it looks so."]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                return_dict=False)
        for q in questions
    ]  # fmt: skip
    prompts = [list(p["input_ids"]) if isinstance(p, dict) else list(p) for p in prompts]
    assert len(prompts[0]) != len(prompts[1])  # ragged: exercises the left padding
    m = 16
    eos = tuple(config.eos_token_ids) or (tok.eos_token_id,)
    comp = sampling.generate(config, params, prompts, max_new_tokens=m, temperature=0.0, eos_token_ids=eos,
                             key=jax.random.key(0))  # fmt: skip
    for r, p in enumerate(prompts):
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=m,
                do_sample=False,
                eos_token_id=list(eos),
                pad_token_id=eos[0],
            )
        ref = out[0, len(p):].tolist()  # fmt: skip
        length = int(comp.lengths[r])
        got = np.asarray(comp.tokens[r, :length]).tolist()
        assert got == ref[:length], (r, tok.decode(got), tok.decode(ref))
        assert length == len(ref) or ref[length:] == [eos[0]] * (len(ref) - length)
