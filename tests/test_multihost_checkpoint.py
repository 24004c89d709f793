# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Checkpoints across two `jax.distributed` processes (4 CPU devices each, `tests/multihost.py`): orbax save and
restore of arrays that no process holds whole (not fully addressable), and the preemption agreement
(`PreemptionFlag.any_process`: a signal seen by one process stops every process at the same step). The expected
values are closed forms (``np.arange``) gathered back to one process; the trainer's own two-process run is
`tests/test_train.py::test_two_process_run_equals_one_process_run`."""

from __future__ import annotations

import numpy as np
import pytest

CHECKPOINT_BODY = r"""
import os
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxgrpo import checkpoint as ckpt
from jaxgrpo.sharding import make_mesh

mesh = make_mesh(1, 8, 1)  # fsdp over all 8 devices: each process holds half of every row-sharded leaf
full = np.arange(16 * 6, dtype=np.float32).reshape(16, 6)
def place(x, spec):
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda idx: x[idx])
state = {"w": place(full, P("fsdp")), "b": place(full[0] * 2.0, P()), "step": place(np.asarray(7, np.int32), P())}
assert not state["w"].is_fully_addressable and not state["b"].is_fully_addressable
directory = os.path.join(os.path.dirname(out), "ckpt")
with ckpt.CheckpointManager(directory, keep=2) as mgr:
    assert mgr.save(3, state, extra={"iterator": [5]})
    mgr.wait()
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    restored, extra = mgr.restore(None, target)
    assert mgr.all_steps() == [3] and extra == {"iterator": [5]}
w = restored["w"]
assert w.sharding == state["w"].sharding and not w.is_fully_addressable
for shard in w.addressable_shards:  # each process's own rows, in place
    np.testing.assert_array_equal(np.asarray(shard.data), full[shard.index])
gathered = {k: np.asarray(multihost_utils.process_allgather(v, tiled=True)) for k, v in restored.items()}

# preemption agreement: only process 1 sees the signal; both must stop
flag = ckpt.PreemptionFlag()
before = flag.any_process()
if pid == 1:
    flag.set(15)
after = flag.any_process()
both = np.asarray(multihost_utils.process_allgather(np.asarray([before, after], np.int32)))
if pid == 0:
    np.savez(out, **gathered, agreement=both)
"""


@pytest.mark.slow
def test_two_process_checkpoint_of_arrays_no_process_holds_whole(tmp_path):
    from multihost import run_two_processes

    got = run_two_processes(CHECKPOINT_BODY, tmp_path)
    full = np.arange(16 * 6, dtype=np.float32).reshape(16, 6)
    np.testing.assert_array_equal(got["w"], full)
    np.testing.assert_array_equal(got["b"], full[0] * 2.0)
    assert int(got["step"]) == 7
    # [process][before the signal, after it]: neither stops before, both stop after
    np.testing.assert_array_equal(got["agreement"].reshape(2, 2), [[0, 1], [0, 1]])


RESUME_BODY = r"""
import os, signal
from jaxgrpo import config as config_lib, trainer
from test_train import SMALL
# fsdp over both processes: every parameter and moment is split between them (no process holds a leaf whole)
cfg = config_lib.load_config("default", [*SMALL, "train.steps=3", "checkpoint.every=0",
                                         "checkpoint.export_final=false", "mesh.data=1", "mesh.fsdp=8"])
run_dir = os.path.join(os.path.dirname(out), "run")
real_step = trainer.Trainer.step
def step_then_preempt(self, step):
    metrics = real_step(self, step)
    if step == 1 and pid == 1:  # only process 1 is told to stop, after the second step
        os.kill(os.getpid(), signal.SIGTERM)
    return metrics
trainer.Trainer.step = step_then_preempt
first = trainer.run(cfg, run_dir)  # both processes stop after step 2 and save it
trainer.Trainer.step = real_step
second = trainer.run(cfg, run_dir)  # restores the sharded state on both processes, runs step 3
if pid == 0:
    history = first + second
    np.savez(out, steps=np.asarray([len(first), len(second)]),
             **{f"{i}:{k}": v for i, rec in enumerate(history) for k, v in rec.items()})
"""


@pytest.mark.slow
def test_two_process_preempted_run_resumes_to_the_uninterrupted_metrics(tmp_path):
    """Two processes, parameters and optimizer state FSDP-sharded across both; SIGTERM reaches process 1 only after
    step 2: both stop at that step (the agreement) with one checkpoint, a second run restores it on both and runs
    step 3; the three steps' metrics equal an uninterrupted single-process 8-device run's."""
    from multihost import run_two_processes
    from test_train import deterministic, small_config

    from jaxgrpo import trainer

    got = run_two_processes(RESUME_BODY, tmp_path)
    assert list(got["steps"]) == [2, 1]
    want = trainer.run(small_config("train.steps=3", "checkpoint.every=0", "checkpoint.export_final=false",
                                    "mesh.data=1", "mesh.fsdp=8"), tmp_path / "one")  # fmt: skip
    assert len(want) == 3
    for i, rec in enumerate(want):
        for k, v in deterministic(rec).items():
            np.testing.assert_allclose(got[f"{i}:{k}"], v, rtol=1e-4, atol=1e-5, err_msg=f"step {i + 1} {k}")
