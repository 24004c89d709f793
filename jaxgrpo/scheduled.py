# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""One step's rollout under a degeneracy-aware schedule (``rollout.schedule != none``): the trainer's glue around
`jaxgrpo.scheduler`.

Per round: the scheduler picks P prompts (no prompt twice) from the prompt iterator (skipping predicted-degenerate ones,
GRESO) and a group size for each (adaptive G, at most ``rollout.schedule_budget`` samples per round: each resampling
round its own); the groups are sampled, scored, and, with ``algo.degenerate_groups=resample``,
rounds repeat until P informative groups are held or ``algo.resample_max_rounds`` rounds were drawn (as the
trainer's own round-based dynamic sampling; on the engine it is done at the group level: `stream` with ``skip``
alone, `stream_sized` with ``adaptive``).
The history is updated once, after every round of the step was scored, so a step that fails in its reward functions
leaves the history as it was (the trainer retries the step).

Groups of unequal size share the step's ``[P, G]`` arrays (G = ``rollout.group_size``, the largest size): a prompt
with G_i < G samples G_i rows; rows G_i..G-1 are padding (``valid`` False, empty completion mask), which the
estimators and the loss ignore (`jaxgrpo.advantages`). G_i rows are sampled as G_i / u sub-groups of u =
``rollout.schedule_min_group`` rows, so one sampler program (u samples per prompt) serves every size; the engine
then runs (slots) × G / u group slots of u rows: as many rows in flight as a run without the schedule.

With ``skip`` alone every group has G rows and the trainer's own `Trainer.sample` samples them (the same program,
the same keys: a step whose prompts are all kept is today's step).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxgrpo import sampling
from jaxgrpo.groups import Rollout, degenerate_groups, merge_groups, resample_metrics, sampled_tokens, stream_groups
from jaxgrpo.rollout import driver as rollout_driver


def rollout(tr: Any, step: int, key: jax.Array) -> tuple[Rollout, dict[str, float]]:
    """The step's rollout and its metrics (``tokens/sampled``, ``resample/*`` with resample, ``schedule/*``);
    ``tr`` is the `jaxgrpo.trainer.Trainer`."""
    sch, a, r = tr.scheduler, tr.cfg.algo, tr.cfg.rollout
    if a.degenerate_groups == "resample" and getattr(tr, "use_engine", False):
        return stream_sized(tr, step, key) if sch.settings.adaptive else stream(tr, step, key)
    want = r.prompts_per_step
    max_rounds = a.resample_max_rounds if a.degenerate_groups == "resample" else 1
    pool: list[Rollout] = []
    seen: list[tuple[list[int], Rollout, np.ndarray]] = []
    informative: list[tuple[int, int]] = []
    degenerate: list[tuple[int, int]] = []
    skipped, sizes_all, stats = [0], [], {}
    while True:
        r_i = len(pool)
        kept = draw_round(tr, step, r_i, skipped)
        sizes = sch.group_sizes(kept)
        round_key = key if r_i == 0 else jax.random.fold_in(key, r_i)
        tr.rollout_stats = {}
        roll = sample_sized(tr, kept, sizes, round_key) if sch.settings.adaptive else tr.sample(kept, round_key)
        stats.update(tr.rollout_stats)
        deg = degenerate_groups(a, roll.rewards, roll.valid)
        pool.append(roll)
        seen.append((kept, roll, deg))
        sizes_all += [int(g) for g in sizes]
        informative += [(r_i, int(p)) for p in np.flatnonzero(~deg)]
        degenerate += [(r_i, int(p)) for p in np.flatnonzero(deg)]
        if len(informative) >= want or len(pool) >= max_rounds:
            break
    counts = record_step(sch, [(kept, roll.rewards, roll.valid, deg) for kept, roll, deg in seen])
    tokens = sampled_tokens(pool)
    out = pool[0] if len(pool) == 1 else merge_groups(pool, (informative + degenerate)[:want])
    extra: dict[str, float] = {"tokens/sampled": tokens}
    if a.degenerate_groups == "resample":
        extra.update(resample_metrics(len(pool), want * len(pool), want, len(informative), len(degenerate), tokens))
    extra.update(schedule_metrics(sch, skipped[0], len(informative), tokens, sizes_all, counts))
    return out, {**extra, **stats}


def draw_round(tr: Any, step: int, r: int, skipped: list[int]) -> list[int]:
    """Round ``r``'s P prompts as the schedule keeps them (the skip rule's draws, ``default_rng([seed, step, r,
    37])``; `jaxgrpo.scheduler.Scheduler.select`: no prompt twice when the data set holds at least P); the prompts it
    skipped are added to ``skipped[0]``."""
    want = tr.cfg.rollout.prompts_per_step
    kept, skip = tr.scheduler.select(lambda n: tr.iterator.next_batch(n), want, step, r,
                                     max_draws=max(100 * want, len(tr.examples)))  # fmt: skip
    skipped[0] += len(skip)
    return kept


def _streamed(tr: Any, done: list[tuple[int, Rollout, bool]], sizes: list[int], rounds: int, admitted: int,
              unread_tokens: int, skipped: int, stats: Any) -> tuple[Rollout, dict[str, float]]:
    """A streamed step's rollout and metrics from its completed groups ``done`` ((prompt, one-group rollout,
    degenerate), in completion order; ``sizes`` their sizes): the history records them, the step trains on the first
    P of the informative groups then the degenerate ones, and ``tokens/sampled`` counts every token sampled
    (``unread_tokens``: those of the groups dropped)."""
    sch, want = tr.scheduler, tr.cfg.rollout.prompts_per_step
    counts = record_step(sch, [([p for p, _, _ in done], np.concatenate([o.rewards for _, o, _ in done]),
                                np.concatenate([o.valid for _, o, _ in done]), np.asarray([d for _, _, d in done]))])
    informative = [o for _, o, d in done if not d]
    pool = informative + [o for _, o, d in done if d]
    tokens = sampled_tokens(pool) + unread_tokens
    out = merge_groups(pool, [(i, 0) for i in range(min(want, len(pool)))])
    extra = resample_metrics(rounds, admitted, want, len(informative), len(pool) - len(informative), tokens)
    extra.update(schedule_metrics(sch, skipped, len(informative), tokens, sizes, counts))
    return out, {**extra, **stats.metrics()}


def record_step(sch: Any, groups: list[tuple[Any, np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, float]:
    """Adds a step's scored groups to the history (``groups``: one ``(prompts, rewards, valid, degenerate)`` per
    round, in order), then moves the exploration bases once for the step (`jaxgrpo.scheduler.Scheduler.adapt`);
    returns the summed counts of `Scheduler.record`."""
    counts: dict[str, float] = {}
    for prompts, rewards, valid, deg in groups:
        for k, v in sch.record(prompts, rewards, valid, deg).items():
            counts[k] = counts.get(k, 0.0) + v
    sch.adapt(counts)
    return counts


def schedule_metrics(sch: Any, skipped: int, informative: int, tokens: float, sizes: list[int],
                     counts: dict[str, float]) -> dict[str, float]:
    """The step's ``schedule/*`` metrics (docs/degeneracy.md §4); ``schedule/explore_pass|fail`` (the skip rule's
    bases, after the step) with ``skip``."""
    sizes_arr = np.asarray(sizes, np.float64)
    bases = {"schedule/explore_pass": sch.explore_pass, "schedule/explore_fail": sch.explore_fail}
    return {
        **(bases if sch.settings.skip else {}),
        "schedule/skipped": float(skipped),
        "schedule/skipped_total": float(sch.skipped_total),
        "schedule/informative_groups": float(informative),
        "schedule/informative_per_1k_tokens": 1000.0 * informative / max(tokens, 1.0),
        "schedule/samples": float(sizes_arr.sum()),
        "schedule/group_size_mean": float(sizes_arr.mean()),
        "schedule/group_size_min": float(sizes_arr.min()),
        "schedule/group_size_max": float(sizes_arr.max()),
        "schedule/predicted_degenerate": counts["predicted"],
        "schedule/predicted_hits": counts["hits"],
        "schedule/predictor_precision": sch.precision,
    }


def stream(tr: Any, step: int, key: jax.Array) -> tuple[Rollout, dict[str, float]]:
    """``skip`` with ``degenerate_groups=resample`` on the engine: dynamic sampling at the group level
    (`jaxgrpo.groups.stream_groups`, as `jaxgrpo.dynamic_sampling.stream_resample`) with the schedule's admission. Each
    round's P prompts are picked by the skip rule (the same draws as the round-based path: ``default_rng([seed, step,
    round, 37])``) when slots free up, each completed group is scored at once, and admission stops when P informative
    groups are done or ``algo.resample_max_rounds`` rounds were admitted; groups still in flight are dropped,
    unobserved (the history records the completed groups only)."""
    skipped = [0]
    done, rounds, stats = stream_groups(tr, key, lambda r: draw_round(tr, step, r, skipped),
                                        tr.cfg.algo.resample_max_rounds, tr.cfg.rollout.prompts_per_step)  # fmt: skip
    return _streamed(tr, done, [tr.cfg.rollout.group_size] * len(done), rounds, stats.admitted, stats.dropped_tokens,
                     skipped[0], stats)  # fmt: skip


def sample_sized(tr: Any, indices: list[int], sizes: np.ndarray, key: jax.Array) -> Rollout:
    """Samples ``sizes[i]`` completions for prompt ``indices[i]`` (multiples of u = ``schedule_min_group``, as
    sub-groups of u) and scores them; returns the padded ``[P, G]`` rollout (padding rows invalid and empty)."""
    unit = tr.scheduler.settings.min_group
    expanded = [i for i, g in zip(indices, sizes) for _ in range(int(g) // unit)]
    prompt_ids = [tr.encoded[i] for i in expanded]
    if tr.use_engine:  # the same rows in flight as G-row groups in `slots` slots
        groups, stats = tr.drive(prompt_ids, key, num_samples=unit)
        tr.rollout_stats = stats.metrics()
        comp = rollout_driver.completions(groups, range(len(prompt_ids)))
    else:  # each host its share (several processes with rollout devices of their own)
        from jaxgrpo import async_rollout

        comp = async_rollout.sample_across_processes(tr, prompt_ids, key, num_samples=unit)
    return score_sized(tr, indices, sizes, comp)


def score_sized(tr: Any, indices: list[int], sizes: np.ndarray | list[int], comp: sampling.Completions) -> Rollout:
    """Scores host-side completions of groups of sizes ``sizes`` (rows prompt-major) and pads them into the
    ``[P, G]`` layout (`pad_groups`)."""
    texts, rw, valid = tr.score_rows(indices, sizes, comp)
    return pad_groups(tr, indices, np.asarray(sizes), comp, texts, rw, valid, tr.cfg.rollout.group_size)


def stream_sized(tr: Any, step: int, key: jax.Array) -> tuple[Rollout, dict[str, float]]:
    """``adaptive`` (with or without ``skip``) with ``degenerate_groups=resample`` on the engine: the streaming fill
    with groups of unequal size. Each round's prompts and sizes G_i are picked as in `rollout`; prompt i enters the
    engine as G_i / u sub-groups of u rows (slots x G / u slots of u rows, as `sample_sized`), its group is scored
    once its last sub-group completes, and admission stops at the P-th informative group or after
    ``algo.resample_max_rounds`` rounds. Groups not complete then are dropped, unobserved; every token they sampled
    (sub-groups finished, in flight or finished beside the last) counts in ``tokens/sampled``."""
    sch, a, r = tr.scheduler, tr.cfg.algo, tr.cfg.rollout
    want, unit = r.prompts_per_step, sch.settings.min_group
    rounds: list[tuple[list[int], np.ndarray]] = []
    entries: list[tuple[int, int]] = []  # engine prompt number -> (round, position in the round)
    parts: dict[tuple[int, int], list[rollout_driver.Group]] = {}
    done: list[tuple[int, Rollout, bool]] = []
    done_sizes: list[int] = []
    skipped = [0]

    def draw() -> list[list[int]]:
        kept = draw_round(tr, step, len(rounds), skipped)
        sizes = sch.group_sizes(kept)
        subs = [(len(rounds), j) for j, g in enumerate(sizes) for _ in range(int(g) // unit)]
        rounds.append((kept, sizes))
        entries.extend(subs)
        return [tr.encoded[kept[j]] for _, j in subs]

    def more() -> list[list[int]] | None:
        return draw() if len(rounds) < a.resample_max_rounds else None

    def on_group(p: int, grp: rollout_driver.Group) -> bool:
        r_i, j = entries[p]
        got = parts.setdefault((r_i, j), [])
        got.append(grp)
        kept, sizes = rounds[r_i]
        if len(got) < int(sizes[j]) // unit:
            return False
        comp = rollout_driver.completions(dict(enumerate(got)), range(len(got)))
        one = score_sized(tr, [kept[j]], [sizes[j]], comp)
        deg = bool(degenerate_groups(a, one.rewards, one.valid)[0])
        done.append((kept[j], one, deg))
        done_sizes.append(int(sizes[j]))
        del parts[(r_i, j)]
        return sum(not d for _, _, d in done) >= want

    _, stats = tr.drive(draw(), key, num_samples=unit, on_group=on_group, more=more)
    unfinished = sum(int(g.mask.sum()) for got in parts.values() for g in got)  # sub-groups of incomplete groups
    admitted = len(set(entries[: stats.admitted]))  # groups with at least one sub-group admitted
    return _streamed(tr, done, done_sizes, len(rounds), admitted, unfinished + stats.dropped_tokens, skipped[0],
                     stats)  # fmt: skip


def pad_groups(tr: Any, indices: list[int], sizes: np.ndarray, comp: sampling.Completions, texts: list[str],
               rewards: np.ndarray, valid: np.ndarray, g_max: int) -> Rollout:
    """Rows of groups of sizes ``sizes`` (concatenated, prompt-major) into ``[P, g_max]`` with invalid padding."""
    n, dest = len(indices), np.concatenate([p * g_max + np.arange(int(g)) for p, g in enumerate(sizes)])
    fields = {}
    for name in ("tokens", "logprobs", "mask", "lengths", "truncated", "entropy"):
        x = getattr(comp, name)
        if x is None:
            continue
        x = np.asarray(x)
        full = np.zeros((n * g_max, *x.shape[1:]), x.dtype)
        full[dest] = x
        fields[name] = full
    out_texts = [""] * (n * g_max)
    for j, d in enumerate(dest):
        out_texts[d] = texts[j]
    flat_r, flat_v = np.zeros(n * g_max, np.float32), np.zeros(n * g_max, bool)
    flat_r[dest], flat_v[dest] = rewards, valid
    return Rollout([tr.encoded[i] for i in indices], [tr.examples[i] for i in indices],
                   sampling.Completions(**fields), out_texts, flat_r.reshape(n, g_max),
                   flat_v.reshape(n, g_max))  # fmt: skip
