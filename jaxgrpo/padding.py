# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Padding and bucketing rules: the static shapes the sampler and the train step compile for.

Every jitted function compiles once per distinct shape, so ragged data is padded to a few bucketed widths:

* `prompt_bucket` — the sampler's prompt width ``Tp`` (and its packed-prompt width): the smallest of 16, 20, 24,
  28, 32, 40, ... (four per octave: at most 25% padding, O(log length) buckets).
* `batch_bucket` — the sampler's number of prompts: the next power of two, a multiple of the batch shards.
* `train_prompt_width` — the train step's prompt width: the longest prompt rounded up to `TRAIN_PROMPT_MULTIPLE`.
* `packed_width` — the train step's packed prompt row (prefix sharing): the sum of the longest prompts a row can
  hold, rounded up to `PACK_BUCKET`; `sampler_packed_width` the sampler's (its rows are known exactly).
* A run's widths: given a ``ladder = (floor, cap)`` -- ``cap`` the widest row the run's data can make
  (`widest_row`), ``floor`` the rung that holds 99% of its steps' rows (`ladder_floor`, from batches drawn from the
  data) -- both packed widths climb `ladder_bucket` (``unit · 2^k``, the top rung ``cap``) from ``floor`` instead: at
  most ``2 + log2(cap / unit)`` programs over a whole run whatever its batches, and in practice one, compiled in the
  first step. The trainer also holds the prompt width fixed (the data's longest prompt, rounded up), so these are the
  only shapes that vary.
* `pack_layout` — the index maps between left-padded prompts ``[P, Tp]`` and packed rows ``[J, W]`` (jit-safe).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

MIN_PROMPT_BUCKET = 16
TRAIN_PROMPT_MULTIPLE = 32  # train-step prompt widths are multiples of this
PACK_BUCKET = 64  # train-step packed prompt rows are a multiple of this wide


def prompt_bucket(length: int, buckets: Sequence[int] | None = None) -> int:
    """Static padded prompt length: the smallest of ``buckets`` >= ``length``; by default the smallest of
    16, 20, 24, 28, 32, 40, 48, 56, 64, 80, ... (``2^k * (1 + j/4)``, j = 0..3) that is >= ``length``."""
    if buckets is not None:
        fits = [b for b in sorted(buckets) if b >= length]
        if not fits:
            raise ValueError(
                f"prompt of {length} tokens is longer than the largest prompt bucket {max(buckets)}; "
                "add a larger bucket to prompt_buckets (or pass prompt_buckets=None for the default buckets)"
            )
        return int(fits[0])
    if length <= MIN_PROMPT_BUCKET:
        return MIN_PROMPT_BUCKET
    step = 1 << max((length - 1).bit_length() - 3, 0)  # a quarter of the octave [2^k, 2^(k+1)) holding length - 1
    return -(-length // step) * step


def batch_bucket(num_prompts: int, multiple_of: int = 1) -> int:
    """Static padded number of prompts: the next power of two >= ``num_prompts``, rounded up to ``multiple_of``."""
    padded = 1 << (max(num_prompts, 1) - 1).bit_length()
    return -(-padded // multiple_of) * multiple_of


def train_prompt_width(prompt_lengths: Sequence[int], cap: int | None = None) -> int:
    """The train step's prompt width: the longest prompt rounded up to `TRAIN_PROMPT_MULTIPLE` (at most ``cap``)."""
    width = TRAIN_PROMPT_MULTIPLE * math.ceil(max(prompt_lengths) / TRAIN_PROMPT_MULTIPLE)
    return width if cap is None else min(width, cap)


def ladder_bucket(need: int, unit: int, cap: int) -> int:
    """The smallest rung of ``unit, 2·unit, 4·unit, ...`` that holds ``need``, or ``cap`` when that rung is wider
    (``cap`` is the top rung: a row of the run is never wider). ValueError when ``need > cap``."""
    if need > cap:
        raise ValueError(f"a packed prompt row of {need} tokens is wider than the run's widest row ({cap} tokens): "
                         "size the cap with jaxgrpo.padding.widest_row over every prompt the run can draw")
    rung = unit << max(math.ceil(max(need, 1) / unit) - 1, 0).bit_length()
    return min(rung, cap)


def ladder_floor(needs: Sequence[int], unit: int, cap: int, quantile: float = 0.99) -> int:
    """The lowest rung a run uses: `ladder_bucket` of the ``quantile`` of ``needs`` (the rows of batches drawn from the
    run's data), so that all but ~1% of its steps share one program."""
    return ladder_bucket(math.ceil(float(np.quantile(np.asarray(needs, np.float64), quantile))), unit, cap)


def widest_row(prompt_lengths: Sequence[int], per_row: int) -> int:
    """The widest packed row ``per_row`` of these prompts can make: the sum of the ``per_row`` longest lengths (the
    ``cap`` of `ladder_bucket` for a run whose prompts all come from ``prompt_lengths``)."""
    return int(np.sort(np.asarray(prompt_lengths, dtype=np.int64))[::-1][: max(per_row, 1)].sum())


def packed_width(prompt_lengths: Sequence[int], pack_rows: int = 1, *, prompt_width: int | None = None,
                 ladder: tuple[int, int] | None = None) -> int:
    """Packed-row width that holds any ``P / pack_rows`` of these prompts: the sum of the ``P / pack_rows`` longest
    lengths rounded up to `PACK_BUCKET` (it fits every row whatever the grouping, and few distinct widths compile);
    with a run's ``ladder = (floor, cap)`` the `ladder_bucket` of ``PACK_BUCKET`` up to ``cap``, at least ``floor``.
    Returns 0 (do not pack) when packing would not be narrower than the padded rows' ``P / pack_rows *
    prompt_width`` tokens."""
    lengths = np.sort(np.asarray(prompt_lengths, dtype=np.int64))[::-1]
    if pack_rows < 1 or len(lengths) % pack_rows:
        raise ValueError(f"pack_rows={pack_rows} must divide the {len(lengths)} prompts")
    per_row = len(lengths) // pack_rows
    need = int(lengths[:per_row].sum())
    if ladder is None:
        width = PACK_BUCKET * math.ceil(need / PACK_BUCKET)
    else:
        width = max(ladder_bucket(need, PACK_BUCKET, ladder[1]), ladder[0])
    if prompt_width is not None and width >= per_row * prompt_width:
        return 0
    return max(width, PACK_BUCKET)


def sampler_packed_width(prompt_lengths: Sequence[int], pack_rows: int, ladder: tuple[int, int] | None = None) -> int:
    """The sampler's packed-row width: `prompt_bucket` of the longest row (prompts ``j*Q .. j*Q+Q-1`` in row j); with
    a run's ``ladder = (floor, cap)`` the `ladder_bucket` of `MIN_PROMPT_BUCKET` up to ``cap``, at least ``floor``."""
    need = sampler_row_need(prompt_lengths, pack_rows)
    return prompt_bucket(need) if ladder is None else max(ladder_bucket(need, MIN_PROMPT_BUCKET, ladder[1]), ladder[0])


def sampler_row_need(prompt_lengths: Sequence[int], pack_rows: int) -> int:
    """The sampler's longest packed row: prompts ``j*Q .. j*Q+Q-1`` lie in row j."""
    per_row = len(prompt_lengths) // pack_rows
    return max(sum(prompt_lengths[j * per_row : (j + 1) * per_row]) for j in range(pack_rows))


def pack_layout(prompt_mask_PT: jax.Array, width: int, rows: int) -> dict[str, jax.Array]:
    """Index maps between left-padded prompt slots ``[P, Tp]`` and ``J = rows`` packed rows of ``W = width`` columns;
    the ``Q = P / J`` consecutive prompts of a row lie end to end, in order.

    Returns int32 ``slot_index [J, Q*Tp]`` (packed column of each slot; 0 for padding slots), ``token_slot [J, W]``
    (flat slot ``q*Tp + s`` of each column; an arbitrary slot for the unused columns at the end), ``last [J, Q]``
    (column of each prompt's last token) and ``position [J, W]`` (each column's position within its prompt). Checks
    that the rows fit when the mask is concrete; under `jax.jit` a too small ``W`` would drop prompt tokens."""
    P, Tp = prompt_mask_PT.shape
    if rows < 1 or P % rows:
        raise ValueError(f"pack_rows={rows} must divide the {P} prompts (one packed row per batch shard)")
    Q = P // rows
    pm = jnp.asarray(prompt_mask_PT).astype(bool)
    n_JQ = jnp.sum(pm, axis=1, dtype=jnp.int32).reshape(rows, Q)
    if not isinstance(prompt_mask_PT, jax.core.Tracer):
        need = int(jnp.max(jnp.sum(n_JQ, axis=1)))
        if need > width:
            raise ValueError(f"packed_width={width} cannot hold a packed row of {need} prompt tokens; use "
                             "jaxgrpo.padding.packed_width(prompt_lengths, pack_rows) to size it")  # fmt: skip
    end_JQ = jnp.cumsum(n_JQ, axis=1)
    first_JQ = Tp - n_JQ  # first real slot of each left-padded prompt
    shift_JQ = end_JQ - n_JQ - first_JQ  # packed column = slot + shift
    slot_index = jnp.where(pm.reshape(rows, Q, Tp), jnp.arange(Tp, dtype=jnp.int32) + shift_JQ[..., None], 0)
    c_W = jnp.arange(width, dtype=jnp.int32)
    q_JW = jnp.minimum(jnp.sum(c_W[None, :, None] >= end_JQ[:, None, :], axis=-1, dtype=jnp.int32), Q - 1)
    s_JW = jnp.clip(c_W - jnp.take_along_axis(shift_JQ, q_JW, axis=1), 0, Tp - 1)
    position = jnp.maximum(s_JW - jnp.take_along_axis(first_JQ, q_JW, axis=1), 0)
    return dict(slot_index=slot_index.reshape(rows, Q * Tp), token_slot=q_JW * Tp + s_JW, last=end_JQ - 1,
                position=position)  # fmt: skip
