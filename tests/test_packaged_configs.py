# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Every packaged config (jaxgrpo/configs/*.yaml) fits the hardware its header names, by the shape-only bound of
`python -m jaxgrpo.compile`: per chip, the master weights, the optimizer state and the KL reference (from
`train_step.abstract_state`, i.e. `jax.eval_shape`: nothing allocated) plus the rollout's KV caches spread over the
chips must be below the chip's memory. Meshes larger than the local devices are abstract (`AbstractMesh`), so the
32-chip pod config is checked on any host. The compiled programs' own figures are `tests/test_compile.py`'s."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh

from jaxgrpo import aot, models, sharding
from jaxgrpo import config as config_lib
from jaxgrpo.learner import train_step as ts

CONFIGS = sorted(p.stem for p in (pathlib.Path(config_lib.__file__).parent / "configs").glob("*.yaml"))
# the hardware each config's header names; CPU configs: the 24 GiB development machine (DESIGN.md, Machines)
HARDWARE = {
    "default": aot.Chip(24 * aot.GiB, 0, 0),
    "smollm2_gsm8k": aot.Chip(24 * aot.GiB, 0, 0),
    "smollm2_gsm8k_lora": aot.Chip(24 * aot.GiB, 0, 0),
    "smollm2_tools": aot.Chip(24 * aot.GiB, 0, 0),
    "qwen2.5-0.5b-instruct_gsm8k": aot.CHIPS["h100"],
    "qwen3-1.7b_gsm8k": aot.CHIPS["h100"],
    "llama3.1-8b_gsm8k_lora": aot.CHIPS["h100"],
    "llama3.1-8b_gsm8k_pod": aot.CHIPS["v5p"],
}


def test_every_packaged_config_names_its_hardware_here():
    assert CONFIGS == sorted(HARDWARE), "a new packaged config needs its hardware in HARDWARE"


@pytest.mark.parametrize("name", CONFIGS)
def test_packaged_config_fits_its_hardware_by_shapes(name):
    cfg = config_lib.load_config(name, [])
    mcfg = aot.model_config(cfg)
    m = cfg.mesh
    chips = m.data * m.fsdp * m.tensor
    mesh = AbstractMesh((m.data, m.fsdp, m.tensor), sharding.MESH_AXES)
    state = ts.abstract_state(mcfg, cfg.algo, cfg.optim, mesh, cfg.train.steps)
    weights, opt = aot.per_chip_bytes(state.params), aot.per_chip_bytes(state.opt_state)
    # independent floor: every parameter is stored once over the chips, in its dtype (master or LoRA's frozen base)
    stored = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params))
    assert weights >= stored / chips
    if mcfg.lora is None:  # full fine-tuning: AdamW's two moments of every master weight
        assert opt >= 2 * models.count_params(mcfg) * jnp.dtype(mcfg.param_dtype).itemsize / chips
    ref = weights * jnp.dtype(mcfg.dtype).itemsize / jnp.dtype(mcfg.param_dtype).itemsize
    ref = ref if cfg.algo.kl_coef > 0 and mcfg.lora is None else 0.0
    bound = weights + opt + ref + aot.rollout_cache_bytes(mcfg, cfg) / chips
    assert aot.fits(bound, HARDWARE[name]), f"{name}: {aot.human(bound)} per chip by shapes alone"
