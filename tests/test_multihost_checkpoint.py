# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Checkpoints across two `jax.distributed` processes (4 CPU devices each, `tests/multihost.py`): orbax save and
restore of arrays that no process holds whole (not fully addressable), and the preemption agreement
(`PreemptionFlag.any_process`: a signal seen by one process stops every process at the same step). The expected
values are closed forms (``np.arange``) gathered back to one process; the trainer's own two-process run is
`tests/test_train.py::test_two_process_run_equals_one_process_run`.

A preempted two-process trainer run with its weights sharded across both processes (fsdp over all 8 devices): one
process gets SIGTERM, both checkpoint and stop at the same step, the resumed run finishes, and its metrics and the HF
export of its sharded weights (written by process 0 alone) equal an uninterrupted single-process run's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

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



RESUME_ARGS = ["train.steps=4", "checkpoint.every=1", "checkpoint.keep=10", "checkpoint.export_final=true",
               "mesh.data=1", "mesh.fsdp=8"]

PREEMPT_RESUME_BODY = r"""
import signal
from jax.experimental import multihost_utils
from jaxgrpo import checkpoint as ckpt_lib, config as config_lib, trainer
from test_train import SMALL
from test_multihost_checkpoint import RESUME_ARGS
cfg = config_lib.load_config("default", [*SMALL, *RESUME_ARGS])
run_dir = os.path.join(os.path.dirname(out), "run")
if pid == 1:  # process 1 alone is preempted, during the second step
    original = trainer.Trainer.step
    def step(self, i):
        if i == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, i)
    trainer.Trainer.step = step
try:
    trainer.run(cfg, run_dir)
    stopped = 0
except ckpt_lib.Preempted as e:
    stopped = e.step
stops = np.asarray(multihost_utils.process_allgather(np.asarray([stopped], np.int32)))
resumed = trainer.run(cfg, run_dir)
changed = config_lib.load_config("default", [*SMALL, *RESUME_ARGS, "optim.learning_rate=0.5"])
t = trainer.Trainer(changed, run_dir, allow_config_change=True)  # the finished run's state: weights span both hosts
spans = [not x.is_fully_addressable for x in jax.tree.leaves(t.state.params)]
t.close()
if pid == 0:
    np.savez(out, stops=stops, resumed=np.asarray(len(resumed)), spans=np.asarray(spans))
"""


@pytest.mark.slow
def test_two_process_preempted_run_resumes_and_exports_its_sharded_weights(tmp_path):
    from multihost import run_two_processes
    from test_train import SMALL, assert_records_close

    from jaxgrpo import config as config_lib
    from jaxgrpo import metrics_log, trainer

    got = run_two_processes(PREEMPT_RESUME_BODY, tmp_path)
    stops = got["stops"].ravel()
    assert stops.tolist() == [2, 2], f"both processes stop after the step in flight when one is signalled: {stops}"
    assert int(got["resumed"]) == 2
    assert got["spans"].any(), "fsdp over both processes' devices: some weights are held by neither process whole"
    changes = (tmp_path / "run" / "config_changes.jsonl").read_text().splitlines()
    assert len(changes) == 1 and '"optim.learning_rate"' in changes[0], "one writer of the run's files, not one a host"

    want_dir = tmp_path / "one"
    trainer.run(config_lib.load_config("default", [*SMALL, *RESUME_ARGS]), want_dir)
    two_dir = tmp_path / "run"
    assert_records_close(metrics_log.read_metrics(two_dir), metrics_log.read_metrics(want_dir), rtol=1e-4, atol=1e-5)
    want, two = load_file(want_dir / "final" / "model.safetensors"), load_file(two_dir / "final" / "model.safetensors")
    assert want.keys() == two.keys()
    for k in want:
        np.testing.assert_allclose(two[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert json.loads((two_dir / "final" / "config.json").read_text()) == json.loads(
        (want_dir / "final" / "config.json").read_text())


WALK_BACK_BODY = r"""
from jax.sharding import NamedSharding, PartitionSpec as Ps
from jaxgrpo import sharding, checkpoint as ckpt_lib
mesh = sharding.make_mesh(1, 8, 1)
x = jax.make_array_from_process_local_data(NamedSharding(mesh, Ps("fsdp")), np.arange(4, dtype=np.float32) + 4 * pid)
m = ckpt_lib.CheckpointManager(os.path.join(os.path.dirname(out), "ckpt"), keep=5)
for s in (1, 2):
    m.save(s, {"x": x}, {"s": s}, force=True)
    m.wait()

def attempt(step):  # step 2 reads, but fails a check on process 1 alone (after the restore's own collectives)
    got = m.restore(step, {"x": x})
    if pid == 1 and step == 2:
        raise OSError("a damaged shard of process 1")
    return got

said = []
step, _ = m.restore_newest(attempt, say=said.append)
steps = np.asarray(jax.experimental.multihost_utils.process_allgather(np.asarray([step], np.int32)))
m.close()
if pid == 0:
    np.savez(out, steps=steps, said=np.asarray(said))
"""


@pytest.mark.slow
def test_hosts_walk_back_to_the_same_step_when_one_cannot_restore(tmp_path):
    """A step that fails on one host only: both restore step 1 and move step 2 aside together (process 0 restored
    step 2 alone, and process 1's move aside waited for it forever)."""
    from multihost import run_two_processes

    got = run_two_processes(WALK_BACK_BODY, tmp_path, timeout=300)
    assert got["steps"].ravel().tolist() == [1, 1]
    (line,) = got["said"].tolist()
    assert "checkpoint step 2 does not restore (it failed on another process); moved it aside" in line
