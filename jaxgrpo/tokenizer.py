# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""A character-level tokenizer made in code, for the from-scratch demo model (``model.tokenizer=builtin:arithmetic``).

Built with the `tokenizers` library (a WordLevel model over single characters, each character its own pre-token)
and wrapped as a ``transformers.PreTrainedTokenizerFast``, so the trainer treats it exactly like a pretrained
model's tokenizer: prompts go through ``apply_chat_template``, completions through ``batch_decode``, and
``save_pretrained`` / ``AutoTokenizer.from_pretrained`` round-trip it.

Vocabulary (``len(tok) == 60``, ids fixed by the order below):

* special tokens: ``<pad>`` (0), ``<unk>`` (1), ``<bos>`` (2), ``<eos>`` (3, also the end of every chat turn),
  ``<|system|>``, ``<|user|>``, ``<|assistant|>`` (role markers);
* digits ``0-9``; space, newline and ``+-*/=().,?:%#!'``; lowercase ``a-z`` (enough for short system prompts).

Any other character (e.g. an uppercase letter) encodes to ``<unk>``; ``data.encode_prompts`` rejects such prompts.

Chat template (Jinja, stored on the tokenizer)::

    <bos>{for each message: <|role|> content <eos>}{if add_generation_prompt: <|assistant|>}

so ``[{"role": "user", "content": "3+4="}]`` renders as ``<bos><|user|>3+4=<eos><|assistant|>`` and a trained
model answers ``7<eos>``. Plain-text encoding (``add_special_tokens=True``) prepends ``<bos>``.
"""

from __future__ import annotations

import string

import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS, *ROLE_TOKENS)
CHARACTERS = tuple(string.digits) + tuple(" \n+-*/=().,?:%#!'") + tuple(string.ascii_lowercase)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('arithmetic_tokenizer: unknown chat role ' ~ message['role']) }}"
    "{% endif %}"
    "{{ '<|' ~ message['role'] ~ '|>' ~ message['content'] ~ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def arithmetic_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """The character-level tokenizer described in the module docstring (a fresh object on every call)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every character is its own pre-token ([\s\S] also matches newlines); special tokens are matched before this.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # concatenate characters, no separator
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        additional_special_tokens=list(ROLE_TOKENS),
        clean_up_tokenization_spaces=False,
        padding_side="left",
        model_max_length=4096,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok
