# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""A GGUF file's tokenizer, rebuilt without torch: `gguf` reads the metadata, `tokenizers` builds a fast tokenizer.

transformers' own GGUF tokenizer path (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``) reads the file with a
torch-based reader, so it fails on an install without torch. This module reads the same metadata keys (llama.cpp's
GGUF spec, https://github.com/ggml-org/ggml/blob/master/docs/gguf.md, "tokenizer.ggml.*" and
"tokenizer.chat_template") with the `gguf` package and builds the tokenizer they describe:

* ``tokenizer.ggml.model == "gpt2"``: byte-level BPE (Radford et al. 2019; GPT-2's byte-to-unicode alphabet), the
  file's merges, text split by the regex ``tokenizer.ggml.pre`` names (Llama 3 and Qwen2 families; GPT-2's own
  split otherwise), byte-level decoding.
* ``tokenizer.ggml.model == "llama"``: SentencePiece-style BPE (Kudo & Richardson 2018) over ``▁``-marked pieces with
  byte fallback (``<0x..>`` tokens); merges from the file, or derived from the vocabulary and its scores.

Tokens the file types CONTROL (3) become special added tokens, USER_DEFINED (4) plain added tokens, so both are
matched whole. BOS/EOS/UNK/PAD are the tokens at the ``*_token_id`` keys; ``tokenizer.ggml.add_bos_token`` /
``add_eos_token`` decide what plain-text encoding adds. The result is a ``transformers.PreTrainedTokenizerFast``
carrying the file's chat template; it encodes, decodes and renders chats as transformers' GGUF tokenizer does
(``tests/test_gguf_tokenizer.py`` checks this on the SmolLM2 GGUF).
"""

from __future__ import annotations

import os
from typing import Any

import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from jaxgrpo.errors import ConfigError
from jaxgrpo.files import gguf_reader

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types (gguf.TokenType)
SPIECE_SPACE = "\u2581"  # SentencePiece's word-boundary marker

# Pre-tokenizer split regexes, keyed by `tokenizer.ggml.pre` (as the models' own tokenizer.json files define them).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2_SPLIT),
}


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (openai/gpt-2, ``encoder.py: bytes_to_unicode``).

    Printable Latin-1 bytes map to themselves; the other 68 bytes to code points 256, 257, ... in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def read_tokenizer_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The ``tokenizer.*`` metadata of a GGUF file (keys without the ``tokenizer.`` prefix), read with `gguf`."""
    reader = gguf_reader(path)
    meta = {k[len("tokenizer.") :]: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    if "ggml.tokens" not in meta:
        raise ConfigError(f"{path}: the GGUF file has no tokenizer (tokenizer.ggml.tokens); set model.tokenizer")
    return meta


def _merges(meta: dict[str, Any], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The file's merges, or (SentencePiece files often store none) every split of a token into two vocabulary
    tokens, ranked by the merged token's score, best first (ties: the pieces' ids), as SentencePiece's BPE ranks."""
    if "ggml.merges" in meta:
        return [tuple(m.split(" ", 1)) for m in meta["ggml.merges"]]  # type: ignore[misc]
    scores = meta.get("ggml.scores")
    if scores is None:
        raise ConfigError("the GGUF tokenizer has neither merges nor scores; set model.tokenizer to an HF directory")
    ranked = []
    for token, score in zip(meta["ggml.tokens"], scores):
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _byte_level_bpe(meta: dict[str, Any]) -> Tokenizer:
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    types = meta.get("ggml.token_type") or ()
    vocab = {}
    for i, token in enumerate(meta["ggml.tokens"]):
        added = i < len(types) and types[i] in (CONTROL, USER_DEFINED)  # llama.cpp stores these as raw text, and
        if not added and not set(token) <= alphabet:  # they are matched as text (`gguf_tokenizer`): keep their key
            token = "".join(spelling[b] for b in token.encode("utf-8"))  # stored as raw text: respell it
        vocab[token] = i
    backend = Tokenizer(models.BPE(vocab=vocab, merges=_merges(meta, vocab), continuing_subword_prefix="",
                                   end_of_word_suffix="", fuse_unk=False))  # fmt: skip
    split = PRE_TOKENIZER_SPLITS.get(meta.get("ggml.pre", ""))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's own split
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])  # fmt: skip
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_bpe(meta: dict[str, Any], unk: str | None) -> Tokenizer:
    vocab = {token: i for i, token in enumerate(meta["ggml.tokens"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=_merges(meta, vocab), unk_token=unk, fuse_unk=True,
                                   byte_fallback=True))  # fmt: skip
    add_prefix = bool(meta.get("ggml.add_space_prefix", True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPIECE_SPACE, prepend_scheme="first" if add_prefix else "never", split=False)
    steps = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    return backend


def _special(meta: dict[str, Any], key: str) -> str | None:
    token_id = meta.get(f"ggml.{key}")
    tokens = meta["ggml.tokens"]
    return tokens[int(token_id)] if token_id is not None and 0 <= int(token_id) < len(tokens) else None


def gguf_tokenizer(path: str | os.PathLike) -> transformers.PreTrainedTokenizerFast:
    """The tokenizer of the GGUF file at `path` (see the module docstring); no torch needed."""
    meta = read_tokenizer_metadata(path)
    kind = meta.get("ggml.model")
    bos, eos = _special(meta, "bos_token_id"), _special(meta, "eos_token_id")
    unk, pad = _special(meta, "unknown_token_id"), _special(meta, "padding_token_id")
    if kind == "gpt2":
        backend = _byte_level_bpe(meta)
        add_bos = bool(meta.get("ggml.add_bos_token", False))
    elif kind == "llama":
        backend = _sentencepiece_bpe(meta, unk)
        add_bos = bool(meta.get("ggml.add_bos_token", True))  # llama.cpp's default for SentencePiece vocabularies
    else:
        raise ConfigError(
            f"{path}: GGUF tokenizer type {kind!r} is not supported (supported: gpt2, llama); set model.tokenizer "
            "to the model's HF tokenizer directory")
    add_eos = bool(meta.get("ggml.add_eos_token", False))

    types = meta.get("ggml.token_type") or ()  # control and user-defined tokens: raw text, their vocabulary keys
    control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(meta["ggml.tokens"], types)
               if ty == CONTROL]  # fmt: skip
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(meta["ggml.tokens"], types)
            if ty == USER_DEFINED]  # fmt: skip
    backend.add_special_tokens(control)
    backend.add_tokens(user)

    single, ids = "$A:0", []
    if add_bos and bos is not None:
        single = f"{bos}:0 {single}"
        ids.append((bos, backend.token_to_id(bos)))
    if add_eos and eos is not None:
        single = f"{single} {eos}:0"
        ids.append((eos, backend.token_to_id(eos)))
    pair = single + (f" {bos}:1" if add_bos and bos is not None else "") + " $B:1"
    pair += f" {eos}:1" if add_eos and eos is not None else ""
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=ids)

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, unk_token=unk, pad_token=pad,
        add_bos_token=add_bos, add_eos_token=add_eos, clean_up_tokenization_spaces=False)  # fmt: skip
    template = meta.get("chat_template")
    if template:
        tok.chat_template = template
    return tok
