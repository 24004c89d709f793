# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The trainer on the rollout engine: dynamic sampling streamed at the group level (each group scored as it
completes, admission stops at P informative groups), against a hand-counted schedule."""

from __future__ import annotations

import numpy as np
from test_train import small_config

from jaxgrpo import scheduler, trainer


def test_streamed_resampling_stops_at_p_informative_groups(tmp_path, monkeypatch):
    cfg = small_config("algo.degenerate_groups=resample", "algo.resample_max_rounds=5", "rollout.engine=continuous",
                       "rollout.slots=2")  # fmt: skip
    tr = trainer.Trainer(cfg, tmp_path)
    assert tr.use_engine
    real_score, scored, every = tr.score, [], [3]

    def score(indices, comp):  # group c (in completion order) is informative iff c % every == 0
        roll = real_score(indices, comp)
        roll.rewards[:] = 0.0
        roll.rewards[0, 0] = float(len(scored) % every[0] == 0)
        scored.append((list(indices), np.asarray(comp.tokens).copy(), int(np.asarray(comp.mask).sum())))
        return roll

    monkeypatch.setattr(tr, "score", score)
    roll, extra = tr.rollout(0)
    # M = 2 < decode_block: both slots' groups end within the block after their admission, so groups complete in
    # admission order, two at a time;
    # the 8th informative group is number 21, so 22 groups were admitted (rounds of 8 prompts: 3 drawn)
    assert len(scored) == 22
    assert extra["resample/rounds"] == 3.0
    assert extra["resample/discarded_groups"] == 22 - 8
    assert extra["resample/degenerate_frac"] == (22 - 8) / 22
    assert extra["resample/informative_frac"] == 1.0
    assert extra["tokens/sampled"] == float(sum(n for _, _, n in scored))  # every completed group's tokens
    assert roll.rewards.shape == (8, 4) and (roll.rewards[:, 0] == 1).all()
    picked = [scored[c] for c in range(0, 22, 3)]
    assert roll.prompt_ids == [tr.encoded[ix[0]] for ix, _, _ in picked]
    np.testing.assert_array_equal(np.asarray(roll.completions.tokens), np.concatenate([t for _, t, _ in picked]))
    for k in ("rollout/slot_utilization", "rollout/decode_steps", "rollout/prefill_tokens_per_s",
              "rollout/decode_tokens_per_s"):  # fmt: skip
        assert extra[k] > 0
    # informative iff c % 4 == 0: the 8th informative group is number 28, the first of its pair; number 29 finished
    # beside it and is dropped unread, its tokens counted as sampled (G = 4 rows of 1..M = 2 tokens)
    scored.clear()
    every[0] = 4
    _, extra = tr.rollout(1)
    assert len(scored) == 29 and extra["resample/rounds"] == 4.0 and extra["resample/discarded_groups"] == 30 - 8
    assert 4 <= extra["tokens/sampled"] - sum(n for _, _, n in scored) <= 8


def test_streamed_skip_admits_only_kept_prompts_and_records_the_completed_groups(tmp_path, monkeypatch):
    """``rollout.schedule=skip`` with resample on the engine (`jaxgrpo.scheduled.stream`): the even prompts carry a
    30-group all-fail streak (keep probability max(0.5^30, 1e-6) = 1e-6), so none is admitted; admission stops at P
    informative groups as without the schedule; the history gains exactly the completed groups."""
    cfg = small_config("rollout.schedule=skip", "rollout.schedule_min_keep=1e-6", "algo.degenerate_groups=resample",
                       "algo.resample_max_rounds=5", "rollout.engine=continuous", "rollout.slots=2")  # fmt: skip
    tr = trainer.Trainer(cfg, tmp_path)
    flat = set(range(0, len(tr.examples), 2))
    for i in flat:
        tr.scheduler.records[i] = scheduler.Record(failures=30.0, streak=-30)
    real_score, scored, every, tokens = tr.score, [], [3], []

    def score(indices, comp):  # group c (in completion order) is informative iff c % every == 0
        roll = real_score(indices, comp)
        roll.rewards[:] = 0.0
        roll.rewards[0, 0] = float(len(scored) % every[0] == 0)
        scored.append(indices[0])
        tokens.append(int(np.asarray(comp.mask).sum()))
        return roll

    monkeypatch.setattr(tr, "score", score)
    roll, extra = tr.rollout(0)
    assert not flat & set(scored)
    assert len(scored) == 22 and extra["resample/rounds"] == 3.0  # the same count as without the schedule (above)
    assert extra["schedule/informative_groups"] == 8 and extra["schedule/skipped"] > 0
    assert extra["schedule/predicted_degenerate"] == 0  # no admitted prompt had a streak
    assert roll.prompt_ids == [tr.encoded[scored[c]] for c in range(0, 22, 3)]
    recs = tr.scheduler.records
    assert set(recs) == flat | set(scored) and all(recs[i].streak == -30 for i in flat)
    for c, i in enumerate(scored):  # one group each (the 22 are distinct: 3 rounds of 8 odd prompts)
        assert recs[i].streak == (0 if c % 3 == 0 else -1) and recs[i].outcomes == [0.25 if c % 3 == 0 else 0.0]
    assert extra["tokens/sampled"] == sum(tokens)
    scored.clear()
    tokens.clear()
    every[0] = 4  # as in the test above: group 29 finished beside the 8th informative one, dropped unread
    _, extra = tr.rollout(1)
    assert len(scored) == 29 and 4 <= extra["tokens/sampled"] - sum(tokens) <= 8


def test_streamed_adaptive_groups_of_unequal_size_stop_at_p_informative_groups(tmp_path, monkeypatch):
    """``rollout.schedule=adaptive`` with resample on the engine (`jaxgrpo.scheduled.stream_sized`): the even prompts
    carry a 30-group all-fail history (p = 1/32: G_i = 2 = u, the floor), the others none (G = 4); a prompt enters
    the engine as G_i / 2 sub-groups of 2 rows and is scored once all of them completed; admission stops at the P-th
    informative group; the step's [P, G] rollout holds the first P informative groups, padding invalid; the history
    gains exactly the scored groups; every sampled token is counted."""
    cfg = small_config("rollout.schedule=adaptive", "algo.degenerate_groups=resample", "algo.resample_max_rounds=5",
                       "rollout.engine=continuous", "rollout.slots=2")  # fmt: skip
    tr = trainer.Trainer(cfg, tmp_path)
    small = set(range(0, len(tr.examples), 2))
    for i in small:
        tr.scheduler.records[i] = scheduler.Record(failures=30.0, streak=-30)
    assert tr.scheduler.group_sizes([0, 1, 2, 3]).tolist() == [2, 4, 2, 4]
    real, scored = tr.scorer, []

    def scorer(texts, examples, ids, **kw):  # group c (in completion order) is informative iff c % 3 == 0
        rw, valid, more = real(texts, examples, ids, **kw)
        rw = np.zeros(len(texts), np.float32)
        rw[0] = float(len(scored) % 3 == 0)
        scored.append((tr.examples.index(examples[0]), len(texts), sum(len(x) for x in ids)))
        return rw, valid, more

    monkeypatch.setattr(tr, "scorer", scorer)
    roll, extra = tr.rollout(0)
    assert len(scored) == 22 and 3 <= extra["resample/rounds"] <= 5  # the 8th informative group is number 21
    assert all(size == (2 if i in small else 4) for i, size, _ in scored) and {s for _, s, _ in scored} == {2, 4}
    assert extra["schedule/informative_groups"] == 8 and extra["resample/informative_frac"] == 1.0
    picked = scored[0:22:3]
    assert roll.rewards.shape == (8, 4) and (roll.rewards[:, 0] == 1).all()
    assert roll.valid.sum(1).tolist() == [size for _, size, _ in picked]
    assert roll.prompt_ids == [tr.encoded[i] for i, _, _ in picked]
    # the scored groups' tokens plus at most the rows in flight (4 slots of 2 rows, M = 2 tokens)
    assert 0 <= extra["tokens/sampled"] - sum(n for *_, n in scored) <= 4 * 2 * 2
    assert sum(len(rec.outcomes) for rec in tr.scheduler.records.values()) == 22
