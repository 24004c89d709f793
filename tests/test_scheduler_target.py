# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""GRESO's adaptive exploration bases (`rollout.schedule_target`, `jaxgrpo.scheduler.Scheduler.adapt`): the bases'
moves by hand, their bounds, the first-pass gating, their checkpointed state, the config's checks, and the skip rule
on a stand-in trainer steering the share of flat groups toward the target."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from test_scheduled import _StandInTrainer

from jaxgrpo import config as config_lib
from jaxgrpo import scheduled, scheduler

PASS, FAIL, MIXED = [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]


def _step(sch: scheduler.Scheduler, groups: dict[int, list[float]]) -> dict[str, float]:
    """One step's groups (prompt -> 4 rewards) recorded, the bases moved once (`scheduled.record_step`)."""
    rw = np.asarray(list(groups.values()), np.float32)
    deg = np.ptp(rw, axis=1) == 0
    return scheduled.record_step(sch, [(list(groups), rw, np.ones_like(rw, bool), deg)])


def _sched(target: float | None = 0.75, adapt_groups: int = 4, **kw) -> scheduler.Scheduler:
    return scheduler.Scheduler(scheduler.Settings(group_size=4, min_group=2, target=target, adapt_groups=adapt_groups,
                                                  **kw))  # fmt: skip


def test_bases_move_by_hand():
    # target 0.75: the all-pass base aims at a share of 0.25, the all-fail base at 0.5 (GRESO's alpha/3, 2 alpha/3)
    sch = _sched(0.75, adapt_groups=4)
    counts = _step(sch, {0: PASS, 1: FAIL, 2: MIXED})
    assert counts == {"predicted": 0, "hits": 0, "groups": 3, "all_pass": 1, "all_fail": 1, "known": 0}
    assert (sch.explore_pass, sch.explore_fail, sch.pending) == (0.5, 0.5, [0, 0, 0])  # no history: not counted
    _step(sch, {0: PASS, 1: FAIL, 2: MIXED, 3: MIXED})  # shares 1/4 >= 0.25 (the edge: down), 1/4 < 0.5 (up)
    assert (sch.explore_pass, sch.explore_fail) == pytest.approx((0.49, 0.51), abs=1e-12)
    _step(sch, {2: MIXED, 3: MIXED, 4: FAIL, 5: FAIL})  # 0 < 0.25 (up), 2/4 >= 0.5 (down)
    assert (sch.explore_pass, sch.explore_fail) == pytest.approx((0.50, 0.50), abs=1e-12)
    _step(sch, {0: PASS, 1: FAIL})  # 2 groups: pooled, below adapt_groups = 4, nothing moves yet
    assert sch.pending == [2, 1, 1] and (sch.explore_pass, sch.explore_fail) == pytest.approx((0.5, 0.5), abs=1e-12)
    _step(sch, {4: FAIL, 6: FAIL, 7: MIXED})  # pooled 5 groups: all-pass 1/5 < 0.25 (up), all-fail 3/5 (down)
    assert (sch.explore_pass, sch.explore_fail) == pytest.approx((0.51, 0.49), abs=1e-12) and sch.pending == [0, 0, 0]
    assert (sch.records[0].streak, sch.records[1].streak) == (3, -3)
    # each streak takes its own base: keep = max(base^|z|, min_keep)
    assert sch.keep_probability(0) == pytest.approx(sch.explore_pass**3, abs=1e-15)
    assert sch.keep_probability(1) == pytest.approx(sch.explore_fail**3, abs=1e-15)
    assert sch.keep_probability(2) == 1.0  # an informative last group: never skipped


def test_bases_stay_in_range_and_skipping_never_becomes_certain():
    sch = _sched(0.25, adapt_groups=2, min_keep=1e-6)
    _step(sch, {0: PASS, 1: FAIL})
    for _ in range(200):  # every group flat: both bases fall to their floor, not below
        _step(sch, {0: PASS, 1: FAIL})
    assert (sch.explore_pass, sch.explore_fail) == (0.05, 0.05)
    assert (sch.records[0].streak, sch.records[1].streak) == (201, -201)
    assert sch.keep_probability(0) == pytest.approx(1e-6, rel=1e-6)  # max(0.05^201, min_keep): never 0
    assert sch.keep_probability(1) == pytest.approx(1e-6, rel=1e-6)
    for _ in range(200):  # every group informative: both rise to their ceiling
        _step(sch, {0: MIXED, 1: MIXED})
    assert (sch.explore_pass, sch.explore_fail) == (0.95, 0.95)


def test_without_a_target_the_base_is_fixed():
    sch, ref = _sched(None), _sched(None)
    for _ in range(5):
        _step(sch, {0: PASS, 1: FAIL, 2: FAIL})
    assert (sch.explore_pass, sch.explore_fail) == (0.5, 0.5)
    assert sch.keep_probability(0) == 1.0 - scheduler.skip_probability(5, 0.5, 0.01)  # today's rule
    assert sch.state()["explore"] == [0.5, 0.5] and ref.state()["explore"] == [0.5, 0.5]


def test_bases_round_trip_and_version_1_states_restore():
    sch = _sched(0.25, adapt_groups=3)
    for groups in ({0: PASS, 1: FAIL}, {0: PASS, 1: FAIL, 2: MIXED}, {2: MIXED, 3: FAIL}):
        _step(sch, groups)
    assert (sch.explore_pass, sch.explore_fail) != (0.5, 0.5) and sch.pending == [2, 0, 1]  # moved once, then pooled
    back = scheduler.Scheduler.from_json(sch.to_json(), sch.settings)
    assert (back.explore_pass, back.explore_fail) == (sch.explore_pass, sch.explore_fail)  # exact through JSON
    assert back.state() == sch.state()
    old = {k: v for k, v in sch.state().items() if k not in ("explore", "pending")}  # a checkpoint before the bases
    old["version"] = 1
    again = _sched(0.25, adapt_groups=3, explore=0.7)
    again.restore(json.loads(json.dumps(old)))
    assert (again.explore_pass, again.explore_fail, again.pending) == (0.7, 0.7, [0, 0, 0])
    assert again.records == sch.records
    with pytest.raises(ValueError, match="unknown version 3"):
        again.restore({**sch.state(), "version": 3})


def test_a_resume_without_a_target_takes_the_configured_base():
    """A version-2 state holds bases and pooled counts; a scheduler with fixed bases (no target) restores the history
    but keeps its own ``explore`` (a resume may change ``schedule_explore`` or turn the target off), nothing pooled."""
    adapted = _sched(0.25, adapt_groups=3)
    for groups in ({0: PASS, 1: FAIL}, {0: PASS, 1: FAIL, 2: MIXED}, {2: MIXED, 3: FAIL}):
        _step(adapted, groups)
    saved = json.loads(adapted.to_json())
    # by hand: step 2 pools 3 groups, all-pass and all-fail shares 1/3 >= 1/12 and 2/12: both bases down by 0.01;
    # step 3 pools 2 groups, one all-fail
    assert saved["explore"] == [0.49, 0.49] and saved["pending"] == [2, 0, 1]
    for explore in (0.5, 0.3):  # the target turned off; and schedule_explore changed too
        fixed = _sched(None, explore=explore)
        fixed.restore(saved)
        assert (fixed.explore_pass, fixed.explore_fail, fixed.pending) == (explore, explore, [0, 0, 0])
        assert fixed.records == adapted.records and fixed.skipped_total == adapted.skipped_total
        assert fixed.keep_probability(0) == pytest.approx(explore**2, abs=1e-15)  # streak 2: max(explore^2, 0.01)
    changed = {**saved, "explore": [0.5, 0.5], "pending": [0, 0, 0]}  # fixed bases saved, a new schedule_explore
    fixed = _sched(None, explore=0.3)
    fixed.restore(changed)
    assert (fixed.explore_pass, fixed.explore_fail) == (0.3, 0.3)
    targeted = _sched(0.25, adapt_groups=3, explore=0.3)  # with a target the saved bases and counts resume
    targeted.restore(saved)
    assert (targeted.explore_pass, targeted.explore_fail, targeted.pending) == (0.49, 0.49, [2, 0, 1])


@pytest.mark.parametrize("overrides, match", [
    (["rollout.schedule=adaptive", "rollout.schedule_target=0.25"], "skips nothing"),
    (["rollout.schedule_target=0.25"], "schedule='none' skips nothing"),  # not silently ignored
    (["rollout.schedule=skip", "rollout.schedule_target=1.0"], r"schedule_target must be in \(0, 1\)"),
    (["rollout.schedule=skip", "rollout.schedule_target=0.25", "rollout.schedule_explore=0.99"],
     r"range \[0.05, 0.95\]"),
])  # fmt: skip
def test_config_refuses_a_target_that_cannot_apply(overrides, match):
    with pytest.raises(config_lib.ConfigError, match=match):
        config_lib.load_config("default", overrides)
    ok = config_lib.load_config("default", ["rollout.schedule=skip", "rollout.schedule_target=0.25"])
    assert scheduler.from_config(ok).settings.target == 0.25
    assert scheduler.from_config(config_lib.load_config("default", ["rollout.schedule=skip"])).settings.target is None


def test_the_bases_steer_the_flat_share_toward_the_target():
    """The stand-in's prompts are a third always-pass, a third always-fail, a third mixed (P = 4, 24 prompts). With the
    fixed base the late steps sample ~3% all-pass and ~3% all-fail groups. A target of 0.03 (shares 0.01 and 0.02)
    lies below that: both bases fall and the rule skips more; a target of 0.9 (0.3 and 0.6) lies above it: both rise
    and the rule skips less, admitting more flat groups. The same draws in every run (the same seeds and steps)."""
    runs = {}
    for target in (None, 0.03, 0.9):
        tr = _StandInTrainer("rollout.schedule=skip", *([f"rollout.schedule_target={target}"] if target else []),
                             num_prompts=24)  # fmt: skip
        for step in range(120):
            _, metrics = scheduled.rollout(tr, step, jax.random.key(step))
        late = [i for batch in tr.sampled[-60:] for i in batch]
        runs[target] = (sum(i % 3 != 2 for i in late) / len(late), tr.scheduler, metrics)
    assert (runs[None][1].explore_pass, runs[None][1].explore_fail) == (0.5, 0.5)
    low, high = runs[0.03][1], runs[0.9][1]
    assert low.explore_pass < 0.5 and low.explore_fail < 0.5 and high.explore_pass > 0.5 and high.explore_fail > 0.5
    assert low.skipped_total > runs[None][1].skipped_total > high.skipped_total
    assert runs[0.03][0] < runs[0.9][0]  # the late flat share
    for _, sch, metrics in runs.values():  # the metrics report the bases after the step
        assert (metrics["schedule/explore_pass"], metrics["schedule/explore_fail"]) == (sch.explore_pass,
                                                                                        sch.explore_fail)
