# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Prompts for RL: GSM8K (hub or local files), synthetic arithmetic, a resumable iterator, prompt encoding.

* ``Example(prompt, answer, meta)`` (`jaxgrpo.example`): one task; ``answer`` is the canonical gold answer string.
* GSM8K (Cobbe et al. 2021): ``datasets.load_dataset(data.hf_id, data.hf_config, split=data.split)``, or, offline,
  ``data.path`` = a ``.jsonl`` / ``.parquet`` file or a directory holding ``{split}.jsonl`` / ``{split}.parquet``
  (or the hub's ``**/{split}-*.parquet`` shards; of a snapshot holding several configurations, those of the folder
  named by ``data.hf_config``, GSM8K's ``main`` by default). Rows need a ``question`` and an ``answer`` whose gold
  number follows ``####``; the gold is normalised (``"1,000"`` → ``"1000"``). A malformed row is a `DataError` naming
  the file, the line (row) number and the field.
* Any `datasets` dataset (``data.source=hf``): ``data.columns`` names the prompt and answer columns; a prompt may be
  a string or a chat (list of ``{role, content}``), see `jaxgrpo.hf_dataset`. ``data.path`` reads local files.
* ``synthetic_arithmetic(n, difficulty, seed)``: verifiable arithmetic whose difficulty knob moves a small model
  between the all-fail, mixed and all-pass regimes of GRPO groups (`jaxgrpo.synthetic`, re-exported here).
* ``PromptIterator``: epoch-wise permutations drawn from ``numpy.random.default_rng([seed, epoch])``; its
  ``state()`` (epoch, position) is checkpointed, so a resumed run sees exactly the prompts of the uninterrupted one.
* ``encode_prompts``: the tokenizer's chat template (``data.template=chat``, as for real chat models) or plain text.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from jaxgrpo import hf_dataset, word_arithmetic
from jaxgrpo.config import DataConfig
from jaxgrpo.errors import DataError
from jaxgrpo.example import Example
from jaxgrpo.rewards import extract_answer, format_number, normalize_number
from jaxgrpo.synthetic import (
    DIFFICULTY_LEVELS,
    MAX_DIFFICULTY,
    SYNTHETIC_DEFAULT_SIZE,
    describe_difficulty,
    synthetic_arithmetic,
)

T = TypeVar("T")

# -- GSM8K ---------------------------------------------------------------------------------------------------------


def gsm8k_example(row: Any, where: str, index: int) -> Example:
    """Converts one GSM8K row ({"question", "answer": "...#### n"}); `where` names it in errors ("f.jsonl line 3")."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object with 'question' and 'answer', got {type(row).__name__}")
    for field in ("question", "answer"):
        if field not in row:
            raise DataError(f"{where}: missing field {field!r} (found fields: {sorted(row)})")
        if not isinstance(row[field], str) or not row[field].strip():
            raise DataError(f"{where}: field {field!r} must be a non-empty string, got {row[field]!r}")
    solution = row["answer"]
    if "####" not in solution:
        raise DataError(f"{where}: field 'answer' has no '#### <number>' final answer: {solution[-80:]!r}")
    gold = normalize_number(extract_answer(solution, "strict"))
    if gold is None:
        tail = solution[solution.rfind("####") :][:80]
        raise DataError(f"{where}: field 'answer' has no number after its last '####': {tail!r}")
    return Example(
        prompt=row["question"].strip(),
        answer=format_number(gold),
        meta={"source": "gsm8k", "index": index, "where": where, "solution": solution},
    )


def _read_jsonl(path: pathlib.Path) -> Iterable[tuple[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path} line {lineno}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from e


def _read_parquet(path: pathlib.Path) -> Iterable[tuple[str, Any]]:
    import pyarrow.parquet as pq

    for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
        yield f"{path} row {i}", row


def _local_files(path: str, split: str, config: str | None = None) -> list[pathlib.Path]:
    p = pathlib.Path(path).expanduser()
    if not p.exists():
        raise DataError(f"data.path={path!r} does not exist; point it at a .jsonl/.parquet file or a directory")
    if p.is_file():
        if p.suffix not in (".jsonl", ".json", ".parquet"):
            raise DataError(f"data.path={path!r}: unsupported file type {p.suffix!r}; use .jsonl or .parquet")
        return [p]
    for name in (f"{split}.jsonl", f"{split}.parquet"):
        if (p / name).is_file():
            return [p / name]
    shards = sorted(p.rglob(f"{split}-*.parquet"))
    folders = sorted({x.parent.relative_to(p).as_posix() for x in shards})
    if len(folders) > 1:  # a hub snapshot of several configurations (GSM8K's main/ and socratic/): one of them
        picked = [f for f in folders if pathlib.PurePosixPath(f).name == config] if config else []
        if len(picked) != 1:
            raise DataError(f"data.path={path!r} holds {split}-*.parquet shards of several configurations {folders}; "
                            f"set data.hf_config to one of them (or point data.path at its folder)")  # fmt: skip
        shards = [x for x in shards if x.parent.relative_to(p).as_posix() == picked[0]]
    if shards:
        return shards
    present = sorted(x.name for x in p.iterdir())[:20]
    raise DataError(
        f"data.path={path!r} holds no {split}.jsonl, {split}.parquet or {split}-*.parquet for data.split={split!r}; "
        f"it contains: {present}"
    )


def local_rows(path: str, split: str = "train", config: str | None = None) -> Iterable[tuple[str, Any]]:
    """(where, row) pairs of the local ``.jsonl`` / ``.parquet`` file(s) that `data.path` and `data.split` name (of a
    hub snapshot holding several configurations, those of the folder named ``config``, `data.hf_config`)."""
    for file in _local_files(path, split, config):
        yield from _read_parquet(file) if file.suffix == ".parquet" else _read_jsonl(file)


def load_gsm8k_local(path: str, split: str = "train", config: str = "main") -> list[Example]:
    """GSM8K rows from a local file or directory (see the module docstring; of a snapshot holding both of GSM8K's
    configurations, the ``config`` folder's)."""
    examples = [gsm8k_example(row, where, i) for i, (where, row) in enumerate(local_rows(path, split, config))]
    if not examples:
        raise DataError(f"data.path={path!r} (split {split!r}) holds no rows")
    return examples


def load_gsm8k_hub(hf_id: str = "openai/gsm8k", hf_config: str = "main", split: str = "train") -> list[Example]:
    """GSM8K through `datasets.load_dataset(hf_id, hf_config, split=split)` (network or the local HF cache)."""
    import datasets

    try:
        ds = datasets.load_dataset(hf_id, hf_config, split=split)
    except Exception as e:  # offline, unknown id/split, ...: say how to work around it
        raise DataError(
            f"could not load {hf_id!r} ({hf_config}, split {split!r}) with datasets: {type(e).__name__}: {e}; "
            "offline, set data.path to a local copy (a directory with train.jsonl/test.jsonl)"
        ) from e
    return [gsm8k_example(row, f"{hf_id}[{hf_config}] {split} row {i + 1}", i) for i, row in enumerate(ds)]


def held_out_split(split: str) -> str:
    """The split a run that trains on ``split`` is evaluated on: ``pair-test`` for the words source's ``pair-train``
    (held out by the unordered operand pair, `jaxgrpo.word_arithmetic`), else ``test``."""
    return "pair-test" if split == "pair-train" else "test"


def held_out_config(cfg: DataConfig, num_examples: int | None) -> DataConfig:
    """The data section of the held-out evaluation of a run trained on ``cfg`` (`held_out_split`)."""
    return dataclasses.replace(cfg, split=held_out_split(cfg.split), num_examples=num_examples)


def load_dataset(cfg: DataConfig, seed: int) -> list[Example]:
    """The examples `cfg` describes (`data.source`: synthetic, gsm8k, hf or words), capped at `data.num_examples`
    (the first n). The sources that read ``data.path`` are `jaxgrpo.config_checks.FILE_SOURCES`."""
    if cfg.source == "synthetic":
        return synthetic_arithmetic(cfg.num_examples or SYNTHETIC_DEFAULT_SIZE, cfg.difficulty, seed, cfg.split)
    if cfg.source == "gsm8k":
        if cfg.path is not None:
            examples = load_gsm8k_local(cfg.path, cfg.split, cfg.hf_config or "main")
        else:
            examples = load_gsm8k_hub(cfg.hf_id, cfg.hf_config or "main", cfg.split)
        return examples[: cfg.num_examples] if cfg.num_examples else examples
    if cfg.source == "hf":  # any `datasets` dataset (jaxgrpo.hf_dataset)
        rows = (local_rows(cfg.path, cfg.split, cfg.hf_config) if cfg.path
                else hf_dataset.hub_rows(cfg.hf_id, cfg.hf_config, cfg.split))  # fmt: skip
        examples = hf_dataset.hf_examples(rows, cfg.columns)
        return examples[: cfg.num_examples] if cfg.num_examples else examples
    if cfg.source == "words":  # arithmetic asked in words, for pretrained chat models (jaxgrpo.word_arithmetic)
        n = cfg.num_examples or word_arithmetic.default_size(cfg.difficulty, cfg.split)
        return word_arithmetic.word_arithmetic(n, cfg.difficulty, seed, cfg.split)
    raise DataError(f"data.source={cfg.source!r} is not a known source; valid choices: synthetic, gsm8k, words, hf")


# -- iteration -------------------------------------------------------------------------------------------------------


class PromptIterator(Generic[T]):
    """Endless batches over `items`, one permutation per epoch from ``default_rng([seed, epoch])``.

    A batch that crosses an epoch boundary takes the rest of this epoch and continues with the next one's
    permutation. ``state()`` → ``{"epoch", "position", "seed", "num_items", "shuffle"}`` (JSON-able ints/bools);
    ``restore(state)`` continues exactly there and refuses a state from a different dataset size, seed or shuffle.
    """

    def __init__(self, items: Sequence[T], batch_size: int, seed: int, shuffle: bool = True):
        if len(items) == 0:
            raise DataError("PromptIterator: the dataset is empty")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise DataError(f"PromptIterator: batch_size must be a positive int, got {batch_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise DataError(f"PromptIterator: seed must be a non-negative int, got {seed!r}")
        self.items = items
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = bool(shuffle)
        self.epoch = 0
        self.position = 0
        self._order: np.ndarray | None = None

    def _epoch_order(self) -> np.ndarray:
        if self._order is None:
            n = len(self.items)
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, self.epoch]).permutation(n)
            else:
                self._order = np.arange(n)
        return self._order

    def next_batch(self, size: int | None = None) -> list[T]:
        """The next `size` (default `batch_size`) items."""
        size = self.batch_size if size is None else size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise DataError(f"PromptIterator.next_batch: size must be a positive int, got {size!r}")
        n = len(self.items)
        out: list[T] = []
        while len(out) < size:
            take = min(size - len(out), n - self.position)
            out.extend(self.items[int(j)] for j in self._epoch_order()[self.position : self.position + take])
            self.position += take
            if self.position == n:
                self.epoch, self.position, self._order = self.epoch + 1, 0, None
        return out

    def state(self) -> dict[str, int | bool]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_items": len(self.items),
                "shuffle": self.shuffle}

    def restore(self, state: dict[str, Any]) -> None:
        missing = {"epoch", "position"} - set(state)
        if missing:
            raise DataError(f"PromptIterator.restore: state lacks {sorted(missing)} (got {state!r})")
        for key, mine in (("num_items", len(self.items)), ("seed", self.seed), ("shuffle", self.shuffle)):
            if key in state and state[key] != mine:
                raise DataError(
                    f"PromptIterator.restore: the checkpoint's {key}={state[key]!r} differs from this run's {mine!r}; "
                    "resume with the same data settings and seed as the interrupted run"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < len(self.items):
            raise DataError(f"PromptIterator.restore: invalid epoch/position {epoch}/{position}")
        self.epoch, self.position, self._order = epoch, position, None


# -- encoding --------------------------------------------------------------------------------------------------------


def prompt_text(tokenizer: Any, example: Example, cfg: DataConfig) -> tuple[str, bool]:
    """(text to tokenize, whether the tokenizer should add its special tokens) for one example."""
    if cfg.template == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(
                f"data.template=chat but the tokenizer {type(tokenizer).__name__} has no chat template; "
                "set data.template=plain"
            )
        chat = example.meta.get("messages") or [{"role": "user", "content": example.prompt}]
        messages = list(chat)
        if cfg.system_prompt and chat[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": cfg.system_prompt})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text, False  # the template already holds BOS etc.
    if cfg.template == "plain":  # a chat row's messages: their contents, one paragraph each
        chat = example.meta.get("messages")
        prompt = "\n\n".join(m["content"] for m in chat) if chat else example.prompt
        own_system = bool(chat) and chat[0]["role"] == "system"  # a chat's system turn wins, as with the template
        text = f"{cfg.system_prompt}\n\n{prompt}" if cfg.system_prompt and not own_system else prompt
        return text, True
    raise DataError(f"data.template={cfg.template!r} is not known; valid choices: chat, plain")


def encode_prompts(tokenizer: Any, examples: Sequence[Example], cfg: DataConfig) -> list[list[int]]:
    """Token ids of each example's prompt (chat template or plain text), checked against `data.max_prompt_tokens`.

    Errors name the example's index: a prompt longer than `data.max_prompt_tokens`, an empty encoding, or
    characters the tokenizer maps to its unknown token.
    """
    if not examples:
        return []
    rendered = [prompt_text(tokenizer, e, cfg) for e in examples]
    special = rendered[0][1]
    texts = [text for text, _ in rendered]
    unk = getattr(tokenizer, "unk_token_id", None)
    enc = tokenizer(texts, add_special_tokens=special, return_offsets_mapping=unk is not None)
    out = []
    for i, (example, text) in enumerate(zip(examples, texts)):
        ids = list(enc["input_ids"][i])
        if not ids:
            raise DataError(f"example {i}: the prompt {example.prompt!r} encodes to no tokens")
        if unk is not None and unk in ids:
            spans = [text[a:b] for t, (a, b) in zip(ids, enc["offset_mapping"][i]) if t == unk]
            raise DataError(
                f"example {i}: the tokenizer cannot represent {sorted(set(spans))} in prompt {example.prompt[:60]!r} "
                "(they encode to its unknown token); use a tokenizer that covers them or change the text"
            )
        if len(ids) > cfg.max_prompt_tokens:
            raise DataError(
                f"example {i}: the prompt is {len(ids)} tokens, longer than data.max_prompt_tokens="
                f"{cfg.max_prompt_tokens}; raise data.max_prompt_tokens (or shorten data.system_prompt)"
            )
        out.append(ids)
    return out


__all__ = [
    "DIFFICULTY_LEVELS",
    "MAX_DIFFICULTY",
    "SYNTHETIC_DEFAULT_SIZE",
    "DataError",
    "Example",
    "describe_difficulty",
    "PromptIterator",
    "encode_prompts",
    "gsm8k_example",
    "load_dataset",
    "load_gsm8k_hub",
    "load_gsm8k_local",
    "prompt_text",
    "synthetic_arithmetic",
]
