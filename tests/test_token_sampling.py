# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The sort-free nucleus (`token_sampling._nucleus_mask_search`, the exact fallback on accelerators) against a
brute-force NumPy nucleus (float64, sorted by logit descending then token id: Holtzman et al. 2020's rule as the module
docstring states it) on random logits with and without ties, and the same sample for the same key whichever path
found the set."""

from __future__ import annotations

import functools
from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import token_sampling


def _np_nucleus(z: np.ndarray, top_p: float) -> np.ndarray:
    """Brute force: order by (-z, id), keep token j iff the float64 softmax mass strictly before it is < top_p."""
    out = np.zeros(z.shape, bool)
    for r, row in enumerate(z.astype(np.float64)):
        order = np.lexsort((np.arange(len(row)), -row))
        q = np.exp(row[order] - row.max())
        q /= q.sum()
        before = np.cumsum(q) - q
        keep = before < top_p
        keep[0] = True
        out[r, order] = keep
    return out


def _logits(seed: int, rows: int, vocab: int, ties: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(rows, vocab)) * rng.uniform(0.3, 4.0, size=(rows, 1))
    if ties:  # few distinct values: large tied groups straddle the threshold
        z = np.round(z * 2) / 2 + 0.0  # -0.0 -> +0.0: equal values (a sort's total order would split them)
    z[0, :] = 0.0  # one uniform row: every token tied
    return z.astype(np.float32)


def _search(z: jax.Array, top_p: jax.Array) -> jax.Array:
    return token_sampling._nucleus_mask_search(z, jax.nn.logsumexp(z, axis=-1, keepdims=True), top_p)


class SearchTest(chex.TestCase):
    @chex.variants(with_jit=True)  # eagerly, the unrolled search dispatches ~100 ops: 30 s on a loaded CPU
    def test_search_jitted_variant(self):
        z = _logits(1, 12, 300, True)
        got = self.variant(_search)(jnp.asarray(z), jnp.float32(0.6171))
        np.testing.assert_array_equal(np.asarray(got), _np_nucleus(z, 0.6171))
        # uniform over 4: exactly ids {0, 1} at top_p 0.5 (the mass before id 2 is 0.5, not < 0.5)
        np.testing.assert_array_equal(np.asarray(self.variant(_search)(jnp.zeros((1, 4)), jnp.float32(0.5))),
                                      [[True, True, False, False]])  # fmt: skip

    def test_search_equals_brute_force_nucleus(self):
        search = jax.jit(_search)
        for seed, ties in [(0, False), (1, True), (2, True)]:
            z = _logits(seed, 12, 300, ties)
            for top_p in (0.0517, 0.3123, 0.6171, 0.9047, 0.9951):  # x 300 far from an integer: uniform row
                expected = _np_nucleus(z, top_p)
                got = np.asarray(search(jnp.asarray(z), jnp.float32(top_p)))
                np.testing.assert_array_equal(got, expected, err_msg=f"seed {seed} ties {ties} top_p {top_p}")

    def test_search_ends_on_one_key_whatever_the_spread_of_the_logits(self):
        """Logits spread over the whole float range and a nucleus edge between values one float32 ulp apart: with a
        step rounded down the last interval stayed up to ~15 keys wide after the 8 passes, and the last token of the
        nucleus was dropped (10 kept of 18)."""
        z = np.full((2, 300), -64.0, np.float32)
        z[:, 150:] = -25.0
        z[:, :10] = 10.0
        z[:, 10:20] = np.nextafter(np.float32(10.0), np.float32(0.0))
        z[1, 20] = 3.0e38  # the other row: keys from -64 to near the largest float
        z[1, 21:300] = -3.0e38
        got = np.asarray(jax.jit(_search)(jnp.asarray(z), jnp.float32(0.9)))
        np.testing.assert_array_equal(got, _np_nucleus(z, 0.9))
        rng = np.random.default_rng(5)  # and many rows of random logits at random top_p: every set exact
        z = (rng.normal(size=(400, 1000)) * rng.uniform(0.5, 3.0, size=(400, 1))).astype(np.float32)
        top_p = rng.uniform(0.5, 0.99, size=(400, 1)).astype(np.float32)
        got = np.asarray(jax.jit(_search)(jnp.asarray(z), jnp.asarray(top_p)))
        want = np.stack([_np_nucleus(z[i : i + 1], float(top_p[i, 0]))[0] for i in range(400)])
        np.testing.assert_array_equal(got, want)

    def test_cpu_paths_equal_brute_force_too(self):
        z = _logits(3, 12, 300, True)
        for candidates in (256, 2):  # the top-k candidates' path and the full-sort fallback
            with mock.patch.object(token_sampling, "TOP_P_CANDIDATES", candidates):
                got = jax.jit(token_sampling._nucleus_mask)(jnp.asarray(z), jnp.float32(0.6171))
            np.testing.assert_array_equal(np.asarray(got), _np_nucleus(z, 0.6171))


def test_same_sample_whichever_path_finds_the_set():
    z = jnp.asarray(_logits(4, 16, 300, True))
    keys = jax.random.split(jax.random.key(7), 16)
    draw = functools.partial(token_sampling.sample_from_logits, top_p=0.8123, return_entropy=True)
    expected = jax.jit(draw)(keys, z, 1.3)
    with mock.patch.object(token_sampling, "_nucleus_mask", _search):
        got = jax.jit(draw)(keys, z, 1.3)
    chex.assert_trees_all_equal(got, expected)


def test_signed_zero_logits_tie_on_every_path():
    """-0 and +0 are one value: q = (.4, .2, .2, .2) with the three zeros tied, top_p 0.65 keeps ids 0, 1, 2 (ties:
    lower id first) on the top-k fast path, the CPU sort and the accelerator search alike (lax.top_k alone ranks
    +0 above -0 and kept id 3 instead of 2), and top-k 3 keeps the same ids."""
    z = jnp.asarray([[np.log(2.0), -0.0, -0.0, 0.0]], jnp.float32)
    want = np.array([[True, True, True, False]])
    for candidates in (4, 1):  # the top-k candidates' path and the full-sort fallback
        with mock.patch.object(token_sampling, "TOP_P_CANDIDATES", candidates):
            got = jax.jit(functools.partial(token_sampling.kept_mask, top_p=0.65))(z)
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=f"candidates={candidates}")
    with mock.patch.object(token_sampling, "_nucleus_mask", _search):
        np.testing.assert_array_equal(np.asarray(jax.jit(functools.partial(token_sampling.kept_mask, top_p=0.65))(z)),
                                      want)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(jax.jit(functools.partial(token_sampling.kept_mask, top_k=3))(z)), want)
    key = jax.jit(token_sampling._sortable_key)(jnp.asarray([-0.0, 0.0, -1e-30, 1e-30], jnp.float32))
    assert key[0] == key[1] and key[2] < key[0] < key[3]
