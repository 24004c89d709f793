# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Mesh construction, the logical-axis rules, and sharded forward == single-device forward on 8 fake CPU devices."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec
from model_helpers import random_params

from jaxgrpo import sharding
from jaxgrpo.models import ModelConfig, forward

CFG = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                  architecture="qwen2", qkv_bias=True)  # fmt: skip


def test_eight_devices():
    assert jax.device_count() == 8, "conftest must force 8 host devices"


def test_make_mesh_shapes_and_errors():
    mesh = sharding.make_mesh(2, 2, 2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(sharding.make_mesh(1, -1, 2).shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    assert dict(sharding.make_mesh(devices=jax.devices()[:1]).shape) == {"data": 1, "fsdp": 1, "tensor": 1}
    with pytest.raises(ValueError, match="= 12 devices, but 8 are available"):
        sharding.make_mesh(3, 2, 2)
    with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
        sharding.make_mesh(-1, -1, 2)
    with pytest.raises(ValueError, match="not divisible"):
        sharding.make_mesh(3, -1, 1)


def test_batch_sharding_and_single_host_init(monkeypatch):
    mesh = sharding.make_mesh(2, 2, 2)
    assert sharding.batch_sharding(mesh, 3).spec == PartitionSpec(("data", "fsdp"), None, None)
    assert sharding.replicated(mesh).spec == PartitionSpec()
    for var in ("JAX_COORDINATOR_ADDRESS", "SLURM_NTASKS", "TPU_WORKER_HOSTNAMES", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert sharding.initialize_distributed() is False


def test_coordinator_environment_passes_the_process_count_and_id(monkeypatch):
    """mesh.distributed=true through the coordinator environment variables: jax itself reads only the address, so
    the count and id must reach `jax.distributed.initialize` as arguments (jax/_src/distributed.py)."""
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "3")
    assert sharding.initialize_distributed() is True
    assert calls == [{"num_processes": 4, "process_id": 3}]
    monkeypatch.delenv("JAX_NUM_PROCESSES")
    monkeypatch.delenv("JAX_PROCESS_ID")
    assert sharding.initialize_distributed() is True and calls[-1] == {}  # a cluster jax detects by itself


def test_rules_and_divisibility_fallback():
    mesh = sharding.make_mesh(1, 4, 2)
    assert sharding.logical_to_spec(("layers", "embed", "heads", "head_dim"), (2, 64, 4, 16), mesh) == PartitionSpec(
        None, "fsdp", "tensor", None
    )
    # 3 kv heads cannot be split over tensor=2 -> replicated on that dim; 6 rows of embed not divisible by fsdp=4
    assert sharding.logical_to_spec(("layers", "embed", "kv_heads", "head_dim"), (2, 6, 3, 16), mesh) == PartitionSpec(
        None, None, None, None
    )
    # vocab and mlp both map to tensor: a mesh axis is used once per array
    assert sharding.logical_to_spec(("mlp", "vocab"), (8, 8), mesh) == PartitionSpec("tensor", None)
    with pytest.raises(ValueError, match="unknown logical axis 'bogus'"):
        sharding.logical_to_spec(("bogus",), (4,), mesh)
    with pytest.raises(ValueError, match="do not match array rank"):
        sharding.logical_to_spec(("embed",), (4, 4), mesh)


# SmolLM2-like head counts: 6 query heads split over tensor=2, 3 kv heads replicated (not divisible)
CFG_KV3 = CFG.replace(num_heads=6, num_kv_heads=3, head_dim=16, architecture="llama", qkv_bias=False)


@pytest.mark.parametrize("shape,cfg", [((1, 4, 2), CFG), ((2, 2, 2), CFG), ((1, 4, 2), CFG_KV3)])
def test_sharded_forward_equals_single_device(shape, cfg):
    params = random_params(cfg)
    tokens = jax.random.randint(jax.random.key(1), (8, 6), 0, cfg.vocab_size)
    mask = jnp.ones((8, 6), bool).at[::3, :2].set(False)
    ref = forward(cfg, params, tokens, attention_mask=mask)

    mesh = sharding.make_mesh(*shape)
    sp = sharding.shard_params(params, cfg, mesh)
    q = sp["layers"]["q"]
    assert q.sharding.spec == PartitionSpec(None, "fsdp", "tensor", None)
    assert len(q.addressable_shards) == 8
    assert q.addressable_shards[0].data.shape == (2, 64 // shape[1], cfg.num_heads // 2, 16)
    kv_axis = None if cfg.num_kv_heads == 3 else "tensor"  # 3 kv heads do not split over tensor=2: replicated
    kv_spec = PartitionSpec(None, "fsdp", kv_axis, None)
    assert sp["layers"]["k"].sharding.spec == kv_spec
    tok = jax.device_put(tokens, sharding.batch_sharding(mesh))
    msk = jax.device_put(mask, sharding.batch_sharding(mesh))
    out = jax.jit(forward, static_argnums=0)(cfg, sp, tok, None, msk)
    chex.assert_shape(out, (8, 6, cfg.vocab_size))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-5, atol=2e-5)


@pytest.mark.slow
def test_mesh_distributed_starts_a_run_from_the_coordinator_environment(tmp_path):
    """mesh.distributed=true with a launcher's JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID (one
    process here): jax.distributed is initialised before anything starts JAX's backend, and a second run in the
    same process finds it initialised (it refused both: "must be called before any JAX calls")."""
    import os
    import pathlib
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    tests = pathlib.Path(__file__).resolve().parent
    script = (f"import sys; sys.path.insert(0, {str(tests)!r})\n"
              "from test_train import small_config\nfrom jaxgrpo import trainer\nimport jax\n"
              "cfg = small_config('train.steps=1', 'mesh.distributed=true', 'checkpoint.every=0', "
              "'checkpoint.export_final=false')\n"
              f"for name in ('a', 'b'):\n    trainer.run(cfg, {str(tmp_path)!r} + '/' + name)\n"
              "print('initialized', jax.distributed.is_initialized())\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {
        "JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0",
        "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(tests.parent)}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "initialized True" in out.stdout, out.stderr[-3000:]


def test_batch_shards_must_each_sit_on_one_host_in_equal_numbers():
    """Two hosts of 4 devices (fake devices carrying a process_index): data × fsdp shards split 2 + 2 pass;
    mesh.tensor = 8 (a shard across both hosts) and 3 shards over 2 hosts are refused in one line."""
    import types

    from jaxgrpo.errors import ConfigError

    devs = np.array([types.SimpleNamespace(process_index=i // 4) for i in range(8)], object)
    sharding.check_process_layout(devs.reshape(1, 4, 2), 2)  # 4 shards of 2 devices: 2 on each host
    sharding.check_process_layout(devs.reshape(1, 8, 1), 2)
    sharding.check_process_layout(devs.reshape(1, 1, 8), 1)  # one process: anything goes
    with pytest.raises(ConfigError, match=r"each shard's mesh.tensor devices must sit on one host"):
        sharding.check_process_layout(devs.reshape(1, 1, 8), 2)
    six = np.array([types.SimpleNamespace(process_index=p) for p in (0, 0, 0, 0, 1, 1)], object)
    with pytest.raises(ConfigError, match=r"a multiple of 2"):
        sharding.check_process_layout(six.reshape(1, 3, 2), 2)  # shards (0,0) (0,0) (1,1): 2 on host 0, 1 on host 1
