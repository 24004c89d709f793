# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Asynchronous rollouts (`jaxgrpo.async_rollout`) of multi-turn runs (`jaxgrpo.multiturn_step`): the rollout thread
runs the turns (either turn scheduler) with the lagged weights while the learner trains.

The tiny random model on SmolLM2's tokenizer with the calculator environment of tests/test_multiturn_train.py (its
config and its uninterrupted 3-step run on the multi-turn engine, the synchronous reference):

* ``max_staleness = 0`` with the rollout on a device of its own (``mesh.rollout=1``, the multi-turn engine) is the
  synchronous run, step for step, and ends with the same parameters; and with the simple loop sampling over four
  rollout devices (``mesh.rollout=4``, beside a 1-device learner: 1 + 4 devices) it is the
  synchronous run that samples with the same sampler on one device;
* k = 1: every step's trajectories are sampled with exactly the weights of version max(s − 1, 0), as published by
  the learner (never older than one update, and not a newer one);
* a run killed (SIGINT) while the rollout thread had sampled two steps ahead resumes and trains every prompt of the
  uninterrupted run once, in order: none of the drawn-ahead prompts lost or trained twice;
* a scripted policy that calls the calculator and then answers: the tool calls run in the tool worker threads (not
  the rollout thread, not the learner's), their replies reach the second turn, and the rewards, turns and tool
  counts are those the script implies;
* an environment's ``get_reward`` that raises in the rollout thread stops the run at that step with the one-line
  `RewardError`, checkpointed at the prompt position of the last trained step (not the thread's, which drew ahead);
* what stays refused is one line: the multi-turn engine on several rollout devices, several hosts (also when the
  caller set up jax.distributed without ``mesh.distributed``).
"""

from __future__ import annotations

import functools
import sys
import threading

import jax
import numpy as np
import pytest
from test_async import stop_two_steps_ahead_then_resume
from test_multiturn_train import ENGINE, assert_same_metrics, calculating_policy, scripted, small

from jaxgrpo import async_rollout, metrics_log, multiturn_step, sampling, sharding, trainer
from jaxgrpo import checkpoint as ckpt_lib
from jaxgrpo import config as config_lib
from jaxgrpo import eval as eval_lib
from jaxgrpo.errors import RewardError


@pytest.mark.slow
def test_staleness_zero_on_a_device_of_its_own_is_the_synchronous_multiturn_run(smollm2_gguf, tmp_path):
    reference = tmp_path / "synchronous"  # as test_multiturn_train's reference run
    trainer.run(small(smollm2_gguf, "train.steps=3", ENGINE), reference)
    want = metrics_log.read_metrics(reference)
    run = tmp_path / "run"
    trainer.run(small(smollm2_gguf, "train.steps=3", ENGINE, "mesh.rollout=1"), run)
    got = metrics_log.read_metrics(run)
    assert [r["step"] for r in got] == [1, 2, 3]
    for i in range(3):
        assert {k for k in got[i] if not k.startswith("async/")} == set(want[i]), f"step {i + 1}"
        assert_same_metrics(got[i], want[i], f"step {i + 1}")
        assert got[i]["async/policy_version"] == i and got[i]["async/staleness_max"] == 0
    assert {"multiturn/tool_calls", "rollout/forced_tokens", "degeneracy/collapse_rate"} <= set(got[0])
    cfg = small(smollm2_gguf, "train.steps=3", ENGINE)
    a = eval_lib.load_policy_for_eval(cfg, reference, 3).params
    b = eval_lib.load_policy_for_eval(cfg, run, 3).params
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_the_simple_loop_on_four_rollout_devices_is_the_synchronous_run(smollm2_gguf, tmp_path, monkeypatch):
    """k = 0 with the simple turn loop sampling over a 4-device rollout group (``mesh.rollout=4``: the last four of
    the 8 fake devices, the learner on the first), against the synchronous run whose loop samples with the same
    sampler (`sampling.generate` on a mesh) on one device: the same run, step for step. (A 1-device learner
    beside the 4 rollout devices: 1 + 4.)"""
    one = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate", staticmethod(functools.partial(sampling.generate,
                                                                                             mesh=one)))  # fmt: skip
    sync = trainer.run(small(smollm2_gguf, "train.steps=2", "checkpoint.every=0"), tmp_path / "sync")
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate", None)
    calls, real_generate = [], sampling.generate

    def generate(*args, mesh=None, **kw):  # each turn's sampler call: the mesh it samples on
        calls.append(mesh)
        return real_generate(*args, mesh=mesh, **kw)

    monkeypatch.setattr(sampling, "generate", generate)
    split = trainer.run(small(smollm2_gguf, "train.steps=2", "checkpoint.every=0", "mesh.rollout=4"),
                        tmp_path / "split")  # fmt: skip
    assert len(calls) >= 2 and all(set(m.devices.flat) == set(jax.devices()[4:]) for m in calls)
    assert len(split) == len(sync) == 2
    for s, (got, want) in enumerate(zip(split, sync)):
        assert {k for k in got if not k.startswith("async/")} == set(want)
        assert_same_metrics(got, want, f"step {s + 1}")
        assert got["async/policy_version"] == s


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.slow
def test_every_step_samples_its_turns_with_version_s_minus_one(smollm2_gguf, tmp_path, monkeypatch):
    """k = 1 on a rollout device of its own, the simple turn loop: the recorded versions are max(s − 1, 0), and the
    weights the turns were sampled with are those the learner published as that version (compared leaf for leaf),
    not the next one."""
    used, published = [], {}
    real_publish, real_rollout = async_rollout.Producer.publish, multiturn_step.rollout

    def publish(self, version, params):
        real_publish(self, version, params)
        published[version] = leaves(self.versions[version])

    def rollout(tr, step):
        used.append((step, leaves(tr.sampler_params()), threading.current_thread().name))
        return real_rollout(tr, step)

    monkeypatch.setattr(async_rollout.Producer, "publish", publish)
    monkeypatch.setattr(multiturn_step, "rollout", rollout)
    # sign advantages: every group has a gradient (the tiny policy's groups are mostly all-fail), so every update
    # moves the weights and the versions differ
    out = trainer.run(small(smollm2_gguf, "train.steps=3", "rollout.max_staleness=1", "mesh.rollout=1",
                            "algo.estimator=sign", "checkpoint.every=0"), tmp_path / "run")  # fmt: skip
    assert [m["async/policy_version"] for m in out] == [0.0, 0.0, 1.0]
    assert [m["async/staleness_max"] for m in out] == [0.0, 1.0, 1.0]
    assert [s for s, _, _ in used] == [0, 1, 2] and {t for _, _, t in used} == {"jaxgrpo-rollout"}
    for step, got, _ in used:
        want = published[max(step - 1, 0)]
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), step
        if step >= 1:  # the update moved the weights: the next version differs
            assert not all(np.array_equal(a, b) for a, b in zip(got, published[step], strict=True)), step
    assert all(np.isfinite(m["loss"]) and m["multiturn/turns"] >= 1 for m in out)


@pytest.mark.slow
def test_a_killed_multiturn_run_trains_every_prompt_once_in_order(smollm2_gguf, tmp_path, monkeypatch, capfd):
    """k = 2, 4 steps: the uninterrupted run against a run stopped by SIGINT after step 2 (checkpointed there) while
    the rollout thread had already sampled steps 3 and 4, then resumed: the trained prompts are the same, step by
    step, and no prompt is trained twice (the uninterrupted run draws each prompt once per epoch)."""
    trained: list[list[str]] = []
    real_batch = multiturn_step.MultiTurn.batch

    def batch(self, scored, pad_id):  # the learner's batch of each trained step
        trained.append([e.prompt for e in scored.examples])
        return real_batch(self, scored, pad_id)

    monkeypatch.setattr(multiturn_step.MultiTurn, "batch", batch)
    cfg = small(smollm2_gguf, "train.steps=4", "rollout.max_staleness=2", "checkpoint.every=0")
    trainer.run(cfg, tmp_path / "whole")
    whole, trained[:] = list(trained), []
    assert len(whole) == 4 and len({p for ps in whole for p in ps}) == 8

    resumed = stop_two_steps_ahead_then_resume(monkeypatch, cfg, tmp_path / "cut", capfd)
    assert trained == whole
    assert [m["async/policy_version"] for m in resumed] == [2.0, 2.0]  # versions 0, 1 are not checkpointed


@pytest.mark.slow
def test_tool_calls_of_the_rollout_thread_run_in_the_tool_workers(smollm2_gguf, tmp_path, monkeypatch):
    """k = 1, the rollout on a device of its own; a scripted policy: turn 1 asks the calculator for the question's
    a + b, turn 2 answers the tool's reply. Every trajectory: 2 turns, 1 tool call, no error, reward 1 (gsm8k_lenient)
    + 0.5 × 1 (CalculatorEnv: a result equal to the gold), so all 4 trajectories of a step score 1.5."""
    from jaxgrpo.build import load_tokenizer
    from jaxgrpo.rollout import tools

    threads, real_calculator = [], tools.calculator

    def calculator(expression):
        threads.append(threading.current_thread().name)
        return real_calculator(expression)

    monkeypatch.setattr(tools, "calculator", calculator)
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate",
                        staticmethod(calculating_policy(load_tokenizer(str(smollm2_gguf)), 0)))  # fmt: skip
    out = trainer.run(small(smollm2_gguf, "train.steps=2", "rollout.max_staleness=1", "mesh.rollout=1",
                            "checkpoint.every=0"), tmp_path / "run")  # fmt: skip
    assert [m["async/policy_version"] for m in out] == [0.0, 0.0]
    for m in out:
        assert m["multiturn/turns"] == 2 and m["multiturn/tool_calls"] == 1 and m["multiturn/tool_error_rate"] == 0
        assert m["reward/mean"] == 1.5 and np.isfinite(m["loss"])
    assert len(threads) == 8 and not {"MainThread", "jaxgrpo-rollout"} & set(threads)


FLAKY_ENV = '''
calls = [0]


class FailsAfterStepZero:
    def reset(self, **kwargs):
        return None

    def get_reward(self):
        calls[0] += 1
        if calls[0] > 4:  # P x G = 4 trajectories a step: step 0 scores, step 1 raises
            raise KeyError("score")
        return 1.0

    def noop(self, x: int) -> str:
        """Does nothing.

        Args:
            x: anything
        """
        return "ok"
'''


@pytest.mark.slow
def test_an_environment_reward_that_raises_in_the_rollout_thread_stops_at_its_step(smollm2_gguf, tmp_path,
                                                                                   monkeypatch):  # fmt: skip
    """k = 1, a scripted one-turn policy: step 0 trains; step 1's rewards raise in the rollout thread (which drew its
    prompts ahead); the learner raises the error at step 1 and the checkpoint holds the position after step 0."""
    from jaxgrpo.build import load_tokenizer

    (tmp_path / "flaky_env.py").write_text(FLAKY_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate",
                        staticmethod(scripted(load_tokenizer(str(smollm2_gguf)), ["I am done."])))  # fmt: skip
    cfg = small(smollm2_gguf, "train.steps=3", "rollout.max_staleness=1", "checkpoint.every=0",
                "data.environment=flaky_env:FailsAfterStepZero", "data.rewards={environment: 1.0}")  # fmt: skip
    try:
        with pytest.raises(RewardError, match=r"FailsAfterStepZero.get_reward\(\) failed .* KeyError") as info:
            trainer.run(cfg, tmp_path / "run")
    finally:
        sys.modules.pop("flaky_env", None)
    assert "\n" not in str(info.value) and "step 1 is checkpointed" in str(info.value)
    manager = ckpt_lib.CheckpointManager(ckpt_lib.run_checkpoint_dir(tmp_path / "run"))
    try:
        assert manager.latest_step() == 1
        position = manager.read_extra(1)["iterator"]
    finally:
        manager.close()
    assert (position["epoch"], position["position"]) == (0, 2)  # after step 0's P = 2 prompts: step 1 is redrawn


def test_what_remains_refused_is_one_line(smollm2_gguf):
    for over, msg in [(["mesh.rollout=2", "rollout.turn_engine=true"], "the multi-turn engine samples on one device"),
                      (["rollout.max_staleness=1", "mesh.distributed=true"], "need rollout devices on every host")]:
        with pytest.raises(config_lib.ConfigError, match=msg) as info:
            small(smollm2_gguf, *over)
        assert "\n" not in str(info.value)


def test_several_processes_are_refused_even_without_mesh_distributed(smollm2_gguf, monkeypatch):
    """jax.distributed set up by the caller (mesh.distributed=false): the device groups refuse in one line."""
    cfg = small(smollm2_gguf, "rollout.max_staleness=1")
    assert async_rollout.device_groups(cfg)[2] is not None  # one process: accepted
    monkeypatch.setattr(async_rollout.jax, "process_count", lambda: 2)
    engine = ["rollout.turn_engine=true", "mesh.fsdp=2", "mesh.rollout=4", "mesh.distributed=true"]
    for over, msg in [(["rollout.max_staleness=1"], "an asynchronous run on 2 processes needs rollout devices"),
                      ([], "multi-turn rollouts on 2 processes need rollout devices on every host"),
                      (engine, "rollout.turn_engine=true samples on one device of each host, but mesh.rollout=4")]:
        with pytest.raises(config_lib.ConfigError, match=msg) as info:
            async_rollout.device_groups(small(smollm2_gguf, *over))
        assert "\n" not in str(info.value)
