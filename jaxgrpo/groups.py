# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""One step's sampled groups on the host, between the rollout half and the learner: the `Rollout` the trainer scores
and keeps, whole groups merged from resampling rounds (`merge_groups`), the train step's `Batch` made from them
(`make_batch`), this process's share of a multi-host batch, and dynamic sampling's metrics."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import advantages, sampling
from jaxgrpo import data as data_lib
from jaxgrpo.learner.batch import Batch, left_pad_prompts


@dataclasses.dataclass
class Rollout:
    """One step's sampled groups, host side, prompt-major: P prompts × G samples."""

    prompt_ids: list[list[int]]
    examples: list[data_lib.Example]
    completions: sampling.Completions
    texts: list[str]
    rewards: np.ndarray  # [P, G]
    valid: np.ndarray  # [P, G]


def estimator_kwargs(algo: Any) -> dict[str, Any]:
    """The estimator's keywords as the train step passes them (`jaxgrpo.learner.minibatch.StepParts`): the degeneracy
    tolerances unless ``algo.estimator_args`` sets them (`advantages.compute` routes them where they are used)."""
    return {"atol": algo.degenerate_atol, "rtol": algo.degenerate_rtol, **algo.estimator_args}


def degenerate_groups(algo: Any, rewards: Any, valid: Any) -> np.ndarray:
    """``[P]`` bool: the groups the step masks as degenerate and a resampling round does not count as informative
    (`jaxgrpo.advantages.degenerate_for` under ``algo``'s estimator, its arguments and the step's tolerances)."""
    return np.asarray(advantages.degenerate_for(algo.estimator, jnp.asarray(rewards, jnp.float32),
                                                jnp.asarray(valid, bool), **estimator_kwargs(algo)))  # fmt: skip


def make_batch(rollout: Rollout, prompt_width: int, pad_id: int) -> Batch:
    """Packs a rollout into the train step's layout: prompt left-padded to `prompt_width`, completion after it."""
    comp = rollout.completions
    prompt, pmask = left_pad_prompts(rollout.prompt_ids, rollout.rewards.shape[1], prompt_width, pad_id)
    ctok = np.asarray(comp.tokens)
    cmask = np.asarray(comp.mask) & rollout.valid.reshape(-1)[:, None]
    return Batch(
        tokens=jnp.asarray(np.concatenate([prompt, np.where(cmask, ctok, pad_id)], axis=1)),
        prompt_mask=jnp.asarray(pmask),
        completion_mask=jnp.asarray(cmask),
        rewards=jnp.asarray(rollout.rewards, jnp.float32),
        valid=jnp.asarray(rollout.valid),
        old_logprobs=jnp.asarray(np.where(cmask, np.asarray(comp.logprobs), 0.0), jnp.float32),
        ref_logprobs=None,
    )


def process_share(batch: Batch, num_groups: int) -> Batch:
    """This process's whole groups of a host-global batch: the contiguous slice `process_index` of P / processes
    groups (`train_step.global_batch` assembles the global array; group order does not change the step)."""
    n = jax.process_count()
    if n == 1:
        return batch
    per, i = num_groups // n, jax.process_index()
    rows = batch.tokens.shape[0] // num_groups

    def take(x):
        if x is None:
            return None
        scale = rows if x.shape[0] == batch.tokens.shape[0] else 1
        return x[i * per * scale:(i + 1) * per * scale]

    return jax.tree.map(take, batch)


def merge_groups(pool: list[Rollout], picks: list[tuple[int, int]]) -> Rollout:
    """Selects whole groups (round, prompt) from several rollouts into one prompt-major rollout."""
    g = pool[0].rewards.shape[1]
    rows = [(r, p * g + j) for r, p in picks for j in range(g)]
    comp_fields = {}
    for f in dataclasses.fields(pool[0].completions):
        if getattr(pool[0].completions, f.name) is None:
            continue
        comp_fields[f.name] = np.stack([np.asarray(getattr(pool[r].completions, f.name))[i] for r, i in rows])
    return Rollout(
        prompt_ids=[pool[r].prompt_ids[p] for r, p in picks],
        examples=[pool[r].examples[p] for r, p in picks],
        completions=type(pool[0].completions)(**comp_fields),
        texts=[pool[r].texts[i] for r, i in rows],
        rewards=np.stack([pool[r].rewards[p] for r, p in picks]),
        valid=np.stack([pool[r].valid[p] for r, p in picks]),
    )


def resample_metrics(rounds: int, sampled: int, want: int, informative: int, degenerate: int,
                     tokens: float) -> dict[str, float]:  # fmt: skip
    """Dynamic sampling's metrics: rounds of P prompts drawn, groups sampled but not trained on, the fractions
    (``degenerate_frac`` among the groups scored: on the engine a group dropped in flight has no outcome)."""
    return {
        "tokens/sampled": tokens,
        "resample/rounds": float(rounds),
        "resample/discarded_groups": float(sampled - want),
        "resample/degenerate_frac": degenerate / max(informative + degenerate, 1),
        "resample/informative_frac": min(informative, want) / want,
    }


def sampled_tokens(rollouts: list[Rollout]) -> float:
    """Completion tokens sampled in these rollouts (every round of a step, discarded groups included)."""
    return float(sum(np.asarray(r.completions.mask).sum() for r in rollouts))


def stream_groups(tr: Any, key: jax.Array, draw_round: Callable[[int], list[int]], max_rounds: int, want: int
                  ) -> tuple[list[tuple[int, Rollout, bool]], int, Any]:
    """Dynamic sampling at the group level on the engine (``tr`` the `jaxgrpo.trainer.Trainer`): rounds of prompts
    ``draw_round(r)`` are admitted as slots free up (at most ``max_rounds``), each completed group is scored at once,
    and admission stops when ``want`` informative groups are done (groups still in flight are dropped). Returns the
    completed groups in completion order as (prompt index, its one-group rollout, degenerate), the rounds drawn and
    the engine's stats."""
    a = tr.cfg.algo
    rounds = [draw_round(0)]
    n = len(rounds[0])
    done: list[tuple[int, Rollout, bool]] = []

    def more() -> list[list[int]] | None:
        if len(rounds) >= max_rounds:
            return None
        rounds.append(draw_round(len(rounds)))
        return [tr.encoded[i] for i in rounds[-1]]

    def on_group(p: int, grp: Any) -> bool:
        comp = sampling.Completions(grp.tokens, grp.logprobs, grp.mask, grp.mask.sum(-1, dtype=np.int32), ~grp.eos,
                                    grp.entropy)  # fmt: skip
        prompt = rounds[p // n][p % n]
        one = tr.score([prompt], comp)
        deg = bool(degenerate_groups(a, one.rewards, one.valid)[0])
        done.append((prompt, one, deg))
        return sum(not d for _, _, d in done) >= want

    _, stats = tr.drive([tr.encoded[i] for i in rounds[0]], key, on_group=on_group, more=more)
    return done, len(rounds), stats
