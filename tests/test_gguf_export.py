# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""GGUF export (`models.save_gguf`), checked against readers that are not the writer:

1. Our loader: float32 export -> `load_pretrained` gives the same config, bit-identical weights and logits (llama,
   tied and untied, linear RoPE scaling; qwen2 biases; qwen3 q/k norms with head_dim != D/N); F16/BF16 tensors equal
   numpy's / ml_dtypes' rounding of the weights, vectors stay F32.
2. transformers' GGUF loader (which reverses llama.cpp's q/k permutation with its own code): its logits on our
   exported llama and qwen2 files equal our forward, and its GGUF tokenizer encodes and renders chats like the HF
   tokenizer the metadata was built from.
3. The metadata llama.cpp reads, via `gguf.GGUFReader`; llama3 RoPE scaling as llama.cpp's ``rope_freqs`` divisors
   (the closed form of its ``convert_hf_to_gguf.py``).
4. The real SmolLM2 GGUF (slow): load -> export -> reload is exact, tokenizer and model metadata equal the source's;
   the tokenizer metadata built from its HF tokenizer has the source's tokens, token types and merges.
5. The trainer's ``checkpoint.export_gguf`` (slow): ``<run_dir>/final.gguf`` holds the same weights as
   ``<run_dir>/final``, with the tokenizer of the model's source (an HF directory or a GGUF file).
6. Errors: dtype, file name, shapes, tokenizers llama.cpp's ``gpt2`` vocabulary cannot express.
"""

import json

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from model_helpers import llama_cpp_rope_factors, rel_err
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from jaxgrpo import config as config_lib
from jaxgrpo import trainer
from jaxgrpo.models import (
    CheckpointError,
    ModelConfig,
    ModelConfigError,
    RopeScaling,
    forward,
    init_params,
    load_pretrained,
    save_gguf,
    save_pretrained,
)
from jaxgrpo.tokenizer import arithmetic_tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # fmt: skip
CORPUS = ["Janet has 3 apples and buys 12 more. How many apples does she have now?",
          "The quick brown fox jumps over the lazy dog, then answers: 15 + 27 = 42.",
          "What is 7 times 8? Think step by step, then give the answer after ####."] * 20  # fmt: skip


def bpe_tokenizer(pre=None) -> transformers.PreTrainedTokenizerFast:
    """A small byte-level BPE tokenizer (GPT-2 style) trained here, with ChatML specials and a chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer_ = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS, show_progress=False,
                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(CORPUS, trainer_)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                                eos_token="<|im_end|>", pad_token="<|endoftext|>")  # fmt: skip
    fast.chat_template = CHAT
    return fast


def tiny(arch="llama", vocab=320, **kw) -> ModelConfig:
    base = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                rope_theta=50000.0, rms_norm_eps=1e-5, max_position_embeddings=256, architecture=arch,
                qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3", head_dim=32 if arch == "qwen3" else None,
                eos_token_ids=(2,))  # fmt: skip
    return ModelConfig(**{**base, **kw})


def random_params(cfg, seed=0):
    """init_params with every leaf perturbed (norms and biases are not their init constants)."""
    params = init_params(cfg, jax.random.key(seed))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    return jax.tree.unflatten(tree, [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def ids(cfg, rows=2, length=11):
    return jnp.asarray(np.random.default_rng(3).integers(0, cfg.vocab_size, (rows, length)), jnp.int32)


def fields(path) -> dict:
    return {k: f.contents() for k, f in GGUFReader(str(path)).fields.items()}


# ------------------------------------------------------------------------------------------- our loader, exact
@pytest.mark.parametrize("cfg", [
    tiny("llama"),
    tiny("llama", tie_word_embeddings=True, rope_scaling=RopeScaling("linear", 2.0)),
    tiny("qwen2", tie_word_embeddings=True),
    tiny("qwen3"),
], ids=["llama", "llama-tied-linear-rope", "qwen2-tied", "qwen3"])  # fmt: skip
def test_float32_export_reloads_exactly(tmp_path, cfg):
    params = random_params(cfg)
    path = save_gguf(cfg, params, tmp_path / "m.gguf", None, dtype="float32")
    cfg2, params2 = load_pretrained(path)
    assert cfg2 == cfg.replace(bos_token_id=None, eos_token_ids=())  # no tokenizer metadata: no special ids
    chex.assert_trees_all_equal(params2, params)
    chex.assert_trees_all_equal(forward(cfg2, params2, ids(cfg)), forward(cfg, params, ids(cfg)))
    assert not path.with_name("m.gguf.tmp").exists()


@pytest.mark.parametrize("dtype,qtype,np_dtype,file_type", [
    ("float16", Q.F16, np.float16, 1), ("bfloat16", Q.BF16, ml_dtypes.bfloat16, 32)])  # fmt: skip
def test_half_precision_tensors(tmp_path, dtype, qtype, np_dtype, file_type):
    cfg = tiny("qwen2")
    params = random_params(cfg)
    path = save_gguf(cfg, params, tmp_path / "m.gguf", None, dtype=dtype)
    reader = GGUFReader(str(path))
    types = {t.name: Q(t.tensor_type) for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == types["token_embd.weight"] == types["output.weight"] == qtype
    assert types["blk.1.attn_norm.weight"] == types["blk.0.attn_k.bias"] == types["output_norm.weight"] == Q.F32
    assert reader.fields["general.file_type"].contents() == file_type
    _, params2 = load_pretrained(path)
    rounded = jax.tree.map(lambda x: np.asarray(x).astype(np_dtype).astype(np.float32), params)
    for k in ("q", "down", "q_bias"):  # matrices rounded once; vectors exact
        want = rounded["layers"][k] if k != "q_bias" else np.asarray(params["layers"][k])
        np.testing.assert_array_equal(np.asarray(params2["layers"][k]), want)
    np.testing.assert_array_equal(np.asarray(params2["embed"]), rounded["embed"])


def test_dtype_defaults_to_the_compute_dtype(tmp_path):
    cfg = tiny("llama", dtype="bfloat16")
    path = save_gguf(cfg, random_params(cfg), tmp_path / "m.gguf", None)
    assert Q(GGUFReader(str(path)).tensors[0].tensor_type) == Q.BF16


def test_llama3_rope_scaling_is_llama_cpps_rope_freqs(tmp_path):
    cfg = tiny("llama", rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64), rope_theta=500000.0)
    params = random_params(cfg)
    path = save_gguf(cfg, params, tmp_path / "m.gguf", None, dtype="float32")
    reader = GGUFReader(str(path))
    (t,) = [t for t in reader.tensors if t.name == "rope_freqs.weight"]
    np.testing.assert_allclose(np.asarray(t.data), llama_cpp_rope_factors(16, 500000.0, 8.0, 1.0, 4.0, 64),
                               rtol=1e-6)  # fmt: skip
    cfg2, params2 = load_pretrained(path)
    assert cfg2.rope_scaling == cfg.rope_scaling
    chex.assert_trees_all_equal(forward(cfg2, params2, ids(cfg)), forward(cfg, params, ids(cfg)))


# ------------------------------------------------------------------------------------------- transformers' reader
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_transformers_reads_the_export(tmp_path, arch):
    tok = bpe_tokenizer()
    cfg = tiny(arch, vocab=len(tok) + 5)  # ids beyond the tokenizer are llama.cpp's [PAD] placeholders
    params = random_params(cfg)
    path = save_gguf(cfg, params, tmp_path / f"{arch}.gguf", tok, dtype="float32")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name,
                                                              dtype=torch.float32).eval()  # fmt: skip
    x = ids(cfg)
    with torch.no_grad():
        ref = model(torch.tensor(np.asarray(x))).logits.numpy()
    assert rel_err(forward(cfg, params, x), ref) < 1e-5


def test_metadata_and_tokenizer_llama_cpp_reads(tmp_path):
    tok = bpe_tokenizer()
    cfg = tiny("llama", vocab=len(tok) + 3)
    path = save_gguf(cfg, random_params(cfg), tmp_path / "policy.gguf", tok, dtype="float32")
    f = fields(path)
    assert f["general.architecture"] == "llama" and f["general.name"] == "policy"
    expect = {"context_length": 256, "embedding_length": 64, "block_count": 2, "feed_forward_length": 96,
              "attention.head_count": 4, "attention.head_count_kv": 2, "rope.dimension_count": 16,
              "vocab_size": len(tok) + 3}  # fmt: skip
    assert {k: f[f"llama.{k}"] for k in expect} == expect
    assert f["llama.rope.freq_base"] == np.float32(50000.0)
    assert f["llama.attention.layer_norm_rms_epsilon"] == np.float32(1e-5)
    assert (f["tokenizer.ggml.model"], f["tokenizer.ggml.pre"]) == ("gpt2", "gpt-2")
    n = len(tok)
    assert f["tokenizer.ggml.tokens"][:n] == tok.convert_ids_to_tokens(list(range(n)))
    assert f["tokenizer.ggml.tokens"][n:] == [f"[PAD{i}]" for i in range(n, n + 3)]
    types = f["tokenizer.ggml.token_type"]
    specials = set(tok.convert_tokens_to_ids(SPECIALS))
    assert all(types[i] == (3 if i in specials else 1) for i in range(n)) and types[n:] == [5, 5, 5]
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]  # by rank
    assert len(merges) > 50 and f["tokenizer.ggml.merges"] == [m if isinstance(m, str) else " ".join(m) for m in merges]
    assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"], f["tokenizer.ggml.padding_token_id"]) \
        == (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert f["tokenizer.ggml.add_bos_token"] is False and f["tokenizer.chat_template"] == CHAT
    # transformers' GGUF tokenizer, built from the file alone, tokenizes and renders chats like the source tokenizer
    ours = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in ["Janet has 37 apples.\nHow many?  ####", "fox jumps; über 12+30=42 <|im_end|>"]:
        assert ours(text)["input_ids"] == tok(text)["input_ids"], text
    chat = [{"role": "user", "content": "What is 7 times 8?"}]
    assert ours.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == \
        tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert ours.eos_token_id == tok.eos_token_id


# ------------------------------------------------------------------------------------------- errors
def test_errors(tmp_path):
    cfg = tiny("llama")
    params = random_params(cfg)
    with pytest.raises(ModelConfigError, match=r"unsupported GGUF dtype 'float64'; supported: \('float32'"):
        save_gguf(cfg, params, tmp_path / "m.gguf", None, dtype="float64")
    with pytest.raises(CheckpointError, match="must end in .gguf"):
        save_gguf(cfg, params, tmp_path / "m.bin", None)
    with pytest.raises(CheckpointError, match="params do not match the config"):
        save_gguf(cfg.replace(num_layers=3), params, tmp_path / "m.gguf", None)
    with pytest.raises(CheckpointError, match="supports byte-level BPE tokenizers .* this one is WordLevel"):
        save_gguf(tiny("llama", vocab=60), random_params(tiny("llama", vocab=60)), tmp_path / "m.gguf",
                  arithmetic_tokenizer())  # fmt: skip
    with pytest.raises(CheckpointError, match="pre-tokenizer .* has no llama.cpp name"):
        save_gguf(cfg, params, tmp_path / "m.gguf", bpe_tokenizer(pre_tokenizers.Sequence(
            [pre_tokenizers.Whitespace(), pre_tokenizers.ByteLevel(add_prefix_space=False)])))
    small = tiny("llama", vocab=100)
    with pytest.raises(CheckpointError, match="has token id .* but the model's vocabulary has 100 ids"):
        save_gguf(small, random_params(small), tmp_path / "m.gguf", bpe_tokenizer())
    source = save_gguf(cfg, params, tmp_path / "src.gguf", bpe_tokenizer())
    big = tiny("llama", vocab=400)
    with pytest.raises(CheckpointError, match="src.gguf has 320 tokens but the model's vocabulary has 400 ids"):
        save_gguf(big, random_params(big), tmp_path / "m.gguf", source)
    assert not (tmp_path / "m.gguf").exists()
    with pytest.raises(config_lib.ConfigError, match="checkpoint.export_gguf=true needs a byte-level BPE tokenizer"):
        config_lib.load_config("default", ["checkpoint.export_gguf=true"])


# ------------------------------------------------------------------------------------------- real SmolLM2
@pytest.mark.slow
def test_smollm2_export_round_trip(smollm2_gguf, smollm2, smollm2_hf_tokenizer, tmp_path):
    cfg, params = smollm2
    path = save_gguf(cfg, params, tmp_path / "smollm2.gguf", smollm2_gguf, dtype="float32")
    cfg2, params2 = load_pretrained(path)
    assert cfg2 == cfg
    chex.assert_trees_all_equal(params2, params)
    x = jnp.asarray([[1, 9690, 198, 504, 3575, 314, 4649, 2]], jnp.int32)
    chex.assert_trees_all_equal(forward(cfg2, params2, x), forward(cfg, params, x))
    src, out = fields(smollm2_gguf), fields(path)
    for key in [k for k in src if k.startswith("tokenizer.")]:
        assert out[key] == src[key], key
    for key in [k for k in src if k.startswith("llama.")]:
        assert out[key] == src[key], key  # context_length 8192, head counts, rope base, rms eps, ...
    # the metadata built from the HF tokenizer (transformers' reading of the GGUF) has llama.cpp's vocabulary
    from jaxgrpo.models.gguf_export import hf_tokenizer_fields

    built = {k: v for k, v, _, _ in hf_tokenizer_fields(smollm2_hf_tokenizer, cfg)}
    for key in ("tokens", "token_type", "merges", "bos_token_id", "eos_token_id", "padding_token_id"):
        assert built[f"tokenizer.ggml.{key}"] == src[f"tokenizer.ggml.{key}"], key
    assert built["tokenizer.chat_template"] == src["tokenizer.chat_template"]


# ------------------------------------------------------------------------------------------- the trainer's export
def test_the_gguf_export_of_a_hub_model_takes_the_runs_tokenizer_without_fetching_the_base(monkeypatch, tmp_path):
    """A Hub id is not resolved again at the end of a run (that fetched the default branch's whole snapshot, whatever
    model.revision pinned): the file's tokenizer fields come from the tokenizer the run loaded."""
    import types

    from jaxgrpo import build, export
    from jaxgrpo import models as jmodels

    seen = {}
    monkeypatch.setattr(build, "resolve_model_path", lambda *a, **k: pytest.fail("the base was resolved again"))
    monkeypatch.setattr(jmodels, "save_gguf", lambda mcfg, params, path, vocab, dtype=None: seen.update(vocab=vocab))
    cfg = tiny()
    run = types.SimpleNamespace(
        cfg=types.SimpleNamespace(model=types.SimpleNamespace(name_or_path="org/model", tokenizer=None),
                                  checkpoint=types.SimpleNamespace(export_gguf_dtype=None)),
        model_config=cfg, state=types.SimpleNamespace(params=random_params(cfg)), run_dir=tmp_path, tokenizer="tok")
    export.gguf(run)
    assert seen == {"vocab": "tok"}


@pytest.mark.slow
@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_trainer_writes_final_gguf(tmp_path, source):
    tok = bpe_tokenizer()
    cfg = tiny("llama", vocab=len(tok), max_position_embeddings=128)
    params = random_params(cfg)
    if source == "hf":
        model_path = tmp_path / "base"
        save_pretrained(cfg, params, model_path, dtype="float32")
        tok.save_pretrained(model_path)
    else:
        model_path = save_gguf(cfg, params, tmp_path / "base.gguf", tok, dtype="float32")
    run_dir = tmp_path / "run"
    overrides = [f"model.name_or_path={model_path}", "model.tokenizer=null", "train.steps=1",
                 "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=2",
                 "checkpoint.every=0", "log.progress=false", "log.tensorboard=false", "log.sample_every=0",
                 "checkpoint.export_gguf=true", "checkpoint.export_gguf_dtype=float32",
                 "data.max_prompt_tokens=64"]  # fmt: skip
    trainer.run(config_lib.load_config("default", overrides), run_dir)
    _, final = load_pretrained(run_dir / "final")
    _, exported = load_pretrained(run_dir / "final.gguf")
    chex.assert_trees_all_equal(exported, final)
    out = fields(run_dir / "final.gguf")
    if source == "gguf":  # copied from the source file
        src = fields(model_path)
        assert {k: v for k, v in out.items() if k.startswith("tokenizer.")} == \
            {k: v for k, v in src.items() if k.startswith("tokenizer.")}
    else:  # built from the run's tokenizer
        assert out["tokenizer.ggml.tokens"] == tok.convert_ids_to_tokens(list(range(len(tok))))
        assert out["tokenizer.chat_template"] == CHAT


def test_a_tokenizer_gguf_cannot_hold_is_refused_before_the_first_step(tmp_path):
    """A Llama-2-style tokenizer (SentencePiece BPE with byte fallback, Metaspace) passes the config check, but
    final.gguf could not express it: the trainer refuses the run at its start, not after its last step."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers import models as tok_models

    tok = Tokenizer(tok_models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                                         show_progress=False))  # fmt: skip
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")  # fmt: skip
    fast.chat_template = CHAT
    cfg = tiny("llama", vocab=len(fast), max_position_embeddings=128)
    save_pretrained(cfg, random_params(cfg), tmp_path / "base", dtype="float32")
    fast.save_pretrained(tmp_path / "base")
    run = config_lib.load_config("default", [f"model.name_or_path={tmp_path / 'base'}", "model.tokenizer=null",
                                             "checkpoint.export_gguf=true", "log.tensorboard=false"])  # fmt: skip
    with pytest.raises(config_lib.ConfigError, match="checkpoint.export_gguf=true: GGUF export supports byte-level "
                                                     "BPE tokenizers .* this one is BPE with byte fallback"):
        trainer.Trainer(run, tmp_path / "run")


def test_a_tokenizer_without_bos_takes_the_configs(tmp_path):
    """transformers' Qwen2Tokenizer has no BOS token; the file then carries config.json's bos_token_id (llama.cpp's
    own converter does the same; without it llama.cpp assumes id 11, a ',' in Qwen's vocabulary)."""
    tok = bpe_tokenizer()
    tok.bos_token = None
    assert tok.bos_token_id is None
    cfg = tiny("llama", vocab=len(tok)).replace(bos_token_id=3)
    path = save_gguf(cfg, random_params(cfg), tmp_path / "m.gguf", tok, dtype="float32")
    assert fields(path)["tokenizer.ggml.bos_token_id"] == 3
    assert load_pretrained(path)[0].bos_token_id == 3
