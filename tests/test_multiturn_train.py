# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The trainer runs multi-turn rollouts (``data.environment`` / ``data.tools``): `jaxgrpo.multiturn_step`.

A tiny random model with SmolLM2's tokenizer and chat template (one compiled shape set for the module):

* a killed run resumes exactly: 1 step, then resumed to 3, against an uninterrupted 3-step run (every metric and
  every parameter equal), the pattern of tests/test_faults.py; it samples on the multi-turn engine
  (``rollout.turn_engine=true``; the other runs here use the simple loop, the default);
* tools that hang, raise or return something unprintable, called by a scripted policy inside a trainer run: each
  is answered as an error, counted in the metrics (the expected counts follow from the script), and the run goes on;
* the README's ten-line environment trains with only its own ``get_reward`` as the reward;
* `python -m jaxgrpo.eval` of the multi-turn run, with a scripted calculator-using policy whose success rate is
  known (1 when it answers the tool's result, 0 when off by one; 1 by the environment's reward either way);
* one-line errors for what the multi-turn step refuses;
* the packaged example (configs/smollm2_tools.yaml, the real SmolLM2) trains a step through `jaxgrpo.train.main`.
"""

from __future__ import annotations

import copy
import json
import pathlib
import re
import shutil
import sys

import jax
import numpy as np
import pytest

from jaxgrpo import config as config_lib
from jaxgrpo import eval as eval_lib
from jaxgrpo import metrics_log, models, multiturn_step, sampling, trainer
from jaxgrpo import train as train_cli

REPO = pathlib.Path(__file__).resolve().parents[1]

TOOLS = '''
import threading

release = threading.Event()


def hang(x: int) -> str:
    """Waits until the test ends.

    Args:
        x: anything
    """
    release.wait(60)
    return "late"


def boom(x: int) -> str:
    """Raises.

    Args:
        x: anything
    """
    raise RuntimeError("tool exploded")


class Unprintable:
    def __str__(self):
        raise ValueError("no text")

    __repr__ = __str__


def garbage(x: int) -> str:
    """Returns an object that has no text.

    Args:
        x: anything
    """
    return Unprintable()


class NoReward:
    def reset(self, **kwargs):
        return None

    def noop(self, x: int) -> str:
        """Does nothing.

        Args:
            x: anything
        """
        return "ok"


class Raising(NoReward):
    def get_reward(self):
        raise KeyError("score")


def trl_environment_reward(completions, environments, **kwargs):  # TRL's environment-mode reward, as its docs write it
    return [environment.get_reward() for environment in environments]
'''


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """Importable test modules: `mt_tools` (the misbehaving tools) and `readme_env` (the README's environment)."""
    root = tmp_path_factory.mktemp("mt_modules")
    (root / "mt_tools.py").write_text(TOOLS)
    readme = (REPO / "README.md").read_text().split("## Environments and tools", 1)[1]
    (root / "readme_env.py").write_text(re.search(r"```python\n(.*?)```", readme, re.DOTALL).group(1))
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("mt_tools", None)
    sys.modules.pop("readme_env", None)


ENGINE = "rollout.turn_engine=true"  # the multi-turn engine (the reference run and its resume)


def small(gguf: pathlib.Path, *extra: str) -> config_lib.Config:
    """A tiny random model with SmolLM2's vocabulary and template, on one-digit sums in words, P = G = 2."""
    base = ["model.name_or_path=tiny", f"model.tokenizer={gguf}", "model.hidden_size=32", "model.intermediate_size=64",
            "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1", "model.max_position_embeddings=1024",
            "data.source=words", "data.difficulty=1", "data.max_prompt_tokens=128",
            "data.rewards={gsm8k_lenient: 1.0, environment: 0.5}",
            "data.environment=jaxgrpo.rollout.arithmetic_env:CalculatorEnv", "rollout.prompts_per_step=2",
            "rollout.group_size=2", "rollout.max_new_tokens=32", "rollout.max_turns=2", "optim.learning_rate=1e-3",
            "log.progress=false", "log.tensorboard=false", "log.sample_every=0", "checkpoint.export_final=false",
            "checkpoint.keep=5", "checkpoint.every=1"]  # fmt: skip
    return config_lib.load_config("default", [*base, *extra])


@pytest.fixture(scope="module")
def reference(smollm2_gguf, tmp_path_factory):
    """An uninterrupted 3-step multi-turn run, checkpointed after every step."""
    run = tmp_path_factory.mktemp("mt_reference") / "run"
    trainer.run(small(smollm2_gguf, "train.steps=3", ENGINE), run)
    return run


def assert_same_metrics(got: dict, want: dict, what: str) -> None:
    for k, v in want.items():
        # timings; the engine's step count and row utilization depend on when each tool returns
        if (not k.startswith(("time/", "throughput/")) and not k.endswith("_per_s")
                and k not in ("rollout/decode_steps", "rollout/row_utilization")):
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6, err_msg=f"{what}: {k}")


@pytest.mark.slow
def test_killed_multiturn_run_resumes_exactly(reference, smollm2_gguf, tmp_path):
    """Stopped after step 1 and resumed to step 3: steps 2 and 3 have the uninterrupted run's metrics, and the
    final parameters are equal, leaf for leaf."""
    want = metrics_log.read_metrics(reference)
    assert [r["step"] for r in want] == [1, 2, 3]
    assert {"multiturn/turns", "multiturn/tool_calls", "multiturn/action_token_share"} <= set(want[0])
    assert {"rollout/row_utilization", "rollout/forced_tokens"} <= set(want[0])  # on the multi-turn engine
    run = tmp_path / "run"
    trainer.run(small(smollm2_gguf, "train.steps=1", ENGINE), run)
    history = trainer.run(small(smollm2_gguf, "train.steps=3", ENGINE), run)
    assert len(history) == 2  # steps 2 and 3, from the step-1 checkpoint
    got = metrics_log.read_metrics(run)
    assert [r["step"] for r in got] == [1, 2, 3]
    for i in range(3):
        assert_same_metrics(got[i], want[i], f"step {i + 1}")
    cfg = small(smollm2_gguf, "train.steps=3", ENGINE)
    a = eval_lib.load_policy_for_eval(cfg, reference, 3).params
    b = eval_lib.load_policy_for_eval(cfg, run, 3).params
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def completions(rows: list[list[int]], width: int) -> sampling.Completions:
    """A scripted policy's turn as the sampler returns it: each row's tokens (ending in EOS), log-prob -0.5 each."""
    toks = np.zeros((len(rows), width), np.int32)
    for i, ids in enumerate(rows):
        toks[i, : len(ids)] = ids
    lens = np.array([len(ids) for ids in rows], np.int32)
    mask = np.arange(width)[None] < lens[:, None]
    return sampling.Completions(tokens=toks, logprobs=np.where(mask, -0.5, 0.0).astype(np.float32), mask=mask,
                                lengths=lens, truncated=np.zeros(len(rows), bool))  # fmt: skip


def scripted(tok, script: list[str]):
    """A `sampling.generate` stand-in: a row whose context holds k assistant turns writes ``script[k - 1]`` then
    ``<|im_end|>`` (log-prob -0.5 per token)."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    def generate(config, params, prompts, *, max_new_tokens, eos_token_ids, key, **kw):
        rows = []
        for ctx in prompts:
            turn = tok.decode(ctx, skip_special_tokens=False).count("<|im_start|>assistant") - 1
            ids = tok(script[turn], add_special_tokens=False)["input_ids"] + [eos]
            assert len(ids) <= max_new_tokens, "the script's turns must fit rollout.max_new_tokens"
            rows.append(ids)
        return completions(rows, max_new_tokens)

    return generate


def calculating_policy(tok, offset: int):
    """A scripted policy for words prompts: turn 1 calls the calculator on the question's ``a + b``; turn 2 answers
    the last number of its context (the tool's reply) plus ``offset`` (0: right, 1: wrong)."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    def generate(config, params, prompts, *, max_new_tokens, eos_token_ids, key, **kw):
        rows = []
        for ctx in prompts:
            text = tok.decode(ctx, skip_special_tokens=False)
            if text.count("<|im_start|>assistant") == 1:
                a, b = re.search(r"What is (\d+) \+ (\d+)\?", text).groups()
                out = call("calculator", json.dumps({"expression": f"{a} + {b}"}))
            else:
                last = int(re.findall(r"\d+", text)[-1])
                out = f"The answer is {last + offset}."
            rows.append(tok(out, add_special_tokens=False)["input_ids"] + [eos])
        return completions(rows, max_new_tokens)

    return generate


@pytest.mark.slow
@pytest.mark.parametrize("offset, reward, rate", [(0, None, 1.0), (1, None, 0.0), (1, "environment", 1.0)])
def test_eval_runs_the_turns_of_a_multiturn_run(reference, tok, tmp_path, monkeypatch, capsys, offset, reward, rate):
    """`python -m jaxgrpo.eval --run-dir` of the multi-turn reference run, with a scripted policy that uses the
    calculator and then answers right (offset 0) or off by one (offset 1): success by the run's correctness reward
    (gsm8k_lenient on the final answer) is 1 or 0; by ``--reward environment`` (CalculatorEnv: a calculator result
    equal to the gold) it is 1 either way."""
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate", staticmethod(calculating_policy(tok, offset)))
    out = tmp_path / "eval"
    args = ["--run-dir", str(reference), "--num-prompts", "3", "--num-samples", "2", "--group-size", "2",
            "--out", str(out)] + (["--reward", reward] if reward else [])  # fmt: skip
    assert eval_lib.main(args) == 0, capsys.readouterr().err[-2000:]
    result = json.loads((out / "eval.json").read_text())
    assert result["mean_success_rate"] == rate and result["pass@k"]["1"] == rate
    assert result["degeneracy"][0]["measured"] == 1.0  # every group all-pass or all-fail
    assert result["multiturn"]["multiturn/turns"] == 2 and result["multiturn"]["multiturn/tool_calls"] == 1
    assert result["settings"]["reward"] == (reward or "gsm8k_lenient")


@pytest.mark.parametrize("env_reward", ["environment", "mt_tools:trl_environment_reward"])
@pytest.mark.parametrize("offset, want", [(0, 1.5), (1, 0.5)])
def test_rewards_are_the_answer_functions_plus_the_weighted_environment_reward(modules, smollm2_gguf, tok, offset,
                                                                               want, env_reward):
    """small()'s rewards: gsm8k_lenient (1 for the right final answer) + 0.5 × CalculatorEnv.get_reward() (1: the
    calculator was asked the question's sum): 1 + 0.5 when the policy answers the tool's result, 0 + 0.5 when it is
    off by one. The environment's reward as jaxgrpo's ``environment`` entry or as a TRL reward function that reads
    ``environments`` (each trajectory's instance), the same numbers. Scripted policy, no model call."""
    from jaxgrpo import build
    from jaxgrpo.rewards import Scorer

    cfg = small(smollm2_gguf, f'data.rewards={{gsm8k_lenient: 1.0, "{env_reward}": 0.5}}')
    examples = trainer.data_lib.load_dataset(cfg.data, cfg.seed)[:2]
    mcfg = build.tiny_model_config(cfg, tok)
    mt = multiturn_step.MultiTurn(cfg, tok, mcfg, build.eos_ids(mcfg, tok), examples)
    mt.generate = calculating_policy(tok, offset)
    scorer = Scorer(multiturn_step.reward_functions(cfg))
    try:
        scored = mt.sample(mcfg, None, examples, jax.random.key(0), scorer)
    finally:
        mt.close()
        scorer.close()
    np.testing.assert_array_equal(scored.rewards, np.full((2, 2), want, np.float32))
    assert scored.valid.all() and [h.tool_calls for h in scored.rollout.histories] == [1, 1, 1, 1]


def test_a_prompt_with_the_tools_description_that_leaves_no_room_is_one_line(smollm2_gguf, tok):
    """SmolLM2's template has no tool syntax, so the tools are described in the system turn: the prompt is far
    longer than the question alone, and a context of 128 tokens cannot hold it and a 32-token turn."""
    from jaxgrpo import build

    cfg = small(smollm2_gguf, "model.max_position_embeddings=128")
    examples = trainer.data_lib.load_dataset(cfg.data, cfg.seed)[:4]
    assert max(len(p) for p in trainer.data_lib.encode_prompts(tok, examples, cfg.data)) + 32 <= 128
    mcfg = build.tiny_model_config(cfg, tok)
    with pytest.raises(config_lib.ConfigError, match=r"with the tools' description is \d+ tokens.*\(128\)") as e:
        multiturn_step.MultiTurn(cfg, tok, mcfg, build.eos_ids(mcfg, tok), examples)
    assert "\n" not in str(e.value)


def test_a_template_that_cannot_append_tool_replies_fails_before_any_step(smollm2_gguf, tok):
    """A template that closes an assistant turn followed by tool messages with another token than a last one: the
    reply could not follow the policy's end-of-turn token, so the run stops at startup with one line."""
    from jaxgrpo import build

    closing = tok.chat_template.replace("'<|im_end|>' + '\n'", "('<|endoftext|>' if message['role'] == 'assistant' "
                                        "and not loop.last else '<|im_end|>') + '\n'")  # fmt: skip
    assert closing != tok.chat_template
    bad = copy.deepcopy(tok)
    bad.chat_template = closing
    cfg = small(smollm2_gguf)
    examples = trainer.data_lib.load_dataset(cfg.data, cfg.seed)[:2]
    mcfg = build.tiny_model_config(cfg, tok)
    with pytest.raises(config_lib.ConfigError, match="closes an assistant turn followed by tool messages") as e:
        multiturn_step.MultiTurn(cfg, bad, mcfg, build.eos_ids(mcfg, tok), examples)
    assert "\n" not in str(e.value)


def test_dr_grpos_constant_is_the_token_budget(smollm2_gguf, monkeypatch, tmp_path):
    """seq-mean-token-sum-norm divides by algo.max_tokens; unset, a multi-turn run takes the token budget (after the
    prompt: max_turns × max_new_tokens = 64 here), the same every step, not the batch's bucketed width."""
    from jaxgrpo.learner import train_step as ts

    seen = []

    class Asked(Exception):
        pass

    def make_train_step(model_config, algo, *a, **kw):
        seen.append(algo.max_tokens)
        raise Asked  # enough: the train step's algo is what was asked

    monkeypatch.setattr(ts, "make_train_step", make_train_step)
    with pytest.raises(Asked):
        trainer.Trainer(small(smollm2_gguf, "algo.estimator=dr_grpo", "algo.aggregation=seq-mean-token-sum-norm"),
                        tmp_path / "run")  # fmt: skip
    assert seen == [64]


@pytest.mark.parametrize("on_error", ["error", "invalidate"])
def test_a_get_reward_that_raises(modules, smollm2_gguf, tok, on_error):
    """error: a one-line RewardError naming the environment and the fix; invalidate: every trajectory invalid."""
    from jaxgrpo import build
    from jaxgrpo.errors import RewardError

    cfg = small(smollm2_gguf, "data.environment=mt_tools:Raising", "data.rewards={environment: 1.0}",
                f"algo.on_reward_error={on_error}")  # fmt: skip
    examples = trainer.data_lib.load_dataset(cfg.data, cfg.seed)[:2]
    mcfg = build.tiny_model_config(cfg, tok)
    mt = multiturn_step.MultiTurn(cfg, tok, mcfg, build.eos_ids(mcfg, tok), examples)
    mt.generate = scripted(tok, ["I am done."])
    try:
        if on_error == "error":
            with pytest.raises(RewardError, match=r"Raising.get_reward\(\) failed .* KeyError") as info:
                mt.sample(mcfg, None, examples, jax.random.key(0), None)
            assert "\n" not in str(info.value) and str(info.value).endswith("set algo.on_reward_error=invalidate")
        else:
            scored = mt.sample(mcfg, None, examples, jax.random.key(0), None)
            assert not scored.valid.any() and not scored.rewards.any()
    finally:
        mt.close()


def call(name: str, args: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


@pytest.mark.slow
def test_tools_that_hang_raise_or_return_garbage_are_reported_and_the_run_goes_on(modules, smollm2_gguf, tok,
                                                                                  tmp_path, monkeypatch):  # fmt: skip
    """Every trajectory calls hang (times out), boom (raises), garbage (unprintable), then the calculator, then
    answers: 5 turns, 4 calls, 3 errors of which 1 timeout, in both steps; the loss counts the policy's tokens only."""
    script = [call("hang", '{"x": 1}'), call("boom", '{"x": 2}'), call("garbage", '{"x": 3}'),
              call("calculator", '{"expression": "3 + 4"}'), "The answer is 7."]  # fmt: skip
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate", staticmethod(scripted(tok, script)))
    policy_tokens = 4 * sum(len(tok(t, add_special_tokens=False)["input_ids"]) + 1 for t in script)  # + <|im_end|>
    import mt_tools

    replies = []
    original = multiturn_step.MT.rollout

    def rollout(*args, **kwargs):
        out = original(*args, **kwargs)
        replies.extend(m["content"] for msgs in out.messages for m in msgs if m["role"] == "tool")
        return out

    monkeypatch.setattr(multiturn_step.MT, "rollout", rollout)
    cfg = small(smollm2_gguf, "train.steps=2", "rollout.max_turns=5", "rollout.max_total_tokens=256",
                "rollout.tool_timeout=0.5", "data.environment=null", "data.rewards={gsm8k_lenient: 1.0}",
                "data.tools=[mt_tools:hang, mt_tools:boom, mt_tools:garbage, jaxgrpo.rollout.tools:calculator]")
    try:
        history = trainer.run(cfg, tmp_path / "run")
    finally:
        mt_tools.release.set()
    assert len(history) == 2
    for m in history:
        assert m["multiturn/turns"] == 5 and m["multiturn/tool_calls"] == 4
        assert m["multiturn/tool_error_rate"] == 0.75 and m["multiturn/tool_timeout_rate"] == 0.25
        assert m["multiturn/truncated_rate"] == 0 and 0 < m["multiturn/action_token_share"] < 1
        assert np.isfinite(m["loss"]) and m["tokens/loss"] == policy_tokens  # the policy's tokens only
    assert replies[:4] == ["Error: hang timed out after 0.5 s.", "Error: boom raised RuntimeError: tool exploded",
                           "Error: garbage raised ValueError: no text", "7"]  # fmt: skip


@pytest.mark.slow
def test_the_readme_environment_trains_on_its_own_reward(modules, smollm2_gguf, tmp_path, monkeypatch):
    """The README's ten-line `Counter` as data.environment, scored by its get_reward alone (no reward function);
    the turns' prefills run the run's ``perf.attention``."""
    from jaxgrpo.models.attention import Kernel

    seen, real = [], models.prefill
    monkeypatch.setattr(models, "prefill", lambda *a, attention_kernel=None, **kw: seen.append(attention_kernel)
                        or real(*a, attention_kernel=attention_kernel, **kw))  # fmt: skip
    cfg = small(smollm2_gguf, "train.steps=1", "data.environment=readme_env:Counter",
                "data.rewards={environment: 1.0}", "perf.attention=chunked", "perf.attention_chunk=8")  # fmt: skip
    (m,) = trainer.run(cfg, tmp_path / "run")
    assert np.isfinite(m["loss"]) and m["reward/mean"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert "reward/invalid_frac" not in m  # no reward function ran
    assert seen and set(seen) == {Kernel("chunked", 8)}, seen


@pytest.mark.parametrize("offset, rate", [(0, 1.0), (1, 0.0)])
def test_the_in_training_evaluation_runs_the_turns(smollm2_gguf, tok, tmp_path, monkeypatch, offset, rate):
    """``train.eval_every`` on a multi-turn run: the held-out prompts run through the turns (the scripted policy calls
    the calculator once, then answers right or wrong by ``offset``), scored by the correctness reward; the ``eval/*``
    metrics and the report under eval/step<N>/ say so."""
    import json

    monkeypatch.setattr(multiturn_step.MultiTurn, "generate", staticmethod(calculating_policy(tok, offset)))
    out = trainer.run(small(smollm2_gguf, "train.steps=2", "train.eval_every=2", "train.eval_examples=3",
                            "checkpoint.every=0"), tmp_path / "run")  # fmt: skip
    assert "eval/pass@1" not in out[0]
    m = out[1]
    assert m["eval/pass@1"] == m["eval/pass@2"] == rate and m["eval/mean_reward"] == rate
    assert m["eval/multiturn/tool_calls"] == 1.0 and m["eval/multiturn/turns"] == 2.0
    report = json.loads((tmp_path / "run" / "eval" / "step2" / "eval.json").read_text())
    assert report["num_prompts"] == 3 and report["multiturn"]["multiturn/tool_calls"] == 1.0


@pytest.mark.slow
def test_a_learner_mesh_trains_the_one_device_run(smollm2_gguf, tmp_path, monkeypatch):
    """The learner on a 4 x 2 data x fsdp mesh of the 8 devices (the simple turn loop sampling over it, the batch split
    by groups over its 8 batch shards) against the same run on one device whose loop samples with the same sampler
    (`sampling.generate` on a one-device mesh): the same metrics, step for step, and the same final weights."""
    import functools

    from jaxgrpo import eval as eval_lib
    from jaxgrpo import multiturn_step, sampling, sharding

    over = ["train.steps=2", "rollout.prompts_per_step=8", "algo.estimator=sign"]
    one = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate",
                        staticmethod(functools.partial(sampling.generate, mesh=one)))  # fmt: skip
    want = trainer.run(small(smollm2_gguf, *over), tmp_path / "one")
    monkeypatch.setattr(multiturn_step.MultiTurn, "generate", None)
    shardings, real_update = [], trainer.Trainer.update

    def update(self, step, batch, packed):
        shardings.append(batch.tokens.sharding)
        return real_update(self, step, batch, packed)

    meshes, real_generate = [], sampling.generate

    def generate(*args, mesh=None, **kw):  # each turn's sampler call: the mesh it samples on
        meshes.append(mesh)
        return real_generate(*args, mesh=mesh, **kw)

    monkeypatch.setattr(trainer.Trainer, "update", update)
    monkeypatch.setattr(sampling, "generate", generate)
    got = trainer.run(small(smollm2_gguf, *over, "mesh.data=4", "mesh.fsdp=2"), tmp_path / "mesh")
    assert len(meshes) >= 2 and all(dict(m.shape) == {"data": 4, "fsdp": 2, "tensor": 1} for m in meshes)
    assert len(got) == len(want) == 2
    for s, (g, w) in enumerate(zip(got, want)):
        assert set(g) == set(w)
        assert_same_metrics(g, w, f"step {s + 1}")
    assert len(shardings) == 2 and all(len(sh.device_set) == 8 and sh.spec[0] == ("data", "fsdp") for sh in shardings)
    cfg = small(smollm2_gguf, *over)
    a = eval_lib.load_policy_for_eval(cfg, tmp_path / "one", 2).params
    b = eval_lib.load_policy_for_eval(cfg, tmp_path / "mesh", 2).params
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("extra, match", [
    (["mesh.distributed=true"], "on several hosts need rollout devices on every host"),
    (["mesh.data=2", ENGINE], "rollout.turn_engine=true samples on one device"),
    (["mesh.distributed=true", "mesh.rollout=1", "rollout.schedule=adaptive"],
     "rollout.schedule=adaptive with asynchronous rollouts runs on one host so far"),
    (["algo.overlong_buffer=65"], r"overlong_buffer must be in \[1, the token budget .* = 64\]"),
])  # fmt: skip
def test_unsupported_settings_are_one_line_errors(smollm2_gguf, tmp_path, extra, match):
    with pytest.raises(config_lib.ConfigError, match=match) as info:
        trainer.Trainer(small(smollm2_gguf, *extra), tmp_path / "run")
    assert "\n" not in str(info.value) and not (tmp_path / "run").exists()


def test_the_environment_reward_needs_an_environment_with_get_reward(modules, smollm2_gguf, tmp_path):
    with pytest.raises(config_lib.ConfigError, match="unless data.environment is set"):
        small(smollm2_gguf, "data.environment=null", "data.tools=[jaxgrpo.rollout.tools:calculator]")
    with pytest.raises(config_lib.ConfigError, match="has no get_reward"):
        trainer.Trainer(small(smollm2_gguf, "data.environment=mt_tools:NoReward"), tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_the_packaged_tools_example_trains_through_the_cli(smollm2_gguf, tmp_path, capsys):
    """configs/smollm2_tools.yaml as packaged (CalculatorEnv, the calculator tool, its system prompt, words level 4,
    gsm8k_lenient + the environment's reward, the warm start on its demonstrations, 2 steps of it here) through
    `python -m jaxgrpo.train`'s main, 2 steps at short shapes, with
    the model swapped for the tiny one on SmolLM2's tokenizer (the real model's train step alone compiles for
    minutes on a CPU; it was run by hand: docs/multiturn.md)."""
    run = tmp_path / "run"
    rc = train_cli.main(["--config", "smollm2_tools", "--run-dir", str(run), "train.steps=2",
                         "model.name_or_path=tiny", f"model.tokenizer={smollm2_gguf}", "model.hidden_size=32",
                         "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
                         "model.num_kv_heads=1", "model.max_position_embeddings=1024", "model.dtype=float32",
                         "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=32",
                         "rollout.max_turns=2", "rollout.max_total_tokens=null", "perf.remat=projections",
                         "warm_start.steps=2", "warm_start.batch_size=2", "warm_start.examples=4",
                         "log.progress=false", "log.tensorboard=false", "checkpoint.export_final=false"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err[-2000:]
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert np.isfinite(r["loss"]) and 1 <= r["multiturn/turns"] <= 2 and r["tokens/loss"] > 0
    saved = config_lib.load_config(str(run / "config.yaml"), [])
    assert saved.data.environment == "jaxgrpo.rollout.arithmetic_env:CalculatorEnv"
    assert saved.data.rewards == {"gsm8k_lenient": 1.0, "environment": 0.2} and saved.data.difficulty == 4
    assert (run / "checkpoints" / "2").is_dir()
    warm = [json.loads(line) for line in (run / "warm_start" / "warm_start.jsonl").read_text().splitlines()]
    assert [r["step"] for r in warm] == [1, 2] and all(r["warm_start/tokens"] > 0 for r in warm)
    shutil.rmtree(run)
