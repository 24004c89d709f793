# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests of the multi-turn engine (`jaxgrpo.rollout.turn_engine`, `jaxgrpo.rollout.turn_driver`).

A tiny random model over a character-level fake tokenizer whose upper ids decode to tool calls, with an environment
whose first observation differs between the rows of a group (so each row has a prompt rest, fed by forcing) and a
tool that answers, raises or hangs depending on its argument. The references:

* the record against a from-scratch `models.forward` over each trajectory's whole token history (prompt, policy
  tokens, tool tokens): at the policy's positions the log-probs of the sampling distribution (temperature applied)
  equal the recorded ones; tool and template positions carry no action mask and no log-prob;
* greedy histories (tokens, action mask, turns, tool calls, errors, timeouts, truncation, answers) equal the simple
  loop's (`multiturn.rollout` over `sampling.generate`, which re-encodes every context), with the token budget
  cutting trajectories in one case;
* a paused row's cache, bit for bit, while the other row decodes a hundred steps (a shared-clock ring writes every
  row's cache every step), and its next turn's log-probs after it resumes, against `models.forward`.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgrpo import models
from jaxgrpo.models.attention import Kernel
from jaxgrpo.rollout import engine, turn_driver
from jaxgrpo.rollout import multiturn as MT
from jaxgrpo.rollout import turn_engine as TE
from jaxgrpo.rollout.env import Toolbox
from jaxgrpo.rollout.tools import ToolRunner

V = 128
CHARS = " \nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789{}\":,<>/_|.=+-*()?!'"
CALL_IDS = range(112, 128)  # each decodes to a call of calc(x = id - 112)
EOS = (2, 5)  # <|im_end|> and the character "a" end a turn
CONFIG = models.ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                            num_kv_heads=1, max_position_embeddings=512)  # fmt: skip
RELEASE = threading.Event()


class FakeTokenizer:
    """Characters one id each; ``<|im_start|>`` 1, ``<|im_end|>`` 2; ids 112.. decode to a hermes tool call."""

    chat_template = "fake <|im_start|>"
    specials = {"<|im_start|>": 1, "<|im_end|>": 2}

    def __init__(self):
        self.pieces = ["", "<|im_start|>", "<|im_end|>"] + list(CHARS)
        self.pieces += ["~"] * (CALL_IDS[0] - len(self.pieces))
        self.pieces += [f'<tool_call>{{"name": "calc", "arguments": {{"x": {i - CALL_IDS[0]}}}}}</tool_call>'
                        for i in CALL_IDS]  # fmt: skip
        assert len(self.pieces) == V

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False, **kw):
        out = "<|im_start|>system\nT<|im_end|>\n" if tools else ""
        out += "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            sp = next((s for s in self.specials if text.startswith(s, i)), None)
            if sp:
                ids.append(self.specials[sp])
                i += len(sp)
            else:
                ids.append(3 + CHARS.index(text[i]) if text[i] in CHARS else 3 + CHARS.index("?"))
                i += 1
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.pieces[int(i)] for i in ids if not (skip_special_tokens and int(i) < 3))


class CalcEnv:
    """A first observation that differs between instances; ``calc`` answers, raises or hangs by its argument."""

    count = 0

    def reset(self, **kwargs):
        CalcEnv.count += 1
        return f"obs {CalcEnv.count % 3}"

    def calc(self, x: int) -> str:
        """Squares a number.

        Args:
            x: the number
        """
        if x % 4 == 1:
            raise ValueError("odd one")
        if x % 8 == 7:
            RELEASE.wait(30)
        return str(x * x)


@pytest.fixture(scope="module")
def params():
    yield models.init_params(CONFIG, jax.random.key(4))
    RELEASE.set()


class SlowEnv(CalcEnv):
    """`CalcEnv` whose ``calc`` never raises or hangs but sleeps ``delay`` seconds, noting the decode blocks the
    driver ran meanwhile (``BLOCKS``: the count so far, kept by a patched `turn_driver._Run.decode`)."""

    delay = 0.0
    during: list[int] = []

    def calc(self, x: int) -> str:
        """Squares a number.

        Args:
            x: the number
        """
        before = BLOCKS[0]
        threading.Event().wait(self.delay)
        SlowEnv.during.append(BLOCKS[0] - before)
        return str(x * x)


BLOCKS = [0]


def run(params, settings, key=0, engine_loop=True, block=4, env=CalcEnv, timeout=0.2, attention=None,
        share=slice(0, 3), row_offset=None):
    """A rollout of 2 trajectories for each of 3 examples, or of the examples ``share`` of them (the rows drawing
    what they would in the whole: ``row_offset``, by default the share's first row; the environments numbered as in
    the whole)."""
    CalcEnv.count = 2 * share.start
    tok, runner = FakeTokenizer(), ToolRunner(workers=2, timeout=timeout)
    examples = [{"prompt": f"what is {i}?"} for i in range(3)][share]
    kw = dict(group_size=2, settings=settings, eos_token_ids=EOS, key=jax.random.key(key),
              row_offset=2 * share.start if row_offset is None else row_offset)
    try:
        if engine_loop:
            att = {} if attention is None else dict(attention=attention)
            out, stats = turn_driver.rollout(CONFIG, params, tok, Toolbox(env), runner, examples, block=block,
                                             **att, **kw)  # fmt: skip
            return out, stats
        if attention is not None:  # the trainer's simple loop: the engine at run-fixed shapes
            kw["generate"] = MT.fixed_generate(MT.LoopShapes(8, 128), attention=attention)
        return MT.rollout(CONFIG, params, tok, Toolbox(env), runner, examples, **kw), None
    finally:
        runner.close()


@pytest.mark.parametrize("engine_loop", [True, False], ids=["turn_engine", "simple_loop"])
def test_the_prefills_take_the_runs_attention_kernel(params, engine_loop, monkeypatch):
    """``attention=`` (a run's resolved ``perf.attention``): the multi-turn engine's prefix prefill and the simple
    loop's prefills encode with that kernel (the chunked online softmax), and the trajectories are those of the
    dense kernel (float32: the kernels differ by rounding only)."""
    settings = MT.TurnSettings(max_turns=3, max_new_tokens=6, max_total_tokens=300, temperature=0.7)
    dense, _ = run(params, settings, key=1, engine_loop=engine_loop)
    kernel, seen, real = Kernel("chunked", 4), [], models.prefill

    def prefill(*args, attention_kernel=None, **kwargs):  # traced once per program: what each prefill runs
        seen.append(attention_kernel)
        return real(*args, attention_kernel=attention_kernel, **kwargs)

    monkeypatch.setattr(models, "prefill", prefill)
    chunked, _ = run(params, settings, key=1, engine_loop=engine_loop, attention=kernel)
    assert seen and set(seen) == {kernel}, seen
    assert sum(h.tool_calls for h in dense.histories) > 0  # several turns, so several prefills
    assert [h.tokens for h in chunked.histories] == [h.tokens for h in dense.histories]
    assert [h.action for h in chunked.histories] == [h.action for h in dense.histories]


@pytest.mark.parametrize("engine_loop", [True, False], ids=["turn_engine", "simple_loop"])
def test_a_rollout_split_in_shares_draws_the_whole_rollouts_trajectories(params, engine_loop):
    """Sampled (temperature 1): the first example's trajectories and the other two's, each share run alone with its
    ``row_offset`` (as hosts split a step's rollout), are the whole rollout's, token for token; the simple loop's
    rows draw with their own ids whichever rows are still running (`sampling.generate`'s ``key_ids``)."""
    settings = MT.TurnSettings(max_turns=3, max_new_tokens=6, max_total_tokens=300, temperature=1.0)
    whole, _ = run(params, settings, key=3, engine_loop=engine_loop)
    parts = [run(params, settings, key=3, engine_loop=engine_loop, share=s)[0] for s in (slice(0, 1), slice(1, 3))]
    hs = whole.histories
    assert len({h.turns for h in hs}) > 1 and sum(h.tool_calls for h in hs) > 0  # rows leave at different turns
    assert [p for part in parts for p in part.prompt_ids] == whole.prompt_ids
    assert [a for part in parts for a in part.answers] == whole.answers
    for i, (g, w) in enumerate(zip([h for part in parts for h in part.histories], hs, strict=True)):
        assert (g.tokens, g.action, g.turns) == (w.tokens, w.action, w.turns), f"trajectory {i}"
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=2e-5)
    unshifted, _ = run(params, settings, key=3, engine_loop=engine_loop, share=slice(1, 3), row_offset=0)
    assert [h.tokens for h in unshifted.histories] != [h.tokens for h in hs[2:]], "without the offset: other keys"


def test_record_equals_teacher_forced_forward(params):
    """Sampled at temperature 0.7: each recorded log-prob is log softmax(logits / 0.7) of `models.forward` over the
    trajectory's whole history; context tokens carry no action and log-prob 0."""
    temp = 0.7
    out, stats = run(params, MT.TurnSettings(max_turns=3, max_new_tokens=6, max_total_tokens=300, temperature=temp),
                     key=1)  # fmt: skip
    hs = out.histories
    assert sum(h.tool_calls for h in hs) > 0 and any(not h.truncated for h in hs)  # both paths taken
    assert stats.forced_tokens > 0 and 0 < stats.metrics()["rollout/row_utilization"] <= 1
    fulls = [out.prompt_ids[p // 2] + h.tokens for p, h in enumerate(hs)]
    width = max(len(f) for f in fulls)  # right-padded: causal attention, the padding is never attended
    tokens = jnp.asarray([f + [0] * (width - len(f)) for f in fulls], jnp.int32)
    lps = np.asarray(jax.nn.log_softmax(models.forward(CONFIG, params, tokens).astype(jnp.float32) / temp, axis=-1))
    for p, h in enumerate(hs):
        lp, n0 = lps[p], len(out.prompt_ids[p // 2])
        want = np.array([lp[n0 + j - 1, t] if a else 0.0 for j, (t, a) in enumerate(zip(h.tokens, h.action))])
        np.testing.assert_allclose(np.array(h.logprobs), want, atol=2e-5, err_msg=f"trajectory {p}")
        policy = sum(h.action)
        assert 0 < policy < len(h.tokens) or h.tool_calls == 0


@pytest.mark.parametrize("budget", [300, 60])
def test_greedy_histories_equal_the_simple_loop(params, budget):
    """Greedy: the engine's trajectories are the simple loop's, whatever the keys (``budget=60`` cuts some)."""
    settings = MT.TurnSettings(max_turns=3, max_new_tokens=6, max_total_tokens=budget, temperature=0.0)
    got, _ = run(params, settings, key=0, engine_loop=True)
    want, _ = run(params, settings, key=7, engine_loop=False)
    assert got.prompt_ids == want.prompt_ids and got.answers == want.answers
    fields = ("tokens", "action", "turns", "tool_calls", "tool_errors", "tool_timeouts", "truncated")
    for i, (g, w) in enumerate(zip(got.histories, want.histories)):
        for f in fields:
            assert getattr(g, f) == getattr(w, f), f"trajectory {i}: {f}"
        np.testing.assert_allclose(g.logprobs, w.logprobs, atol=2e-5)
    hs = got.histories
    if budget == 300:  # the paths the comparison covers
        assert len({h.turns for h in hs}) > 1  # rows finish at different turns
        assert sum(h.tool_errors for h in hs) > 0 and sum(h.tool_timeouts for h in hs) > 0  # raised, hung: answered
        # rows that answer before max_turns (a random model's 6-token answer is cut off, so truncated too), rows
        # stopped by max_turns
        assert any(h.turns < 3 and h.tool_calls < h.turns for h in hs) and any(h.truncated and h.turns == 3 for h in hs)
    else:  # the token budget cuts a trajectory before its last turn
        assert any(h.truncated and h.turns < 3 for h in hs) and max(len(h.tokens) for h in hs) <= budget


def test_paused_row_cache_survives_other_rows_decoding(params):
    """Row 0 ends its turn after one token and stays out of the batch while row 1 decodes 100 steps: its cache is
    unchanged bit for bit; resumed with appended tokens, its next turn's log-probs match `models.forward`."""
    prefix, first = [1, 20, 21, 22], [[23, 24], [25]]
    spec = TE.TurnSpec(1, 2, 128, 16, 4, False, 0, False, ())
    tok, mask = engine.left_pad([prefix], 16, 1)
    caches = TE.prefill_prefix(CONFIG, spec, params, tok, mask, mask)
    seq = np.zeros((2, 128), np.int32)
    seq[0, :2], seq[1, :1] = first[0], first[1]
    state = TE.init_state(spec, jax.random.key(0), seq, np.array([2, 1]), np.array([4, 4]), np.array([1, 110]),
                          np.array([True, True]))  # fmt: skip
    weights, temp, top_p = engine.prepare_weights(CONFIG, params), jnp.float32(1.0), jnp.float32(1.0)
    caches, state = TE.decode_block(CONFIG, spec, weights, caches, state, temp, top_p)
    assert not bool(state.active[0]) and bool(state.active[1])
    snapshot = [(np.asarray(c.k[0]), np.asarray(c.v[0])) for c in caches.rows]
    for _ in range(25):
        caches, state = TE.decode_block(CONFIG, spec, weights, caches, state, temp, top_p)
    assert int(state.pos[1]) > 100 and int(state.pos[0]) == 2
    for (k0, v0), c in zip(snapshot, caches.rows):
        np.testing.assert_array_equal(np.asarray(c.k[0]), k0)
        np.testing.assert_array_equal(np.asarray(c.v[0]), v0)
    row0 = np.asarray(state.seq[0]).copy()
    row0[3:6] = [30, 31, 32]  # appended "tool" tokens after the sampled one
    seq = np.stack([row0, np.asarray(state.seq[1])])
    state = TE.resume(state, np.array([True, False]), seq, np.array([6, int(state.known[1])], np.int32),
                      np.array([5, 0], np.int32))  # fmt: skip
    for _ in range(3):
        caches, state = TE.decode_block(CONFIG, spec, weights, caches, state, temp, top_p)
    n = int(state.known[0])
    assert n > 6 and not bool(state.active[0])
    history = prefix + np.asarray(state.seq[0, :n]).tolist()
    lp = jax.nn.log_softmax(models.forward(CONFIG, params, jnp.asarray([history], jnp.int32))[0], axis=-1)
    sampled = [2] + list(range(6, n))  # the first turn's token and the second turn's
    want = [float(lp[len(prefix) + j - 1, history[len(prefix) + j]]) for j in sampled]
    np.testing.assert_allclose(np.asarray(state.logprobs[0])[sampled], want, atol=2e-5)


def test_a_slow_tool_delays_its_row_only(params, monkeypatch):
    """Every tool call sleeps 0.3 s: the trajectories, sampled at temperature 0.7, are those of instant tools (a
    row's tokens depend on its key and its own cache, not on when it returns), and the other rows decode while a tool
    runs (several blocks during a call; a driver that takes each result after one block would run at most one)."""
    decode = turn_driver._Run.decode

    def counted(self):
        BLOCKS[0] += 1
        return decode(self)

    monkeypatch.setattr(turn_driver._Run, "decode", counted)
    settings = MT.TurnSettings(max_turns=3, max_new_tokens=6, max_total_tokens=300, temperature=0.7)
    outs = []
    for delay in (0.0, 0.3):
        SlowEnv.delay, SlowEnv.during = delay, []
        outs.append(run(params, settings, key=3, env=SlowEnv, timeout=10.0)[0])
    (fast, slow), during = outs, SlowEnv.during
    assert sum(h.tool_calls for h in slow.histories) > 0 and slow.answers == fast.answers
    for i, (g, w) in enumerate(zip(slow.histories, fast.histories)):
        assert (g.tokens, g.action, g.turns, g.tool_calls) == (w.tokens, w.action, w.turns, w.tool_calls), i
        np.testing.assert_array_equal(g.logprobs, w.logprobs)
    assert max(during) >= 3, during
