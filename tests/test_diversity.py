# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Diversity metrics: the sampling entropy against closed forms and against the entropy recomputed from
teacher-forced logits at the sampled positions; distinct completions per group on hand cases (the trainer's
``diversity/*`` metrics are checked in tests/test_retain.py, on the same tiny run)."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_sampling import PROMPTS, _np_truncated_probs, _teacher_forced_logits, tiny_model

from jaxgrpo import diversity, sampling, token_sampling


def _entropy(logits, temperature=1.0, **kw):
    keys = jax.random.split(jax.random.key(0), logits.shape[0])
    return np.asarray(token_sampling.sample_from_logits(keys, jnp.asarray(logits, jnp.float32), temperature,
                                                        return_entropy=True, **kw)[2])  # fmt: skip


class EntropyClosedForm(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_uniform_and_top_k(self):
        v = 50
        logits = np.zeros((2, v), np.float32)
        fn = self.variant(lambda k, x: token_sampling.sample_from_logits(k, x, 0.7, return_entropy=True))
        _, _, h = fn(jax.random.split(jax.random.key(1), 2), jnp.asarray(logits))
        np.testing.assert_allclose(h, math.log(v), rtol=1e-6)  # uniform at any temperature: log V
        logits = np.arange(v, dtype=np.float32)[None]
        # top-k = 1: a point mass
        np.testing.assert_allclose(_entropy(logits, top_k=1), 0.0, atol=1e-6)

    def test_two_tokens_is_the_binary_entropy_at_temperature(self):
        a, t = 1.3, 0.5
        logits = np.full((1, 8), -1e9, np.float32)
        logits[0, 3], logits[0, 6] = a, 0.0
        p = 1 / (1 + math.exp(-a / t))  # softmax of (a, 0) / t
        expect = -(p * math.log(p) + (1 - p) * math.log(1 - p))
        np.testing.assert_allclose(_entropy(logits, t), expect, rtol=1e-5)

    def test_top_p_renormalises_over_the_nucleus(self):
        logits = np.log(np.asarray([[0.5, 0.3, 0.15, 0.05]], np.float32))
        expect = -(5 / 8 * math.log(5 / 8) + 3 / 8 * math.log(3 / 8))  # nucleus {0.5, 0.3} at top_p 0.6
        np.testing.assert_allclose(_entropy(logits, top_p=0.6), expect, rtol=1e-5)
        logits = np.log(np.asarray([[0.4, 0.3, 0.2, 0.1]], np.float32))
        q = np.asarray([0.4, 0.3, 0.2]) / 0.9  # top-k 3, then top-p 0.95 keeps all three
        np.testing.assert_allclose(_entropy(logits, top_k=3, top_p=0.95), -(q * np.log(q)).sum(), rtol=1e-5)

    def test_greedy_reports_the_untempered_entropy(self):
        logits = np.log(np.asarray([[0.6, 0.4]], np.float32))
        keys = jax.random.split(jax.random.key(0), 1)
        _, _, h = token_sampling.sample_from_logits(keys, jnp.asarray(logits), 1.0, greedy=True, return_entropy=True)
        np.testing.assert_allclose(h, -(0.6 * math.log(0.6) + 0.4 * math.log(0.4)), rtol=1e-5)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 5, 0.8)])
def test_sampler_entropy_equals_teacher_forced(temperature, top_k, top_p):
    config, params = tiny_model()
    g, m = 3, 6
    eos = tuple(range(0, 64, 4))  # a quarter of the vocabulary ends a row: some rows end early
    comp = sampling.generate(config, params, PROMPTS, num_samples=g, max_new_tokens=m, temperature=temperature,
                             top_k=top_k, top_p=top_p, eos_token_ids=eos, key=jax.random.key(5))  # fmt: skip
    chex.assert_shape(comp.entropy, (len(PROMPTS) * g, m))
    logits = _teacher_forced_logits(config, params, PROMPTS, comp, g)
    mask = np.asarray(comp.mask)
    assert not mask.all(), "want some rows ended by EOS, to check the masked positions"
    ref = np.zeros(mask.shape)
    for r, i in zip(*np.nonzero(mask)):
        q = _np_truncated_probs(logits[r, i], temperature, top_k, top_p)
        q = q[q > 0]
        ref[r, i] = -(q * np.log(q)).sum()
    np.testing.assert_allclose(np.asarray(comp.entropy), ref, atol=2e-5)
    assert ref[mask].min() >= 0 and ref[mask].max() > 0.3  # (a one-token nucleus has entropy 0)


def test_distinct_per_group_hand_cases():
    tokens = np.asarray([[1, 2, 9], [1, 2, 5], [1, 3, 0], [4, 0, 0],  # group 0: rows 0, 1 equal up to their masks
                         [7, 7, 7], [7, 7, 7], [7, 7, 7], [7, 7, 8]])  # group 1: three copies and one other
    mask = np.asarray([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 0, 0],
                       [1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]], bool)  # fmt: skip
    np.testing.assert_array_equal(diversity.distinct_per_group(tokens, mask, 4), [3, 2])
    np.testing.assert_array_equal(diversity.distinct_per_group(tokens, mask, 2), [1, 2, 1, 2])
    ent = np.where(mask, 2.0, 99.0)
    ent[0, 0] = 0.5
    got = diversity.diversity_metrics(tokens, mask, ent, 4)
    assert got["diversity/distinct"] == 2.5 and got["diversity/distinct_frac"] == 2.5 / 4
    assert got["diversity/entropy"] == pytest.approx((0.5 + 2.0 * 18) / 19)  # 19 completion tokens; the rest ignored
    with pytest.raises(ValueError, match="whole groups"):
        diversity.distinct_per_group(tokens, mask, 3)


def test_padding_rows_of_smaller_groups_count_nowhere():
    """An adaptive schedule's groups of G_i = 2 and 4 rows padded to G = 4 (padding: no tokens). Group 0's two real
    rows are one completion: 1 distinct of 2 (not 2 of 4: the empty padding would pass for a second completion)."""
    tokens = np.asarray([[5, 6], [5, 6], [0, 0], [0, 0], [1, 0], [2, 0], [3, 0], [3, 0]])
    mask = np.asarray([[1, 1], [1, 1], [0, 0], [0, 0], [1, 0], [1, 0], [1, 0], [1, 0]], bool)
    real = mask.any(-1)
    np.testing.assert_array_equal(diversity.distinct_per_group(tokens, mask, 4, real), [1, 3])
    got = diversity.diversity_metrics(tokens, mask, None, 4, real)
    assert got == {"diversity/distinct": 2.0, "diversity/distinct_frac": (1 / 2 + 3 / 4) / 2}

