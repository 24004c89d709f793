# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Reward scoring in worker threads: parallel results equal serial ones in order, a hanging function is cut off at
the timeout and the run goes on (in `Scorer` and in a real training run), the config keys, and reward failures as
one clean ``error:`` line from the command line."""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest

from jaxgrpo import config as config_lib
from jaxgrpo import rewards, trainer
from jaxgrpo import train as train_cli
from jaxgrpo.example import Example
from jaxgrpo.reward_pool import RewardPool

SMALL = ["train.steps=1", "rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=2",
         "checkpoint.every=0", "checkpoint.export_final=false", "log.progress=false", "log.tensorboard=false",
         "log.sample_every=0"]


def ex(answer: str, i: int = 0) -> Example:
    return Example(prompt=f"question {i}", answer=answer, meta={"index": i})


def _jittered(completion: str, example: Example) -> float:
    time.sleep((hash(completion) % 7) / 1000)  # finish out of submission order
    return float(len(completion)) * (1 + example.meta["index"])


def _jittered_batch(completions, index, **kwargs):
    time.sleep((hash(completions[0]) % 7) / 1000)
    return [float(len(c)) - i for c, i in zip(completions, index)]


def test_parallel_equals_serial_in_order():
    rng = np.random.default_rng(0)
    texts = ["".join(rng.choice(list("ab#1 \\boxed{}"), size=rng.integers(1, 12))) for _ in range(48)]
    texts[::5] = ["#### 12", "\\boxed{12}", "12", "#### 1,2", "The answer is 12.", "\\boxed{\\frac{24}{2}}",
                  "#### 13", "12 or 13", "#### 12\nConfidence: 90%", "<eos>"]
    examples = [ex("12", i // 4) for i in range(48)]
    fns = [(name, 1.0) for name in rewards.REWARDS] + [(_jittered, 0.5), (_jittered_batch, 2.0)]
    serial = rewards.score(texts, examples, fns, batch_size=4)
    for workers in (1, 4):
        parallel = rewards.score(texts, examples, fns, workers=workers, timeout=60.0, batch_size=4)
        np.testing.assert_array_equal(parallel[0], serial[0])
        np.testing.assert_array_equal(parallel[1], serial[1])
    # and the serial values are what the functions give one by one
    one_by_one = [sum(w * float(rewards.resolve(f)[1](t, e)) for f, w in fns[:-1]) for t, e in zip(texts, examples)]
    batch_part = [2.0 * (len(t) - e.meta["index"]) for t, e in zip(texts, examples)]
    np.testing.assert_allclose(serial[0], np.add(one_by_one, batch_part).astype(np.float32), rtol=1e-6)


def test_workers_run_calls_concurrently():
    # every call waits at a 4-party barrier: the 8 calls finish only if the 4 workers run them 4 at a time (one at a
    # time, the first call would wait out the barrier's timeout and fail with BrokenBarrierError)
    barrier = threading.Barrier(4, timeout=30)
    lock, running, peak = threading.Lock(), [0], [0]

    def call(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        barrier.wait()
        with lock:
            running[0] -= 1
        return i

    pool = RewardPool(workers=4, timeout=60.0)
    results = pool.run([lambda i=i: call(i) for i in range(8)])
    pool.close()
    assert [r.error for r in results] == [None] * 8
    assert [r.value for r in results] == list(range(8))
    assert peak[0] == 4


def test_pool_reports_exceptions_and_checks_arguments():
    pool = RewardPool(workers=2)
    ok, bad = pool.run([lambda: 1.0, lambda: 1 / 0])
    assert ok.value == 1.0 and ok.error is None
    assert isinstance(bad.error, ZeroDivisionError) and not bad.timed_out
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.run([lambda: 1.0])
    with pytest.raises(ValueError, match="needs worker threads"):
        RewardPool(workers=0, timeout=1.0)
    with pytest.raises(ValueError, match="timeout"):
        RewardPool(workers=1, timeout=0.0)


class _Hang:
    """A reward that blocks on the samples whose completion is "hang" until released."""

    __name__ = "hang_on_marked"

    def __init__(self):
        self.release = threading.Event()

    def __call__(self, completion: str, example: Example) -> float:
        if completion == "hang":
            self.release.wait(60)
        return 1.0


def test_hanging_call_is_cut_off_and_scoring_goes_on():
    hang = _Hang()
    scorer = rewards.Scorer([(hang, 1.0), ("arithmetic", 1.0)], workers=2, timeout=0.5)
    texts = ["1", "hang", "2", "hang", "1", "1"]
    examples = [ex("1", i) for i in range(6)]
    try:
        with pytest.warns(RuntimeWarning, match="'hang_on_marked' ran past data.reward_timeout=0.5s on sample 1"):
            r, valid, timed_out = scorer(texts, examples)
        np.testing.assert_array_equal(timed_out, [False, True, False, True, False, False])
        np.testing.assert_array_equal(valid, [True, False, True, False, True, True])
        np.testing.assert_array_equal(r, [2.0, 0.0, 1.0, 0.0, 2.0, 2.0])
        assert set(scorer.pool.stuck) == {"hang_on_marked"}
        # the pool kept its capacity: the next batch is scored normally, and the warning is not repeated
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            r2, valid2, _ = scorer(["1", "1"], examples[:2])
        assert valid2.all() and list(r2) == [2.0, 2.0]
        stats = scorer.take_stats()
        assert stats["reward/timeouts"] == 2.0 and stats["reward/invalid_frac"] == 2 / 8
        assert scorer.take_stats()["reward/timeouts"] == 0.0  # reset on read
    finally:
        hang.release.set()
    deadline = time.monotonic() + 5
    while scorer.pool.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert scorer.pool.stuck == {}  # released threads end; what they return is dropped
    scorer.close()


def test_too_many_stuck_calls_is_a_clean_error():
    hang = _Hang()
    scorer = rewards.Scorer([(hang, 1.0)], workers=2, timeout=0.2, on_error="invalidate")
    scorer.pool.stuck_limit = 3
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with pytest.raises(rewards.RewardError, match="calls of reward 'hang_on_marked' are still running"):
                scorer(["hang"] * 3, [ex("1", i) for i in range(3)])
    finally:
        hang.release.set()
        scorer.close()


@pytest.mark.parametrize(
    "override, match",
    [
        ("data.reward_workers=-1", "data.reward_workers must be >= 0"),
        ("data.reward_timeout=0", "data.reward_timeout must be > 0 seconds or null"),
        ("data.reward_workers=0", "data.reward_timeout=60.0 needs data.reward_workers >= 1"),
    ],
)
def test_config_keys_are_validated(override, match):
    with pytest.raises(config_lib.ConfigError, match=match):
        config_lib.load_config("default", [override])


def test_config_accepts_math_verify_and_serial_scoring():
    cfg = config_lib.load_config("default", ["data.rewards={math_verify: 1.0}", "data.reward_workers=0",
                                             "data.reward_timeout=null"])
    assert cfg.data.rewards == {"math_verify": 1.0} and cfg.data.reward_workers == 0


REWARD_MODULE = '''
import threading

release = threading.Event()
_lock = threading.Lock()
_calls = [0]


def hang_first_three(completion, example):
    with _lock:
        _calls[0] += 1
        n = _calls[0]
    if n <= 3:
        release.wait(60)
    return 1.0


def raising(completion, example):
    raise ZeroDivisionError("boom")
'''


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    name = f"user_rewards_{tmp_path.name}"  # a fresh module per test: its call counter starts at 0
    (tmp_path / f"{name}.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.mark.slow
def test_training_run_survives_a_hanging_reward(tmp_path, reward_module):
    import importlib

    cfg = config_lib.load_config("default", [*SMALL, "data.rewards.arithmetic=null",
                                             f"data.rewards.{reward_module}:hang_first_three=1.0",
                                             "data.reward_timeout=1"])
    try:
        with pytest.warns(RuntimeWarning, match="hang_first_three"):
            (rec,) = trainer.run(cfg, tmp_path / "run")
    finally:
        importlib.import_module(reward_module).release.set()
    assert rec["reward/timeouts"] == 3.0
    assert rec["reward/invalid_frac"] == 3 / 32
    assert rec["reward/mean"] == 1.0 and np.isfinite(rec["loss"])


def test_cli_reward_failure_is_one_clean_line(tmp_path, reward_module, capsys):
    code = train_cli.main([*SMALL, "data.rewards.arithmetic=null", f"data.rewards.{reward_module}:raising=1.0",
                           "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith(f"error: reward '{reward_module}:raising' raised ZeroDivisionError: boom on sample 0 ")
    assert lines[0].endswith("fix the function, or set algo.on_reward_error=invalidate to drop such samples from "
                             "the update")
