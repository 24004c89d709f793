# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The supervised warm start (`jaxgrpo.warm_start`, ``warm_start.*``).

References, independent of the module's code:

* token histories: SmolLM2's template is prefix-stable, so a demonstration's prompt and history must equal a
  from-scratch tokenization of the whole conversation rendered by the template (the assistant texts as content), and
  its action tokens must be exactly each assistant text plus ``<|im_end|>``, written out here as strings; and the
  simple multi-turn loop, with a scripted policy writing the same turns and the real calculator answering, must
  record the same tokens and action mask (what RL will sample in is what the warm start trained on);
* the loss: the negative log-likelihood of the action tokens from `models.forward`'s full logits (log_softmax,
  gather), NumPy float64;
* the update: one step equals optax's own ``clip_by_global_norm`` + ``adamw`` on the gradient of that reference
  loss; with LoRA only the adapters move;
* the trainer: a multi-turn run with a warm start and a KL term, stopped after step 1 and resumed, equals the
  uninterrupted run metric for metric (the resumed run restores the warm-started policy, its KL reference, instead of
  training it again) and the warm start moved the parameters.
"""

from __future__ import annotations

import json
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_multiturn_train import assert_same_metrics, scripted, small
from test_train_step import V, tiny_config  # noqa: E402  the tiny model of tests/test_train_step.py

from jaxgrpo import build, metrics_log, models, trainer
from jaxgrpo import checkpoint as ckpt_lib
from jaxgrpo import warm_start as W
from jaxgrpo.config_sections import Config, OptimConfig, WarmStartConfig
from jaxgrpo.errors import ConfigError, DataError
from jaxgrpo.models import lora
from jaxgrpo.rollout import arithmetic_env, multiturn
from jaxgrpo.rollout.env import Toolbox
from jaxgrpo.rollout.tools import ToolCall, ToolRunner, format_calls, parse_tool_calls
from jaxgrpo.word_arithmetic import word_arithmetic

ENV = "jaxgrpo.rollout.arithmetic_env:CalculatorEnv"
SYSTEM = "Use the calculator tool, then reply with just the number."
CONTEXT = types.SimpleNamespace(max_position_embeddings=1024)  # the model config the loop reads (a scripted policy)


@pytest.fixture(scope="module")
def schemas():
    return Toolbox.from_config(ENV, []).episodes(word_arithmetic(1, 4, 0, "train"))[0].schemas


def eos_ids(tok):
    return [tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id]


def test_format_calls_reads_back_in_each_family():
    calls = [ToolCall("calculator", {"expression": "12 + 7"}), ToolCall("lookup", {"key": "é", "n": 2})]
    hermes = format_calls(calls, "hermes", "Let me compute.")
    assert hermes == ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 + 7"}}\n'
                      '</tool_call>\n<tool_call>\n{"name": "lookup", "arguments": {"key": "é", "n": 2}}\n</tool_call>')
    assert parse_tool_calls(hermes, "hermes") == calls
    llama = format_calls(calls, "llama3")
    assert llama == ('{"name": "calculator", "parameters": {"expression": "12 + 7"}}; '
                     '{"name": "lookup", "parameters": {"key": "é", "n": 2}}')
    assert parse_tool_calls(llama, "llama3") == calls
    assert format_calls([], "llama3", "19") == "19" and parse_tool_calls("19", "llama3") == []
    with pytest.raises(ConfigError, match="either tool calls or text"):
        format_calls(calls, "llama3", "text")


def test_content_given_as_text_parts_is_the_joined_text(tok, schemas):
    """TRL's conversational form may give content as a list of {type: text} parts: the same tokens as the string."""
    plain = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2 + 3?"}]},
             {"role": "assistant", "content": [{"type": "text", "text": "5"}]}]
    a, b = (W.demonstration_history(tok, schemas, SYSTEM, m, eos_ids(tok)) for m in (plain, parts))
    assert (a.prompt, a.tokens, a.action) == (b.prompt, b.tokens, b.action)


def test_a_demonstration_is_a_from_scratch_tokenization_with_the_assistant_text_as_actions(tok, schemas):
    (ex,) = word_arithmetic(1, 4, 0, "train")
    (conv,) = arithmetic_env.demonstrations([ex])
    a, b = ex.meta["a"], ex.meta["b"]
    h = W.demonstration_history(tok, schemas, SYSTEM, conv, eos_ids(tok))
    call = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a} + {b}"}}}}\n</tool_call>'
    whole = tok.apply_chat_template(
        [{"role": "system", "content": h_system(tok, schemas)}, {"role": "user", "content": ex.prompt},
         {"role": "assistant", "content": call}, {"role": "tool", "content": str(a + b)},
         {"role": "assistant", "content": str(a + b)}], tokenize=False)  # fmt: skip
    assert whole.endswith("<|im_end|>\n")
    scratch = tok(whole[: -len("\n")], add_special_tokens=False)["input_ids"]
    assert h.prompt + h.tokens == scratch
    spans, cur = [], []
    for t, act in zip(h.tokens, h.action):
        if act:
            cur.append(t)
        elif cur:
            spans, cur = [*spans, cur], []
    spans.append(cur)
    assert [tok.decode(s) for s in spans] == [call + "<|im_end|>", f"{a + b}<|im_end|>"]
    assert h.turns == 2 and h.tool_calls == 1


def h_system(tok, schemas) -> str:
    """The system turn a rollout renders for SmolLM2 (no tool syntax: the tools described after the prompt)."""
    from jaxgrpo.rollout.history import ChatFormat

    return ChatFormat(tok, schemas, SYSTEM).system_prompt


def test_a_demonstration_is_what_the_rollout_records_when_the_policy_writes_it(tok, schemas):
    examples = word_arithmetic(3, 4, 1, "train")
    convs = arithmetic_env.demonstrations(examples)
    want = [W.demonstration_history(tok, schemas, SYSTEM, c, eos_ids(tok)) for c in convs]
    for ex, c, h in zip(examples, convs, want):  # the scripted policy writes the demonstration's assistant texts
        turns = [format_calls([ToolCall("calculator", {"expression": c[1]["tool_calls"][0]["function"]["arguments"][
            "expression"]})], "hermes"), c[3]["content"]]
        runner = ToolRunner(workers=1, timeout=5.0)
        try:
            out = multiturn.rollout(CONTEXT, None, tok, Toolbox.from_config(ENV, []), runner, [ex], group_size=1,
                                    settings=multiturn.TurnSettings(max_turns=3, max_new_tokens=64),
                                    eos_token_ids=eos_ids(tok), key=jax.random.key(0), system_prompt=SYSTEM,
                                    generate=scripted(tok, turns))  # fmt: skip
        finally:
            runner.close()
        (got,) = out.histories
        assert got.prompt == h.prompt and got.tokens == h.tokens and got.action == h.action
        assert got.tool_calls == h.tool_calls == 1 and got.turns == h.turns == 2


@pytest.mark.parametrize("messages, match", [
    ([{"role": "assistant", "content": "1"}], "must start with the user's prompt"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "1"}, {"role": "tool", "content": "2"}],
     "ends with a 'tool' message"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "1"}, {"role": "assistant", "content": "2"}],
     "right after another"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {"name": "calculator"}}]},
      {"role": "tool", "content": "2"}, {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
     "malformed tool call .*no 'name' string"),
    ([{"role": "user", "content": "q"},
      {"role": "assistant", "tool_calls": [{"function": {"name": "calculator", "arguments": {}}}]}],
     "the last assistant turn makes tool calls"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "<tool_call>{}</tool_call>"}],
     "does not read back"),
    ([{"role": "user", "content": "q"}], "no assistant turn"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": 19}], "message 1: its content must be text"),
    ([{"role": "user", "content": [{"type": "image"}]}, {"role": "assistant", "content": "1"}],
     "the user's prompt: its content must be text"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {"name": "calculator",
      "arguments": {}}}]}, {"role": "tool", "content": {"r": 2}}, {"role": "assistant", "content": "2"}],
     "message 2: its content must be text .*got dict"),
])  # fmt: skip
def test_malformed_demonstrations_are_one_line_errors(tok, schemas, messages, match):
    with pytest.raises(DataError, match=match) as err:
        W.demonstration_history(tok, schemas, SYSTEM, messages, eos_ids(tok), "demo 3")
    assert str(err.value).startswith("demo 3") and "\n" not in str(err.value)


def test_demonstrations_load_from_jsonl_and_from_a_function(tmp_path):
    good = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps(good[0]) + "\n\n")
    assert W.load_conversations(WarmStartConfig(demonstrations=str(path)), []) == [good[0]["messages"]]
    examples = word_arithmetic(5, 4, 0, "train")
    got = W.load_conversations(WarmStartConfig(demonstrations="jaxgrpo.rollout.arithmetic_env:demonstrations",
                                               examples=3), examples)  # fmt: skip
    assert [c[0]["content"] for c in got] == [e.prompt for e in examples[:3]]
    path.write_text("{not json\n")
    with pytest.raises(DataError, match="line 1 is not JSON"):
        W.load_conversations(WarmStartConfig(demonstrations=str(path)), [])
    with pytest.raises(DataError, match="does not exist"):
        W.load_conversations(WarmStartConfig(demonstrations=str(tmp_path / "missing.jsonl")), [])


# -- the loss and the update, on the tiny model of test_train_step ---------------------------------------------------
TP, TC = 5, 7


def raw_rows(seed: int = 0):
    """Four rows: prompts of 2-5 tokens (left-padded), completions of 3-7 tokens with a context span inside."""
    rng = np.random.default_rng(seed)
    B = 4
    plen, clen = rng.integers(2, TP + 1, B), rng.integers(3, TC + 1, B)
    pmask = np.arange(TP)[None] >= (TP - plen)[:, None]
    cmask = np.arange(TC)[None] < clen[:, None]
    action = cmask.copy()
    action[:, 1:3] = False  # a reply of two tokens after the first policy token
    tokens = np.concatenate([np.where(pmask, rng.integers(1, V, (B, TP)), 0),
                             np.where(cmask, rng.integers(1, V, (B, TC)), 0)], 1).astype(np.int32)  # fmt: skip
    return W.Rows(jnp.asarray(tokens), jnp.asarray(pmask), jnp.asarray(cmask), jnp.asarray(action))


def reference_nll(config, params, rows: W.Rows):
    attn = jnp.concatenate([rows.prompt_mask, rows.completion_mask], 1)
    logits = models.forward(config, params, rows.tokens, attention_mask=attn)
    logp = jax.nn.log_softmax(logits[:, TP - 1 : -1].astype(jnp.float32), -1)
    picked = jnp.take_along_axis(logp, rows.tokens[:, TP:, None], -1)[..., 0]
    m = rows.action_mask & rows.completion_mask
    return -jnp.sum(jnp.where(m, picked, 0.0)) / jnp.sum(m)


def test_the_loss_is_the_nll_of_the_action_tokens_only():
    config = tiny_config()
    params = models.init_params(config, jax.random.key(0))
    rows = raw_rows()
    loss, n = jax.jit(lambda p, r: W.nll(config, p, r))(params, rows)
    attn = np.concatenate([np.asarray(rows.prompt_mask), np.asarray(rows.completion_mask)], 1)
    logits = np.asarray(models.forward(config, params, rows.tokens, attention_mask=jnp.asarray(attn)), np.float64)
    z = logits[:, TP - 1 : -1]
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    m = np.asarray(rows.action_mask & rows.completion_mask)
    picked = np.take_along_axis(logp, np.asarray(rows.tokens)[:, TP:, None], -1)[..., 0]
    assert int(n) == m.sum() < np.asarray(rows.completion_mask).sum()
    np.testing.assert_allclose(float(loss), -(picked * m).sum() / m.sum(), rtol=1e-5)
    every = rows._replace(action_mask=rows.completion_mask)  # the context tokens would change it
    assert abs(float(W.nll(config, params, every)[0]) - float(loss)) > 1e-3


def test_one_step_is_optax_adamw_on_the_reference_gradient():
    config = tiny_config()
    params = models.init_params(config, jax.random.key(1))
    rows = raw_rows(1)
    optim = OptimConfig(max_grad_norm=0.5, weight_decay=0.01)
    init, step = W.make_sft_step(config, optim, 3e-3)
    grads = jax.grad(reference_nll, argnums=1)(config, params, rows)
    assert float(optax.tree_utils.tree_norm(grads)) > 0.5  # the clip acts
    tx = optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(3e-3, weight_decay=0.01, mask=lambda p: jax.tree_util
                     .tree_map_with_path(lambda k, _: "norm" not in jax.tree_util.keystr(k), p)))  # fmt: skip
    updates, _ = tx.update(grads, tx.init(params), params)
    want = optax.apply_updates(params, updates)
    copy = jax.tree.map(jnp.copy, params)
    got, _, metrics = step(copy, init(copy), rows)
    np.testing.assert_allclose(float(metrics["warm_start/loss"]), float(reference_nll(config, params, rows)),
                               rtol=1e-5)  # fmt: skip
    # Adam's first update is about lr * sign(g): an entry whose gradient is near Adam's eps moves by a float32
    # rounding of two gradient computations, so the tolerance is absolute, a thousandth of the learning rate
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=3e-6)


def test_with_lora_only_the_adapters_move():
    config = tiny_config().replace(lora=models.LoraSpec(rank=2, alpha=4.0))
    params = lora.add_adapters(config, models.init_params(config.replace(lora=None), jax.random.key(2)),
                               jax.random.key(3))  # fmt: skip
    init, step = W.make_sft_step(config, OptimConfig(), 1e-2)
    copy = jax.tree.map(jnp.copy, params)
    got, _, _ = step(copy, init(copy), raw_rows(2))
    base0, ad0 = lora.split(params)
    base1, ad1 = lora.split(got)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), base0, base1)
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(ad0), jax.tree.leaves(ad1)))  # fmt: skip


def test_a_lora_warm_start_keeps_the_adapters_and_restores_them_onto_the_base_the_run_loads(tmp_path, monkeypatch):
    """The warm start's checkpoint holds what it trained, the adapters; a restart restores them onto the base it
    loaded (which the run's checkpoints fingerprint), not onto a base saved beside them."""
    from jaxgrpo.rollout.history import TurnHistory

    config = tiny_config().replace(lora=models.LoraSpec(rank=2, alpha=4.0))
    params = lora.add_adapters(config, models.init_params(config.replace(lora=None), jax.random.key(2)),
                               jax.random.key(3))  # fmt: skip
    trained = lora.with_trainable(params, jax.tree.map(lambda x: x + 0.5, lora.trainable(params)))
    monkeypatch.setattr(W, "train", lambda *a, **k: (trained, [{"step": 1, "warm_start/loss": 0.25}]))
    monkeypatch.setattr(W, "demonstration_history", lambda *a, **k: TurnHistory(prompt=[1]))
    cfg = types.SimpleNamespace(warm_start=types.SimpleNamespace(steps=1),
                                data=types.SimpleNamespace(system_prompt=None))  # fmt: skip
    got = W.warm_start(cfg, config, params, None, [[]], (0,), [], tmp_path)
    chex.assert_trees_all_equal(got, trained)
    other = lora.with_trainable(lora.add_adapters(config, models.init_params(config.replace(lora=None),
                                                                             jax.random.key(9)), jax.random.key(3)),
                                lora.trainable(params))  # fmt: skip
    restored = W.warm_start(cfg, config, other, None, [[]], (0,), [], tmp_path)
    chex.assert_trees_all_equal(lora.split(restored)[0], lora.split(other)[0])  # the base loaded now
    chex.assert_trees_all_equal(lora.trainable(restored), lora.trainable(trained))  # the adapters trained then


def test_lora_with_a_kl_term_is_refused():
    from jaxgrpo import config as config_lib

    with pytest.raises(ConfigError, match="KL reference is the frozen base"):
        config_lib.load_config("smollm2_tools", ["lora.rank=4", "algo.kl_coef=0.05"])
    with pytest.raises(ConfigError, match="warm_start.demonstrations"):
        config_lib.load_config("default", ["warm_start.demonstrations=demos.txt"])
    assert isinstance(config_lib.load_config("smollm2_tools", []), Config)


# -- the trainer -----------------------------------------------------------------------------------------------------
WARM = ["warm_start.demonstrations=jaxgrpo.rollout.arithmetic_env:demonstrations", "warm_start.examples=6",
        "warm_start.steps=4", "warm_start.batch_size=3", "warm_start.learning_rate=1e-2", "algo.kl_coef=0.1",
        "train.steps=2"]  # fmt: skip


@pytest.mark.slow
def test_a_warm_started_run_resumes_with_its_warm_started_reference(smollm2_gguf, tmp_path, capsys):
    """An uninterrupted 2-step run against one stopped after step 1 and resumed: the same metrics at both steps; the
    warm start's losses are logged, and fall; the resumed trainer restores the warm-started policy (not trained
    again) and its KL reference is that policy, not the base model."""
    ref = tmp_path / "ref"
    trainer.run(small(smollm2_gguf, *WARM), ref)
    log = [json.loads(x) for x in (ref / "warm_start" / "warm_start.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and log[-1]["warm_start/loss"] < log[0]["warm_start/loss"]
    run = tmp_path / "run"
    trainer.run(small(smollm2_gguf, *WARM, "train.steps=1"), run)
    capsys.readouterr()
    trainer.run(small(smollm2_gguf, *WARM), run)
    assert "warm start restored" in capsys.readouterr().err
    want, got = metrics_log.read_metrics(ref), metrics_log.read_metrics(run)
    assert [r["step"] for r in got] == [1, 2]
    for i in range(2):
        assert_same_metrics(got[i], want[i], f"step {i + 1}")
    cfg = small(smollm2_gguf, *WARM)
    tr = trainer.Trainer(cfg, run)  # resumes at step 2
    try:
        with ckpt_lib.CheckpointManager(run / "warm_start", keep=1) as mgr:
            warm = mgr.restore(4, {"params": tr.state.params})[0]["params"]
        _, base, _ = build.build_policy(cfg, build.policy_key(cfg))
        warm_c, base_c = models.compute_params(tr.model_config, warm), models.compute_params(tr.model_config, base)
        for r, w in zip(jax.tree.leaves(tr.ref_params), jax.tree.leaves(warm_c), strict=True):
            np.testing.assert_array_equal(np.asarray(r), np.asarray(w))
        assert any(not np.array_equal(np.asarray(r), np.asarray(b))
                   for r, b in zip(jax.tree.leaves(tr.ref_params), jax.tree.leaves(base_c)))  # fmt: skip
    finally:
        tr.close()


def test_a_missing_demonstrations_file_stops_the_run_before_the_model_loads(smollm2_gguf, tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(build, "build_policy", no_model)
    with pytest.raises(DataError, match="missing.jsonl'? does not exist"):
        trainer.run(small(smollm2_gguf, f"warm_start.demonstrations={tmp_path / 'missing.jsonl'}"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_single_turn_run_warm_starts_from_a_jsonl_file(smollm2_gguf, tmp_path):
    """No environment: the demonstrations are answers alone, read from a .jsonl file; the run trains a step after
    them; on an 8-device fsdp mesh the warm start gives the same parameters (to float32 rounding of the sharded
    reductions); a demonstration longer than the model's context is a one-line error before any step."""
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps({"messages": [{"role": "user", "content": e.prompt},
                                                      {"role": "assistant", "content": e.answer}]}) + "\n"
                             for e in word_arithmetic(6, 1, 0, "train")))  # fmt: skip
    single = ["data.environment=null", "data.rewards={gsm8k_lenient: 1.0}", f"warm_start.demonstrations={demos}",
              "warm_start.steps=3", "warm_start.batch_size=4", "train.steps=1"]  # fmt: skip
    run = tmp_path / "run"
    trainer.run(small(smollm2_gguf, *single), run)
    assert len((run / "warm_start" / "warm_start.jsonl").read_text().splitlines()) == 3
    assert [r["step"] for r in metrics_log.read_metrics(run)] == [1]
    trainer.run(small(smollm2_gguf, *single, "mesh.fsdp=8", "rollout.prompts_per_step=8"), tmp_path / "mesh")
    one, two = (warm_params(small(smollm2_gguf, *single), tmp_path / d) for d in ("run", "mesh"))
    for x, y in zip(jax.tree.leaves(one), jax.tree.leaves(two), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=2e-6)
    with demos.open("a") as f:  # an answer of 1,100 words: past the tiny model's 1,024 positions
        f.write(json.dumps({"messages": [{"role": "user", "content": "Count."},
                                         {"role": "assistant", "content": " ".join(["one"] * 1100)}]}) + "\n")
    with pytest.raises(DataError, match="longer than the model's context"):
        trainer.run(small(smollm2_gguf, *single), tmp_path / "short")
    assert not (tmp_path / "short").exists()  # a failed start leaves no run directory


def warm_params(cfg, run):
    """The warm-started parameters a run saved (``<run>/warm_start``), on one device."""
    _, base, _ = build.build_policy(cfg, build.policy_key(cfg))
    with ckpt_lib.CheckpointManager(run / "warm_start", keep=1) as mgr:
        return mgr.restore(cfg.warm_start.steps, {"params": base})[0]["params"]


def test_demonstration_calls_read_as_the_rollout_reads_model_calls():
    """A demonstration's calls go through the parser's own reading (`tools.as_call`): arguments as an object, a JSON
    string or null; a call without a name, or with arguments that are no object, is a one-line error."""
    msg = {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1 + 2"}'}},
        {"function": {"name": "calculator", "arguments": None}}, {"name": "lookup", "arguments": {"key": "k"}}]}
    assert W._calls(msg, "demo 1") == [ToolCall("calculator", {"expression": "1 + 2"}), ToolCall("calculator", {}),
                                       ToolCall("lookup", {"key": "k"})]
    for bad, match in [({"function": {"name": "", "arguments": {}}}, "no 'name' string"),
                       ({"function": {"name": "calculator", "arguments": "[1]"}}, "must be a JSON object"),
                       ({"function": {"name": "calculator", "arguments": "{"}}, "not valid JSON"),
                       ("x", "JSON object")]:
        with pytest.raises(DataError, match=f"demo 1: malformed tool call .*: .*{match}") as err:
            W._calls({"role": "assistant", "tool_calls": [bad]}, "demo 1")
        assert "\n" not in str(err.value)
