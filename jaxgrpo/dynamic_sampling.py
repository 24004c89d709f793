# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""One step's rollout for the trainer: P groups, or with ``algo.degenerate_groups=resample`` DAPO's dynamic sampling
(Yu et al. 2025, arXiv:2503.14476): prompts are drawn until P informative groups are held or
``algo.resample_max_rounds`` rounds of P prompts are spent, group by group (the rollout driver) or in rounds
(several hosts with rollout devices of their own: each samples its share of a round); a degeneracy-aware schedule
(``rollout.schedule``) is `jaxgrpo.scheduled`'s."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxgrpo.groups import Rollout, degenerate_groups, merge_groups, resample_metrics, sampled_tokens, stream_groups
from jaxgrpo.scheduled import rollout as scheduled_rollout


def rollout(tr: Any, step: int) -> tuple[Rollout, dict[str, float]]:
    """Samples P groups; with degenerate_groups=resample, keeps drawing prompts until P informative groups are
    held or `algo.resample_max_rounds` rounds of P prompts are spent (DAPO's dynamic sampling, Yu et al. 2025,
    arXiv:2503.14476; with the engine at the group level: each group is scored as it completes and the next
    prompt takes its slot). A shortfall is filled with degenerate groups (the step masks them). ``tr``: the
    `jaxgrpo.trainer.Trainer`."""
    key = jax.random.fold_in(jax.random.fold_in(tr.key, step), 0)
    a = tr.cfg.algo
    tr.rollout_stats = {}
    if tr.scheduler is not None:  # degeneracy-aware admission and group sizes (jaxgrpo.scheduled)
        return scheduled_rollout(tr, step, key)
    if a.degenerate_groups != "resample":
        first = tr.sample(tr.iterator.next_batch(), key)
        return first, {"tokens/sampled": sampled_tokens([first]), **tr.rollout_stats}
    if tr.use_engine:
        return stream_resample(tr, key)
    first = tr.sample(tr.iterator.next_batch(), key)
    want = len(first.prompt_ids)
    pool, informative, degenerate = [first], [], []
    while True:
        r_i, cur = len(pool) - 1, pool[-1]
        deg = degenerate_groups(a, cur.rewards, cur.valid)
        informative += [(r_i, p) for p in np.flatnonzero(~deg)]
        degenerate += [(r_i, p) for p in np.flatnonzero(deg)]
        if len(informative) >= want or len(pool) >= a.resample_max_rounds:
            break
        pool.append(tr.sample(tr.iterator.next_batch(), jax.random.fold_in(key, len(pool))))
    kept = (informative + degenerate)[:want]
    sampled = sum(len(r.prompt_ids) for r in pool)
    return merge_groups(pool, kept), resample_metrics(len(pool), sampled, want, len(informative), len(degenerate),
                                                      sampled_tokens(pool))  # fmt: skip


def stream_resample(tr: Any, key: jax.Array) -> tuple[Rollout, dict[str, float]]:
    """Dynamic sampling at the group level: rounds of P prompts are drawn as slots free up; each completed group
    is scored at once; the run stops when P informative groups are done (groups in flight are dropped; their tokens
    count in ``tokens/sampled``)."""
    want = tr.cfg.rollout.prompts_per_step
    done, rounds, stats = stream_groups(tr, key, lambda _: tr.iterator.next_batch(), tr.cfg.algo.resample_max_rounds,
                                        want)  # fmt: skip
    tr.rollout_stats = stats.metrics()
    informative = [one for _, one, d in done if not d]
    degenerate = [one for _, one, d in done if d]
    pool = informative + degenerate
    kept = merge_groups(pool, [(i, 0) for i in range(min(want, len(pool)))])
    return kept, {**resample_metrics(rounds, stats.admitted, want, len(informative), len(degenerate),
                                     sampled_tokens(pool) + stats.dropped_tokens), **tr.rollout_stats}  # fmt: skip
