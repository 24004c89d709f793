# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The train step's batch of one rollout, sized to what was sampled, and the shapes a run fixes for it.

A run fixes the prompt width (the data's longest prompt, rounded up) and the packed widths' ladders
(`perf.shape_ladders`) once (`StepShapes`). With ``perf.trim_batch`` each step's batch is then cut to what it holds:

* **Completion width** ``Tc = ladder_bucket(n, u, M)`` (`padding.ladder_bucket`), ``n`` the longest completion that
  can carry loss (a valid sample, not in a masked degenerate group), ``M = rollout.max_new_tokens`` the top rung,
  ``u = completion_unit(M)`` (``M / 8`` rounded up to 16): at most four or five widths over a run, not one per step.
  Columns past ``n`` are padding in every loss row, so the loss, its denominators and its gradient are unchanged; the
  one use of ``Tc`` in the loss, ``seq-mean-token-sum-norm``'s constant ``max_tokens``, is fixed to ``M`` when unset
  (`step_algo`).
* **Rows.** With ``algo.degenerate_groups`` = mask (or resample) a degenerate group's tokens leave the loss and every
  denominator; dropping such a group before the step leaves the loss and gradient unchanged *provided* no other group
  reads it: not with ``grpo``'s ``scale="batch"`` (its batch std counts every group) nor with Clip-Cov (its random
  token draw has the batch's shape); `row_blocker` says why not. Group ``p`` of a rollout is trained in part
  ``p mod S`` (``S = num_minibatches × grad_accum_steps``, `jaxgrpo.learner.minibatch`), and each part must keep its
  groups so that every optimizer update sees the same ones: `kept_groups` keeps, for every part, its informative groups
  and fills up to ``m`` with the part's own degenerate groups (still masked by the step), ``m`` the
  `padding.ladder_bucket` of the fullest part's informative count on rungs ``u_r · 2^k`` up to ``P / S``, ``u_r`` a
  quarter of ``P / S`` rounded up to a multiple of the batch shards ``data × fsdp``. The batch has ``P' = S · m``
  groups, a multiple of ``S × data × fsdp`` as the step requires (each shard holds whole parts' groups), and at most
  three row counts occur over a run.

The step's metrics that read the whole rollout (degeneracy diagnostics, masked groups, prompt and completion tokens)
are computed on the host from the full rollout (`full_metrics`) and replace the trimmed batch's; the token
statistics (entropy, sampler mismatch) are over the trained rows.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxgrpo import advantages as advantages_lib
from jaxgrpo import degeneracy, padding
from jaxgrpo.config_sections import AlgoConfig, PerfConfig
from jaxgrpo.groups import Rollout, degenerate_groups, estimator_kwargs, make_batch, merge_groups, process_share
from jaxgrpo.learner.batch import Batch, global_batch
from jaxgrpo.learner.perf import packed_prompt_width, shape_ladders

COMPLETION_UNIT = 16  # completion widths are multiples of this (or the cap)
COMPLETION_RUNGS = 8  # the lowest completion rung is about max_new_tokens / this
ROW_RUNGS = 4  # the fewest groups per part trained is about (P / S) / this


def completion_unit(cap: int) -> int:
    """The lowest rung of the completion-width ladder: ``cap / 8`` rounded up to a multiple of 16."""
    return COMPLETION_UNIT * max(math.ceil(cap / COMPLETION_RUNGS / COMPLETION_UNIT), 1)


def completion_width(longest: int, cap: int) -> int:
    """The train step's completion width for a step whose longest loss-carrying completion has ``longest`` tokens:
    the smallest rung of ``u, 2u, 4u, ...`` (``u = completion_unit(cap)``) that holds it, or ``cap``."""
    return padding.ladder_bucket(max(int(longest), 1), completion_unit(cap), cap)


def row_unit(groups_per_part: int, shards: int) -> int:
    """The lowest rung of groups per part: a quarter of ``groups_per_part``, rounded up to a multiple of ``shards``."""
    return shards * max(math.ceil(groups_per_part / ROW_RUNGS / shards), 1)


def kept_groups(degenerate: np.ndarray, splits: int, shards: int) -> np.ndarray:
    """The groups of a rollout to train on, in the batch's new order: for each part ``s`` (groups ``p ≡ s mod
    splits``) its informative groups then its own degenerate ones, ``m`` per part, ``m`` the rung of the fullest part
    (module docstring); new group ``j·splits + s`` is part ``s``'s ``j``-th, so it stays in part ``s``."""
    deg = np.asarray(degenerate, bool)
    P = deg.shape[0]
    if P % (splits * shards):
        raise ValueError(f"{P} groups cannot be split into {splits} parts on {shards} batch shards")
    n = P // splits
    parts = [np.arange(s, P, splits) for s in range(splits)]
    ordered = [np.concatenate([p[~deg[p]], p[deg[p]]]) for p in parts]  # informative first, stable
    need = max(int((~deg[p]).sum()) for p in parts)
    m = padding.ladder_bucket(max(need, 1), row_unit(n, shards), n)
    return np.stack([o[:m] for o in ordered], axis=1).reshape(-1)


def row_blocker(algo: AlgoConfig) -> str | None:
    """Why this algo's degenerate groups cannot be dropped from the batch (None: they can): they are not masked, or
    another group's loss reads them."""
    if algo.degenerate_groups not in ("mask", "resample"):
        return None if algo.degenerate_groups == "keep" else f"algo.degenerate_groups={algo.degenerate_groups}"
    if algo.estimator == "grpo" and algo.estimator_args.get("scale", "group") == "batch":
        return "grpo's scale=batch reads every group's rewards"
    if algo.objective == "clip_cov":
        return "Clip-Cov draws its random tokens over the batch's shape"
    return None


def step_algo(algo: AlgoConfig, max_new_tokens: int) -> AlgoConfig:
    """``algo`` with ``max_tokens`` set to ``max_new_tokens`` when unset (its documented meaning): the train step
    would otherwise take the batch's completion width, which `StepShapes` narrows."""
    return algo if algo.max_tokens is not None else dataclasses.replace(algo, max_tokens=int(max_new_tokens))


def full_metrics(algo: AlgoConfig, roll: Rollout) -> dict[str, float]:
    """The step's metrics that read the whole rollout, from the host: `degeneracy.diagnostics` (with the
    estimator's advantages), ``degeneracy/masked_groups``, ``tokens/prompt`` and ``tokens/completion``."""
    rewards, valid = jnp.asarray(roll.rewards, jnp.float32), jnp.asarray(roll.valid, bool)
    adv = advantages_lib.compute(algo.estimator, rewards, valid, **estimator_kwargs(algo))
    out = degeneracy.diagnostics(rewards, valid, adv, atol=algo.degenerate_atol, rtol=algo.degenerate_rtol)
    out = {k: float(v) for k, v in out.items()}
    G = roll.rewards.shape[1]
    masked = algo.degenerate_groups in ("mask", "resample")
    out["degeneracy/masked_groups"] = float(degenerate_groups(algo, roll.rewards, roll.valid).sum()) if masked else 0.0
    out["tokens/prompt"] = float(G * sum(len(p) for p in roll.prompt_ids))
    out["tokens/completion"] = float((np.asarray(roll.completions.mask) & roll.valid.reshape(-1)[:, None]).sum())
    return out


def narrow(roll: Rollout, groups: np.ndarray, width: int) -> Rollout:
    """The rollout's ``groups`` (in that order) with completions cut to ``width`` columns."""
    picked = merge_groups([roll], [(0, int(p)) for p in groups])
    comp = picked.completions
    cut = {f.name: np.asarray(getattr(comp, f.name))[:, :width] for f in dataclasses.fields(comp)
           if f.name in ("tokens", "logprobs", "mask", "entropy") and getattr(comp, f.name) is not None}
    return dataclasses.replace(picked, completions=dataclasses.replace(comp, **cut))


@dataclasses.dataclass
class StepShapes:
    """The shapes a run's train step takes: the prompt width and packed-width ladders fixed at startup, and each
    step's batch (`batch`) trimmed as the module docstring says when ``perf.trim_batch``."""

    algo: AlgoConfig
    perf: PerfConfig
    mesh: Mesh | None
    max_new_tokens: int
    prompt_width: int
    ladders: dict[str, tuple[int, int]]
    pad_id: int = 0

    @classmethod
    def for_prompts(cls, prompt_lengths: list[int], prompts_per_step: int, slots: int, algo: AlgoConfig,
                    perf: PerfConfig, mesh: Mesh | None, max_new_tokens: int, pad_id: int = 0) -> StepShapes:
        """A run's shapes from every prompt length it can draw (`padding.train_prompt_width`, `shape_ladders`)."""
        ladders = shape_ladders(prompt_lengths, prompts_per_step, slots, algo, mesh)
        return cls(algo, perf, mesh, int(max_new_tokens), padding.train_prompt_width([max(prompt_lengths)]), ladders,
                   pad_id)  # fmt: skip

    @property
    def shards(self) -> int:
        return 1 if self.mesh is None else int(self.mesh.shape["data"] * self.mesh.shape["fsdp"])

    def notes(self) -> list[str]:
        """Why ``perf.trim_batch`` applies only in part to this run (one line each; empty when it applies fully)."""
        if not self.perf.trim_batch:
            return []
        if self.algo.objective == "clip_cov":
            return ["perf.trim_batch=true does not apply: Clip-Cov draws its random tokens over the batch's shape; "
                    "the batch keeps rollout.max_new_tokens and every group"]
        why = row_blocker(self.algo)
        if self.algo.degenerate_groups != "keep" and why:
            return [f"perf.trim_batch=true keeps the degenerate groups in the batch: {why}"]
        return []

    def plan(self, roll: Rollout) -> tuple[np.ndarray, int]:
        """``(groups, completion width)`` of this rollout's batch (all groups at ``max_new_tokens`` when trimming is
        off or does not apply)."""
        P = roll.rewards.shape[0]
        everything = (np.arange(P), self.max_new_tokens)
        if not self.perf.trim_batch or self.algo.objective == "clip_cov":
            return everything
        masked = self.algo.degenerate_groups in ("mask", "resample")
        deg = degenerate_groups(self.algo, roll.rewards, roll.valid) if masked else np.zeros(P, bool)
        groups = np.arange(P)
        if self.drops_rows():
            splits = int(self.algo.num_minibatches) * int(self.algo.grad_accum_steps)
            groups = kept_groups(deg, splits, self.shards)
        G = roll.rewards.shape[1]
        rows = (groups[:, None] * G + np.arange(G)).reshape(-1)
        rows = rows[(roll.valid & ~deg[:, None]).reshape(-1)[rows]]  # the batch's rows that can carry loss tokens
        longest = int(np.asarray(roll.completions.mask).sum(-1)[rows].max()) if rows.size else 1
        return groups, completion_width(longest, self.max_new_tokens)

    def drops_rows(self) -> bool:
        """Whether this run's batches leave out masked degenerate groups."""
        masked = self.algo.degenerate_groups in ("mask", "resample")
        return self.perf.trim_batch and masked and row_blocker(self.algo) is None

    def batch(self, roll: Rollout, overlong_filter: bool = False) -> tuple[Batch, int, Rollout, dict[str, float]]:
        """``(batch, packed prompt width, the rollout trained on, metric overrides)`` of one step: the batch placed on
        the mesh (this process's groups); the overrides: the full rollout's `full_metrics` when groups can be dropped,
        and ``batch/groups`` and ``batch/completion_width``."""
        groups, width = self.plan(roll)
        P = roll.rewards.shape[0]
        trained = roll
        if len(groups) != P or width != self.max_new_tokens:
            trained = narrow(roll, groups, width)
        # whenever groups can be dropped (not only when they are), so that its few eager ops compile in the first step
        overrides = full_metrics(self.algo, roll) if self.drops_rows() else {}
        overrides.update({"batch/groups": float(len(groups)), "batch/completion_width": float(width)})
        batch = make_batch(trained, self.prompt_width, self.pad_id)
        if overlong_filter:  # DAPO overlong filtering: truncated completions leave the loss
            batch = batch.replace(truncated=jnp.asarray(np.asarray(trained.completions.truncated), bool))
        if self.mesh is not None:
            batch = global_batch(process_share(batch, len(trained.prompt_ids)), self.mesh)
        packed = packed_prompt_width([len(p) for p in trained.prompt_ids], self.prompt_width, self.algo, self.perf,
                                     self.mesh, ladder=self.ladders["train"])  # fmt: skip
        return batch, packed, trained, overrides

