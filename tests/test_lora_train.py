# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""LoRA through the trainer: resume is exact, a checkpoint refuses another base, the KL reference is the base with the
adapters off, and the real model's exported PEFT adapter loads onto transformers' model with the merged export's
logits."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file
from test_train import SMALL, _env

from jaxgrpo import config as config_lib
from jaxgrpo import eval as eval_lib
from jaxgrpo import metrics_log, models, trainer
from jaxgrpo.models import lora

LORA = [*SMALL, "lora.rank=4", "lora.alpha=8", "optim.learning_rate=1e-2", "algo.kl_coef=0.05"]


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory) -> pathlib.Path:
    """A LoRA run of 2 steps (of the 4 of ``LORA``), shared: a test that resumes it works on a copy."""
    run = tmp_path_factory.mktemp("lora") / "run"
    trainer.run(config_lib.load_config("default", [*LORA, "train.steps=2"]), run)
    return run


def test_resume_is_exact_and_the_reference_is_the_base(tmp_path, two_step_run):
    """4 steps in one go equal 2 steps + a resumed run of 2 (adapters bit for bit, deterministic metrics); the KL to
    the reference is exactly 0 at the first step (zero-initialised B: the policy is the base) and grows after."""
    straight = tmp_path / "straight"
    trainer.run(config_lib.load_config("default", LORA), straight)
    resumed = tmp_path / "resumed"
    shutil.copytree(two_step_run, resumed)
    trainer.run(config_lib.load_config("default", LORA), resumed)
    a, b = load_file(straight / "final_adapter" / "adapter_model.safetensors"), load_file(
        resumed / "final_adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and len(a) == 2 * 7 * 2  # A and B for 7 projections in 2 layers
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    ma, mb = metrics_log.read_metrics(straight), metrics_log.read_metrics(resumed)
    assert [r["step"] for r in mb] == [1, 2, 3, 4]
    for ra, rb in zip(ma, mb):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-6, abs=1e-9)
    assert ma[0]["kl"] == 0.0 and ma[-1]["kl"] > 0
    config = json.loads((straight / "final_adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["peft_type"] == "LORA"
    assert sorted(config["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                         "up_proj", "down_proj"])  # fmt: skip


def test_resume_on_another_base_is_refused_and_eval_reads_the_adapters(two_step_run):
    run = two_step_run
    cfg = config_lib.load_config("default", [*LORA, "train.steps=2"])
    # evaluation rebuilds the base and joins the checkpoint's adapters: the merged HF export's weights
    policy = eval_lib.load_policy_for_eval(cfg, run, None)
    assert policy.step == 2 and policy.model_config.lora is not None
    _, exported = models.load_pretrained(run / "final")
    merged = lora.merge(policy.model_config, policy.params)
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(merged), jax.tree.leaves(exported)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7,
                                   err_msg=jax.tree_util.keystr(path))  # fmt: skip
    # seed=1 initialises another tiny base model
    with pytest.raises(config_lib.ConfigError, match="trained on base model"):
        trainer.Trainer(config_lib.load_config("default", [*LORA, "seed=1"]), run, allow_config_change=True)
    with pytest.raises(config_lib.ConfigError, match="holds LoRA adapters but this run has lora.rank=0"):
        trainer.Trainer(config_lib.load_config("default", [*SMALL]), run, allow_config_change=True)


@pytest.mark.slow
def test_smollm2_lora_cli_exports_an_adapter_peft_loads(tmp_path, smollm2_hf_model, gsm8k_dir):
    """The real model trains a step with lora.rank=8 through the CLI (sign advantages: all-fail groups still push);
    peft applies the exported adapter to transformers' own load of the GGUF base and gives the merged export's
    logits."""
    import peft
    import torch
    import transformers

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "jaxgrpo.train", "--config", "smollm2_gsm8k", "--run-dir", str(run),
           f"data.path={gsm8k_dir}", "lora.rank=8", "train.steps=1", "rollout.prompts_per_step=2",
           "rollout.group_size=2", "rollout.max_new_tokens=4", "data.num_examples=8",
           "algo.grad_accum_steps=1", "algo.estimator=sign", "optim.learning_rate=1e-2", "optim.warmup_steps=0",
           "log.progress=false", "log.tensorboard=false"]  # fmt: skip
    subprocess.run(cmd, check=True, env=_env(), cwd=tmp_path, capture_output=True)
    with_adapter = peft.PeftModel.from_pretrained(smollm2_hf_model, run / "final_adapter").eval()  # on transformers'
    # own load of the GGUF base
    merged = transformers.AutoModelForCausalLM.from_pretrained(run / "final", dtype=torch.float32).eval()
    ids = torch.tensor([[1, 504, 2365, 6354, 16438, 27003, 690, 253, 23790, 2767, 30]])
    with torch.no_grad():
        got, want = with_adapter(ids).logits.numpy(), merged(ids).logits.numpy()
        with with_adapter.disable_adapter():
            plain = with_adapter(ids).logits.numpy()
    scale = np.max(np.abs(want))
    assert np.max(np.abs(got - want)) / scale < 1e-4
    assert np.max(np.abs(plain - want)) / scale > 1e-5  # the step moved the adapted model away from the base
