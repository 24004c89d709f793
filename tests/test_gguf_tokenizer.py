# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The torch-free GGUF tokenizer (`jaxgrpo.gguf_tokenizer`) against transformers' own GGUF tokenizer.

transformers reads GGUF metadata with its torch-based reader and builds the tokenizer with its own converter classes
(torch is installed in the test environment, so it serves as the independent reference). Both must agree on:
token ids of varied text (unicode, digits, whitespace runs, special tokens written in the text), decoding (with and
without special tokens, ids that split a UTF-8 character), chat templates and the special-token ids.

1. The real SmolLM2-135M-Instruct GGUF (byte-level BPE, ``tokenizer.ggml.model = gpt2``).
2. A SentencePiece-style vocabulary (``tokenizer.ggml.model = llama``, byte fallback, no merges stored: they come
   from the scores) written here with `gguf.GGUFWriter`.
3. The training entry point on the SmolLM2 GGUF never imports torch (checked in a fresh interpreter).
"""

import pathlib
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch  # noqa: F401  (required: transformers converts the GGUF tokenizer with it)

from jaxgrpo.errors import ConfigError
from jaxgrpo.files import gguf_reader
from jaxgrpo.gguf_tokenizer import byte_alphabet, gguf_tokenizer
from jaxgrpo.models import load_tokenizer as transformers_gguf_tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "1234567890 3.14159 -42 1,000,000 2+2=4 #### 72",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\r\nand   runs   of    spaces",
    "Ünïcödé: café, naïve, Straße, Ελληνικά, русский, 中文字符, 日本語のテキスト, 한국어",
    "emoji 🙂🚀 and combining e\u0301 and zero\u200bwidth",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after a special token<|im_end|>",
    "it's we're they'll I'd you've DON'T",
    "",
    " ",
    "\n",
    "```python\ndef f(x):\n    return x ** 2\n```",
]
CHATS = [
    [{"role": "user", "content": "What is 3 + 4?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Ünïcödé 中文 🙂"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b\n\nc"}, {"role": "user", "content": "d"}],
]


def _assert_same(ours, ref, texts, chats, rng):
    assert len(ours) == len(ref)
    assert ours.get_vocab() == ref.get_vocab()
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(ours, name) == getattr(ref, name), name
    assert sorted(ours.all_special_ids) == sorted(ref.all_special_ids)
    for text in texts:
        for special in (True, False):
            assert ours(text, add_special_tokens=special)["input_ids"] == ref(text, add_special_tokens=special)[
                "input_ids"], (text, special)  # fmt: skip
        ids = ref(text)["input_ids"]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), text
    batch = ours(texts, return_offsets_mapping=True)
    ref_batch = ref(texts, return_offsets_mapping=True)
    assert batch["input_ids"] == ref_batch["input_ids"]
    assert batch["offset_mapping"] == ref_batch["offset_mapping"]
    random_ids = rng.integers(0, len(ref), size=(20, 12)).tolist()  # arbitrary ids: partial UTF-8 bytes included
    assert ours.batch_decode(random_ids) == ref.batch_decode(random_ids)
    assert ours.batch_decode(random_ids, skip_special_tokens=True) == ref.batch_decode(
        random_ids, skip_special_tokens=True)  # fmt: skip
    assert ours.chat_template == ref.chat_template
    for chat in chats:
        for gen in (True, False):
            text = ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            assert text == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            assert ours(text, add_special_tokens=False)["input_ids"] == ref(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def smollm2_tokenizers(smollm2_gguf):
    return gguf_tokenizer(smollm2_gguf), transformers_gguf_tokenizer(smollm2_gguf)


def test_smollm2_matches_transformers(smollm2_tokenizers):
    ours, ref = smollm2_tokenizers
    _assert_same(ours, ref, TEXTS, CHATS, np.random.default_rng(0))
    assert ours.eos_token == "<|im_end|>" and ours.bos_token == "<|im_start|>"
    assert ours("hi")["input_ids"] == ours("hi", add_special_tokens=False)["input_ids"]  # the file: no BOS added
    assert ours.decode(ours("Straße 中文 🙂")["input_ids"]) == "Straße 中文 🙂"


def test_smollm2_gsm8k_prompts_match(smollm2_tokenizers, gsm8k_dir):
    import json

    ours, ref = smollm2_tokenizers
    with open(gsm8k_dir / "test.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(64), f)]
    texts = [r["question"] for r in rows] + [r["answer"] for r in rows]
    assert ours(texts)["input_ids"] == ref(texts)["input_ids"]


def test_byte_alphabet_is_a_bijection_onto_the_byte_level_alphabet():
    from tokenizers import pre_tokenizers

    table = byte_alphabet()
    assert sorted(table) == list(range(256))
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("a")] == "a"


def _write_sentencepiece_gguf(path: pathlib.Path, add_bos: bool | None) -> pathlib.Path:
    """A small SentencePiece-style vocabulary: <unk> <s> </s>, 256 byte tokens, characters and merged pieces."""
    sp = "\u2581"
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789") + [sp, ".", ",", "?", "T"]
    pieces = [sp + "t", "he", sp + "the", "in", sp + "a", "er", "ll", "llo", sp + "h", sp + "hello", "an", sp + "an",
              "12", "123", sp + "1", "on", sp + "on", "e" + sp]  # fmt: skip
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + chars + pieces + ["<tool>"]
    types = [2, 3, 3] + [6] * 256 + [1] * (len(chars) + len(pieces)) + [4]
    scores = [0.0] * (3 + 256) + [-100.0 - i for i in range(len(chars))] + [-1.0 - i for i in range(len(pieces))]
    scores += [0.0]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_chat_template("{% for m in messages %}{{ bos_token }}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}"
                        "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("add_bos", [None, False])
def test_sentencepiece_gguf_matches_transformers(tmp_path, add_bos):
    path = _write_sentencepiece_gguf(tmp_path / "sp.gguf", add_bos)
    ours, ref = gguf_tokenizer(path), transformers_gguf_tokenizer(path)
    texts = ["hello the tan 123 on", " the  hello", "Hello, the 1234?", "ünï 中 🙂 é", "a<s>b</s>c<tool>d", "\n\tx",
             "", "e e e"]  # fmt: skip
    _assert_same(ours, ref, texts, [[{"role": "user", "content": "hello the 12"}]], np.random.default_rng(1))
    assert (ours("the")["input_ids"][0] == 1) == (add_bos is None)  # llama.cpp adds BOS unless the file says not


def test_byte_level_added_tokens_of_any_script_keep_their_ids(tmp_path):
    """llama.cpp stores a byte-level vocabulary's control and user-defined tokens as raw text, DeepSeek-R1-Distill's
    full-width ones included: they keep their ids (BOS 256, EOS 257, 258 for the user marker), the vocabulary does not
    grow, and BOS is added (``add_bos_token``); by hand from the file's layout."""
    table = byte_alphabet()
    bar, sp = "\uff5c", "\u2581"  # full-width vertical bar, SentencePiece's space
    bos, eos, user = f"<{bar}begin{sp}of{sp}sentence{bar}>", f"<{bar}end{sp}of{sp}sentence{bar}>", f"<{bar}User{bar}>"
    tokens = [table[b] for b in range(256)] + [bos, eos, user, "hi"]
    path = tmp_path / "bl.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3, 3, 4, 1])
    w.add_token_merges(["h i"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = gguf_tokenizer(path)
    assert len(tok) == 260 and (tok.bos_token_id, tok.eos_token_id) == (256, 257)
    assert tok.convert_tokens_to_ids(user) == 258
    assert tok(f"hi{user}a")["input_ids"] == [256, 259, 258, ord("a")]
    assert tok.decode([256, 259, 258, 257], skip_special_tokens=True) == f"hi{user}"


def test_a_gguf_file_is_parsed_once_per_version(tmp_path):
    """The model loader, the tokenizer and the compile tool share one parse of a file; a rewritten file is parsed
    again."""
    path = _write_sentencepiece_gguf(tmp_path / "sp.gguf", None)
    first = gguf_reader(path)
    assert gguf_reader(str(tmp_path / "." / "sp.gguf")) is first
    assert "tokenizer.ggml.add_bos_token" not in first.fields
    _write_sentencepiece_gguf(path, False)
    again = gguf_reader(path)
    assert again is not first and again.fields["tokenizer.ggml.add_bos_token"].contents() is False


def test_unsupported_tokenizer_type_is_a_config_error(tmp_path):
    path = tmp_path / "bert.gguf"
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_tokenizer_model("bert")
    w.add_token_list(["[PAD]", "a"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConfigError, match="'bert' is not supported"):
        gguf_tokenizer(path)


@pytest.mark.slow
def test_train_on_smollm2_gguf_imports_no_torch(smollm2_gguf, gsm8k_dir):
    """Building the policy and encoding prompts for the SmolLM2 config (everything the train CLI does before the
    first step) in a fresh interpreter leaves torch unimported."""
    code = f"""
import sys, jax
from jaxgrpo import build, data
from jaxgrpo.config import load_config
cfg = load_config("configs/smollm2_gsm8k.yaml", ["data.path={gsm8k_dir}", "data.num_examples=4"])
mcfg, params, tok = build.build_policy(cfg, jax.random.key(0))
examples = data.load_dataset(cfg.data, 0)
assert data.encode_prompts(tok, examples, cfg.data)
bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert not bad, bad
print("ok", type(tok).__name__)
"""
    repo = pathlib.Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok PreTrainedTokenizerFast" in out.stdout or "ok TokenizersBackend" in out.stdout
