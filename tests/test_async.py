# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Asynchronous rollouts (`jaxgrpo.async_rollout`) on 8 fake CPU devices: ``max_staleness = 0`` on a device group of
its own is the synchronous run step for step; with k = 1, 2 every step's samples come from version max(s − k, 0)
exactly (never older than k); a killed and resumed run trains every prompt of the uninterrupted run once, in order."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
from test_train import deterministic, small_config

from jaxgrpo import async_rollout, step_batch, trainer
from jaxgrpo import checkpoint as ckpt_lib
from jaxgrpo import config as config_lib


def assert_same_run(a: list[dict], b: list[dict], rtol: float = 1e-5) -> None:
    assert len(a) == len(b)
    for s, (x, y) in enumerate(zip(a, b)):
        x = {k: v for k, v in deterministic(x).items() if not k.startswith("async/")}
        y = deterministic(y)
        assert x.keys() == y.keys(), (s, x.keys() ^ y.keys())
        for k in y:
            np.testing.assert_allclose(x[k], y[k], rtol=rtol, atol=1e-6, err_msg=f"step {s} {k}")


def test_staleness_zero_on_a_device_of_its_own_is_the_synchronous_run(tmp_path):
    sync = trainer.run(small_config("train.steps=3"), tmp_path / "sync")
    split = trainer.run(small_config("train.steps=3", "mesh.rollout=1"), tmp_path / "split")
    assert_same_run(split, sync)
    assert [m["async/staleness_max"] for m in split] == [0.0, 0.0, 0.0]
    assert [m["async/policy_version"] for m in split] == [0.0, 1.0, 2.0]



def test_lora_sends_the_frozen_base_once_then_only_the_adapters(tmp_path, monkeypatch):
    """With LoRA the rollout device gets the frozen base once and then, after every update, the adapters alone
    (counted in bytes against the parameter counts); k = 0 is still the synchronous run."""
    sent: list[int] = []
    real_groups = async_rollout.device_groups

    def groups(cfg):
        learner, rollout, place = real_groups(cfg)

        def counted(tree, *where):
            sent.append(sum(x.size * x.dtype.itemsize for x in jax_leaves(tree)))
            return place(tree, *where)

        return learner, rollout, counted

    monkeypatch.setattr(async_rollout, "device_groups", groups)
    lora = ["train.steps=3", "lora.rank=4", "lora.alpha=8", "optim.learning_rate=1e-2", "algo.estimator=sign"]
    sync = trainer.run(small_config(*lora), tmp_path / "sync")
    assert sent == [], "a synchronous run copies nothing"
    split = trainer.run(small_config(*lora, "mesh.rollout=1"), tmp_path / "split")
    assert_same_run(split, sync)
    from jaxgrpo import aot, models

    mcfg = aot.model_config(small_config(*lora))
    total, base = models.count_params(mcfg), models.count_params(mcfg.replace(lora=None))
    assert sent == [4 * base] + [4 * (total - base)] * 4  # float32; versions 0 (with the base), 1, 2, 3

@pytest.mark.parametrize("k", [1, 2])
def test_every_step_samples_with_version_s_minus_k(tmp_path, monkeypatch, k):
    used = []  # (step, the sampler's weights) as the producer set them: compare with the published versions
    published: dict[int, list] = {}
    real_publish, real_rollout = async_rollout.Producer.publish, trainer.Trainer.rollout

    def publish(self, version, params):
        real_publish(self, version, params)
        published[version] = [np.asarray(x) for x in jax_leaves(self.versions[version])]

    def rollout(self, step):
        used.append((step, [np.asarray(x) for x in jax_leaves(self.sampler_params())]))
        return real_rollout(self, step)

    monkeypatch.setattr(async_rollout.Producer, "publish", publish)
    monkeypatch.setattr(trainer.Trainer, "rollout", rollout)
    # sign advantages: every group has a gradient (a tiny random policy's groups are mostly all-fail), so every
    # update moves the weights and the versions differ
    out = trainer.run(small_config("train.steps=4", f"rollout.max_staleness={k}", "algo.estimator=sign"),
                      tmp_path / "run")
    assert [m["async/staleness_max"] for m in out] == [float(min(s, k)) for s in range(4)]
    assert [m["async/policy_version"] for m in out] == [float(max(s - k, 0)) for s in range(4)]
    for step, leaves in used:  # the weights really are those of version max(s - k, 0), not a newer one
        want = published[max(step - k, 0)]
        assert all(np.array_equal(a, b) for a, b in zip(leaves, want))
        if step - k >= 0:  # and they differ from the next version (the update moved them)
            assert not all(np.array_equal(a, b) for a, b in zip(leaves, published[step - k + 1]))


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def stop_two_steps_ahead_then_resume(monkeypatch, cfg, run_dir, capfd) -> list[dict]:
    """Runs ``cfg`` (k >= 2) in ``run_dir``, stopped by SIGINT after step 2 (checkpointed there) once the rollout
    thread holds steps 3 and 4 (indices 2, 3) sampled ahead, then resumed; returns the resumed run's metrics."""
    real_step = trainer.Trainer.step

    def step_then_signal(self, step):
        out = real_step(self, step)
        if step == 1:  # once the rollout thread holds steps 2 and 3, sampled ahead
            with self.producer.cond:
                self.producer.cond.wait_for(lambda: {2, 3} <= set(self.producer.ready), timeout=300)
                assert {2, 3} <= set(self.producer.ready)
            threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT)).start()
            threading.Event().wait(0.5)  # the handler runs in the main thread, between bytecodes
        return out

    monkeypatch.setattr(trainer.Trainer, "step", step_then_signal)
    with pytest.raises(ckpt_lib.Preempted) as info:
        trainer.run(cfg, run_dir)
    assert info.value.step == 2
    monkeypatch.setattr(trainer.Trainer, "step", real_step)
    resumed = trainer.run(cfg, run_dir)
    assert "asynchronous run resumed at step 2" in capfd.readouterr().err
    return resumed


def test_a_resumed_run_trains_every_prompt_once_in_order(tmp_path, monkeypatch, capfd):
    """k = 2, 6 steps: the uninterrupted run against a run stopped by SIGINT after step 2 (checkpointed there) while
    the rollout thread had already sampled steps 3 and 4 (indices 2, 3), then resumed: the trained prompts are the
    same, step by step, none of the drawn-ahead ones lost or trained twice (the uninterrupted run draws each prompt
    once per epoch)."""
    trained: list[list[str]] = []
    real_batch = step_batch.StepShapes.batch

    def batch(self, roll, *a, **kw):  # the learner's batch of each trained step
        trained.append([e.prompt for e in roll.examples])
        return real_batch(self, roll, *a, **kw)

    monkeypatch.setattr(step_batch.StepShapes, "batch", batch)
    cfg = small_config("rollout.max_staleness=2", "checkpoint.every=0", "checkpoint.export_final=false",
                       "data.num_examples=64", "train.steps=6")  # fmt: skip
    trainer.run(cfg, tmp_path / "whole")
    whole, trained[:] = list(trained), []

    resumed = stop_two_steps_ahead_then_resume(monkeypatch, cfg, tmp_path / "cut", capfd)
    assert len(whole) == 6 and trained == whole
    assert [m["async/policy_version"] for m in resumed] == [2.0, 2.0, 2.0, 3.0]  # versions 0, 1 are not saved


def test_config_errors_are_one_line():
    for over, msg in [
        (["mesh.rollout=8"], "mesh.rollout=8 + the learner's mesh.data × fsdp × tensor = 1 devices > the 8"),
        (["rollout.max_staleness=-1"], "rollout.max_staleness"),
        (["rollout.max_staleness=1", "mesh.distributed=true"], "set mesh.rollout to a multiple of the process count"),
        (["mesh.rollout=2", "mesh.distributed=true", "rollout.schedule=adaptive"],
         "rollout.schedule=adaptive with asynchronous rollouts runs on one host so far"),
        (["mesh.rollout_fsdp=0"], "mesh.rollout_fsdp"),
        (["mesh.rollout=3", "mesh.rollout_fsdp=2"], r"mesh.rollout \(3\) must be a multiple of it"),
        (["mesh.rollout_fsdp=2"], r"mesh.rollout \(0\) must be a multiple of it"),
    ]:
        with pytest.raises(config_lib.ConfigError, match=msg.replace("×", ".").replace("+", r"\+")):
            cfg = small_config(*over)
            async_rollout.device_groups(cfg)



def test_several_processes_need_rollout_devices_on_every_host(monkeypatch):
    """jax.distributed set up by the caller (mesh.distributed=false): the device groups refuse in one line."""
    monkeypatch.setattr(async_rollout.jax, "process_count", lambda: 2)
    for over, msg in [(["rollout.max_staleness=1"], "set mesh.rollout to a multiple of 2 .each host samples"),
                      (["mesh.rollout=3"], "set mesh.rollout to a multiple of 2"),
                      (["mesh.rollout=2", "rollout.schedule=adaptive"], "rollout.schedule=adaptive with asynchronous"),
                      (["mesh.data=2", "mesh.rollout=2", "mesh.rollout_fsdp=2"],
                       "mesh.rollout_fsdp=2 must divide each host's 1 rollout devices")]:
        with pytest.raises(config_lib.ConfigError, match=msg) as info:
            async_rollout.device_groups(small_config(*over))
        assert "\n" not in str(info.value)

def test_rollout_fsdp_places_a_copy_split_over_the_rollout_devices():
    """``mesh.rollout_fsdp = 2`` on 4 rollout devices: a 2 × 2 data × fsdp mesh, and the published copy (a LoRA run's
    base and adapters, each placed where it sits in the params tree) holds half of every dimension of the hidden size
    on each device and every other dimension whole; the values are the learner's."""
    import jax

    from jaxgrpo import aot, models

    cfg = small_config("mesh.data=4", "mesh.rollout=4", "mesh.rollout_fsdp=2", "lora.rank=4", "lora.alpha=8")
    learner, rollout, place = async_rollout.device_groups(cfg)
    assert dict(rollout.shape) == {"data": 2, "fsdp": 2, "tensor": 1}
    assert not set(learner.devices.flat) & set(rollout.devices.flat)
    mcfg = aot.model_config(cfg)
    base, adapters = models.lora.split(models.init_params(mcfg, jax.random.key(0)))
    D = mcfg.hidden_size
    assert D not in (mcfg.intermediate_size, mcfg.vocab_size, mcfg.head_dim, mcfg.num_layers, 4)
    for tree, placed in [(base, place(base, mcfg)), (adapters, place(adapters, mcfg, models.lora.ADAPTERS_PATH))]:
        for x, y in zip(jax.tree.leaves(tree), jax.tree.leaves(placed)):
            assert set(y.sharding.device_set) == set(rollout.devices.flat)
            assert y.addressable_shards[0].data.shape == tuple(d // 2 if d == D else d for d in x.shape)
            np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


@pytest.mark.slow
def test_four_learner_and_four_rollout_devices_equal_the_synchronous_mesh_run(tmp_path):
    """8 devices split 4 + 4 (the learner's data mesh, the sampler over a 4-device data mesh of its own), k = 0,
    against the synchronous run whose learner and sampler share an 8-device data mesh: the same run. The rollout
    devices run the group driver with 4 slots for the 8 prompts (continuous batching: 4 admitted, then each freed
    slot refilled), which draws each prompt's rows with that prompt's keys, as the synchronous run's 8 slots do."""
    sync = trainer.run(small_config("train.steps=2", "mesh.data=8"), tmp_path / "sync")
    split = trainer.run(small_config("train.steps=2", "mesh.data=4", "mesh.rollout=4", "rollout.slots=4"),
                        tmp_path / "split")  # fmt: skip
    assert_same_run(split, sync, rtol=1e-4)
    # the driver's counters: 8 prompts through 4 slots of 4 rows need two rounds of decode blocks, so more decode
    # steps than the synchronous run's one batch
    assert all(a["rollout/decode_steps"] > b["rollout/decode_steps"] for a, b in zip(split, sync))
    # the rollout's weights split in two (mesh.rollout_fsdp: a 2 x 2 mesh; the engine decodes with its layers split)
    halves = trainer.run(small_config("train.steps=2", "mesh.data=4", "mesh.rollout=4", "mesh.rollout_fsdp=2",
                                      "rollout.slots=4"), tmp_path / "halves")  # fmt: skip
    assert_same_run(halves, sync, rtol=1e-4)


@pytest.mark.slow
def test_the_default_demo_learns_one_step_off_policy(tmp_path):
    """`python -m jaxgrpo.train rollout.max_staleness=1`: the default task is learned as in the synchronous demo
    (test_train.test_default_demo_learns: near chance at first, >= 0.9 over the last 20 steps)."""
    from jaxgrpo import metrics_log

    cfg = config_lib.load_config("default", ["log.progress=false", "log.tensorboard=false", "rollout.max_staleness=1"])
    trainer.run(cfg, tmp_path / "run")
    recs = metrics_log.read_metrics(tmp_path / "run")
    reward = np.array([r["reward/mean"] for r in recs])
    assert len(recs) == cfg.train.steps and all(r["async/staleness_max"] == min(r["step"] - 1, 1) for r in recs)
    assert reward[:5].mean() < 0.1 and reward[-20:].mean() >= 0.9


def test_a_failed_share_raises_alike_on_every_host():
    """`async_rollout.swap`'s parts from the other hosts: a share whose reward failed raises a `RewardError` here too
    (every host then checkpoints, a collective), any other failure a `RuntimeError` naming the process; on one
    process the failing share raises its own exception."""
    from jaxgrpo.errors import RewardError

    failed = async_rollout.failure_part
    with pytest.raises(RewardError, match="process 1: reward fn failed: fix it") as info:
        async_rollout.raise_failed([b"rows", failed(RewardError("reward fn failed", "fix it"))])
    assert info.value.advice == "fix it"
    with pytest.raises(RuntimeError, match="the rollout of process 0 failed: ValueError: boom"):
        async_rollout.raise_failed([failed(ValueError("boom")), b"rows"])
    async_rollout.raise_failed([b"rows", b""])  # nothing failed

    class Trainer:
        producer = None

    def make():
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        async_rollout.swap(Trainer(), make)


def test_each_host_scores_its_block_of_groups_and_every_host_gets_every_score(monkeypatch):
    """Two simulated hosts (threads; the swap through the coordinator replaced by a barrier): groups of 2, 4 and 2 rows
    split as host 0: groups 0-1, host 1: group 2 (`host_share`); a batched reward sees each group once, on one host;
    both hosts return all 8 scores and count all 8 samples, one of them invalid (the reward's None)."""
    import types

    import jax

    from jaxgrpo import rewards
    from jaxgrpo.example import Example

    local, barrier, box, calls = threading.local(), threading.Barrier(2), [None, None], [[], []]
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: local.pid)

    def swap(tr, make):
        box[local.pid] = make()
        barrier.wait()
        return list(box)

    def length(prompts, completions, **kwargs):
        calls[local.pid].append(list(prompts))
        return [None if c == "?" else float(len(c)) for c in completions]

    monkeypatch.setattr(async_rollout, "swap", swap)
    texts = ["a", "bb", "ccc", "d", "ee", "?", "gg", "h"]
    rows = [Example(p, "1") for p in "AABBBBCC"]
    out = [None, None]

    def host(pid):
        local.pid = pid
        tr = types.SimpleNamespace(scorer=rewards.Scorer([(length, 1.0)], workers=0), producer=None)
        rw, valid = async_rollout.score_across_processes(tr, texts, rows, [[0]] * 8, [2, 4, 2])
        out[pid] = (rw.tolist(), valid.tolist(), tr.scorer.take_stats())

    threads = [threading.Thread(target=host, args=(pid,)) for pid in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [[["A", "A"], ["B"] * 4], [["C", "C"]]]
    for rw, valid, stats in out:
        assert rw == [1, 2, 3, 1, 2, 0, 2, 1] and valid == [True] * 5 + [False] + [True] * 2
        assert stats["reward/invalid_frac"] == 1 / 8


def test_every_host_handles_a_failed_exchange_alike(monkeypatch):
    """The first process whose share failed decides, on every host: process 0's XLA error and process 1's reward
    error make every host raise a non-reward error (no host checkpoints alone, waiting for the others); a lone
    reward error makes every host raise a RewardError."""
    from jaxgrpo.errors import RewardError

    xla, reward = RuntimeError("XLA: out of memory"), RewardError("reward 'f' raised ValueError", "fix it")
    both = [async_rollout.failure_part(xla), async_rollout.failure_part(reward), b"ok"]
    for pid, own in ((0, xla), (1, reward), (2, None)):
        monkeypatch.setattr(async_rollout.jax, "process_index", lambda pid=pid: pid)
        with pytest.raises(Exception) as got:
            async_rollout.settle(both, own)
        assert not isinstance(got.value, RewardError) and "out of memory" in str(got.value), pid
        assert got.value.__cause__ is (own if pid == 1 else None)
    lone = [b"ok", async_rollout.failure_part(reward)]
    for pid, own in ((0, None), (1, reward)):
        monkeypatch.setattr(async_rollout.jax, "process_index", lambda pid=pid: pid)
        with pytest.raises(RewardError):
            async_rollout.settle(lone, own)
    async_rollout.settle([b"ok", b"ok"], None)  # nothing failed


def test_each_run_names_its_exchanges_afresh():
    """A run that stopped with one host an exchange ahead (its producer had begun the next round) must not shift the
    next run's pairs: every run starts its sequences at 0 under names of its own."""
    async_rollout.start_run()
    first = [async_rollout.exchange_name("rollout", async_rollout.next_exchange("rollout")) for _ in range(3)]
    async_rollout.start_run()
    assert async_rollout.next_exchange("rollout") == 0 and async_rollout.next_exchange("eval") == 0
    assert async_rollout.exchange_name("rollout", 0) not in first and first[0].endswith("/0")
