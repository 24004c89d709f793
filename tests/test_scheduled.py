# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The trainer's side of degeneracy-aware scheduling (`jaxgrpo.scheduled`): skip and resample on a stand-in trainer
whose rewards are fixed per prompt, a retried step counting its skips once, and the real trainer (off = today's run,
resume = the same history, the start notes). The scheduler's own math: `test_scheduler.py`."""

from __future__ import annotations

import json
import math
import pathlib
import types

import jax
import numpy as np
import pytest

from jaxgrpo import config as config_lib
from jaxgrpo import data as data_lib
from jaxgrpo import sampling, scheduled, scheduler, train_loop
from jaxgrpo.errors import RewardError
from jaxgrpo.groups import Rollout

DATA = pathlib.Path(__file__).parent / "data"


# -- the trainer's glue (jaxgrpo.scheduled) on a stand-in trainer: rewards fixed per prompt ----------------------------
class _StandInTrainer:
    """What `scheduled.rollout` reads of a Trainer. Prompt i: i % 3 == 0 always passes, 1 always fails, 2 is mixed;
    every completion is 2 tokens."""

    def __init__(self, *overrides: str, num_prompts: int = 12):
        self.cfg = config_lib.load_config("default", ["rollout.prompts_per_step=4", "rollout.group_size=4", *overrides])
        self.scheduler = scheduler.from_config(self.cfg)
        self.examples = list(range(num_prompts))
        self.encoded = [[1, 2, 3]] * num_prompts
        self.iterator = data_lib.PromptIterator(list(range(num_prompts)), 4, 0, True)
        self.rollout_stats: dict = {}
        self.sampled: list[list[int]] = []

    def sample(self, indices, key):
        self.sampled.append(list(indices))
        n, g = len(indices), self.cfg.rollout.group_size
        rw = np.asarray([[1.0] * g if i % 3 == 0 else [0.0] * g if i % 3 == 1 else [1.0] + [0.0] * (g - 1)
                         for i in indices], np.float32)  # fmt: skip
        mask = np.zeros((n * g, 3), bool)
        mask[:, :2] = True
        comp = sampling.Completions(np.ones((n * g, 3), np.int32), np.zeros((n * g, 3), np.float32), mask,
                                    mask.sum(-1), np.zeros(n * g, bool), None)  # fmt: skip
        return Rollout([self.encoded[i] for i in indices], [self.examples[i] for i in indices], comp, [""] * (n * g),
                       rw, np.ones((n, g), bool))  # fmt: skip


def test_skip_learns_which_prompts_are_flat_and_skips_only_them():
    tr = _StandInTrainer("rollout.schedule=skip", "rollout.schedule_explore=0.5")
    first, extra = scheduled.rollout(tr, 0, jax.random.key(0))
    assert extra["schedule/skipped"] == 0  # no history yet: the iterator's first batch, as without the schedule
    mixed = sum(i % 3 == 2 for i in tr.sampled[0])
    assert extra["schedule/informative_groups"] == mixed
    assert extra["schedule/informative_per_1k_tokens"] == pytest.approx(1000 * mixed / (4 * 4 * 2))
    assert extra["tokens/sampled"] == 4 * 4 * 2 and extra["schedule/group_size_mean"] == 4
    for step in range(1, 40):
        _, extra = scheduled.rollout(tr, step, jax.random.key(step))
    sch = tr.scheduler
    assert sch.skipped_total > 0
    streaks = {i: rec.streak for i, rec in sch.records.items()}
    assert all(streaks[i] > 0 for i in streaks if i % 3 == 0) and all(streaks[i] < 0 for i in streaks if i % 3 == 1)
    assert all(streaks[i] == 0 for i in streaks if i % 3 == 2)  # mixed prompts are never predicted flat
    assert sch.precision == 1.0  # rewards are fixed per prompt: every predicted-degenerate group was degenerate
    late = [i for batch in tr.sampled[-20:] for i in batch]
    assert sum(i % 3 == 2 for i in late) / len(late) > 0.6  # most admitted prompts are now the informative third


def test_skip_composes_with_resample_rounds():
    tr = _StandInTrainer("rollout.schedule=skip", "algo.degenerate_groups=resample", "algo.resample_max_rounds=6")
    roll, extra = scheduled.rollout(tr, 0, jax.random.key(0))
    informative = [i for batch in tr.sampled for i in batch if i % 3 == 2]
    assert extra["resample/rounds"] == len(tr.sampled)
    assert len(informative) >= 4 or len(tr.sampled) == 6
    assert (np.ptp(roll.rewards, axis=1) > 0).sum() == min(4, len(informative))  # the informative groups first


class _LoopTrainer(_StandInTrainer):
    """What `train_loop.loop` reads of a Trainer, on the stand-in: a step is `scheduled.rollout`; the reward of step
    ``fail_at`` fails after its prompts were drawn (as a reward function's RewardError in scoring); checkpoints are
    kept in ``saved``. Every prompt starts with streak 5 (keep max(0.5^5, 0.01) = 1/32), so draws skip."""

    def __init__(self, run_dir: pathlib.Path, fail_at: int | None = None):
        super().__init__("rollout.schedule=skip", "train.steps=3", "checkpoint.every=0",
                         "checkpoint.export_final=false", "log.sample_every=0")  # fmt: skip
        self.scheduler.records = {i: scheduler.Record(streak=5) for i in range(len(self.examples))}
        self.start_step, self.sampled_tokens, self.retain_sets, self.run_dir = 0, 0, [], run_dir
        self.state, self.fail_at, self.step_no, self.skipped_in_failed = object(), fail_at, 0, None
        self.saved: list[tuple[int, dict]] = []
        self.ckpt = types.SimpleNamespace(save=lambda step, state, extra, force: self.saved.append((step, extra)),
                                          wait=lambda: None)  # fmt: skip

    def step(self, step: int) -> dict[str, float]:
        self.step_no = step
        _, metrics = scheduled.rollout(self, step, jax.random.key(step))
        self.state = object()  # the update
        return metrics

    def sample(self, indices, key):
        if self.step_no == self.fail_at:
            self.skipped_in_failed = self.scheduler.skipped_total
            raise RewardError("reward 'f' raised ZeroDivisionError", "fix the reward function")
        return super().sample(indices, key)

    def saved_state(self):
        return self.state

    def checkpoint_extra(self) -> dict:
        return {"iterator": self.iterator.state(), "scheduler": json.loads(self.scheduler.to_json())}


def test_a_step_retried_after_a_reward_error_counts_its_skips_once(tmp_path):
    """A RewardError in step 1 checkpoints step 1 with the iterator's position and the schedule's state of before the
    failed step (its draws had added their skips to skipped_total); the resumed run's step 1 then equals the
    uninterrupted run's: the same prompts, the same skips, the same skipped_total."""
    logger = types.SimpleNamespace(log=lambda step, metrics: None)
    stop = types.SimpleNamespace(any_process=lambda: False, signal=None)
    whole = _LoopTrainer(tmp_path / "whole")
    history = train_loop.loop(whole, logger, stop)
    assert len(history) == 3 and whole.scheduler.skipped_total == sum(m["schedule/skipped"] for m in history)

    failing = _LoopTrainer(tmp_path / "failed", fail_at=1)
    with pytest.raises(RewardError, match="step 1 is checkpointed"):
        train_loop.loop(failing, logger, stop)
    [(step, extra)] = failing.saved
    after_step_0 = history[0]["schedule/skipped_total"]
    assert step == 1 and failing.skipped_in_failed > after_step_0  # step 1's draws skipped before the reward failed
    assert extra["scheduler"]["skipped_total"] == after_step_0  # ... and the checkpoint does not count them
    resumed = _LoopTrainer(tmp_path / "failed")
    resumed.iterator.restore(extra["iterator"])
    resumed.scheduler.restore(extra["scheduler"])
    resumed.start_step = step
    rest = train_loop.loop(resumed, logger, stop)
    assert [m["schedule/skipped_total"] for m in rest] == [m["schedule/skipped_total"] for m in history[1:]]
    assert resumed.sampled[0] == whole.sampled[1] and resumed.scheduler.state() == whole.scheduler.state()


def test_padded_groups_layout():
    class Tr:
        encoded, examples = [[5], [6], [7]], ["a", "b", "c"]

    sizes = np.asarray([2, 4, 2])
    n = sizes.sum()
    tok = np.arange(n * 3, dtype=np.int32).reshape(n, 3) + 1
    comp = sampling.Completions(tok, tok * 0.5, np.ones((n, 3), bool), np.full(n, 3), np.ones(n, bool), None)
    rw = np.arange(n, dtype=np.float32)
    roll = scheduled.pad_groups(Tr(), [0, 1, 2], sizes, comp, [str(t) for t in range(n)], rw, np.ones(n, bool), 4)
    np.testing.assert_array_equal(roll.valid, [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    np.testing.assert_array_equal(roll.rewards, [[0, 1, 0, 0], [2, 3, 4, 5], [6, 7, 0, 0]])
    rows = [0, 1, 4, 5, 6, 7, 8, 9]  # where the 8 sampled rows go in the [3 * 4] layout
    np.testing.assert_array_equal(np.asarray(roll.completions.tokens)[rows], tok)
    pad = [2, 3, 10, 11]
    assert not np.asarray(roll.completions.mask)[pad].any() and (np.asarray(roll.completions.tokens)[pad] == 0).all()
    assert not np.asarray(roll.completions.truncated)[pad].any()
    assert [roll.texts[r] for r in rows] == [str(t) for t in range(n)] and roll.texts[2] == ""
    assert roll.prompt_ids == [[5], [6], [7]] and roll.completions.entropy is None


# -- the trainer -------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_schedule_off_is_todays_run(tmp_path):
    """rollout.schedule=none (the default): the same metrics as the trainer before the scheduler existed (main
    0ca1515; tests/data/make_schedule_off_metrics.py), and no schedule/ metric or checkpoint field."""
    from test_train import deterministic, small_config

    from jaxgrpo import checkpoint as ckpt_lib
    from jaxgrpo import trainer

    cfg = small_config("train.steps=2", "checkpoint.every=2", "checkpoint.export_final=false")
    assert cfg.rollout.schedule == "none"
    history = [deterministic(m) for m in trainer.run(cfg, tmp_path / "run")]
    golden = json.loads((DATA / "schedule_off_metrics.json").read_text())
    assert len(history) == len(golden) and not any(k.startswith("schedule/") for h in history for k in h)
    iid_keys = ("degeneracy/iid_rate", "degeneracy/excess_over_iid")  # (since estimated without bias: by hand below)
    for got, want in zip(history, golden):  # the metrics of that trainer (later ones may add keys, not change these)
        for k in set(want) - set(iid_keys):
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
        g = cfg.rollout.group_size
        n = round(want["groups/num"] * g)
        s = round(want["degeneracy/success_rate"] * n)
        iid = (math.comb(s, g) + math.comb(n - s, g)) / math.comb(n, g)
        np.testing.assert_allclose(got["degeneracy/iid_rate"], iid, rtol=1e-5)
        np.testing.assert_allclose(got["degeneracy/excess_over_iid"],
                                   want["degeneracy/all_pass"] + want["degeneracy/all_fail"] - iid, atol=1e-6)
    with ckpt_lib.CheckpointManager(ckpt_lib.run_checkpoint_dir(tmp_path / "run"), keep=2, save_interval=0) as mgr:
        assert "scheduler" not in mgr.read_extra()


@pytest.mark.slow
def test_skip_adaptive_run_resumes_to_the_same_history(tmp_path):
    """4 steps uninterrupted vs 2 steps + a resumed run to 4: the same metrics and the same per-prompt history (with
    GRESO's adaptive bases: their pooled counts resume too)."""
    from test_train import deterministic, small_config

    from jaxgrpo import checkpoint as ckpt_lib
    from jaxgrpo import trainer

    sched = ["rollout.schedule=skip+adaptive", "rollout.schedule_budget=24", "rollout.schedule_target=0.25",
             "data.num_examples=8",
             "checkpoint.every=1", "checkpoint.export_final=false"]  # fmt: skip
    whole = trainer.run(small_config(*sched, "train.steps=4"), tmp_path / "a")
    trainer.run(small_config(*sched, "train.steps=2"), tmp_path / "b")
    resumed = trainer.run(small_config(*sched, "train.steps=4"), tmp_path / "b", allow_config_change=True)
    assert len(resumed) == 2
    for got, want in zip(resumed, whole[2:]):
        got, want = deterministic(got), deterministic(want)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    states = []
    for run in ("a", "b"):
        with ckpt_lib.CheckpointManager(ckpt_lib.run_checkpoint_dir(tmp_path / run), keep=5, save_interval=0) as m:
            states.append(m.read_extra(4)["scheduler"])
    assert states[0] == states[1] and len(states[0]["records"]) == 8
    assert states[0]["pending"][0] == 3 * 8  # steps 1-3 drew known prompts (8 groups each); 24 < 32: not moved yet
    # the schedule acted: 24 samples for 8 prompts of G = 4 (groups of 2 and 4 in one [8, 4] batch), and the prompts
    # whose groups were all-fail (almost all, for the tiny random policy) were skipped now and then
    assert whole[-1]["schedule/skipped_total"] > 0
    for m in whole:  # the sampled tokens are those of the G_i samples, not of the padded [P, G] array
        assert (m["schedule/samples"], m["schedule/group_size_min"], m["schedule/group_size_max"]) == (24, 2, 4)
        assert m["tokens/sampled"] <= 24 * 2 and m["tokens/completion"] == m["tokens/sampled"]


@pytest.mark.parametrize("schedule, steps, n, resample, notes", [
    ("skip", 10, 40, False, ["draws at most one pass over the 40 prompts"]),  # 10 x 4 = 40 draws: none recurs
    ("skip", 11, 40, False, []),  # 44 draws: a second pass begins
    ("skip+adaptive", 5, 64, True, ["= 20 draws at most one pass over the 64"]),
    ("none", 10, 40, False, []),
    ("none", 10, 12, True, ["fewer than rollout.prompts_per_step × algo.resample_max_rounds = 16"]),
])  # fmt: skip
def test_start_notes_on_prompt_counts(schedule, steps, n, resample, notes, capsys):
    """A schedule reads a prompt's earlier groups, so it is inert when the run cannot draw a prompt twice (the study's
    amendment 5); resampling rounds that can exhaust the data set are noted too. Counts by hand, P = 4."""
    from jaxgrpo import trainer

    cfg = config_lib.load_config(None, [f"rollout.schedule={schedule}", f"train.steps={steps}",
                                        "rollout.prompts_per_step=4", "algo.resample_max_rounds=4"]
                                 + (["algo.degenerate_groups=resample"] if resample else []))  # fmt: skip
    trainer.check_prompt_count(cfg, n)
    err = capsys.readouterr().err
    assert len(err.splitlines()) == len(notes) and all(note in err for note in notes)


@pytest.mark.parametrize("mode, noted", [("keep", False), ("mask", True), ("resample", True)])
def test_start_note_on_avspo_without_its_degenerate_groups(mode, noted, capsys):
    """AVSPO gives non-degenerate groups grpo's advantages bit for bit: with mask or resample the run is grpo's."""
    from jaxgrpo import trainer

    cfg = config_lib.load_config(None, ["algo.estimator=avspo", f"algo.degenerate_groups={mode}"])
    trainer.check_prompt_count(cfg, 10_000)
    assert ("this run trains as grpo would" in capsys.readouterr().err) is noted
