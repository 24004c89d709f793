# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Any `datasets` dataset (``data.source=hf``): rows with a prompt column and a gold-answer column.

``data.columns`` maps the roles to column names (``{prompt: question, answer: answer}``; a role left out is looked up
under its own name). A prompt cell is either

* a string: the user turn (``data.system_prompt``, if set, goes before it), or
* a chat, a list of ``{"role", "content"}`` messages (the conversational format of TRL's datasets): the prompt is the
  messages up to and including the last ``user`` turn (a trailing assistant reply, e.g. the reference solution of an
  SFT dataset, is dropped); ``data.system_prompt`` is added only when the chat has no system turn of its own.

The answer cell is a string or a number; a GSM8K-style solution ``"... #### 42"`` is reduced to what follows its last
``####`` (the convention of GSM8K-derived sets), so numeric rewards see the final answer. Rows come from
``datasets.load_dataset(data.hf_id, data.hf_config, split=data.split)`` (the hub, the HF cache offline, or a local
directory of data files) or, with ``data.path``, from local ``.jsonl`` / ``.parquet`` files read as for GSM8K.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jaxgrpo.errors import DataError
from jaxgrpo.example import Example

ROLES = ("prompt", "answer")  # the keys of data.columns
CHAT_ROLES = ("system", "user", "assistant", "tool")


def column_names(columns: Mapping[str, str]) -> tuple[str, str]:
    """(prompt column, answer column) for a ``data.columns`` mapping; a role left out keeps its own name."""
    unknown = sorted(set(columns) - set(ROLES))
    if unknown:
        raise DataError(f"data.columns has {unknown}; its keys are {list(ROLES)} (e.g. data.columns.prompt=question)")
    return columns.get("prompt", "prompt"), columns.get("answer", "answer")


def _messages(value: list, where: str, column: str) -> list[dict[str, str]]:
    """The chat up to and including its last user turn, each message checked to be {role, content} strings."""
    chat = []
    for j, m in enumerate(value):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: column {column!r} message {j} must be a {{'role': str, 'content': str}} "
                            f"mapping, got {str(m)[:80]}")  # fmt: skip
        if m["role"] not in CHAT_ROLES:
            raise DataError(f"{where}: column {column!r} message {j} has role {m['role']!r}; chat roles are "
                            f"{', '.join(CHAT_ROLES)}")  # fmt: skip
        chat.append({"role": m["role"], "content": m["content"]})
    users = [j for j, m in enumerate(chat) if m["role"] == "user"]
    if not users:
        raise DataError(f"{where}: column {column!r} is a chat without a user turn; the prompt ends at the last one")
    return chat[: users[-1] + 1]


def gold_answer(value: Any, where: str, column: str) -> str:
    """The answer cell as the gold string: numbers as written, a ``#### n`` solution reduced to ``n``."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataError(f"{where}: column {column!r} must be a string or a number, got {type(value).__name__}")
    text = str(value).strip()
    if "####" in text:
        text = text[text.rfind("####") + 4 :].strip()
    if not text:
        raise DataError(f"{where}: column {column!r} is empty")
    return text


def hf_example(row: Any, columns: Mapping[str, str], where: str, index: int) -> Example:
    """One row as an `Example` (see the module docstring); errors name the row and the missing or bad column."""
    prompt_col, answer_col = column_names(columns)
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: expected a row with columns, got {type(row).__name__}")
    for role, col in (("prompt", prompt_col), ("answer", answer_col)):
        if col not in row:
            raise DataError(f"{where}: no column {col!r} for the {role} (columns: {sorted(row)}); map it with "
                            f"data.columns.{role}=<column>")  # fmt: skip
    cell = row[prompt_col]
    meta: dict[str, Any] = {"source": "hf", "index": index, "where": where}
    if isinstance(cell, str):
        if not cell.strip():
            raise DataError(f"{where}: column {prompt_col!r} is empty")
        prompt = cell.strip()
    elif isinstance(cell, list):
        meta["messages"] = _messages(cell, where, prompt_col)
        prompt = meta["messages"][-1]["content"]
    else:
        raise DataError(f"{where}: column {prompt_col!r} must be a string or a list of chat messages, got "
                        f"{type(cell).__name__}")  # fmt: skip
    return Example(prompt=prompt, answer=gold_answer(row[answer_col], where, answer_col), meta=meta)


def hub_rows(hf_id: str, hf_config: str | None, split: str) -> Iterable[tuple[str, Any]]:
    """(where, row) pairs of ``datasets.load_dataset(hf_id, hf_config, split=split)``; failures are DataErrors."""
    import datasets

    name = f"{hf_id}[{hf_config}]" if hf_config else hf_id
    try:
        ds = datasets.load_dataset(hf_id, hf_config, split=split)
    except Exception as e:  # offline, unknown id/config/split, ...: say what to set
        msg = str(e).splitlines()[0] if str(e) else ""
        raise DataError(f"could not load data.hf_id={hf_id!r} (data.hf_config={hf_config!r}, data.split={split!r}) "
                        f"with datasets: {type(e).__name__}: {msg}; offline, set data.path to local .jsonl/.parquet "
                        "files") from e  # fmt: skip
    for i, row in enumerate(ds):
        yield f"{name} {split} row {i + 1}", row


def hf_examples(rows: Iterable[tuple[str, Any]], columns: Mapping[str, str]) -> list[Example]:
    """Examples of (where, row) pairs; an empty source is a DataError."""
    examples = [hf_example(row, columns, where, i) for i, (where, row) in enumerate(rows)]
    if not examples:
        raise DataError("data.source=hf: the dataset holds no rows")
    return examples
