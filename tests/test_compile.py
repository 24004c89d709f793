# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`python -m jaxgrpo.compile`: the train step compiled ahead of time on abstract weights, per-chip memory against the
chip, exit code 1 when it does not fit; the model architecture found without loading weights."""

from __future__ import annotations

import importlib.util

import pytest

from jaxgrpo import aot
from jaxgrpo import compile as compile_cli
from jaxgrpo import config as config_lib


def test_default_config_fits_the_local_device(capsys):
    assert compile_cli.main([]) == 0
    out = capsys.readouterr().out
    assert "train step total" in out and "decode cache" in out and out.strip().endswith("fits")


def test_a_chip_too_small_fails_with_exit_code_1(capsys, monkeypatch):
    monkeypatch.setattr(aot, "chip_of", lambda devices: ("tiny-chip", aot.Chip(64 * 1024, 1e12, 1e11)))
    assert compile_cli.main(["train.steps=3"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_compiled_weights_match_the_parameter_count():
    cfg = config_lib.load_config("default", [])
    mcfg = aot.model_config(cfg)
    step = aot.compile_train_step(cfg, mcfg, aot.topology_devices(None, 1))
    from jaxgrpo import models

    assert step["weights"] == models.count_params(mcfg) * 4  # float32 masters, one device
    assert step["optimizer"] >= 2 * step["weights"]  # AdamW's two moments (plus its step counter)
    assert step["temporaries"] > 0 and step["flops"] > 0


def test_model_config_from_a_preset_named_directory():
    cfg = config_lib.load_config("default", ["model.name_or_path=models/llama-3.1-8b-instruct", "model.dtype=bfloat16"])
    mcfg = aot.model_config(cfg)
    assert (mcfg.num_layers, mcfg.hidden_size, mcfg.dtype, mcfg.param_dtype) == (32, 4096, "bfloat16", "float32")


def test_bad_input_is_one_line(capsys):
    assert compile_cli.main(["mesh.fsdp=16"]) == 2  # 8 local (fake) devices, a mesh of 16
    assert "the mesh needs 16 devices" in capsys.readouterr().err


def test_sharded_over_local_devices(capsys):
    # 8 fake CPU devices: FSDP over 4 of them, 2-way data parallel
    assert compile_cli.main(["mesh.data=2", "mesh.fsdp=4", "rollout.prompts_per_step=8"]) == 0
    assert "mesh data=2 fsdp=4" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (pip install jaxgrpo[tpu])")
def test_tpu_topology_compiles(capsys):
    assert compile_cli.main(["--topology", "v5e:2x2", "mesh.fsdp=4", "rollout.prompts_per_step=16"]) == 0
    assert "4 x v5e" in capsys.readouterr().out
