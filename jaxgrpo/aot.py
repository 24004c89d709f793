# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Will a config fit its hardware? Ahead-of-time compilation of the train step for a device topology, on this host.

The train step (`jaxgrpo.train_step.make_train_step`, every perf switch as `jaxgrpo.perf.resolve_perf` applies it to
the target platform) is lowered on abstract weights (`train_step.abstract_state`: shapes, dtypes and shardings, no
checkpoint needed) and a worst-case batch (every prompt ``data.max_prompt_tokens`` long, every completion
``rollout.max_new_tokens``), then compiled by XLA for the target: a TPU slice through libtpu's compile-only devices
(``jax.experimental.topologies.get_topology_desc``, as MaxText's ``train_compile.py`` does; ``pip install
jaxgrpo[tpu]`` brings libtpu), or the local backend. XLA's `memory_analysis` then gives per-chip bytes exactly as the
slice would allocate them: arguments (weights + optimizer state + batch), outputs, temporaries. The rollout's KV
caches (prefix cache, decode cache, recorded projections) and the sampler's compute-dtype weight copy are computed
from their shapes (`rollout_bytes`). FLOPs come from XLA's `cost_analysis`; the roofline step time is
``max(flops / peak FLOP/s, bytes accessed / HBM bandwidth)`` per chip.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgrpo import models, padding, sharding
from jaxgrpo import train_step as ts
from jaxgrpo.config import Config
from jaxgrpo.errors import ConfigError
from jaxgrpo.perf import resolve_perf


@dataclasses.dataclass(frozen=True)
class Chip:
    """Per-chip capacity (bytes usable by programs), peak dense bfloat16 FLOP/s and HBM bandwidth (vendor figures)."""

    hbm_bytes: float
    peak_flops: float
    hbm_bandwidth: float


GiB = 1024**3
CHIPS = {  # Google Cloud TPU system-architecture pages; NVIDIA H100/H200 SXM datasheets (dense, no sparsity)
    "v4": Chip(32 * GiB, 275e12, 1.2e12),
    "v5e": Chip(15.75 * GiB, 197e12, 0.82e12),
    "v5p": Chip(95 * GiB, 459e12, 2.76e12),
    "v6e": Chip(31.25 * GiB, 918e12, 1.64e12),
    "h100": Chip(80e9, 989e12, 3.35e12),
    "h200": Chip(141e9, 989e12, 4.8e12),
}


def model_config(cfg: Config) -> models.ModelConfig:
    """The architecture of ``cfg.model`` without loading weights: the tiny model's sizes, an HF ``config.json``, a
    GGUF's metadata, or a preset (`models.PRESETS`) named by ``name_or_path`` or by its directory's name."""
    from jaxgrpo import build

    m = cfg.model
    name = m.name_or_path
    if name == "tiny":
        return build.tiny_model_config(cfg, build.load_tokenizer(m.tokenizer or "builtin:arithmetic"))
    base = pathlib.Path(name).name.lower()
    preset = next((p for p in sorted(models.PRESETS, key=len, reverse=True) if base.startswith(p)), None)
    if not pathlib.Path(name).exists() and name != "smollm2" and preset is not None:
        return models.get_preset(preset, dtype=m.dtype).replace(param_dtype=m.param_dtype)
    path = build.resolve_model_path(name)
    if path.endswith(".gguf"):
        from gguf import GGUFReader

        from jaxgrpo.models.convert import gguf_config

        return gguf_config(GGUFReader(path), m.dtype).replace(param_dtype=m.param_dtype)
    cfg_json = json.loads((pathlib.Path(path) / "config.json").read_text())
    return models.from_hf_config(cfg_json, dtype=m.dtype).replace(param_dtype=m.param_dtype)


def topology_devices(topology: str | None, count: int | None = None) -> list[Any]:
    """Compile-only devices of a TPU slice such as ``"v5e:4x8"``, or (``None``) the first ``count`` local devices."""
    if topology is None:
        local = jax.devices()
        if count is not None and count > len(local):
            raise ConfigError(f"the mesh needs {count} devices but {len(local)} are local; name a --topology or set "
                              "mesh.* to fit")  # fmt: skip
        return local[:count] if count else local
    from jax.experimental import topologies

    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)
    except Exception as e:  # no libtpu, or an unknown name
        raise ConfigError(f"cannot describe TPU topology {topology!r} ({type(e).__name__}: {e}); install libtpu "
                          "(`pip install jaxgrpo[tpu]`) and name a slice such as v5e:4x8 or v4:2x2x2") from e


def chip_of(devices: list[Any]) -> tuple[str, Chip | None]:
    kind = str(devices[0].device_kind).lower().replace(" ", "")
    for name in ("v5e", "v5lite", "v5p", "v6e", "v6lite", "v4", "h100", "h200"):
        if name in kind:
            key = {"v5lite": "v5e", "v6lite": "v6e"}.get(name, name)
            return key, CHIPS[key]
    if kind.endswith("v5"):  # "TPU v5" is the v5p
        return "v5p", CHIPS["v5p"]
    return kind, None


def abstract_batch(cfg: Config, mesh: Mesh, prompt_width: int) -> ts.Batch:
    """A worst-case rollout batch as sharded ``ShapeDtypeStruct``\\s (rows over the batch axes)."""
    P, G, Tc = cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens
    B = P * G
    rows = lambda *shape: NamedSharding(mesh, PartitionSpec(sharding.BATCH_AXES, *[None] * (len(shape) - 1)))  # noqa: E731
    sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rows(*shape))  # noqa: E731
    ref = sds((B, Tc), jnp.float32) if cfg.algo.kl_coef > 0 else None
    return ts.Batch(tokens=sds((B, prompt_width + Tc), jnp.int32), prompt_mask=sds((B, prompt_width), bool),
                    completion_mask=sds((B, Tc), bool), rewards=sds((P, G), jnp.float32), valid=sds((P, G), bool),
                    old_logprobs=sds((B, Tc), jnp.float32), ref_logprobs=ref)  # fmt: skip


def compile_train_step(cfg: Config, mcfg: models.ModelConfig, devices: list[Any]) -> dict[str, float]:
    """Compile the train step for ``devices``; per-chip bytes (arguments, outputs, temporaries) and cost figures."""
    m = cfg.mesh
    mesh = sharding.make_mesh(m.data, m.fsdp, m.tensor, devices=devices)
    shards = int(mesh.shape["data"] * mesh.shape["fsdp"])
    perf, _ = resolve_perf(cfg.algo, cfg.perf, num_shards=shards * int(mesh.shape["tensor"]),
                           platform=devices[0].platform)  # fmt: skip
    init_fn, step_fn = ts.make_train_step(mcfg, cfg.algo, cfg.optim, perf=perf, mesh=mesh,
                                          temperature=cfg.rollout.temperature, total_steps=cfg.train.steps)  # fmt: skip
    del init_fn
    width = padding.train_prompt_width([cfg.data.max_prompt_tokens])
    packed = ts.packed_prompt_width([cfg.data.max_prompt_tokens] * cfg.rollout.prompts_per_step, width, cfg.algo,
                                    perf, mesh)  # fmt: skip
    state = ts.abstract_state(mcfg, cfg.algo, cfg.optim, mesh, cfg.train.steps)
    per_chip = lambda tree: float(sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize  # noqa: E731
                                      for x in jax.tree.leaves(tree)))  # fmt: skip
    compiled = step_fn.lower(state, abstract_batch(cfg, mesh, width), packed_prompt_width=packed).compile()
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
    return dict(
        weights=per_chip(state.params), optimizer=per_chip(state.opt_state), batch_shards=shards,
        arguments=float(mem.argument_size_in_bytes), outputs=float(mem.output_size_in_bytes),
        aliased=float(mem.alias_size_in_bytes), temporaries=float(mem.temp_size_in_bytes),
        flops=float(cost.get("flops", 0.0)), bytes_accessed=float(cost.get("bytes accessed", 0.0)),
    )  # fmt: skip


def rollout_bytes(mcfg: models.ModelConfig, cfg: Config, chips: int, batch_shards: int) -> dict[str, float]:
    """Per-chip bytes of the rollout beyond the master weights: the sampler's compute-dtype weight copy (sharded like
    the weights), the prefix cache (one copy per prompt), the decode cache and, where projections are reused, the
    record — each split over the batch shards."""
    c, r = mcfg, cfg.rollout
    isz = jnp.dtype(c.dtype).itemsize
    P, B, M = r.prompts_per_step, r.prompts_per_step * r.group_size, r.max_new_tokens
    Tp = padding.prompt_bucket(cfg.data.max_prompt_tokens)
    kv = 2 * c.num_layers * c.num_kv_heads * c.head_dim * isz
    copy = 0.0 if c.dtype == c.param_dtype else models.count_params(c) * isz / chips
    record = c.num_layers * B * max(M - 1, 1) * sum(models.projection_widths(c).values()) * isz
    reuse = cfg.perf.reuse_projections and batch_shards == 1
    return dict(compute_copy=copy, prefix_cache=kv * P * Tp / batch_shards, decode_cache=kv * B * M / batch_shards,
                record=record / batch_shards if reuse else 0.0)  # fmt: skip


def fits(total: float, chip: Chip | None) -> bool:
    return chip is None or total <= chip.hbm_bytes


def roofline_seconds(flops: float, bytes_accessed: float, chip: Chip | None) -> float:
    """``max(flops / peak, bytes / bandwidth)`` for one chip (NaN when the chip is unknown)."""
    if chip is None:
        return math.nan
    return max(flops / chip.peak_flops, bytes_accessed / chip.hbm_bandwidth)



def human(nbytes: float) -> str:
    return f"{nbytes / GiB:8.2f} GiB" if nbytes >= GiB / 4 else f"{nbytes / 1024**2:8.2f} MiB"
