# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Degeneracy-aware rollout scheduling: which prompts get sampled this step, and how many samples each gets.

Host side, NumPy only: a per-prompt history of group outcomes, the skip rule and the group-size rule, and a state that
serializes to JSON and restores exactly (checkpointed with the prompt iterator's position). The trainer's glue (which
calls the sampler with these decisions) is `jaxgrpo.scheduled`; ``rollout.schedule`` picks the mode:
``none`` (today's run), ``skip``, ``adaptive`` or ``skip+adaptive``.

History, per prompt (updated once per step for the groups that were trained on or discarded by resampling):

- the success rate of each group, s = #{valid members with r >= success_threshold} / #{valid members}; the last
  ``window`` of them are kept (``outcomes``);
- a discounted Beta estimate of the success probability: S <- d S + successes, F <- d F + failures (d = ``decay``,
  forgetting old policies), p = (1 + S) / (2 + S + F) (the posterior mean under a uniform Beta(1, 1) prior);
- the streak z: +k after k consecutive all-pass groups, -k after k consecutive all-fail groups, 0 after an informative
  group (all-pass / all-fail: a degenerate group, `jaxgrpo.degeneracy.degenerate_mask`, whose common reward is
  >= / < success_threshold).

**Skip** (GRESO, Zheng et al. 2025, "Act Only When It Pays: Efficient Reinforcement Learning for LLM Reasoning via
Selective Rollouts", arXiv:2506.02177; its released code, ``DataProfiler.*_probabilistic_skip``): a prompt whose
streak is z != 0 is skipped before sampling with probability

    P_skip(z) = 1 - max(explore^|z|, min_keep),      P_skip(0) = 0,

explore in (0, 1) the exploration base (GRESO starts it at 0.5) and min_keep > 0 the floor on the keep probability
(GRESO's 0.01). P_skip rises with the streak toward 1 - min_keep and never reaches 1, so a prompt the policy has grown
into comes back. The base is fixed by default (``target`` None). With a ``target`` share alpha of zero-variance
groups (GRESO's adaptive exploration, its released trainer's ``target_zero_variance``, 0.25), an all-pass streak
uses a base p_pass and an all-fail streak a base p_fail, both starting at ``explore``. Each base moves by
``explore_step`` (0.01): down (more skipping) while the share of all-pass groups among the sampled ones is >= alpha/3
(of all-fail groups: >= 2 alpha/3; GRESO's split, which explores hard prompts more), up otherwise, and stays within
``explore_range`` ([0.05, 0.95], GRESO's bounds). GRESO moves the bases once a step on that step's share, from its
second epoch on. Here the share is pooled over steps until at least ``adapt_groups`` (32) groups were sampled, then
the bases move once: for steps of >= 32 prompts that is GRESO's rule; with few prompts a step, a single step's share
is too coarse (with P = 4 it is a multiple of 1/4, and the once-a-step comparison would track the median step, not
the mean share). Only steps that sampled a prompt with a history count (GRESO's "from the second epoch").

**Adaptive group size** (Neyman allocation: in stratified sampling the variance-optimal number of draws from a stratum
is proportional to its standard deviation; Neyman 1934): the reward of a binary task has standard deviation
sigma(p) = sqrt(p (1 - p)), so a prompt gets

    G(p) = clip(u * ceil(G_max * 2 sigma(p) / u), u, G_max)

samples, u = ``min_group`` (the floor and the unit: sizes are multiples of u, G_max = ``rollout.group_size`` a
multiple of u), so a prompt at p = 1/2 (every unseen prompt: the prior) gets all G_max and a prompt predicted flat
gets the floor. Per sample, a small group of a near-flat prompt finds an informative group about as often as a large
one (1 - p^G - (1-p)^G grows slower than G), so the samples saved cost little signal. A total sample ``budget``
per round (each resampling round its own) caps the sum: while the sizes exceed it, the group with the most samples
per unit of sigma (the one furthest above its Neyman share) gives back u samples (never below the floor).
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from jaxgrpo.errors import ConfigError

RolloutSchedule = Literal["none", "skip", "adaptive", "skip+adaptive"]
ROLLOUT_SCHEDULES: tuple[str, ...] = typing.get_args(RolloutSchedule)
STATE_VERSION = 2  # 2 adds the exploration bases; a version 1 state (a fixed base) restores with both at `explore`
EXPLORE_RANGE = (0.05, 0.95)  # the adapted bases' bounds (GRESO's min_p, max_p)

__all__ = ["RolloutSchedule", "ROLLOUT_SCHEDULES", "Settings", "Record", "Scheduler", "skip_probability",
           "success_estimate", "group_size", "allocate", "from_config", "validate"]


def skip_probability(streak: int, explore: float = 0.5, min_keep: float = 0.01) -> float:
    """GRESO's skip probability ``1 - max(explore^|streak|, min_keep)``; 0 for streak 0 (see the module docstring)."""
    _check_skip_args(explore, min_keep)
    if streak == 0:
        return 0.0
    return 1.0 - max(explore ** abs(int(streak)), min_keep)


def _check_skip_args(explore: float, min_keep: float) -> None:
    if not 0.0 < explore < 1.0:
        raise ValueError(f"explore must be in (0, 1) (GRESO's exploration base, 0.5); got {explore!r}")
    if not 1e-6 <= min_keep <= 1.0:
        raise ValueError(f"min_keep must be in [1e-6, 1] (the least keep probability, GRESO's 0.01); got {min_keep!r}")


def success_estimate(successes: float, failures: float) -> float:
    """The posterior mean ``(1 + S) / (2 + S + F)`` of a success probability under a Beta(1, 1) prior."""
    return (1.0 + successes) / (2.0 + successes + failures)


def group_size(p: float, g_max: int, unit: int) -> int:
    """``clip(unit * ceil(g_max * 2 sqrt(p(1-p)) / unit), unit, g_max)`` (Neyman allocation, module docstring)."""
    _check_sizes(g_max, unit)
    sigma2 = 2.0 * math.sqrt(max(p * (1.0 - p), 0.0))
    g = unit * math.ceil(g_max * sigma2 / unit - 1e-9)  # - 1e-9: p = 1/2 gives exactly g_max, not one unit more
    return int(min(max(g, unit), g_max))


def _check_sizes(g_max: int, unit: int) -> None:
    if unit < 2 or g_max < unit or g_max % unit:
        raise ValueError(f"group sizes need 2 <= min_group <= G_max with G_max a multiple of min_group; got "
                         f"min_group={unit}, G_max={g_max}")


def allocate(ps: Sequence[float], g_max: int, unit: int, budget: int | None = None) -> np.ndarray:
    """Each prompt's group size `group_size(p)`; then, while their sum exceeds ``budget``, the group with the largest
    ``size / sigma(p)`` (ties: the later prompt) above the floor gives back ``unit`` samples. int ``[len(ps)]``."""
    _check_sizes(g_max, unit)
    sizes = np.array([group_size(float(p), g_max, unit) for p in ps], np.int64)
    if budget is None:
        return sizes
    if budget < unit * len(sizes):
        raise ValueError(f"a budget of {budget} samples cannot give {len(sizes)} prompts min_group={unit} each; "
                         f"raise the budget to >= {unit * len(sizes)} or lower min_group")
    sigma = np.sqrt(np.clip(np.asarray(ps, np.float64) * (1.0 - np.asarray(ps, np.float64)), 0.0, None))
    while sizes.sum() > budget:
        ratio = np.where(sizes > unit, sizes / np.maximum(sigma, 1e-12), -np.inf)
        i = len(ratio) - 1 - int(np.argmax(ratio[::-1]))  # the last of the largest
        sizes[i] -= unit
    return sizes


@dataclasses.dataclass(frozen=True)
class Settings:
    """The scheduler's knobs (``rollout.schedule_*`` in the config)."""

    skip: bool = True
    adaptive: bool = False
    explore: float = 0.5  # GRESO's exploration base p: P_skip(z) = 1 - max(p^|z|, min_keep)
    min_keep: float = 0.01  # the least keep probability of a prompt with a long streak
    min_group: int = 2  # the floor and unit of adaptive group sizes
    group_size: int = 8  # G_max: the width of the step's [P, G] arrays
    budget: int | None = None  # samples per round, each resampling round its own (adaptive); None = P * G_max
    decay: float = 0.9  # forgetting of the Beta estimate per observed group
    window: int = 8  # outcomes kept per prompt
    success_threshold: float = 0.5  # a member succeeds when r >= this
    target: float | None = None  # GRESO's target share of zero-variance groups (adapts the bases); None = fixed base
    explore_step: float = 0.01  # the bases' move (GRESO's)
    adapt_groups: int = 32  # the bases move once per this many sampled groups, on their pooled shares
    explore_range: tuple[float, float] = EXPLORE_RANGE  # the adapted bases' bounds

    def __post_init__(self):
        _check_skip_args(self.explore, self.min_keep)
        if self.target is not None:
            lo, hi = self.explore_range
            if not 0.0 < self.target < 1.0:
                raise ValueError(f"target must be in (0, 1) (GRESO's 0.25) or None; got {self.target!r}")
            if not 0.0 < lo <= self.explore <= hi < 1.0:
                raise ValueError(f"with a target, explore={self.explore!r} must lie in explore_range="
                                 f"{self.explore_range!r}, a range within (0, 1)")
            if not self.explore_step > 0.0 or self.adapt_groups < 1:
                raise ValueError(f"explore_step must be positive (GRESO's 0.01) and adapt_groups >= 1; got "
                                 f"{self.explore_step!r} and {self.adapt_groups!r}")
        _check_sizes(self.group_size, self.min_group)
        if not 0.0 <= self.decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1]; got {self.decay!r}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1; got {self.window!r}")


@dataclasses.dataclass
class Record:
    """One prompt's history: discounted successes/failures, the signed streak, the last outcomes."""

    successes: float = 0.0
    failures: float = 0.0
    streak: int = 0
    outcomes: list[float] = dataclasses.field(default_factory=list)

    @property
    def p(self) -> float:
        return success_estimate(self.successes, self.failures)


class Scheduler:
    """Per-prompt history and the decisions made from it. Randomness (the skip draws) comes from
    ``numpy.random.default_rng([seed, step, round, 37])``, so a resumed run draws what the uninterrupted one did."""

    def __init__(self, settings: Settings, seed: int = 0):
        self.settings, self.seed = settings, int(seed)
        self.records: dict[int, Record] = {}
        self.predicted = 0  # admitted prompts whose streak predicted a degenerate group (cumulative)
        self.predicted_hits = 0  # ... whose group was degenerate
        self.skipped_total = 0
        self.explore_pass = self.explore_fail = settings.explore  # the bases of all-pass / all-fail streaks
        self.pending = [0, 0, 0]  # groups, all-pass, all-fail sampled since the bases last moved

    # -- decisions -----------------------------------------------------------------------------------------------
    def keep_probability(self, prompt: int) -> float:
        s = self.settings
        rec = self.records.get(int(prompt))
        if not s.skip or rec is None:
            return 1.0
        base = self.explore_pass if rec.streak > 0 else self.explore_fail
        return 1.0 - skip_probability(rec.streak, base, s.min_keep)

    def select(self, draw: Callable[[int], list[int]], want: int, step: int, round_: int = 0,
               max_draws: int | None = None) -> tuple[list[int], list[int]]:
        """Prompts for one round: ``draw(n)`` gives the next n prompt indices; each is kept with its keep probability
        until ``want`` are kept. After ``max_draws`` drawn prompts (default ``100 * want``) the rest are kept
        unconditionally (a data set of prompts that all have long streaks still fills a step).

        A round's prompts are distinct: the draws may run past the end of the data set (the iterator reshuffles per
        pass), and a drawn prompt already kept in this round is passed over, without a random draw, neither kept nor
        skipped (it counts toward ``max_draws``). Only after ``2 * max_draws`` drawn prompts is a repeat kept (a data
        set of fewer than ``want`` prompts still fills a round). A round in which no kept prompt comes back takes the
        same random draws and decisions as without this rule. Returns (kept, skipped) in draw order; a prompt skipped,
        then drawn again, is decided again (and listed in ``skipped`` once per skip)."""
        rng = np.random.default_rng([self.seed, int(step), int(round_), 37])
        limit = 100 * want if max_draws is None else max_draws
        kept: list[int] = []
        skipped: list[int] = []
        taken: set[int] = set()
        drawn = 0  # prompts drawn in this round, repeats passed over included
        while len(kept) < want:
            for i in map(int, draw(want - len(kept))):
                repeat = i in taken
                if repeat and drawn < 2 * limit:
                    pass  # already kept in this round: passed over, no random draw
                elif repeat or drawn >= limit or rng.random() < self.keep_probability(i):
                    kept.append(i)
                    taken.add(i)
                else:
                    skipped.append(i)
                drawn += 1
        self.skipped_total += len(skipped)
        return kept, skipped

    def group_sizes(self, prompts: Sequence[int]) -> np.ndarray:
        """Each prompt's group size: G_max when not adaptive, else `allocate` of the prompts' estimates."""
        s = self.settings
        if not s.adaptive:
            return np.full(len(prompts), s.group_size, np.int64)
        ps = [self.records[i].p if i in self.records else 0.5 for i in map(int, prompts)]
        return allocate(ps, s.group_size, s.min_group, s.budget)

    def predicts_degenerate(self, prompt: int) -> bool:
        rec = self.records.get(int(prompt))
        return rec is not None and rec.streak != 0

    # -- history -------------------------------------------------------------------------------------------------
    def record(self, prompts: Sequence[int], rewards: np.ndarray, valid: np.ndarray, degenerate: np.ndarray
               ) -> dict[str, float]:
        """Adds one group per prompt (rewards/valid ``[n, G]``, degenerate ``[n]``); returns these groups' counts:
        ``predicted`` (the prompt's streak was nonzero) and ``hits`` (and the group was degenerate), the predictor's;
        ``groups``, ``all_pass``, ``all_fail`` and ``known`` (the prompt had a history), what `adapt` reads."""
        s = self.settings
        rewards, valid, degenerate = np.asarray(rewards), np.asarray(valid, bool), np.asarray(degenerate, bool)
        predicted = hits = known = all_pass = all_fail = 0
        for row, prompt in enumerate(map(int, prompts)):
            known += prompt in self.records
            rec = self.records.setdefault(prompt, Record())
            n = int(valid[row].sum())
            wins = int((valid[row] & (rewards[row] >= s.success_threshold)).sum())
            if rec.streak != 0:
                predicted += 1
                hits += int(degenerate[row])
            rec.successes = s.decay * rec.successes + wins
            rec.failures = s.decay * rec.failures + (n - wins)
            rec.outcomes = (rec.outcomes + [wins / max(n, 1)])[-s.window:]
            if degenerate[row] and n > 0 and wins in (0, n):  # (not pass_at_k's no-signal groups of mixed rewards)
                up = wins == n  # a degenerate group's members all succeed or all fail
                rec.streak = (max(rec.streak, 0) + 1) if up else (min(rec.streak, 0) - 1)
                all_pass, all_fail = all_pass + up, all_fail + (not up)
            else:
                rec.streak = 0
        self.predicted += predicted
        self.predicted_hits += hits
        return {"predicted": float(predicted), "hits": float(hits), "groups": float(len(degenerate)),
                "all_pass": float(all_pass), "all_fail": float(all_fail), "known": float(known)}

    def adapt(self, counts: dict[str, float]) -> None:
        """Adds a step's summed `record` counts to the pooled shares and moves the exploration bases once at least
        ``adapt_groups`` groups are pooled (module docstring); nothing without a target, and a step none of whose
        groups had a history is not counted."""
        s = self.settings
        if s.target is None or not counts.get("known"):
            return
        self.pending = [a + int(counts[k]) for a, k in zip(self.pending, ("groups", "all_pass", "all_fail"))]
        groups, all_pass, all_fail = self.pending
        if groups < s.adapt_groups:
            return
        lo, hi = s.explore_range

        def move(base: float, share: float, target: float) -> float:
            return min(max(base - s.explore_step if share >= target else base + s.explore_step, lo), hi)

        self.explore_pass = move(self.explore_pass, all_pass / groups, s.target / 3)
        self.explore_fail = move(self.explore_fail, all_fail / groups, 2 * s.target / 3)
        self.pending = [0, 0, 0]

    # -- state ---------------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON-able state; `restore` of it gives back an equal scheduler (floats round-trip exactly through JSON)."""
        return {
            "version": STATE_VERSION,
            "records": {str(k): [r.successes, r.failures, r.streak, list(r.outcomes)]
                        for k, r in sorted(self.records.items())},
            "predicted": self.predicted, "predicted_hits": self.predicted_hits, "skipped_total": self.skipped_total,
            "explore": [self.explore_pass, self.explore_fail], "pending": list(self.pending),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Puts back a `state` (version 1 or 2; ValueError for another). Without a target (fixed bases) both bases are
        this run's ``explore`` and nothing is pooled, whatever the state saved: a resume may change
        ``schedule_explore`` or turn the target off. With a target, the saved bases and pooled counts resume (a
        version 1 state, from before the bases: both at ``explore``, nothing pooled)."""
        if not isinstance(state, dict) or state.get("version") not in (1, STATE_VERSION):
            got = state.get("version") if isinstance(state, dict) else state
            raise ValueError(f"scheduler state of an unknown version {got!r}; expected version {STATE_VERSION}")
        bases = state.get("explore", [self.settings.explore] * 2)  # version 1: the fixed base
        self.explore_pass, self.explore_fail = float(bases[0]), float(bases[1])
        self.pending = [int(x) for x in state.get("pending", [0, 0, 0])]
        self.records = {int(k): Record(float(v[0]), float(v[1]), int(v[2]), [float(x) for x in v[3]])
                        for k, v in state["records"].items()}
        self.predicted = int(state["predicted"])
        self.predicted_hits = int(state["predicted_hits"])
        self.skipped_total = int(state["skipped_total"])
        if self.settings.target is None:  # fixed bases: the configured one, not the saved (or adapted) ones
            self.explore_pass = self.explore_fail = self.settings.explore
            self.pending = [0, 0, 0]

    def to_json(self) -> str:
        return json.dumps(self.state(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, settings: Settings, seed: int = 0) -> Scheduler:
        out = cls(settings, seed)
        out.restore(json.loads(text))
        return out

    @property
    def precision(self) -> float:
        """Cumulative predictor precision: of the admitted prompts predicted degenerate, the fraction that were."""
        return self.predicted_hits / self.predicted if self.predicted else 0.0


def validate(cfg: Any) -> None:
    """ConfigError for ``rollout.schedule_*`` values out of range (called by `jaxgrpo.config.validate`)."""
    r = cfg.rollout
    if r.schedule_target is not None and "skip" not in r.schedule:
        raise ConfigError(f"rollout.schedule_target={r.schedule_target!r} adapts the skip rule, but rollout.schedule="
                          f"{r.schedule!r} skips nothing; use rollout.schedule=skip (or skip+adaptive) or "
                          "schedule_target=null")
    if r.schedule == "none":
        return
    fix = None
    if not 0.0 < r.schedule_explore < 1.0:
        fix = f"rollout.schedule_explore must be in (0, 1) (GRESO's 0.5), got {r.schedule_explore!r}"
    elif not 1e-6 <= r.schedule_min_keep <= 1.0:
        fix = f"rollout.schedule_min_keep must be in [1e-6, 1] (GRESO's 0.01), got {r.schedule_min_keep!r}"
    elif "adaptive" in r.schedule and (r.schedule_min_group < 2 or r.group_size % r.schedule_min_group):
        fix = (f"rollout.schedule_min_group={r.schedule_min_group} must be >= 2 and divide rollout.group_size="
               f"{r.group_size}; e.g. rollout.schedule_min_group=2")
    elif "adaptive" in r.schedule and 0 < r.schedule_budget < r.schedule_min_group * r.prompts_per_step:
        fix = (f"rollout.schedule_budget={r.schedule_budget} is below prompts_per_step × schedule_min_group = "
               f"{r.prompts_per_step * r.schedule_min_group}; raise it or set 0 (= prompts_per_step × group_size)")
    elif r.schedule_budget < 0:
        fix = f"rollout.schedule_budget must be >= 0 (0 = prompts_per_step × group_size), got {r.schedule_budget!r}"
    elif not 0.0 <= r.schedule_decay <= 1.0:
        fix = f"rollout.schedule_decay must be in [0, 1], got {r.schedule_decay!r}"
    elif r.schedule_target is not None and not 0.0 < r.schedule_target < 1.0:
        fix = f"rollout.schedule_target must be in (0, 1) (GRESO's 0.25) or null, got {r.schedule_target!r}"
    elif r.schedule_target is not None and not EXPLORE_RANGE[0] <= r.schedule_explore <= EXPLORE_RANGE[1]:
        fix = (f"with rollout.schedule_target, schedule_explore={r.schedule_explore!r} is the bases' start and must "
               f"lie in their range [{EXPLORE_RANGE[0]}, {EXPLORE_RANGE[1]}]; e.g. 0.5")
    if fix:
        raise ConfigError(fix)


def from_config(cfg: Any) -> Scheduler | None:
    """The run's scheduler (None for ``rollout.schedule=none``)."""
    r = cfg.rollout
    if r.schedule == "none":
        return None
    adaptive = "adaptive" in r.schedule
    settings = Settings(skip="skip" in r.schedule, adaptive=adaptive, explore=r.schedule_explore,
                        min_keep=r.schedule_min_keep, min_group=r.schedule_min_group if adaptive else r.group_size,
                        group_size=r.group_size,
                        budget=r.schedule_budget or None, decay=r.schedule_decay, target=r.schedule_target)
    return Scheduler(settings, cfg.seed)
