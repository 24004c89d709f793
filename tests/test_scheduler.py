# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Degeneracy-aware scheduling (`jaxgrpo.scheduler`): GRESO's skip probability, adaptive group
sizes under a budget, the history and its exact JSON round trip, and varying-G advantages against per-group closed
forms (the trainer's side: `test_scheduled.py`)."""

from __future__ import annotations

import itertools
import json
import math
import pathlib

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgrpo import advantages, scheduler
from jaxgrpo import config as config_lib

DATA = pathlib.Path(__file__).parent / "data"


# -- skip probability (GRESO: 1 - max(p^z, min_keep)) ------------------------------------------------------------------
@pytest.mark.parametrize("explore,min_keep", [(0.5, 0.01), (0.9, 1e-6), (0.01, 0.5)])
def test_skip_probability_is_gresos_and_never_reaches_one(explore, min_keep):
    streaks = list(range(-3000, 3001)) + [10**9, -(10**9)]
    probs = [scheduler.skip_probability(z, explore, min_keep) for z in streaks]
    assert all(p < 1.0 for p in probs)  # for every streak, however long
    assert scheduler.skip_probability(0, explore, min_keep) == 0.0
    for z in (1, 2, 3, 7, 40):  # the closed form, both signs (all-pass and all-fail streaks)
        want = 1.0 - max(explore**z, min_keep)
        assert scheduler.skip_probability(z, explore, min_keep) == pytest.approx(want, abs=1e-15)
        assert scheduler.skip_probability(-z, explore, min_keep) == pytest.approx(want, abs=1e-15)
    pos = [scheduler.skip_probability(z, explore, min_keep) for z in range(0, 200)]
    assert all(b >= a for a, b in zip(pos, pos[1:]))  # rises with the streak
    assert pos[-1] == pytest.approx(1.0 - min_keep)  # ... toward 1 - min_keep


def test_skip_probability_rejects_a_certain_skip():
    for bad in ({"explore": 0.0}, {"explore": 1.0}, {"min_keep": 0.0}, {"min_keep": 1e-20}):
        with pytest.raises(ValueError, match="explore|min_keep"):
            scheduler.skip_probability(3, **{"explore": 0.5, "min_keep": 0.01, **bad})


def test_a_long_streak_prompt_is_still_sampled_at_the_floor_rate():
    sch = scheduler.Scheduler(scheduler.Settings(explore=0.5, min_keep=0.01, group_size=4, min_group=2), seed=3)
    # P_keep = max(0.5^60, 0.01) = 0.01 and max(0.5^2, 0.01) = 0.25; a new prompt at every draw (a round keeps no
    # prompt twice), each with that streak; the kept fraction of the draws is binomial: within 5 sd
    for step, streak, q in ((0, -60, 0.01), (1, 2, 0.25)):
        fresh = iter(range(10**9))

        def draw(k: int, streak: int = streak, fresh=fresh) -> list[int]:
            out = [next(fresh) for _ in range(k)]
            sch.records.update({i: scheduler.Record(streak=streak) for i in out})
            return out

        sch.records, sch.skipped_total = {}, 0
        kept, skipped = sch.select(draw, 400, step=step, max_draws=10**9)
        tries = len(kept) + len(skipped)
        assert len(kept) == 400 and sch.skipped_total == len(skipped)
        assert abs(400 / tries - q) < 5 * math.sqrt(q * (1 - q) / tries), (streak, 400 / tries)
    # past max_draws the rest is kept unconditionally, past 2 max_draws repeats too: a step always fills
    sch.records = {0: scheduler.Record(streak=-60)}  # one prompt, drawn again and again
    kept, skipped = sch.select(lambda k: [0] * k, 4, step=9, max_draws=10)
    assert kept == [0] * 4 and len(skipped) <= 10


def _cycle(order: list[int]):
    """A ``draw(k)`` that returns the next k of ``order``, repeated endlessly (a data set drawn pass after pass)."""
    it = itertools.cycle(order)
    return lambda k: [next(it) for _ in range(k)]


def test_a_round_keeps_no_prompt_twice():
    """Draws that run past the end of the data set bring back prompts kept earlier in the round: those are passed
    over (no random draw, not skipped). Keep probabilities of 1 (no history) and 1e-6 (streak -60, min_keep = 1e-6)
    make the outcome certain for seed 0 (its first 14 uniforms for step 0, round 0 are all >= 0.02)."""
    sch = scheduler.Scheduler(_settings(min_keep=1e-6))
    for i in (2, 3, 4, 5):
        sch.records[i] = scheduler.Record(streak=-60)
    # draws 0 1 2 3 4 5 | 0 1 2 3 4 5 | 0 1 2 3 4 5 | 0 1 2: 0 and 1 kept, 2-5 skipped three times, the repeats of 0
    # and 1 passed over, and the 21st draw (2), at max_draws = 20, is kept unconditionally
    kept, skipped = sch.select(_cycle([0, 1, 2, 3, 4, 5]), 3, step=0, max_draws=20)
    assert kept == [0, 1, 2] and skipped == [2, 3, 4, 5] * 3 and sch.skipped_total == 12
    # six prompts at the floor (keep min_keep = 0.01) drawn pass after pass, ~100 draws a kept prompt: the round
    # holds four different ones
    floor = scheduler.Scheduler(_settings())
    floor.records = {i: scheduler.Record(streak=-60) for i in range(6)}
    for step in range(5):
        kept, skipped = floor.select(_cycle([0, 1, 2, 3, 4, 5]), 4, step=step)
        assert len(set(kept)) == len(kept) == 4, (step, kept)
    # fewer prompts than wanted: 2 prompts of keep 1, want 3; the repeats are passed over until 2 max_draws = 10
    # prompts were drawn, then kept (draws 0 1 | 0 1 0 1 0 1 0 1 | 0)
    kept, skipped = scheduler.Scheduler(_settings()).select(_cycle([0, 1]), 3, step=0, max_draws=5)
    assert kept == [0, 1, 0] and skipped == []


def test_a_passed_over_repeat_takes_no_random_draw():
    """Seed 0, step 0, round 0 draws the uniforms u = 0.294, 0.590, 0.678, 0.059, 0.022, 0.325, ... Prompt 0 (no
    history) is kept with u0; its repeat is passed over without a uniform; prompts 1-7 (streak 1: keep 0.5) take
    u1..: 1 (0.590) and 2 (0.678) are skipped, 3 (0.059), 4 (0.022) and 5 (0.325) kept. (Had the repeat taken u1,
    prompt 1 would take 0.678, 2 would be kept with 0.059 and the round would be [0, 2, 3, 4].)"""
    sch = scheduler.Scheduler(_settings())
    for i in range(1, 8):
        sch.records[i] = scheduler.Record(streak=1)
    order = iter([0, 0, 1, 2, 3, 4, 5, 6, 7])
    kept, skipped = sch.select(lambda k: [next(order) for _ in range(k)], 4, step=0)
    assert kept == [0, 3, 4, 5] and skipped == [1, 2] and sch.skipped_total == 2


# -- adaptive group size -----------------------------------------------------------------------------------------------
def test_group_size_closed_form():
    # G(p) = clip(2 ceil(8 * 2 sqrt(p(1-p)) / 2), 2, 8), by hand
    assert scheduler.group_size(0.5, 8, 2) == 8  # 2 sqrt(1/4) = 1 -> 8
    assert scheduler.group_size(0.0, 8, 2) == 2  # flat -> the floor
    assert scheduler.group_size(1.0, 8, 2) == 2
    assert scheduler.group_size(0.1, 8, 2) == 6  # 8 * 0.6 = 4.8 -> 2 * ceil(2.4) = 6
    assert scheduler.group_size(0.02, 8, 2) == 4  # 8 * 2 sqrt(0.0196) = 2.24 -> 4
    assert scheduler.group_size(0.005, 8, 2) == 2  # 8 * 0.1411 = 1.13 -> 2
    assert scheduler.group_size(0.3, 16, 4) == 16  # 16 * 0.9165 = 14.66 -> 4 * ceil(3.67) = 16
    assert scheduler.group_size(0.05, 16, 4) == 8  # 16 * 0.4359 = 6.97 -> 8
    with pytest.raises(ValueError, match="multiple of min_group"):
        scheduler.group_size(0.5, 6, 4)


def test_allocation_under_a_budget_by_hand():
    # unconstrained sizes [8, 8, 6, 2] (24 samples); a budget of 16: the largest size / sigma gives back 2 at a
    # time: sigma = [.5, .5, .3, 0]: 6/.3=20 -> [8,8,4,2]; 16,16,13.3 (last of ties) -> [8,6,4,2]; 16,12,13.3 ->
    # [6,6,4,2]; 12,12,13.3 -> [6,6,2,2] = 16
    ps = [0.5, 0.5, 0.1, 0.0]
    np.testing.assert_array_equal(scheduler.allocate(ps, 8, 2), [8, 8, 6, 2])
    np.testing.assert_array_equal(scheduler.allocate(ps, 8, 2, budget=16), [6, 6, 2, 2])
    np.testing.assert_array_equal(scheduler.allocate(ps, 8, 2, budget=100), [8, 8, 6, 2])
    np.testing.assert_array_equal(scheduler.allocate(ps, 8, 2, budget=8), [2, 2, 2, 2])
    with pytest.raises(ValueError, match="budget"):
        scheduler.allocate(ps, 8, 2, budget=7)


@pytest.mark.parametrize("seed", range(5))
def test_allocation_respects_budget_floor_cap_and_unit(seed):
    rng = np.random.default_rng(seed)
    for _ in range(50):
        n, unit = int(rng.integers(1, 20)), int(rng.choice([2, 4]))
        g_max = unit * int(rng.integers(1, 5))
        ps = rng.uniform(0, 1, n) ** rng.uniform(0.2, 5)
        budget = int(rng.integers(unit * n, g_max * n + 5))
        free = scheduler.allocate(ps, g_max, unit)
        sizes = scheduler.allocate(ps, g_max, unit, budget)
        assert sizes.sum() <= budget
        assert (sizes >= unit).all() and (sizes <= g_max).all() and (sizes % unit == 0).all()
        assert (sizes <= free).all()  # a budget only takes samples away
        if free.sum() <= budget:
            np.testing.assert_array_equal(sizes, free)
        else:
            assert sizes.sum() > budget - unit  # it stops as soon as the budget holds


# -- history -----------------------------------------------------------------------------------------------------------
def _settings(**kw) -> scheduler.Settings:
    return scheduler.Settings(**{"group_size": 4, "min_group": 2, "decay": 0.5, "window": 3, **kw})


def test_history_streaks_and_discounted_beta_by_hand():
    sch = scheduler.Scheduler(_settings())
    valid = np.ones((1, 4), bool)
    seq = [[1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    streaks, out = [], []
    for r in seq:
        rw = np.asarray([r], np.float32)
        deg = np.asarray([len(set(r)) == 1])
        out.append(sch.record([7], rw, valid, deg))
        streaks.append(sch.records[7].streak)
    assert streaks == [1, 2, 0, -1, -2, -3, 1]
    # S <- 0.5 S + wins, F <- 0.5 F + losses over wins 4,4,1,0,0,0,4 and losses 0,0,3,4,4,4,0
    s = f = 0.0
    for w in (4, 4, 1, 0, 0, 0, 4):
        s, f = 0.5 * s + w, 0.5 * f + (4 - w)
    rec = sch.records[7]
    assert (rec.successes, rec.failures) == (s, f)
    assert rec.p == (1 + s) / (2 + s + f)
    assert rec.outcomes == [0.0, 0.0, 1.0]  # the last window = 3 success rates
    # predicted degenerate = a nonzero streak before the group: groups 2..7 were predicted; all but group 3 hit
    assert [o["predicted"] for o in out] == [0, 1, 1, 0, 1, 1, 1]
    assert [o["hits"] for o in out] == [0, 1, 0, 0, 1, 1, 1]
    assert sch.precision == 4 / 5


def test_history_ignores_padding_and_counts_a_one_member_group_as_degenerate():
    sch = scheduler.Scheduler(_settings())
    rw = np.asarray([[1.0, 0.0, 5.0, 5.0], [1.0, 0.0, 0.0, 0.0]], np.float32)
    valid = np.asarray([[True, True, False, False], [True, False, False, False]])
    sch.record([0, 1], rw, valid, np.asarray([False, True]))
    assert (sch.records[0].successes, sch.records[0].failures, sch.records[0].streak) == (1.0, 1.0, 0)
    assert (sch.records[1].successes, sch.records[1].failures, sch.records[1].streak) == (1.0, 0.0, 1)


def test_a_no_signal_group_of_mixed_rewards_is_no_streak():
    """pass_at_k (k = 2) masks a group of 3 successes in 4 as degenerate (no signal), but it is neither all-pass nor
    all-fail: it starts no streak (it counted as all-fail, -1) and is a hit of a prediction."""
    sch = scheduler.Scheduler(_settings())
    valid = np.ones((1, 4), bool)
    sch.record([3], np.asarray([[1, 1, 1, 1]], np.float32), valid, np.asarray([True]))
    out = sch.record([3], np.asarray([[1, 1, 1, 0]], np.float32), valid, np.asarray([True]))
    assert sch.records[3].streak == 0 and (out["all_pass"], out["all_fail"], out["hits"]) == (0.0, 0.0, 1.0)


def test_history_round_trips_through_json_exactly():
    rng = np.random.default_rng(0)
    a = scheduler.Scheduler(_settings(), seed=11)
    for step in range(30):
        kept, _ = a.select(lambda k: list(rng.integers(0, 12, k)), 4, step)
        rw = (rng.uniform(size=(4, 4)) < rng.uniform(size=(4, 1))).astype(np.float32) * 0.7 + 0.1
        deg = np.asarray([len(set(row)) == 1 for row in rw.tolist()])
        a.record(kept, rw, np.ones((4, 4), bool), deg)
    text = json.dumps(a.state())  # what the checkpoint stores
    b = scheduler.Scheduler.from_json(text, _settings(), seed=11)
    assert b.state() == a.state()
    assert {k: vars(v) for k, v in b.records.items()} == {k: vars(v) for k, v in a.records.items()}
    # and it decides the same: the same prompts kept at the next step, the same group sizes
    pool = list(range(12)) * 10
    draw_a, draw_b = iter(pool), iter(pool)
    ka = a.select(lambda k: [next(draw_a) for _ in range(k)], 6, 30)
    kb = b.select(lambda k: [next(draw_b) for _ in range(k)], 6, 30)
    assert ka == kb
    adaptive = _settings(adaptive=True)
    a.settings = b.settings = adaptive
    np.testing.assert_array_equal(a.group_sizes(range(12)), b.group_sizes(range(12)))
    with pytest.raises(ValueError, match="version"):
        b.restore({"version": 99})


def test_schedule_config_errors_are_one_line_and_name_the_key():
    ok = config_lib.load_config("default", ["rollout.schedule=skip+adaptive", "rollout.group_size=8"])
    assert scheduler.from_config(ok).settings.adaptive
    assert scheduler.from_config(config_lib.load_config("default", [])) is None
    for override, key in (("rollout.schedule_explore=1.0", "schedule_explore"),
                          ("rollout.schedule_min_keep=0", "schedule_min_keep"),
                          ("rollout.schedule_min_group=3", "schedule_min_group"),
                          ("rollout.schedule_budget=3", "schedule_budget"),
                          ("rollout.schedule_decay=2", "schedule_decay")):  # fmt: skip
        with pytest.raises(config_lib.ConfigError, match=key) as e:
            config_lib.load_config("default", ["rollout.schedule=adaptive", "rollout.group_size=8", override])
        assert "\n" not in str(e.value)
    with pytest.raises(config_lib.ConfigError, match="none, skip, adaptive"):
        config_lib.load_config("default", ["rollout.schedule=greso"])


# -- varying G: groups of unequal size in one [P, G_max] array (closed forms per group) -------------------------------
SIZES = [2, 3, 5, 8, 4, 6, 7]
GROUPS = [[1, 0], [1, 1, 0], [0, 0, 1, 0, 1], [1, 0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0, 1, 1],
          [0.25, 0.5, 1.0, 0.0, 0.75, 0.5, 0.25]]  # the last: non-binary rewards (grpo, dr_grpo, rloo, max_rl)


def _padded(groups: list[list[float]], g_max: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """[P, g_max] rewards with garbage in the padding (it must not matter) and the valid mask."""
    rw = np.full((len(groups), g_max), 7.5, np.float32)
    rw[:, ::2] = -3.0
    valid = np.zeros((len(groups), g_max), bool)
    for i, g in enumerate(groups):
        rw[i, : len(g)], valid[i, : len(g)] = g, True
    return rw, valid


def _reference(name: str, r: np.ndarray, batch_std: float | None = None) -> np.ndarray:
    """The estimator's formula on one group of n = len(r) members (its own G), float64, by hand."""
    n, m = len(r), r.mean()
    if name == "sign":
        return np.sign(r - 0.5)
    if name == "pass_at_k":  # k = 2, binary rewards; Chen et al. 2025
        k, c = 2, int((r >= 0.5).sum())
        rho = 1 - math.comb(n - c, k) / math.comb(n, k)
        sigma = math.sqrt(rho * (1 - rho))
        if n < k or sigma == 0:
            return np.zeros(n)
        wrong = (1 - rho - math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)) / (sigma + 1e-6)
        return np.where(r >= 0.5, (1 - rho) / (sigma + 1e-6), wrong)
    if np.ptp(r) == 0:
        return np.zeros(n)  # degenerate: exactly 0 from every centred estimator
    if name in ("grpo", "avspo"):
        s = batch_std if batch_std is not None else math.sqrt(((r - m) ** 2).sum() / (n - 1))
        return (r - m) / (s + 1e-6)
    if name == "grpo_ddof0":
        return (r - m) / (math.sqrt(((r - m) ** 2).sum() / n) + 1e-6)
    if name == "dr_grpo":
        return r - m
    if name == "rloo":
        return np.array([r[i] - np.delete(r, i).mean() for i in range(n)])
    if name == "max_rl":
        return (r - m) / m
    raise ValueError(name)


CASES = {  # name in _reference -> (estimator, kwargs, the groups it is defined for)
    "grpo": ("grpo", {}, GROUPS), "grpo_ddof0": ("grpo", {"ddof": 0}, GROUPS), "dr_grpo": ("dr_grpo", {}, GROUPS),
    "rloo": ("rloo", {}, GROUPS), "sign": ("sign", {}, GROUPS[:-1]), "pass_at_k": ("pass_at_k", {"k": 2}, GROUPS[:-1]),
    "max_rl": ("max_rl", {}, GROUPS), "avspo": ("avspo", {}, GROUPS),
}


class VaryingGroupSizeTest(chex.TestCase):
    """Each estimator on groups of sizes 2..8 padded into one [P, 8] array equals its formula with the group's own G."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_advantages_equal_their_per_group_closed_forms(self):
        for name, (est, kw, groups) in CASES.items():
            rw, valid = _padded(groups)
            fn = self.variant(lambda r, v, est=est, kw=kw: advantages.compute(est, r, v, **kw))
            adv = np.asarray(fn(jnp.asarray(rw), jnp.asarray(valid)))
            assert adv.shape == rw.shape and adv.dtype == np.float32
            assert (adv[~valid] == 0).all(), name  # padding gets exactly 0
            for i, g in enumerate(groups):
                if name == "avspo" and np.ptp(g) == 0:
                    continue  # avspo's degenerate groups follow its own virtual-sample rule (tests/test_advantages.py)
                np.testing.assert_allclose(adv[i, : len(g)], _reference(name, np.asarray(g, np.float64)), rtol=2e-5,
                                           atol=2e-6, err_msg=f"{name} group {i} (n={len(g)})")

    @chex.variants(with_jit=True, without_jit=True)
    def test_batch_scale_uses_every_valid_reward_once(self):
        rw, valid = _padded(GROUPS)
        adv = np.asarray(self.variant(lambda r, v: advantages.grpo(r, v, scale="batch"))(jnp.asarray(rw),
                                                                                          jnp.asarray(valid)))
        flat = np.concatenate([np.asarray(g, np.float64) for g in GROUPS])
        s = flat.std(ddof=1)  # the std of all valid rewards: padding neither counted nor weighted by G_max
        for i, g in enumerate(GROUPS):
            np.testing.assert_allclose(adv[i, : len(g)], _reference("grpo", np.asarray(g, np.float64), s), rtol=2e-5,
                                       atol=2e-6)
