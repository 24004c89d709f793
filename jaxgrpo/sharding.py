# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Device mesh, the one logical-axis -> mesh-axis rules table, parameter shardings and multi-host start-up.

The mesh has three axes: ``data`` (pure data parallel: parameters replicated), ``fsdp`` (data parallel with
parameters sharded, ZeRO-3 style; GSPMD inserts the all-gathers) and ``tensor`` (Megatron-style model parallel over
heads, MLP width and vocab). Batches are sharded over ``("data", "fsdp")``.

Each weight names its logical axes once (`jaxgrpo.models.param_axes`); `RULES` maps each logical axis to a mesh axis.
A dimension whose size is not divisible by its mesh axis size (e.g. 3 kv heads on tensor=2) is replicated on that
axis instead, so every model fits every mesh; a mesh axis is used at most once per array.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis -> mesh axis (None = replicated)
RULES: dict[str, str | None] = {
    "layers": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "lora_rank": None,  # LoRA adapters: A [*in, r], B [r, *out] shard like their base weight's in/out axes
}


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh over ``devices`` (default: all). One size may be -1 (= the rest)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sum(s == -1 for s in sizes) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got data={data} fsdp={fsdp} tensor={tensor}")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh axis sizes must be positive or -1, got data={data} fsdp={fsdp} tensor={tensor}")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices are not divisible by data*fsdp*tensor (known part) = {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(
            f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} = {int(np.prod(sizes))} devices, "
            f"but {len(devices)} are available; make the product equal the device count (or use -1 for one axis)"
        )
    try:  # topology-aware device order on TPU/GPU slices (a plain reshape on CPU)
        grid = mesh_utils.create_device_mesh(sizes, devices)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.asarray(devices, dtype=object).reshape(sizes)
    return Mesh(grid, MESH_AXES)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """PartitionSpec for an array with these logical axes, by `RULES` (non-divisible dims are replicated)."""
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {tuple(axes)} do not match array rank {len(shape)} (shape {tuple(shape)})")
    used: set[str] = set()
    spec: list[str | None] = []
    for name, size in zip(axes, shape):
        if name is not None and name not in RULES:
            raise ValueError(f"unknown logical axis {name!r}; known: {sorted(RULES)}")
        mesh_axis = RULES.get(name) if name is not None else None
        if mesh_axis is not None and (mesh_axis in used or size % mesh.shape[mesh_axis]):
            mesh_axis = None
        if mesh_axis is not None and mesh.shape[mesh_axis] == 1:
            mesh_axis = None
        if mesh_axis is not None:
            used.add(mesh_axis)
        spec.append(mesh_axis)
    return PartitionSpec(*spec)


def _is_axes(x: Any) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def param_shardings(config: Any, mesh: Mesh) -> Any:
    """NamedSharding per parameter (same tree as the params) for `config` on `mesh`."""
    from jaxgrpo.models.params import param_axes, param_shapes

    axes = param_axes(config)
    shapes = param_shapes(config)
    return jax.tree.map(
        lambda a, s: NamedSharding(mesh, logical_to_spec(a, s, mesh)), axes, shapes, is_leaf=_is_axes
    )


def part_shardings(tree: Any, config: Any, mesh: Mesh, prefix: Sequence[str] = ()) -> Any:
    """`param_shardings` for a part of the params tree: ``tree``'s leaves sit at ``prefix`` + their own paths in the
    whole tree of `config` (e.g. LoRA's adapters, `models.lora.split`, at ``("layers", "lora")``)."""
    whole = param_shardings(config, mesh)

    def find(path: tuple, _: Any) -> NamedSharding:
        node = whole
        for key in (*prefix, *(getattr(k, "key", getattr(k, "idx", None)) for k in path)):
            node = node[key]
        return node

    return jax.tree_util.tree_map_with_path(find, tree)


def shard_params(params: Any, config: Any, mesh: Mesh) -> Any:
    """Place `params` on `mesh` by the rules (a jitted reshard: works for host and device arrays)."""
    shardings = param_shardings(config, mesh)
    return jax.tree.map(lambda x, s: jax.device_put(x, s), params, shardings)


def check_process_layout(devices: np.ndarray, processes: int) -> None:
    """On several processes each host feeds its own share of a step's groups (`jaxgrpo.groups.process_share`), which
    needs every batch shard (a ``(data, fsdp)`` cell of the learner mesh's ``devices``, its ``tensor`` devices) on one
    host and as many shards on each host. A ConfigError names the fix when not (``mesh.tensor`` spanning hosts
    assembled a global batch whose copies differed from host to host, without an error)."""
    if processes == 1:
        return
    data, fsdp, tensor = devices.shape
    owners = [{d.process_index for d in cell} for cell in devices.reshape(data * fsdp, tensor)]
    per_host = np.bincount([next(iter(o)) for o in owners if len(o) == 1], minlength=processes)
    if any(len(o) > 1 for o in owners) or len(set(per_host.tolist())) != 1:
        from jaxgrpo.errors import ConfigError

        raise ConfigError(f"the learner mesh (data={data}, fsdp={fsdp}, tensor={tensor}) does not split its batch "
                          f"shards over the {processes} processes: each shard's mesh.tensor devices must sit on one "
                          f"host and every host hold as many shards (mesh.data × mesh.fsdp a multiple of {processes}); "
                          "keep mesh.tensor within a host's devices")  # fmt: skip


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding for a batch-major array of rank `ndim`: axis 0 over ``("data", "fsdp")``, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def initialize_distributed() -> bool:
    """Call `jax.distributed.initialize()` on multi-host runs (TPU pods / SLURM / coordinator env vars set:
    ``JAX_COORDINATOR_ADDRESS`` with ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``).

    Returns True when it initialised a multi-process run, False on a single host. Must run before any JAX
    computation; afterwards `make_mesh()` sees every host's devices and builds one global mesh.
    """
    env = os.environ
    multi = (
        "JAX_COORDINATOR_ADDRESS" in env
        or int(env.get("SLURM_NTASKS", "1")) > 1
        or "TPU_WORKER_HOSTNAMES" in env and "," in env.get("TPU_WORKER_HOSTNAMES", "")
        or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
    )
    if not multi:
        return False
    if jax.distributed.is_initialized():  # a second run in this process, or a launcher that initialised it
        return True
    # jax reads the coordinator's address from the environment but not the process count and id: a launcher that
    # sets JAX_NUM_PROCESSES / JAX_PROCESS_ID beside JAX_COORDINATOR_ADDRESS (no cluster auto-detection) passes them
    kwargs = {k: int(env[v]) for k, v in (("num_processes", "JAX_NUM_PROCESSES"), ("process_id", "JAX_PROCESS_ID"))
              if v in env}  # fmt: skip
    jax.distributed.initialize(**kwargs)
    return True
