# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""GGUF loading vs transformers' own GGUF loader (which dequantizes with the same `gguf` package to float32).

1. Tiny GGUF files written here with `gguf.GGUFWriter` for llama (q/k rows permuted the way llama.cpp's
   ``convert_hf_to_gguf.py`` does), qwen2 and qwen3, with F32/F16/Q8_0/Q4_0/Q4_1 tensors: our logits and weights must
   match transformers' loading of the same file. Our q/k un-permutation and transformers' are independent code.
2. The real SmolLM2-135M-Instruct Q4_1 GGUF (slow): config equals the published HF config, the dequantized weights
   equal transformers' exactly, the logits agree to float32 round-off (measured max relative error ~3e-6 with
   ``max |ours - ref| / max |ref|``: both sides use identical float32 weights and differ only in the order of float32
   operations over 30 layers; we assert < 1e-4), and greedy decoding of a chat-templated question says "Paris".
3. Errors: unsupported quantization type, unsupported architecture, missing tensor, truncated file.
"""

import pathlib

import chex
import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from model_helpers import llama_cpp_rope_factors, rel_err

from jaxgrpo.models import (
    CheckpointError,
    ModelConfigError,
    RopeScaling,
    forward,
    get_preset,
    hidden_states,
    lm_head,
    load_pretrained,
    load_tokenizer,
)

V, D, F, N, K, H, L = 64, 64, 96, 4, 2, 16, 2


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (HF rotate-half rows -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: pathlib.Path, arch: str, seed: int = 0, qtypes=None, skip=(), tied=False, theta=10000.0,
                    rope_freqs=None) -> pathlib.Path:
    """A tiny random model as GGUF. qtypes: {gguf tensor suffix: GGMLQuantizationType}, default F32."""
    rng = np.random.default_rng(seed)
    # qwen3: explicit head_dim != D / N. transformers' GGUF loader ignores qwen3.attention.key_length and assumes
    # Qwen3's default 128, so use 128 to stay comparable (our loader reads key_length).
    head_dim = 128 if arch == "qwen3" else H
    qtypes = qtypes or {}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_context_length(128)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(N)
    w.add_head_count_kv(K)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(head_dim)
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(V)

    def add(name: str, x: np.ndarray) -> None:
        if name in skip:
            return
        q = qtypes.get(name.split(".", 2)[-1] if name.startswith("blk.") else name, Q.F32)
        x = x.astype(np.float32)
        if q == Q.F32:
            w.add_tensor(name, x)
        elif q == Q.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, q), raw_dtype=q)

    add("token_embd.weight", 0.5 * rng.standard_normal((V, D)))
    if rope_freqs is not None:
        add("rope_freqs.weight", rope_freqs)
    for i in range(L):
        q = 0.2 * rng.standard_normal((N * head_dim, D))
        k = 0.2 * rng.standard_normal((K * head_dim, D))
        if arch == "llama":
            q, k = _llama_cpp_permute(q, N), _llama_cpp_permute(k, K)
        add(f"blk.{i}.attn_q.weight", q)
        add(f"blk.{i}.attn_k.weight", k)
        add(f"blk.{i}.attn_v.weight", 0.2 * rng.standard_normal((K * head_dim, D)))
        add(f"blk.{i}.attn_output.weight", 0.2 * rng.standard_normal((D, N * head_dim)))
        if arch == "qwen2":
            add(f"blk.{i}.attn_q.bias", 0.3 * rng.standard_normal(N * head_dim))
            add(f"blk.{i}.attn_k.bias", 0.3 * rng.standard_normal(K * head_dim))
            add(f"blk.{i}.attn_v.bias", 0.3 * rng.standard_normal(K * head_dim))
        if arch == "qwen3":
            add(f"blk.{i}.attn_q_norm.weight", 1 + 0.3 * rng.standard_normal(head_dim))
            add(f"blk.{i}.attn_k_norm.weight", 1 + 0.3 * rng.standard_normal(head_dim))
        add(f"blk.{i}.attn_norm.weight", 1 + 0.3 * rng.standard_normal(D))
        add(f"blk.{i}.ffn_norm.weight", 1 + 0.3 * rng.standard_normal(D))
        add(f"blk.{i}.ffn_gate.weight", 0.2 * rng.standard_normal((F, D)))
        add(f"blk.{i}.ffn_up.weight", 0.2 * rng.standard_normal((F, D)))
        add(f"blk.{i}.ffn_down.weight", 0.2 * rng.standard_normal((D, F)))
    add("output_norm.weight", 1 + 0.3 * rng.standard_normal(D))
    if not tied:
        add("output.weight", 0.2 * rng.standard_normal((V, D)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def hf_gguf_model(path: pathlib.Path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()


QUANTS = {"attn_q.weight": Q.Q4_0, "attn_k.weight": Q.Q4_1, "attn_v.weight": Q.Q8_0, "attn_output.weight": Q.F16,
          "ffn_gate.weight": Q.Q8_0, "ffn_up.weight": Q.Q4_1, "ffn_down.weight": Q.Q4_0, "token_embd.weight": Q.Q8_0,
          "output.weight": Q.F16}  # fmt: skip


@pytest.mark.parametrize("arch,tied", [("llama", False), ("qwen2", True), ("qwen3", False)])
def test_tiny_gguf_matches_transformers(tmp_path, arch, tied):
    path = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", arch, qtypes=QUANTS, tied=tied)
    cfg, params = load_pretrained(path)
    assert (cfg.architecture, cfg.tie_word_embeddings, cfg.qkv_bias, cfg.qk_norm) == (
        arch, tied, arch == "qwen2", arch == "qwen3")  # fmt: skip
    assert cfg.head_dim == (128 if arch == "qwen3" else H) and cfg.vocab_size == V
    model = hf_gguf_model(path)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    # weights: dequantized values identical; q/k un-permuted identically
    np.testing.assert_array_equal(np.asarray(params["layers"]["q"][1]).reshape(D, -1).T,
                                  sd["model.layers.1.self_attn.q_proj.weight"])  # fmt: skip
    np.testing.assert_array_equal(np.asarray(params["layers"]["k"][0]).reshape(D, -1).T,
                                  sd["model.layers.0.self_attn.k_proj.weight"])  # fmt: skip
    np.testing.assert_array_equal(np.asarray(params["layers"]["down"][0]).T, sd["model.layers.0.mlp.down_proj.weight"])
    ids = np.random.default_rng(1).integers(0, V, (2, 12))
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
    ours = forward(cfg, params, jnp.asarray(ids, jnp.int32))
    assert rel_err(ours, ref) < 1e-4


@pytest.mark.parametrize("factor,low,high", [(8.0, 1.0, 4.0), (8.0, 1.0, 8.0), (32.0, 2.0, 16.0)])
def test_gguf_llama3_rope_freqs(tmp_path, factor, low, high):
    freqs = llama_cpp_rope_factors(H, 10000.0, factor, low, high, 8192)
    path = write_tiny_gguf(tmp_path / "rope.gguf", "llama", rope_freqs=freqs)
    cfg, _ = load_pretrained(path)
    assert cfg.rope_scaling == RopeScaling("llama3", factor, low, high, 8192)


def test_gguf_errors(tmp_path):
    # unsupported quantization type (Q5_K: a valid GGUF type we do not dequantize)
    w = gguf.GGUFWriter(str(tmp_path / "q5k.gguf"), "llama")
    for fn, v in [(w.add_block_count, 1), (w.add_context_length, 64), (w.add_embedding_length, 256),
                  (w.add_feed_forward_length, 256), (w.add_head_count, 4), (w.add_head_count_kv, 4),
                  (w.add_layer_norm_rms_eps, 1e-6), (w.add_rope_freq_base, 1e4), (w.add_vocab_size, 4)]:  # fmt: skip
        fn(v)
    w.add_tensor("token_embd.weight", np.zeros((4, 176), np.uint8), raw_dtype=Q.Q5_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=r"'token_embd.weight' has quantization type Q5_K.*supported: \("):
        load_pretrained(tmp_path / "q5k.gguf")
    # missing tensor
    write_tiny_gguf(tmp_path / "missing.gguf", "llama", skip=("blk.1.ffn_down.weight",))
    with pytest.raises(CheckpointError, match="'blk.1.ffn_down.weight' not found in missing.gguf"):
        load_pretrained(tmp_path / "missing.gguf")
    # unsupported architecture
    w = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi3")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelConfigError, match="unsupported GGUF architecture 'phi3'; supported: \\('llama'"):
        load_pretrained(tmp_path / "phi.gguf")
    # rope_freqs that are not llama3 scaling
    write_tiny_gguf(tmp_path / "rope.gguf", "llama", rope_freqs=np.linspace(1, 3, H // 2))
    with pytest.raises(ModelConfigError, match="rope_freqs tensor .* is not a llama3 RoPE scaling"):
        load_pretrained(tmp_path / "rope.gguf")
    # truncated file
    good = write_tiny_gguf(tmp_path / "good.gguf", "qwen2").read_bytes()
    (tmp_path / "trunc.gguf").write_bytes(good[: len(good) // 3])
    with pytest.raises(CheckpointError, match="trunc.gguf is not a readable GGUF file"):
        load_pretrained(tmp_path / "trunc.gguf")


# ----------------------------------------------------------------------------------------------- real SmolLM2
@pytest.mark.slow
def test_smollm2_config_matches_published(smollm2):
    cfg, params = smollm2
    # HuggingFaceTB/SmolLM2-135M-Instruct config.json
    assert (cfg.architecture, cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (
        "llama", 49152, 576, 1536, 30)  # fmt: skip
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta, cfg.rms_norm_eps) == (
        9, 3, 64, 100000.0, 1e-5)  # fmt: skip
    assert cfg.tie_word_embeddings and cfg.rope_scaling is None and cfg.eos_token_ids == (2,)
    chex.assert_shape(params["layers"]["q"], (30, 576, 9, 64))
    assert sum(x.size for x in jax.tree.leaves(params)) == 134_515_008  # published SmolLM2-135M count
    assert cfg == get_preset("smollm2-135m")


@pytest.mark.slow
def test_smollm2_matches_transformers_gguf_loading(smollm2, smollm2_gguf, smollm2_hf_model):
    cfg, params = smollm2
    model = smollm2_hf_model  # transformers' own load of the GGUF
    sd = model.state_dict()
    for ours, theirs in [(params["layers"]["q"][7].reshape(576, -1).T, "model.layers.7.self_attn.q_proj.weight"),
                         (params["layers"]["k"][29].reshape(576, -1).T, "model.layers.29.self_attn.k_proj.weight"),
                         (params["embed"], "model.embed_tokens.weight")]:  # fmt: skip
        np.testing.assert_array_equal(np.asarray(ours), sd[theirs].numpy())
    tok = load_tokenizer(smollm2_gguf)
    texts = ["The quick brown fox jumps over the lazy dog.", "2 + 2 ="]
    rows = [tok(t)["input_ids"] for t in texts]
    with torch.no_grad():
        refs = [model(torch.tensor([r])).logits[0].numpy() for r in rows]
    W = max(map(len, rows))
    ids = np.zeros((2, W), np.int32)
    mask = np.zeros((2, W), bool)
    for i, r in enumerate(rows):  # left padding
        ids[i, W - len(r) :], mask[i, W - len(r) :] = r, True
    ours = np.asarray(jax.jit(forward, static_argnums=0)(cfg, params, jnp.asarray(ids), None, jnp.asarray(mask)))
    for i in range(2):
        err = rel_err(ours[i][mask[i]], refs[i])
        assert err < 1e-4, err


@pytest.mark.slow
def test_smollm2_greedy_answer(smollm2, smollm2_gguf):
    cfg, params = smollm2
    tok = load_tokenizer(smollm2_gguf)
    assert tok.chat_template
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, tokenize=False)  # fmt: skip
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    n_new, W = 12, len(ids) + 12
    buf = np.zeros((1, W), np.int32)
    buf[0, : len(ids)] = ids

    @jax.jit
    def next_token(params, buf, length):
        mask = jnp.arange(W)[None] < length
        h = hidden_states(cfg, params, buf, attention_mask=mask)[:, length - 1]  # right padding: one compile
        return jnp.argmax(h @ lm_head(cfg, params), axis=-1)

    length = len(ids)
    for _ in range(n_new):
        t = int(next_token(params, jnp.asarray(buf), length)[0])
        buf[0, length] = t
        length += 1
        if t in cfg.eos_token_ids or t == tok.convert_tokens_to_ids("<|im_end|>"):
            break
    answer = tok.decode(buf[0, len(ids) : length], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.slow
def test_tokenizer_from_gguf_saves_and_reloads_as_hf_dir(smollm2_gguf, tmp_path):
    tok = load_tokenizer(smollm2_gguf)
    tok.save_pretrained(tmp_path)
    tok2 = load_tokenizer(tmp_path)
    text = "Janet has 3 apples. 2 + 2 = 4!"
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]
    msgs = [{"role": "user", "content": "hi"}]
    assert tok2.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs, tokenize=False)
    assert tok.convert_ids_to_tokens(2) == "<|im_end|>"
