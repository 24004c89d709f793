# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for jaxgrpo.checkpoint: round trips of a TrainState-like pytree (params, optax Adam state, step, typed and
raw PRNG keys), sharded restore onto a mesh, keep-K pruning, the save cadence, crash safety (a process killed
mid-save by orbax itself, and a stray temporary directory), JSON extras, and the preemption flag."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgrpo import checkpoint as ckpt


@flax.struct.dataclass
class State:
    params: dict
    opt_state: optax.OptState
    step: jax.Array
    rng: jax.Array


def make_state(seed: int, typed_key: bool = True) -> State:
    k1, k2 = jax.random.split(jax.random.key(seed))
    params = {"w": jax.random.normal(k1, (8, 4)), "layers": {"b": jax.random.normal(k2, (3, 4))}}
    opt = optax.adam(1e-2)
    opt_state = opt.init(params)
    # one real update so mu/nu/count are non-trivial
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt_state = opt.update(grads, opt_state, params)
    rng = jax.random.key(100 + seed) if typed_key else jax.random.PRNGKey(100 + seed)
    return State(params=params, opt_state=opt_state, step=jnp.asarray(seed, jnp.int32), rng=rng)


def zeros_like_state(state: State) -> State:
    """A target with the same structure/dtypes but different values (keys are replaced by other keys)."""

    def z(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.key(12345, impl=jax.random.key_impl(x))
        return jnp.zeros_like(x)

    return jax.tree.map(z, state)


def assert_state_equal(a: State, b: State) -> None:
    def data(x):
        return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    chex.assert_trees_all_equal(jax.tree.map(data, a), jax.tree.map(data, b))
    chex.assert_trees_all_equal_dtypes(a, b)
    assert jax.tree.structure(a) == jax.tree.structure(b)


@pytest.mark.parametrize("typed_key", [True, False], ids=["typed-key", "raw-key"])
def test_round_trip_concrete_and_abstract_target(tmp_path, typed_key):
    state = make_state(3, typed_key)
    extra = {
        "iterator": {"epoch": 2, "position": np.int64(17)},
        "rng": np.arange(2, dtype=np.uint32),
        "config_hash": "abc",
        "ratio": np.float32(0.5),
    }
    with ckpt.CheckpointManager(tmp_path / "ck", keep=2, save_interval=1) as mgr:
        assert mgr.latest_step() is None
        assert mgr.save(7, state, extra)
        assert mgr.latest_step() == 7  # in flight (async): restore waits for it
        restored, got_extra = mgr.restore(7, zeros_like_state(state))
        assert_state_equal(restored, state)
        assert isinstance(restored, State)
        assert got_extra == {
            "iterator": {"epoch": 2, "position": 17},
            "rng": [0, 1],
            "config_hash": "abc",
            "ratio": 0.5,
        }
        # an abstract target (jax.eval_shape) restores too, to jax Arrays
        restored2, _ = mgr.restore(None, jax.eval_shape(lambda: state))
        assert_state_equal(restored2, state)
        assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(restored2))
        if typed_key:
            # the restored key is a usable typed key giving the same stream
            chex.assert_trees_all_equal(jax.random.uniform(restored2.rng, (3,)), jax.random.uniform(state.rng, (3,)))


def test_sharded_restore_onto_mesh(tmp_path):
    devices = np.asarray(jax.devices()[:8]).reshape(4, 2)
    mesh = Mesh(devices, ("data", "fsdp"))
    x = jnp.arange(8 * 6, dtype=jnp.float32).reshape(8, 6)
    state = {"w": jax.device_put(x, NamedSharding(mesh, PartitionSpec("data", "fsdp"))), "step": jnp.int32(4)}
    with ckpt.CheckpointManager(tmp_path, keep=1) as mgr:
        mgr.save(4, state, {})
        mgr.wait()
        # restore into a *different* layout: sharded over fsdp only on the rows
        target_sharding = NamedSharding(mesh, PartitionSpec("fsdp", None))
        target = {
            "w": jax.ShapeDtypeStruct((8, 6), jnp.float32, sharding=target_sharding),
            "step": jax.ShapeDtypeStruct((), jnp.int32),
        }
        restored, _ = mgr.restore(4, target)
    assert restored["w"].sharding == target_sharding
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(x))
    assert len(restored["w"].addressable_shards) == 8
    assert restored["w"].addressable_shards[0].data.shape == (4, 6)
    assert int(restored["step"]) == 4


def test_keep_k_pruning_and_cadence(tmp_path):
    with ckpt.CheckpointManager(tmp_path, keep=2, save_interval=3) as mgr:
        written = [s for s in range(1, 11) if mgr.save(s, {"x": jnp.full((2,), s, jnp.float32)}, {"s": s})]
        mgr.wait()
        assert written == [3, 6, 9]
        assert mgr.all_steps() == [6, 9]
        # forced save off the cadence (preemption / end of training), then a repeat of the same step is a no-op
        assert mgr.save(10, {"x": jnp.full((2,), 10.0)}, {"s": 10}, force=True)
        assert not mgr.save(10, {"x": jnp.full((2,), -1.0)}, {"s": -1}, force=True)
        mgr.wait()
        assert mgr.all_steps() == [9, 10]
        restored, extra = mgr.restore(None, {"x": jnp.zeros((2,))})
    assert extra == {"s": 10}
    np.testing.assert_array_equal(restored["x"], [10.0, 10.0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["10", "9"]


def test_interval_zero_saves_only_when_forced(tmp_path):
    with ckpt.CheckpointManager(tmp_path, keep=3, save_interval=0) as mgr:
        assert not any(mgr.save(s, {"x": jnp.zeros(())}) for s in range(5))
        assert mgr.save(5, {"x": jnp.zeros(())}, force=True)
        mgr.wait()
        assert mgr.all_steps() == [5]


def test_restore_subtree_reads_params_only(tmp_path):
    state = make_state(1)
    with ckpt.CheckpointManager(tmp_path, keep=1) as mgr:
        mgr.save(1, state, {})
        mgr.wait()
        params = mgr.restore_subtree(1, "params", jax.tree.map(jnp.zeros_like, state.params))
        assert mgr.read_extra() == {}
        with pytest.raises(ckpt.CheckpointError, match="no 'nope' entry"):
            mgr.restore_subtree(1, "nope", {"a": jnp.zeros(())})
        with pytest.raises(ckpt.CheckpointError, match="not in the checkpoint"):
            mgr.restore_subtree(1, "params", {**state.params, "extra_weight": jnp.zeros(())})
        with pytest.raises(ckpt.CheckpointError, match=r"params.w has shape \(8, 4\) in the checkpoint but \(5, 4\)"):
            mgr.restore_subtree(1, "params", {**state.params, "w": jnp.zeros((5, 4))})
        # the full restore needs the whole structure
        with pytest.raises(ckpt.CheckpointError, match="opt_state.* are not in the restore target"):
            mgr.restore(1, {"params": state.params, "step": state.step, "rng": state.rng})
    chex.assert_trees_all_equal(params, state.params)


CRASH_SCRIPT = textwrap.dedent("""
    import asyncio, os, sys
    import jax.numpy as jnp
    from orbax.checkpoint._src.path import atomicity
    from jaxgrpo import checkpoint as ckpt

    original = atomicity.AtomicRenameTemporaryPath.finalize

    async def finalize(self):
        if self.get_final().name == "2":
            os._exit(17)  # killed after every array was written, before the rename that commits the step
        return await original(self)

    atomicity.AtomicRenameTemporaryPath.finalize = finalize
    mgr = ckpt.CheckpointManager(sys.argv[1], keep=3, save_interval=1)
    mgr.save(1, {"x": jnp.full((4,), 1.0)}, {"pos": 1})
    mgr.wait()
    mgr.save(2, {"x": jnp.full((4,), 2.0)}, {"pos": 2})
    mgr.wait()
    sys.exit(0)  # not reached
""")


def test_process_killed_mid_save_restores_last_complete(tmp_path):
    directory = tmp_path / "ck"
    repo = str(pathlib.Path(ckpt.__file__).resolve().parents[1])
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=os.environ.get("JAXGRPO_TEST_XLA_EXTRA", ""),  # one device (conftest's compile flags)
        PYTHONPATH=os.pathsep.join([repo, *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, str(directory)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 17, proc.stderr[-3000:]
    leftovers = ckpt.incomplete_checkpoints(directory)
    assert [p.name.split(".")[0] for p in leftovers] == ["2"]  # the half-written step is on disk ...
    assert any(leftovers[0].rglob("*"))  # ... with data in it
    with ckpt.CheckpointManager(directory, keep=3) as mgr:  # ... but never picked up
        assert mgr.all_steps() == [1]
        restored, extra = mgr.restore(mgr.latest_step(), {"x": jnp.zeros((4,))})
        assert extra == {"pos": 1}
        np.testing.assert_array_equal(restored["x"], np.ones(4))
        assert ckpt.incomplete_checkpoints(directory) == []  # opening a manager cleared the leftover
        # and the killed step can be written again
        assert mgr.save(2, {"x": jnp.full((4,), 2.0)}, {"pos": 2})
        mgr.wait()
        assert mgr.latest_step() == 2


def test_stray_tmp_directory_is_ignored(tmp_path):
    with ckpt.CheckpointManager(tmp_path, keep=3) as mgr:
        mgr.save(3, {"x": jnp.ones((2,))}, {"pos": 3})
        mgr.wait()
        stray = tmp_path / "5.orbax-checkpoint-tmp-1234567"
        (stray / "state").mkdir(parents=True)
        (stray / "state" / "garbage").write_bytes(b"\x00" * 10)
        assert mgr.latest_step() == 3
        _, extra = mgr.restore(None, {"x": jnp.zeros((2,))})
        assert extra == {"pos": 3}


def test_bad_inputs_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="keep=0"):
        ckpt.CheckpointManager(tmp_path, keep=0)
    with pytest.raises(ValueError, match="save_interval=-1"):
        ckpt.CheckpointManager(tmp_path, keep=1, save_interval=-1)
    with ckpt.CheckpointManager(tmp_path / "a", keep=1) as mgr:
        with pytest.raises(ckpt.CheckpointError, match="no complete checkpoint"):
            mgr.restore(None, {"x": jnp.zeros(())})
        with pytest.raises(ValueError, match=r"extra\['obj'\] has type object"):
            mgr.save(1, {"x": jnp.zeros(())}, {"obj": object()}, force=True)
        with pytest.raises(ValueError, match=r"extra\['loss'\] is nan"):
            mgr.save(1, {"x": jnp.zeros(())}, {"loss": float("nan")}, force=True)
        with pytest.raises(ValueError, match="step=-1"):
            mgr.save(-1, {"x": jnp.zeros(())}, force=True)
        mgr.save(1, {"x": jnp.zeros((3,))}, force=True)
        mgr.wait()
        with pytest.raises(ckpt.CheckpointError, match="available steps: \\[1\\]"):
            mgr.restore(2, {"x": jnp.zeros((3,))})
        with pytest.raises(ckpt.CheckpointError, match="y .* not in the checkpoint"):
            mgr.restore(1, {"y": jnp.zeros((3,))})
        with pytest.raises(ckpt.CheckpointError, match=r"x has shape \(3,\) in the checkpoint but \(4,\)"):
            mgr.restore(1, {"x": jnp.zeros((4,))})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        ckpt.CheckpointManager(tmp_path / "file", keep=1)


def test_signal_sets_flag_and_second_sigint_interrupts():
    before_term, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    flag = ckpt.install_signal_handlers()
    try:
        assert not flag.is_set() and not flag.any_process()
        os.kill(os.getpid(), signal.SIGTERM)  # would terminate the test process without the handler
        assert flag.is_set() and flag.signal == signal.SIGTERM and flag.any_process()
        flag.clear()
        os.kill(os.getpid(), signal.SIGINT)
        assert flag and flag.signal == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        # the second Ctrl-C put the previous handlers back
        assert signal.getsignal(signal.SIGTERM) is before_term
        assert signal.getsignal(signal.SIGINT) is before_int
    finally:
        flag.uninstall()
    assert signal.getsignal(signal.SIGINT) is before_int
