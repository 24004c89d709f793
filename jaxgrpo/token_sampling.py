# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Drawing one token per row from logits: temperature, top-k, top-p, inversion sampling, the reported log-prob.

Sampling distribution (per row, per step), with raw float32 logits ``l`` over the vocabulary:
  * temperature ``T > 0``: ``z = l / T``;
  * top-k (``k > 0``): keep the ``k`` largest ``z`` (ties: the lower token id first, so exactly ``k`` survive);
  * top-p (``p < 1``): sort the survivors by ``z`` descending (ties: lower id first), ``q = softmax(z)`` over them,
    keep the shortest prefix whose mass reaches ``p``: token ``j`` is kept iff ``sum_{i<j} q_i < p`` (the first
    token is always kept) -- the "nucleus" of Holtzman et al. 2020, "The Curious Case of Neural Text
    Degeneration", Sec. 3.1; applied after top-k on the renormalised top-k mass, the same order as HF
    transformers' TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper. Without top-k the nucleus is
    looked for among the largest logits, and when they are not enough an exact fallback runs (a full sort on CPU,
    a sort-free search of the threshold on accelerators: `_nucleus_mask_search`; the same set);
  * sample ``x ~ q = softmax(z restricted to the kept set)`` by inversion (the inverse-CDF method; e.g. Devroye
    1986, "Non-Uniform Random Variate Generation", Sec. II.2): one ``u ~ U[0, 1)`` per row and step, ``x`` = the
    first candidate slot ``j`` (in slot order) with ``sum_{i<=j} q_i > u * sum_i q_i``. The cumulative sums are
    taken in two levels (blocks of 128 slots, then within the chosen block), so a step costs O(V) with one random
    number per row instead of one per vocabulary entry; the sampled law is ``q`` up to the float32 rounding of those
    sums (~1e-7 relative), and a slot of probability 0 (truncated) is never returned;
  * reported ``logprob = z_x - logsumexp_{j kept} z_j``: the log-probability under the distribution actually
    sampled from (after temperature and truncation), in float32, as the trainer's old-policy logprob.
  * ``T = 0`` is greedy: ``x = argmax_j l_j`` (ties: the lowest id); top-k/top-p are irrelevant then (the argmax
    always survives them) and the reported logprob is ``log_softmax(l)_x``, under the untempered, untruncated
    model distribution (the temperature -> 0 limit would give 0 for every token, which carries no information).
  * optional entropy (``return_entropy=True``): the Shannon entropy in nats of the same distribution the log-prob is
    reported under, ``H = -sum_{j kept} q_j log q_j = lse - sum_j q_j z_j`` with ``q = softmax(z)`` over the kept set
    (after temperature, top-k and top-p; greedy: of ``softmax(l)``). It reuses the ``q`` and ``lse`` the draw needs:
    one multiply-add over the candidates, no extra forward.

Without top-k the draw over the whole vocabulary never materialises ``q``: per block of 128 tokens it sums
``exp(z - max)`` and ``exp(z - max) z`` (on accelerators in one pass over the logits, merging blocks as online softmax
does; `_draw_vocabulary`), takes ``lse``, the block to draw from and the entropy from those sums, and reads only the
drawn block's logits again: the same law and the same log-prob, up to float32 rounding of the sums.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# at import, not where it runs: its Pallas TPU import registers a jax config state that jit's tracing keys carry
# (jax 0.11: `pallas_fuser_disable_nested_fuse`); registered in the middle of a run's first step, it changed every key
# traced before it and the second step retraced and recompiled them (issue 34)
from jaxgrpo import block_sums

# Nucleus sampling without top-k first looks for the nucleus among this many most likely tokens (exact when their
# mass reaches top_p; otherwise the exact fallback runs): on CPU 256 (a full sort of a large vocabulary is slow on
# XLA:CPU), on accelerators 16 (XLA:GPU's sort-free top-k kernel takes k <= 16).
TOP_P_CANDIDATES = 256
TOP_P_CANDIDATES_ACCELERATOR = 16
# the sort-free threshold search: thresholds per pass + 1, and passes (16 ways, each interval at most ceil(R / 16)
# keys wide, narrow the < 2^32 keys to one in 8 passes)
_SEARCH_WAYS = 16
_SEARCH_PASSES = 8


def _first_argmax(x: jax.Array) -> jax.Array:
    """``argmax`` over the last axis (lowest index among ties), as max + masked min: cheaper than XLA's variadic
    argmax reduction on CPU."""
    m = jnp.max(x, axis=-1, keepdims=True)
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where(x == m, iota, x.shape[-1]), axis=-1)


def _keep_prefix(q_sorted: jax.Array, top_p: jax.Array) -> jax.Array:
    """Nucleus rule on descending probabilities: keep slot j iff the mass strictly before it is < top_p."""
    mass_before = jnp.cumsum(q_sorted, axis=-1) - q_sorted
    return (mass_before < top_p).at[..., 0].set(True)


def _sortable_key(z: jax.Array) -> jax.Array:
    """float32 -> uint32 with the same order (sign set: all bits flipped, else the sign bit set; -0 taken as +0)."""
    bits = jax.lax.bitcast_convert_type(jnp.where(z == 0.0, 0.0, z), jnp.uint32)  # (XLA folds a `z + 0.0` away)
    return jnp.where(bits >= jnp.uint32(1 << 31), ~bits, bits | jnp.uint32(1 << 31))


def _mass_above(q: jax.Array, key: jax.Array, t_NxJ: jax.Array) -> jax.Array:
    """``sum_i q_i [key_i > t_j]`` per row and threshold: ``[N, J]`` (one read of ``q`` and ``key``)."""
    return jnp.sum(jnp.where(key[:, None, :] > t_NxJ[:, :, None], q[:, None, :], 0.0), axis=-1)


def _nucleus_mask_search(z: jax.Array, lse: jax.Array, top_p: jax.Array) -> jax.Array:
    """The nucleus of ``softmax(z)`` without sorting: a search for its threshold on the order-preserving integer key
    of ``z`` (`_sortable_key`). With ``M(t) = sum_i q_i [key_i > t]`` non-increasing, the smallest ``t`` with
    ``M(t) < top_p`` is the key ``k0`` of the last kept value: every token above it has mass before it < top_p and
    every token below it has >= top_p. `_SEARCH_WAYS` - 1 thresholds per pass narrow ``(lo, hi]`` (invariant
    ``M(lo) >= top_p > M(hi)``) to one key in `_SEARCH_PASSES` passes over the vocabulary. Tokens tied at ``k0`` are
    kept in id order while ``M(k0) + rank * q(k0) < top_p`` (rank: tied tokens of lower id), the sorted rule's ties."""
    q = jnp.exp(z - lse)
    key = _sortable_key(z)
    lo, hi = jnp.min(key, axis=-1) - jnp.uint32(1), jnp.max(key, axis=-1)
    ways = jnp.arange(1, _SEARCH_WAYS, dtype=jnp.uint32)
    for _ in range(_SEARCH_PASSES):
        width = hi - lo  # >= 1; the step rounds up, so every interval, the last included, is at most ceil(width / 16)
        step = width // _SEARCH_WAYS + (width % _SEARCH_WAYS > 0).astype(jnp.uint32)
        t = lo[:, None] + jnp.minimum(step[:, None] * ways, width[:, None])  # (step * 15 < 2^32: no overflow)
        mass = _mass_above(q, key, t)
        lo = jnp.max(jnp.where(mass >= top_p, t, lo[:, None]), axis=-1)
        hi = jnp.min(jnp.where(mass < top_p, t, hi[:, None]), axis=-1)
    above = _mass_above(q, key, hi[:, None])[:, 0]
    tied = key == hi[:, None]
    q0 = jnp.max(jnp.where(tied, q, 0.0), axis=-1)

    def by_rank():  # exact tie order; a cumulative count over the vocabulary, so only when some row has a tie
        rank = jnp.cumsum(tied, axis=-1, dtype=jnp.int32) - 1
        return (key > hi[:, None]) | (tied & (above[:, None] + rank * q0[:, None] < top_p))

    no_ties = jnp.all(jnp.sum(tied, axis=-1) <= 1)
    return jax.lax.cond(no_ties, lambda: key >= hi[:, None], by_rank)


def _row_scatter(vocab: int, ids: jax.Array, values: jax.Array) -> jax.Array:
    """``[N, vocab]`` booleans, ``values[n, j]`` at ``ids[n, j]``, False elsewhere: a scatter vmapped over the rows
    (their axis a batching dimension, which a mesh splitting the rows partitions with no collective)."""
    return jax.vmap(lambda i, v: jnp.zeros(vocab, bool).at[i].set(v))(ids, values)


def _nucleus_mask(z: jax.Array, top_p: jax.Array) -> jax.Array:
    """Boolean ``[N, V]`` mask of the nucleus of ``softmax(z)`` (ties in z: lower token id first).

    Fast path: the nucleus is searched among the largest logits (``lax.top_k``; `TOP_P_CANDIDATES` on CPU,
    `TOP_P_CANDIDATES_ACCELERATOR` elsewhere, where XLA:GPU's top-k kernel takes at most 16 and a larger ``k`` compiles
    to a full sort of ``[rows, vocab]``); it is exact whenever their total mass reaches ``top_p`` in every row (the
    next token then has mass-before >= top_p). If some row's nucleus is wider, a ``lax.cond`` takes the exact
    fallback: a stable full-vocabulary sort on CPU, the sort-free threshold search `_nucleus_mask_search` elsewhere.
    Every path gives the same set, so the sample does not depend on which one ran (the noise is indexed by token id,
    see below).
    """
    vocab = z.shape[-1]
    lse = jax.nn.logsumexp(z, axis=-1, keepdims=True)

    def nucleus(z_sorted, ids):
        keep = _keep_prefix(jnp.exp(z_sorted - lse), top_p)
        return _row_scatter(vocab, ids, keep)

    def full_sort():
        ids = jnp.argsort(-z, axis=-1, stable=True).astype(jnp.int32)
        return nucleus(jnp.take_along_axis(z, ids, axis=-1), ids)

    def candidates_then(cand: int, fallback):
        z_c, ids_c = jax.lax.top_k(z, min(vocab, cand))  # descending, ties: lower index first
        covered = jnp.all(jnp.sum(jnp.exp(z_c - lse), axis=-1) >= top_p)
        return jax.lax.cond(covered, lambda: nucleus(z_c, ids_c), fallback)

    return jax.lax.platform_dependent(
        cpu=lambda: candidates_then(TOP_P_CANDIDATES, full_sort),
        default=lambda: candidates_then(TOP_P_CANDIDATES_ACCELERATOR, lambda: _nucleus_mask_search(z, lse, top_p)),
    )


def truncated_logits(
    logits: jax.Array, temperature: jax.Array | float, *, top_k: int = 0, top_p: jax.Array | float | None = None
) -> tuple[jax.Array, jax.Array | None]:
    """Temperature-scaled logits restricted to the top-k / top-p set: ``(cand_logits [..., W], cand_ids)``.

    ``cand_logits`` hold ``z = logits / temperature`` for the candidate tokens and ``-inf`` for the truncated ones;
    ``cand_ids [..., W]`` int32 maps candidate slots to token ids, or is None when slot j is token j (``W = V``).
    With ``top_k``, ``W = k`` (``lax.top_k``, no full sort) and top-p renormalises over the k candidates (HF's
    order); with top-p alone the nucleus is found by `_nucleus_mask` over the whole vocabulary. ``top_k`` is static
    (0 = off); ``top_p=None`` = off (static), otherwise its value may be traced.
    """
    z = logits.astype(jnp.float32) / jnp.asarray(temperature, jnp.float32)
    # -0 as +0 (XLA folds a `+ 0.0` away): lax.top_k ranks +0 above -0, the sort and the search take them as a tie
    z = jnp.where(z == 0.0, 0.0, z)
    if 0 < top_k < z.shape[-1]:
        z, ids = jax.lax.top_k(z, top_k)  # descending, ties: lower index first
        if top_p is not None:
            z = jnp.where(_keep_prefix(jax.nn.softmax(z, axis=-1), jnp.asarray(top_p, jnp.float32)), z, -jnp.inf)
        return z, ids
    if top_p is not None:
        z = jnp.where(_nucleus_mask(z, jnp.asarray(top_p, jnp.float32)), z, -jnp.inf)
    return z, None


def kept_mask(z: jax.Array, *, top_k: int = 0, top_p: float | None = None) -> jax.Array:
    """Boolean ``[N, V]``: the tokens the top-k / top-p rule of `truncated_logits` keeps from already
    temperature-scaled logits ``z [N, V]`` (the same set, ties included: it runs `truncated_logits` at temperature 1,
    an exact division). ``top_k`` (0 = off) and ``top_p`` (None = off) are static. For a learner that scores sampled
    tokens under the sampling distribution (`jaxgrpo.learner.logprobs`)."""
    vocab = z.shape[-1]
    cand, ids = truncated_logits(z, 1.0, top_k=top_k, top_p=top_p)
    if ids is None:
        return jnp.isfinite(cand)
    return _row_scatter(vocab, ids, jnp.isfinite(cand))


_CDF_BLOCK = 128


def _last_positive(x: jax.Array) -> jax.Array:
    """Index of the last entry > 0 along the last axis (0 if none)."""
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.max(jnp.where(x > 0, iota, 0), axis=-1)


def invert_cdf(q: jax.Array, u: jax.Array) -> jax.Array:
    """Inverse-CDF draw per row: the first slot ``j`` of ``q [N, W]`` (non-negative, any total) with
    ``cumsum(q)_j > u * sum(q)``, ``u [N]`` in [0, 1); two-level cumulative sums over blocks of `_CDF_BLOCK` slots.
    Rounding can only push the threshold past the last positive slot; it is clipped there, so the slot returned
    always has ``q > 0``."""
    n, w = q.shape
    nb = -(-w // _CDF_BLOCK)
    q_NBC = jnp.pad(q, ((0, 0), (0, nb * _CDF_BLOCK - w))).reshape(n, nb, _CDF_BLOCK)
    block_mass = jnp.sum(q_NBC, axis=-1)
    block_cdf = jnp.cumsum(block_mass, axis=-1)
    target = u * block_cdf[:, -1]
    block = jnp.minimum(jnp.sum(block_cdf <= target[:, None], axis=-1, dtype=jnp.int32), _last_positive(block_mass))
    rest = target - (jnp.take_along_axis(block_cdf - block_mass, block[:, None], axis=-1)[:, 0])
    q_NC = jnp.take_along_axis(q_NBC, block[:, None, None], axis=1)[:, 0]
    within = jnp.sum(jnp.cumsum(q_NC, axis=-1) <= rest[:, None], axis=-1, dtype=jnp.int32)
    return block * _CDF_BLOCK + jnp.minimum(within, _last_positive(q_NC))


def entropy_from_probs(q: jax.Array, z: jax.Array, lse: jax.Array) -> jax.Array:
    """``H = lse - sum_j q_j z_j`` per row for ``q = exp(z - lse)`` (nats); slots with ``z = -inf`` (truncated,
    ``q = 0``) contribute nothing. The same value as ``-sum q log q`` without evaluating ``0 * log 0``."""
    return lse - jnp.sum(q * jnp.where(q > 0, z, 0.0), axis=-1)


def sample_from_logits(
    keys: jax.Array,
    logits: jax.Array,
    temperature: jax.Array | float,
    *,
    greedy: bool = False,
    top_k: int = 0,
    top_p: jax.Array | float | None = None,
    return_entropy: bool = False,
    tpu_kernel: bool = False,
) -> tuple[jax.Array, ...]:
    """Sample one token per row of ``logits [N, V]`` with per-row ``keys [N]``: ``(tokens [N] int32, logprobs [N])``,
    and ``entropy [N]`` (nats, the sampling distribution's; module docstring) too when ``return_entropy`` (static).

    The distribution and the reported log-probabilities are those of the module docstring. ``greedy``, ``top_k``
    (0 = off) and whether ``top_p`` is None (off) are static; the values of ``temperature`` and ``top_p`` may be
    traced. The uniform draw is per row: the inversion runs over candidate slots, token ids without top-k (so the
    two nucleus paths, which give the same set, give the same sample) and ranks with it. ``tpu_kernel`` (static): on
    a TPU, the vocabulary draw's block sums by the Pallas kernel `jaxgrpo.block_sums` (one read of the logits) where
    it applies (no top-k/top-p, rows in multiples of 8); only for logits whose rows are not split over a mesh by
    the SPMD partitioner, which would gather them whole for the kernel (inside `jax.shard_map` they are local).
    """
    logits = logits.astype(jnp.float32)
    if greedy:
        tokens = _first_argmax(logits)
        lse = jax.nn.logsumexp(logits, axis=-1)
        logp = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0] - lse
        if return_entropy:
            return tokens, logp, entropy_from_probs(jnp.exp(logits - lse[:, None]), logits, lse)
        return tokens, logp
    if 0 < top_k < logits.shape[-1]:  # k candidates: small, drawn as they are
        z, ids = truncated_logits(logits, temperature, top_k=top_k, top_p=top_p)
        lse = jax.nn.logsumexp(z, axis=-1)
        u = _uniforms(keys)
        q = jnp.exp(z - lse[:, None])
        slot = invert_cdf(q, u)
        logp = jnp.take_along_axis(z, slot[:, None], axis=-1)[:, 0] - lse
        tokens = jnp.take_along_axis(ids, slot[:, None], axis=-1)[:, 0].astype(jnp.int32)
        return (tokens, logp, entropy_from_probs(q, z, lse)) if return_entropy else (tokens, logp)
    keep = None
    if top_p is not None:
        z, _ = truncated_logits(logits, temperature, top_p=top_p)
        keep = jnp.isfinite(z)
    tokens, logp, entropy = _draw_vocabulary(logits, temperature, _uniforms(keys), keep, tpu_kernel)
    return (tokens, logp, entropy) if return_entropy else (tokens, logp)


def _uniforms(keys: jax.Array) -> jax.Array:
    return jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)


def _block_sums_two_pass(z_NBC: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per row the max ``m`` of ``z [N, nb, C]``, and per block ``sum exp(z - m)`` and ``sum exp(z - m) z``: a max
    pass, then one pass for both sums."""
    top = jnp.max(z_NBC, axis=(1, 2))
    e_NBC = jnp.exp(z_NBC - top[:, None, None])
    return top, jnp.sum(e_NBC, axis=-1), jnp.sum(e_NBC * jnp.where(e_NBC > 0, z_NBC, 0.0), axis=-1)


def _combine(a, b):
    """Online softmax sums (Milakov & Gimelshein 2018): ``(m, s, t)`` = (max, ``sum exp(z - m)``, ``sum exp(z - m)
    z``) of two sets merged; ``m = -inf`` is the empty set."""
    (ma, sa, ta), (mb, sb, tb) = a, b
    m = jnp.maximum(ma, mb)
    fa = jnp.where(ma == -jnp.inf, 0.0, jnp.exp(ma - m))
    fb = jnp.where(mb == -jnp.inf, 0.0, jnp.exp(mb - m))
    return m, sa * fa + sb * fb, ta * fa + tb * fb


def _block_sums_one_pass(z_NBC: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`_block_sums_two_pass` in one pass over ``z``: each block's max and sums by one variadic reduction with the
    online-softmax combiner (`_combine`), rescaled to the row's max afterwards (on accelerators, where the logits'
    HBM reads are the cost)."""
    finite = z_NBC > -jnp.inf
    return _to_row_max(*jax.lax.reduce((z_NBC, finite.astype(jnp.float32), jnp.where(finite, z_NBC, 0.0)),
                                       (-jnp.inf, 0.0, 0.0), _combine, (2,)))  # fmt: skip


def _to_row_max(m_NB: jax.Array, s_NB: jax.Array, t_NB: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-block ``(max, sum exp(z - max), sum exp(z - max) z)`` rescaled to the row's max: ``(top, mass, moment)``
    as `_block_sums_two_pass` gives them."""
    top = jnp.max(m_NB, axis=-1)
    scale = jnp.where(m_NB == -jnp.inf, 0.0, jnp.exp(m_NB - top[:, None]))
    return top, s_NB * scale, t_NB * scale


def _draw_vocabulary(logits: jax.Array, temperature: jax.Array | float, u: jax.Array, keep: jax.Array | None,
                     tpu_kernel: bool = False) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """The inverse-CDF draw over the whole vocabulary (`invert_cdf`'s rule on ``q = exp(z - max z)``, ``z = logits /
    temperature``, ``-inf`` where ``keep`` is False) from per-block sums: per block of `_CDF_BLOCK` tokens the mass
    ``sum exp(z - max)`` and its first moment ``sum exp(z - max) z`` (one pass over the logits on accelerators,
    `_block_sums_one_pass`; two on CPU; with ``tpu_kernel`` on a TPU the Pallas kernel `jaxgrpo.block_sums`, which
    reads the raw logits where they lie), from which come ``lse = max + log(sum of masses)``, the block to draw
    from, and the entropy ``lse - sum of moments / sum of masses``; then only the drawn block's logits are read again
    (its 128 values, from which the token and its log-prob ``z_x - lse``). Returns ``(tokens, logprobs, entropy)``."""
    n, v = logits.shape
    t = jnp.asarray(temperature, jnp.float32)

    def scaled(x, kept):
        z = x.astype(jnp.float32) / t
        return z if kept is None else jnp.where(kept, z, -jnp.inf)

    nb = -(-v // _CDF_BLOCK)

    def xla(sums):  # over the scaled logits viewed as [N, blocks, 128]
        return lambda x: sums(jnp.pad(scaled(x, keep), ((0, 0), (0, nb * _CDF_BLOCK - v)),
                                      constant_values=-jnp.inf).reshape(n, nb, _CDF_BLOCK))  # fmt: skip

    branches = dict(cpu=xla(_block_sums_two_pass), default=xla(_block_sums_one_pass))
    if tpu_kernel and keep is None:
        if block_sums.supported(n, v):
            branches["tpu"] = lambda x: _to_row_max(*block_sums.block_sums(x, t))
    top, mass, moment = jax.lax.platform_dependent(logits, **branches)
    # the barrier keeps XLA from folding the sums of the block sums into sums over the logits (another pass)
    mass, moment = jax.lax.optimization_barrier((mass, moment))
    cdf = jnp.cumsum(mass, axis=-1)
    total = cdf[:, -1]
    lse = top + jnp.log(total)
    target = u * total
    block = jnp.minimum(jnp.sum(cdf <= target[:, None], axis=-1, dtype=jnp.int32), _last_positive(mass))
    rest = target - jnp.take_along_axis(cdf - mass, block[:, None], axis=-1)[:, 0]
    ids = block[:, None] * _CDF_BLOCK + jnp.arange(_CDF_BLOCK, dtype=jnp.int32)[None, :]
    inside = jnp.minimum(ids, v - 1)
    kept = None if keep is None else jnp.take_along_axis(keep, inside, axis=-1)
    z_NC = jnp.where(ids < v, scaled(jnp.take_along_axis(logits, inside, axis=-1), kept), -jnp.inf)
    e_NC = jnp.exp(z_NC - top[:, None])
    within = jnp.minimum(jnp.sum(jnp.cumsum(e_NC, axis=-1) <= rest[:, None], axis=-1, dtype=jnp.int32),
                         _last_positive(e_NC))  # fmt: skip
    logp = jnp.take_along_axis(z_NC, within[:, None], axis=-1)[:, 0] - lse
    entropy = lse - jnp.sum(moment, axis=-1) / total
    return (block * _CDF_BLOCK + within).astype(jnp.int32), logp, entropy
