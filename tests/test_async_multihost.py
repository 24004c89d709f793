# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Asynchronous rollouts on two JAX processes (`async_rollout.process_groups`, two CPU processes of 4 fake devices
each): the learner's fsdp mesh spans 2 + 2 devices of the two hosts, each host samples its half of every step on its
2 other devices (the weights whole on each, or split over the two, ``mesh.rollout_fsdp = 2``) and the halves travel
through the coordinator's key-value store. The runs are checked against one
process: ``max_staleness = 0`` against the synchronous run step for step; k = 1 by the versions each step sampled
with (the lag itself is checked against the published weights on one process, `test_async.py`), with a checkpoint
saved while the rollout thread samples ahead."""

from __future__ import annotations

import pytest
from test_async import assert_same_run
from test_train import small_config

from jaxgrpo import host, metrics_log, trainer

SPLIT_ARGS = ["train.steps=3", "mesh.data=1", "mesh.fsdp=4", "mesh.rollout=4"]
EVAL_ARGS = ["train.eval_every=3", "train.eval_examples=6", "train.retain_every=3",
             "train.retain={copy: {difficulty: 0, split: test, num_examples: 5}}"]

SPLIT_BODY = r"""
from jaxgrpo import async_rollout, config as config_lib, trainer
from test_train import SMALL
from test_async_multihost import EVAL_ARGS, SPLIT_ARGS
from jaxgrpo import host
got = host.exchange("jaxgrpo/test/big", bytes([pid]) * (5 << 20))  # in three parts of the key-value store
sizes = [len(b) for b in got] + [b[-1] for b in got]
for k in (0, 1):  # checkpoint.every=2: a save at step 2 while the rollout thread samples step 3; k = 0 with each
    # host's copy of the weights split over its 2 rollout devices (mesh.rollout_fsdp), k = 1 whole on each
    split = ["mesh.rollout_fsdp=2", *EVAL_ARGS] if k == 0 else []
    cfg = config_lib.load_config("default", [*SMALL, *SPLIT_ARGS, *split, f"rollout.max_staleness={k}"])
    trainer.run(cfg, os.path.join(os.path.dirname(out), f"k{k}"))
    if k == 0:  # its evaluations, a batch each: retain at steps 0 and 3, held-out at 3
        evals = async_rollout.next_exchange("eval")
from jaxgrpo import async_rollout
learner, rollout, _ = async_rollout.device_groups(cfg)  # the learner spans both hosts; each host samples on its own
assert {d.process_index for d in learner.devices.flat} == {0, 1} and learner.devices.size == 4
assert {d.process_index for d in rollout.devices.flat} == {pid} and rollout.devices.size == 2
cfg = config_lib.load_config("default", [*SMALL, *SPLIT_ARGS, "mesh.rollout_fsdp=2"])
_, rollout, place = async_rollout.device_groups(cfg)
assert dict(rollout.shape) == {"data": 1, "fsdp": 2, "tensor": 1}
from jaxgrpo import aot, models, sharding
mcfg = aot.model_config(cfg)
params = sharding.shard_params(models.init_params(mcfg, jax.random.key(0)), mcfg, learner)
placed = place(params, mcfg)  # this host's copy, the hidden size split over its 2 rollout devices
for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(placed)):
    assert set(y.sharding.device_set) == set(rollout.devices.flat)
    assert y.addressable_shards[0].data.shape == tuple(d // 2 if d == mcfg.hidden_size else d for d in x.shape)
    assert np.array_equal(np.asarray(y), np.asarray(jax.jit(lambda a: a, out_shardings=sharding.replicated(learner))(
        x).addressable_data(0)))
assert async_rollout.next_exchange("rollout") == 6, "each of the run's 3 steps swapped its halves and scores once"
if pid == 0:
    np.savez(out, sizes=np.asarray(sizes), evals=evals)
"""


@pytest.mark.slow
def test_two_hosts_split_equals_one_process(tmp_path):
    from multihost import run_two_processes

    got = run_two_processes(SPLIT_BODY, tmp_path)
    sizes = got["sizes"].tolist()
    assert int(got["evals"]) == 3, "each evaluation's batch swapped its hosts' scores once"
    assert sizes == [5 << 20, 5 << 20, 0, 1], "each process's 5 MiB, in process order"
    two = {k: metrics_log.read_metrics(tmp_path / f"k{k}") for k in (0, 1)}
    trainer.run(small_config("train.steps=3", "mesh.data=1", "mesh.fsdp=8", *EVAL_ARGS), tmp_path / "sync")  # one mesh
    sync = metrics_log.read_metrics(tmp_path / "sync")
    assert_same_run(two[0], sync, rtol=1e-4)  # the evaluations too: each host scored its block of their rows
    assert {"eval/pass@1", "retain/copy/accuracy"} <= two[0][-1].keys()
    two[0], sync = ([r for r in x if "reward/mean" in r] for x in (two[0], sync))  # (not the retain set's step 0)
    assert [r["async/policy_version"] for r in two[0]] == [0.0, 1.0, 2.0]
    assert [r["async/policy_version"] for r in two[1]] == [0.0, 0.0, 1.0]  # step s samples with version s - 1
    assert_same_run(two[1][:1], sync[:1], rtol=1e-4)  # step 0: version 0 and the same prompts either way


def test_exchange_on_one_process_is_the_payload():
    assert host.exchange("jaxgrpo/test", b"abc") == [b"abc"]
