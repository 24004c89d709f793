# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Hugging Face Hub ids for ``model.name_or_path`` (`jaxgrpo.build.resolve_model_path`), tested offline.

Each test writes a fake HF cache (``$HF_HOME/hub/models--org--name/{refs,snapshots}``, the layout huggingface_hub
itself reads) holding a tiny random Llama saved by transformers, sets ``HF_HUB_OFFLINE=1`` and resolves the id.
The loaded policy's logits must equal transformers' forward of the same files; ``model.revision`` picks a branch's
snapshot; a missing repo, revision or snapshot is a one-line ConfigError.
"""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from model_helpers import rel_err

from jaxgrpo import build, models
from jaxgrpo.config import load_config
from jaxgrpo.errors import ConfigError
from jaxgrpo.tokenizer import arithmetic_tokenizer

MAIN, V2 = "a" * 40, "b" * 40  # commit hashes of the two snapshots


def _write_snapshot(repo: pathlib.Path, commit: str, refs: list[str], hidden: int, seed: int) -> None:
    snap = repo / "snapshots" / commit
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=60, hidden_size=hidden, intermediate_size=2 * hidden,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, tie_word_embeddings=False)  # fmt: skip
    transformers.LlamaForCausalLM(cfg).save_pretrained(snap, safe_serialization=True)
    arithmetic_tokenizer().save_pretrained(snap)
    (snap / "pytorch_model.bin").write_bytes(b"not fetched by jaxgrpo, harmless in a cache")
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)


@pytest.fixture()
def hf_home(tmp_path, monkeypatch):
    home = tmp_path / "hf_home"
    repo = home / "hub" / "models--tiny-org--tiny-llama"
    _write_snapshot(repo, MAIN, ["main"], hidden=32, seed=0)
    _write_snapshot(repo, V2, ["v2"], hidden=48, seed=1)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


def _policy(*overrides: str):
    cfg = load_config(None, ["model.name_or_path=tiny-org/tiny-llama", *overrides])
    return build.build_policy(cfg, jax.random.key(0))


@pytest.mark.parametrize("revision,commit", [(None, MAIN), ("v2", V2), (MAIN, MAIN)])
def test_hub_id_loads_the_cached_snapshot(hf_home, revision, commit):
    mcfg, params, tok = _policy(*([f"model.revision={revision}"] if revision else []))
    snap = hf_home / "hub" / "models--tiny-org--tiny-llama" / "snapshots" / commit
    ref = transformers.LlamaForCausalLM.from_pretrained(snap).eval()
    assert mcfg.hidden_size == ref.config.hidden_size
    ids = tok("12+34=56")["input_ids"]
    assert ids == transformers.AutoTokenizer.from_pretrained(snap)("12+34=56")["input_ids"]
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0].numpy()
    ours = np.asarray(models.forward(mcfg, params, jnp.asarray([ids]))[0])
    assert rel_err(ours, expected) < 1e-4


def test_resolve_model_path_returns_the_snapshot_directory(hf_home):
    path = pathlib.Path(build.resolve_model_path("tiny-org/tiny-llama", "v2"))
    assert path == hf_home / "hub" / "models--tiny-org--tiny-llama" / "snapshots" / V2
    # a Hub id names the tokenizer too
    tok = build.load_tokenizer("tiny-org/tiny-llama")
    assert tok("7*8")["input_ids"] == arithmetic_tokenizer()("7*8")["input_ids"]


def test_unknown_id_offline_is_a_one_line_error(hf_home):
    with pytest.raises(ConfigError, match=r"'nobody/nothing': HF_HUB_OFFLINE is set and the HF cache .* holds no "
                                          r"snapshot") as e:  # fmt: skip
        build.resolve_model_path("nobody/nothing")
    assert "\n" not in str(e.value)


def test_unknown_revision_offline_is_a_one_line_error(hf_home):
    with pytest.raises(ConfigError, match=r"model.revision='nope'") as e:
        build.resolve_model_path("tiny-org/tiny-llama", "nope")
    assert "\n" not in str(e.value)


def test_snapshot_without_safetensors_is_refused(hf_home):
    repo = hf_home / "hub" / "models--tiny-org--gguf-only"
    (repo / "snapshots" / MAIN).mkdir(parents=True)
    (repo / "snapshots" / MAIN / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    with pytest.raises(ConfigError, match="no config.json with safetensors weights"):
        build.resolve_model_path("tiny-org/gguf-only")


@pytest.mark.parametrize("name,hub", [("Qwen/Qwen2.5-0.5B-Instruct", True), ("meta-llama/Llama-3.1-8B-Instruct", True),
                                      ("tiny", False), ("smollm2", False), ("./model", False), ("/abs/dir", False),
                                      ("a/b/c", False), ("../x", False), ("models/../x", False),
                                      ("org/name.gguf", True)])  # fmt: skip
def test_is_hub_id(name, hub):
    assert build.is_hub_id(name) == hub


def test_tokenizer_only_snapshot_serves_model_tokenizer(hf_home):
    repo = hf_home / "hub" / "models--tiny-org--tokenizer-only"
    arithmetic_tokenizer().save_pretrained(repo / "snapshots" / MAIN)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    mcfg, _, tok = _policy("model.tokenizer=tiny-org/tokenizer-only")
    assert tok("1+2")["input_ids"] == arithmetic_tokenizer()("1+2")["input_ids"]
    with pytest.raises(ConfigError, match="no config.json with safetensors weights"):
        build.resolve_model_path("tiny-org/tokenizer-only")


def test_revision_without_hub_id_is_refused(smollm2_gguf):
    with pytest.raises(ConfigError, match=r"model.revision='v2' applies to Hub ids \(org/name\) only"):
        build.resolve_model_path("smollm2", "v2")


def test_neither_path_nor_hub_id_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="neither 'tiny', 'smollm2', a Hugging Face Hub id"):
        build.resolve_model_path(str(tmp_path / "missing" / "dir"))


def test_the_policy_tokenizer_is_read_without_the_weights(hf_home, smollm2_gguf, monkeypatch):
    """`build.policy_tokenizer` (the compile CLI's, for multi-turn shapes): a Hub id's tokenizer from its snapshot
    without a download of weights, and the packaged "smollm2" alias's from its GGUF, as `build_policy` gives them."""
    monkeypatch.setattr(build, "download_from_hub", lambda *a, weights=True: pytest.fail("weights") if weights else
                        str(hf_home / "hub" / "models--tiny-org--tiny-llama" / "snapshots" / MAIN))  # fmt: skip
    tok = build.policy_tokenizer(load_config(None, ["model.name_or_path=tiny-org/tiny-llama"]))
    assert tok("1+2")["input_ids"] == arithmetic_tokenizer()("1+2")["input_ids"]
    want = build.load_tokenizer(str(smollm2_gguf))
    got = build.policy_tokenizer(load_config(None, ["model.name_or_path=smollm2"]))
    assert got("What is 3 + 4?")["input_ids"] == want("What is 3 + 4?")["input_ids"] and got.vocab_size == 49152
