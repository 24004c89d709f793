# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""What ``benchmarks/gpu_carry.py`` carries to a GPU machine for the step against TRL, and ``vs_trl.py --random-init``
that uses it: the carried shape is SmolLM2-135M-Instruct's as jaxgrpo reads the GGUF itself (an independent reader:
transformers' GGUF code writes the carried files), the GSM8K head is the data set's first problems, and the random
checkpoint is one model to both frameworks (jaxgrpo's logits equal transformers'), the same on every call."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers
from benchmark_module import load
from model_helpers import rel_err

from jaxgrpo import build, data, models
from jaxgrpo.config import DataConfig, load_config


@pytest.fixture(scope="module")
def shape_dir(tmp_path_factory, smollm2_gguf):
    out = tmp_path_factory.mktemp("shape")
    load("gpu_carry").model_shape(out)
    return out


def test_carried_shape_is_the_gguf_model(shape_dir, smollm2, smollm2_gguf):
    mcfg, _ = smollm2  # jaxgrpo's own reading of the GGUF
    hf = transformers.AutoConfig.from_pretrained(shape_dir)
    assert (hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers) == (576, 1536, 30)
    assert (hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers, hf.num_attention_heads,
            hf.num_key_value_heads, hf.vocab_size, hf.tie_word_embeddings) == (
        mcfg.hidden_size, mcfg.intermediate_size, mcfg.num_layers, mcfg.num_heads, mcfg.num_kv_heads, mcfg.vocab_size,
        mcfg.tie_word_embeddings)  # fmt: skip
    assert hf.rope_parameters["rope_theta"] == pytest.approx(mcfg.rope_theta)
    text = "Natalia sold clips to 48 of her friends in April."
    carried = transformers.AutoTokenizer.from_pretrained(shape_dir)
    assert carried(text)["input_ids"] == build.load_tokenizer(str(smollm2_gguf))(text)["input_ids"]
    assert not list(shape_dir.glob("*.safetensors"))  # the shape only: weights are made on the GPU machine


def test_gsm8k_head_is_the_first_problems(tmp_path):
    gsm8k = load("gpu_carry").REPO.parent / "shared" / "data" / "gsm8k"
    load("gpu_carry").gsm8k_head(tmp_path, 5)
    cfg = DataConfig(source="gsm8k", path=str(tmp_path), shuffle=False, rewards={"gsm8k": 1.0})
    full = DataConfig(source="gsm8k", path=str(gsm8k), num_examples=5, shuffle=False, rewards={"gsm8k": 1.0})
    got, want = data.load_dataset(cfg, 0), data.load_dataset(full, 0)
    assert [(e.prompt, e.answer) for e in got] == [(e.prompt, e.answer) for e in want] and len(got) == 5


def test_random_init_is_one_model_to_both_frameworks(tmp_path, shape_dir):
    tiny = tmp_path / "tiny"
    config = transformers.AutoConfig.from_pretrained(shape_dir)
    config.update({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 8})  # fmt: skip
    config.save_pretrained(tiny)
    transformers.AutoTokenizer.from_pretrained(shape_dir).save_pretrained(tiny)
    vs_trl = load("vs_trl")
    vs_trl.random_init(str(tiny), str(tmp_path / "a"))
    vs_trl.random_init(str(tiny), str(tmp_path / "b"))
    a, b = (safetensors.numpy.load_file(tmp_path / d / "model.safetensors") for d in "ab")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)  # seed 0: the same on every call
    assert np.std(a["model.layers.0.mlp.down_proj.weight"]) > 0.01  # random, not zeros

    cfg = load_config(None, [f"model.name_or_path={tmp_path / 'a'}"])
    mcfg, params, tok = build.build_policy(cfg, jax.random.key(0))
    assert (mcfg.hidden_size, mcfg.num_layers) == (32, 2)
    ids = tok("What is 12 + 30?")["input_ids"]
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a", dtype=torch.float32).eval()
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0].numpy()
    ours = np.asarray(models.forward(mcfg, params, jnp.asarray([ids]))[0])
    assert rel_err(ours, expected) < 1e-4
