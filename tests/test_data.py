# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for jaxgrpo.data and jaxgrpo.tokenizer: GSM8K from jsonl/parquet/the `datasets` hub path (offline, with
`datasets.load_dataset` monkeypatched), malformed rows, synthetic arithmetic checked by evaluating the prompt,
the resumable iterator, and prompt encoding through the code-made tokenizer's chat template."""

import dataclasses
import json

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import transformers

from jaxgrpo import data
from jaxgrpo.config import DataConfig
from jaxgrpo.tokenizer import arithmetic_tokenizer


def read_rows(path, n=None):
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    return rows[:n] if n else rows


# -- GSM8K ---------------------------------------------------------------------------------------------------------


def test_gsm8k_local_dir_matches_independent_parse(gsm8k_dir):
    examples = data.load_gsm8k_local(str(gsm8k_dir), "test")
    rows = read_rows(gsm8k_dir / "test.jsonl")
    assert len(examples) == len(rows) == 1319
    for e, row in zip(examples, rows):
        assert e.prompt == row["question"].strip()
        assert e.answer == row["answer"].split("####")[-1].strip().replace(",", "")
    first = examples[0]
    assert first.meta["index"] == 0 and first.meta["where"].endswith("test.jsonl line 1")
    assert "####" in first.meta["solution"]


def test_load_dataset_gsm8k_file_and_cap(gsm8k_dir):
    cfg = DataConfig(source="gsm8k", path=str(gsm8k_dir / "train.jsonl"), num_examples=3)
    examples = data.load_dataset(cfg, seed=0)
    assert [e.answer for e in examples] == ["72", "10", "5"]


def test_gsm8k_parquet_file_and_hub_shard_layout(gsm8k_dir, tmp_path):
    rows = read_rows(gsm8k_dir / "train.jsonl", 6)
    expected = [(e.prompt, e.answer) for e in data.load_gsm8k_local(str(gsm8k_dir), "train")[:6]]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    got = data.load_dataset(DataConfig(source="gsm8k", path=str(tmp_path)), 0)
    assert [(e.prompt, e.answer) for e in got] == expected
    shard_dir = tmp_path / "hub" / "main"
    shard_dir.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[:3]), shard_dir / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[3:]), shard_dir / "train-00001-of-00002.parquet")
    got = data.load_gsm8k_local(str(tmp_path / "hub"), "train")
    assert [(e.prompt, e.answer) for e in got] == expected
    assert "row 1" in got[3].meta["where"] and "00001-of-00002" in got[3].meta["where"]
    # the hub snapshot holds GSM8K's two configurations: main's rows only (data.hf_config picks the other)
    socratic = tmp_path / "hub" / "socratic"
    socratic.mkdir()
    other = [{**r, "question": "Socratic: " + r["question"]} for r in rows]
    pq.write_table(pa.Table.from_pylist(other), socratic / "train-00000-of-00001.parquet")
    got = data.load_dataset(DataConfig(source="gsm8k", path=str(tmp_path / "hub")), 0)
    assert [(e.prompt, e.answer) for e in got] == expected
    got = data.load_dataset(DataConfig(source="gsm8k", path=str(tmp_path / "hub"), hf_config="socratic"), 0)
    assert [e.prompt for e in got] == ["Socratic: " + p for p, _ in expected]
    with pytest.raises(data.DataError, match=r"several configurations \['main', 'socratic'\]; set data.hf_config"):
        list(data.local_rows(str(tmp_path / "hub"), "train"))


def test_gsm8k_hub_path_offline(gsm8k_dir, monkeypatch):
    rows = read_rows(gsm8k_dir / "test.jsonl", 20)
    calls = []

    def fake_load_dataset(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    got = data.load_dataset(DataConfig(source="gsm8k", split="test", num_examples=10), seed=0)
    assert calls == [("openai/gsm8k", "main", "test")]
    local = data.load_gsm8k_local(str(gsm8k_dir), "test")[:10]
    assert [(e.prompt, e.answer) for e in got] == [(e.prompt, e.answer) for e in local]
    assert got[4].meta["where"] == "openai/gsm8k[main] test row 5"


def test_gsm8k_hub_failure_points_to_data_path(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(data.DataError, match="set data.path"):
        data.load_dataset(DataConfig(source="gsm8k"), seed=0)


@pytest.mark.parametrize(
    "bad_line, match",
    [
        ('{"question": "How many?"}', r"line 2: missing field 'answer'"),
        ('{"answer": "#### 3"}', r"line 2: missing field 'question'"),
        ('{"question": "How many?", "answer": 3}', r"line 2: field 'answer' must be a non-empty string"),
        ('{"question": "How many?", "answer": "three"}', r"line 2: field 'answer' has no '#### <number>'"),
        ('{"question": "How many?", "answer": "#### three"}', r"line 2: field 'answer' has no number after"),
        ('{"question": "How many?", ', r"line 2: invalid JSON"),
        ('[1, 2]', r"line 2: expected an object"),
    ],
)
def test_malformed_rows_name_file_line_and_field(tmp_path, bad_line, match):
    path = tmp_path / "train.jsonl"
    path.write_text('{"question": "Fine?", "answer": "ok\\n#### 1"}\n' + bad_line + "\n", encoding="utf-8")
    with pytest.raises(data.DataError, match=match) as info:
        data.load_dataset(DataConfig(source="gsm8k", path=str(tmp_path)), seed=0)
    assert str(path) in str(info.value)


def test_bad_paths(tmp_path):
    with pytest.raises(data.DataError, match="does not exist"):
        data.load_gsm8k_local(str(tmp_path / "nope"), "train")
    (tmp_path / "other.txt").write_text("x")
    with pytest.raises(data.DataError, match=r"no train.jsonl.*other.txt"):
        data.load_gsm8k_local(str(tmp_path), "train")
    with pytest.raises(data.DataError, match="unsupported file type"):
        data.load_gsm8k_local(str(tmp_path / "other.txt"), "train")


# -- synthetic arithmetic ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("difficulty", range(0, 8))
def test_synthetic_answers_are_correct(difficulty):
    examples = data.synthetic_arithmetic(200, difficulty, seed=1)
    assert len(examples) == 200
    for e in examples:
        assert e.prompt.endswith("=")
        assert set(e.prompt[:-1]) <= set("0123456789+-")
        assert int(e.answer) == eval(e.prompt[:-1])  # independent check: Python evaluates the expression
        assert e.answer == str(int(e.answer))  # canonical
        assert e.meta["difficulty"] == difficulty


def test_synthetic_difficulty_levels():
    def operands(e):
        return [int(x) for x in e.prompt[:-1].replace("-", "+").split("+")]

    lv0 = data.synthetic_arithmetic(100, 0, seed=0)
    assert all(len(e.prompt) == 2 and e.answer == e.prompt[0] for e in lv0)
    lv1 = data.synthetic_arithmetic(300, 1, seed=0)
    assert all(int(e.answer) <= 9 and len(operands(e)) == 2 for e in lv1)
    assert len({e.prompt for e in lv1}) == 55  # every carry-free pair of digits appears
    lv2 = data.synthetic_arithmetic(300, 2, seed=0)
    assert max(int(e.answer) for e in lv2) >= 10 and all(max(operands(e)) <= 9 for e in lv2)
    lv3 = data.synthetic_arithmetic(100, 3, seed=0)
    assert all(10 <= x <= 99 for e in lv3 for x in operands(e)) and "-" not in "".join(e.prompt for e in lv3)
    lv4 = data.synthetic_arithmetic(100, 4, seed=0)
    assert any(int(e.answer) < 0 for e in lv4)
    lv6 = data.synthetic_arithmetic(50, 6, seed=0)
    assert all(len(operands(e)) == 4 for e in lv6)


def test_synthetic_determinism_and_errors():
    a = data.synthetic_arithmetic(50, 3, seed=5)
    assert a == data.synthetic_arithmetic(50, 3, seed=5)
    assert a != data.synthetic_arithmetic(50, 3, seed=6)
    assert a != data.synthetic_arithmetic(50, 3, seed=5, split="test")
    cfg = DataConfig(source="synthetic", difficulty=3, num_examples=50)
    assert data.load_dataset(cfg, seed=5) == a
    assert len(data.load_dataset(DataConfig(), seed=0)) == data.SYNTHETIC_DEFAULT_SIZE
    with pytest.raises(data.DataError, match=r"data.difficulty must be an int in \[0, 12\]"):
        data.synthetic_arithmetic(5, 13, seed=0)
    with pytest.raises(data.DataError, match="n must be a positive int"):
        data.synthetic_arithmetic(0, 1, seed=0)


# -- iterator --------------------------------------------------------------------------------------------------------


def test_iterator_epochs_are_permutations():
    items = list(range(10))
    it = data.PromptIterator(items, batch_size=5, seed=3)
    epochs = [it.next_batch() + it.next_batch() for _ in range(3)]
    for e in epochs:
        assert sorted(e) == items
    assert epochs[0] != epochs[1]  # a fresh permutation per epoch
    assert it.state()["epoch"] == 3 and it.state()["position"] == 0
    plain = data.PromptIterator(items, batch_size=4, seed=3, shuffle=False)
    assert [plain.next_batch() for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]


def test_iterator_batches_cross_epochs():
    it = data.PromptIterator(list("abcdefg"), batch_size=3, seed=0)
    seq = sum((it.next_batch() for _ in range(7)), [])  # 21 items = 3 whole epochs
    for k in range(3):
        assert sorted(seq[7 * k : 7 * (k + 1)]) == list("abcdefg")
    assert len(it.next_batch(size=10)) == 10


def test_iterator_resume_sees_the_same_prompts():
    items = list(range(13))
    full = data.PromptIterator(items, batch_size=4, seed=11)
    uninterrupted = [full.next_batch() for _ in range(9)]
    first = data.PromptIterator(items, batch_size=4, seed=11)
    before = [first.next_batch() for _ in range(4)]
    saved = json.loads(json.dumps(first.state()))  # what a checkpoint stores
    resumed = data.PromptIterator(items, batch_size=4, seed=11)
    resumed.restore(saved)
    after = [resumed.next_batch() for _ in range(5)]
    assert before + after == uninterrupted


def test_iterator_errors():
    with pytest.raises(data.DataError, match="empty"):
        data.PromptIterator([], 2, 0)
    with pytest.raises(data.DataError, match="batch_size"):
        data.PromptIterator([1], 0, 0)
    it = data.PromptIterator(list(range(5)), 2, seed=0)
    with pytest.raises(data.DataError, match="num_items=6 differs"):
        it.restore({"epoch": 0, "position": 1, "num_items": 6})
    with pytest.raises(data.DataError, match="seed=1 differs"):
        it.restore({"epoch": 0, "position": 1, "seed": 1})
    with pytest.raises(data.DataError, match="lacks"):
        it.restore({"epoch": 0})


# -- tokenizer and encoding ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    return arithmetic_tokenizer()


def test_tokenizer_vocab_and_round_trip(tok, tmp_path):
    assert len(tok) <= 64
    assert tok.pad_token_id == 0 and tok.eos_token_id is not None and tok.bos_token_id is not None
    text = "12+34-5=41\nwhat is 7*(3/2)? 10.5, 100%"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
    assert tok.convert_ids_to_tokens(tok("3+4", add_special_tokens=False)["input_ids"]) == ["3", "+", "4"]
    assert tok.batch_decode([ids + [tok.eos_token_id, tok.pad_token_id]], skip_special_tokens=True) == [text]
    tok.save_pretrained(tmp_path)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == len(tok) and loaded.chat_template == tok.chat_template
    assert loaded(text, add_special_tokens=False)["input_ids"] == ids
    assert loaded.decode(ids) == text
    assert loaded.eos_token_id == tok.eos_token_id


def test_chat_template_tokens(tok):
    msgs = [{"role": "system", "content": "be brief."}, {"role": "user", "content": "3+4="}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<bos><|system|>be brief.<eos><|user|>3+4=<eos><|assistant|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<bos>", "<|system|>", *"be brief.", "<eos>", "<|user|>", *"3+4=",
                                              "<eos>", "<|assistant|>"]


def test_encode_prompts_chat_and_plain(tok):
    examples = [data.Example("3+4=", "7"), data.Example("12+5=", "17")]
    t = tok.convert_tokens_to_ids
    chat = data.encode_prompts(tok, examples, DataConfig(template="chat"))
    assert chat[0] == [t("<bos>"), t("<|user|>"), t("3"), t("+"), t("4"), t("="), t("<eos>"), t("<|assistant|>")]
    assert len(chat[1]) == len(chat[0]) + 1
    plain = data.encode_prompts(tok, examples, DataConfig(template="plain"))
    assert plain[0] == [t("<bos>"), t("3"), t("+"), t("4"), t("=")]
    sys_chat = data.encode_prompts(tok, examples[:1], DataConfig(system_prompt="add."))
    assert sys_chat[0][:4] == [t("<bos>"), t("<|system|>"), t("a"), t("d")]
    sys_plain = data.encode_prompts(tok, examples[:1], DataConfig(template="plain", system_prompt="add."))
    assert tok.decode(sys_plain[0], skip_special_tokens=True) == "add.\n\n3+4="


def test_encode_prompts_errors(tok):
    examples = [data.Example("1=", "1"), data.Example("12+34+56=", "102")]
    with pytest.raises(data.DataError) as info:
        data.encode_prompts(tok, examples, DataConfig(template="plain", max_prompt_tokens=6))
    msg = str(info.value)
    assert "example 1" in msg and "10 tokens" in msg and "data.max_prompt_tokens=6" in msg
    with pytest.raises(data.DataError, match=r"example 0: the tokenizer cannot represent \['A', 'B'\]"):
        data.encode_prompts(tok, [data.Example("A+B=", "0")], DataConfig())
    no_template = arithmetic_tokenizer()
    no_template.chat_template = None
    with pytest.raises(data.DataError, match="set data.template=plain"):
        data.encode_prompts(no_template, examples, DataConfig(template="chat"))


def test_synthetic_prompts_fit_the_tokenizer(tok):
    for difficulty in (0, 2, 5, 12):
        ids = data.encode_prompts(tok, data.synthetic_arithmetic(20, difficulty, 0), DataConfig())
        assert all(tok.unk_token_id not in x for x in ids)
        assert np.max([len(x) for x in ids]) <= 8 + 3 * (difficulty - 2 if difficulty > 4 else 2)


def test_example_is_frozen():
    e = data.Example("1+1=", "2")
    assert e.meta == {}
    with pytest.raises(AttributeError):
        e.answer = "3"


# -- any `datasets` dataset (data.source=hf) -------------------------------------------------------------------------


def test_hf_source_local_dataset_dir_through_datasets(gsm8k_dir, tmp_path):
    """A local dataset directory loaded by `datasets.load_dataset` itself (offline), columns renamed by data.columns:
    prompts and gold answers equal an independent parse of the same rows."""
    rows = read_rows(gsm8k_dir / "test.jsonl", 12)
    renamed = [{"problem": r["question"], "solution": r["answer"], "extra": i} for i, r in enumerate(rows)]
    pq.write_table(pa.Table.from_pylist(renamed[:8]), tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(renamed[8:]), tmp_path / "test.parquet")
    columns = {"prompt": "problem", "answer": "solution"}
    cfg = DataConfig(source="hf", hf_id=str(tmp_path), split="test", columns=columns)
    got = data.load_dataset(cfg, 0)
    assert [(e.prompt, e.answer) for e in got] == [
        (r["question"].strip(), r["answer"].split("####")[-1].strip()) for r in rows[8:]]  # fmt: skip
    assert got[0].meta["source"] == "hf" and "test row 1" in got[0].meta["where"]
    capped = data.load_dataset(DataConfig(source="hf", hf_id=str(tmp_path), num_examples=3, columns=columns), 0)
    assert [e.prompt for e in capped] == [r["question"].strip() for r in rows[:3]]


def _chat_rows():
    return [
        {"messages": [{"role": "user", "content": "what is 2+3?"}, {"role": "assistant", "content": "5"}], "gold": 5},
        {"messages": [{"role": "system", "content": "be brief."}, {"role": "user", "content": "7*6?"}], "gold": "42"},
        {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"},
                      {"role": "user", "content": "and 2+2?"}, {"role": "assistant", "content": "4"}],
         "gold": "#### 4"},
    ]  # fmt: skip


def test_hf_source_chat_rows_prompt_is_the_chat_up_to_the_last_user_turn(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _chat_rows()))
    cfg = DataConfig(source="hf", path=str(path), columns={"prompt": "messages", "answer": "gold"},
                     system_prompt="solve it.")  # fmt: skip
    examples = data.load_dataset(cfg, 0)
    assert [e.answer for e in examples] == ["5", "42", "4"]
    assert [e.prompt for e in examples] == ["what is 2+3?", "7*6?", "and 2+2?"]
    texts = [data.prompt_text(arithmetic_tokenizer(), e, cfg)[0] for e in examples]
    # the arithmetic tokenizer's template: <bos>{<|role|>content<eos>}...<|assistant|>
    assert texts == [
        "<bos><|system|>solve it.<eos><|user|>what is 2+3?<eos><|assistant|>",
        "<bos><|system|>be brief.<eos><|user|>7*6?<eos><|assistant|>",  # the row's own system turn is kept
        "<bos><|system|>solve it.<eos><|user|>1+1?<eos><|assistant|>2<eos><|user|>and 2+2?<eos><|assistant|>",
    ]
    plain = DataConfig(source="hf", path=str(path), columns={"prompt": "messages", "answer": "gold"},
                       template="plain")  # fmt: skip
    assert data.prompt_text(arithmetic_tokenizer(), examples[2], plain) == ("1+1?\n\n2\n\nand 2+2?", True)
    plain_sys = dataclasses.replace(plain, system_prompt="solve it.")  # the row's own system turn wins, as above
    assert [data.prompt_text(arithmetic_tokenizer(), e, plain_sys)[0] for e in examples[:2]] == [
        "solve it.\n\nwhat is 2+3?", "be brief.\n\n7*6?"]
    ids = data.encode_prompts(arithmetic_tokenizer(), examples, cfg)
    assert arithmetic_tokenizer().decode(ids[0]) == texts[0]


@pytest.mark.parametrize("row,columns,match", [
    ({"question": "q", "answer": "1"}, {}, r"no column 'prompt' for the prompt \(columns: \['answer', 'question'\]\); "
                                           r"map it with data.columns.prompt=<column>"),
    ({"prompt": "q"}, {}, r"no column 'answer' .*data.columns.answer=<column>"),
    ({"prompt": [{"role": "assistant", "content": "x"}], "answer": "1"}, {}, "a chat without a user turn"),
    ({"prompt": [{"role": "user"}], "answer": "1"}, {}, r"message 0 must be a \{'role': str, 'content': str\}"),
    ({"prompt": [{"role": "robot", "content": "x"}], "answer": "1"}, {}, "has role 'robot'"),
    ({"prompt": "q", "answer": None}, {}, "column 'answer' must be a string or a number"),
    ({"prompt": "q", "answer": "#### "}, {}, "column 'answer' is empty"),
    ({"prompt": 3, "answer": "1"}, {}, "must be a string or a list of chat messages"),
    ({"prompt": "q", "answer": "1"}, {"question": "prompt"}, r"data.columns has \['question'\]"),
])  # fmt: skip
def test_hf_source_bad_rows_name_the_row_and_the_fix(tmp_path, row, columns, match):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "fine", "answer": 3}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(data.DataError, match=match) as e:
        data.load_dataset(DataConfig(source="hf", path=str(path), columns=columns), 0)
    assert "\n" not in str(e.value)
    if "data.columns has" not in match:
        assert "rows.jsonl line 2" in str(e.value)


def test_hf_source_unknown_dataset_offline_is_a_data_error():
    with pytest.raises(data.DataError, match=r"could not load data.hf_id='nobody/no-such-set' .*set data.path"):
        data.load_dataset(DataConfig(source="hf", hf_id="nobody/no-such-set"), 0)


def test_hf_source_config_keys():
    from jaxgrpo.config import ConfigError, load_config

    cfg = load_config(None, ["data.source=hf", "data.hf_id=org/set", "data.columns={prompt: question}",
                             "data.rewards={gsm8k: 1.0}"])  # fmt: skip
    assert cfg.data.columns == {"prompt": "question"} and cfg.data.hf_config is None
    with pytest.raises(ConfigError, match="data.columns"):
        load_config(None, ["data.source=hf", "data.columns={question: prompt}"])
