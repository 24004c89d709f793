# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests of jaxgrpo.rollout.multiturn: the turn loop over a sampler, with a scripted policy (so every path is
exercised: a good call, a malformed call, a direct answer, a policy that never stops calling) and once with the
real `sampling.generate` on a tiny random model.

The references: the conversation each trajectory should have had, written out here, tokenized from scratch by
SmolLM2's (prefix-stable) template; the turn, call and error counts of each scripted path; `batch.check_batch`.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxgrpo import models, multiturn_step, sampling
from jaxgrpo.config import AlgoConfig
from jaxgrpo.learner.batch import check_batch, multiturn_batch
from jaxgrpo.rollout import multiturn as MT
from jaxgrpo.rollout.env import Toolbox
from jaxgrpo.rollout.history import ChatFormat
from jaxgrpo.rollout.tools import ToolRunner


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of integers and + - * /.

    Args:
        expression: The expression, e.g. 12*7.
    """
    if not set(expression) <= set("0123456789+-*/() "):
        raise ValueError("only integers and + - * / ( )")
    return str(eval(expression, {"__builtins__": {}}))  # checked above: arithmetic only


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'
BAD = '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
ANSWER = "12 times 7 is 84."
# the text of each trajectory's policy turns, by turn
SCRIPT = [[CALL, ANSWER], [BAD, ANSWER], [ANSWER], [CALL, CALL, CALL]]


def scripted_generate(tok, script):
    """A `sampling.generate` stand-in: row r's t-th call writes script[r][t] then <|im_end|> (log-prob -0.5 each)."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    turn = {}

    def generate(config, params, prompts, *, max_new_tokens, eos_token_ids, key, **kw):
        rows = []
        for ctx in prompts:
            r = next(r for r, start in starts.items() if ctx[: len(start)] == start)
            t = turn.get(r, 0)
            turn[r] = t + 1
            rows.append((tok(script[r][t], add_special_tokens=False)["input_ids"] + [eos])[:max_new_tokens])
        M = max_new_tokens
        toks = np.zeros((len(rows), M), np.int32)
        for i, ids in enumerate(rows):
            toks[i, : len(ids)] = ids
        lens = np.array([len(ids) for ids in rows], np.int32)
        mask = np.arange(M)[None] < lens[:, None]
        return sampling.Completions(tokens=toks, logprobs=np.where(mask, -0.5, 0.0).astype(np.float32), mask=mask,
                                    lengths=lens, truncated=np.array([ids[-1] != eos for ids in rows]))  # fmt: skip

    starts: dict[int, list[int]] = {}  # row -> its first prompt, filled by the test
    return generate, starts


def test_scripted_turn_loop_histories_counts_and_batch(tok):
    box = Toolbox(None, [calculator])
    examples = [{"prompt": f"What is 12 times 7? ({i})", "answer": "84"} for i in range(len(SCRIPT))]
    generate, starts = scripted_generate(tok, SCRIPT)
    chat = ChatFormat(tok, box.episodes(examples[:1])[0].schemas)
    for r, ex in enumerate(examples):  # rows are told apart by their (distinct) prompts
        starts[r] = chat.prompt_tokens(chat.prompt_messages(ex["prompt"]))
    settings = MT.TurnSettings(max_turns=3, max_new_tokens=64, max_total_tokens=400, temperature=1.0)
    config = models.ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                                num_kv_heads=1, max_position_embeddings=2048)  # fmt: skip
    out = MT.rollout(config, None, tok, box,
                     ToolRunner(workers=2, timeout=5.0), examples, group_size=1, settings=settings,
                     eos_token_ids=[tok.convert_tokens_to_ids("<|im_end|>")], key=jax.random.key(0),
                     generate=generate)  # fmt: skip
    h = out.histories
    assert [x.turns for x in h] == [2, 2, 1, 3]
    assert [x.tool_calls for x in h] == [1, 1, 0, 2] and [x.tool_errors for x in h] == [0, 1, 0, 0]
    assert [x.truncated for x in h] == [False, False, False, True]  # row 3 never stops calling: max_turns
    assert out.answers[:3] == [ANSWER] * 3 and out.answers[3] == ""
    assert out.messages[0][-2] == {"role": "tool", "name": "calculator", "content": "84"}
    assert out.messages[1][-2]["content"].startswith("Error: invalid JSON in <tool_call>")
    # row 0's exact history is the from-scratch tokenization of its conversation (SmolLM2's template is stable)
    scratch = chat.encode(chat.render(out.messages[0], False))
    full = out.prompt_ids[0] + h[0].tokens
    assert full == scratch[: len(full)] and tok.decode(scratch[len(full) :]) == "\n"
    # the policy's tokens are exactly the action tokens, with their log-probs
    for r, x in enumerate(h):
        policy = [t for t, a in zip(x.tokens, x.action) if a]
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        expect = [i for text in SCRIPT[r][: x.turns] for i in tok(text, add_special_tokens=False)["input_ids"] + [eos]]
        assert policy == expect and x.logprobs == [(-0.5 if a else 0.0) for a in x.action]
    # packed for the train step: shapes check, action mask carried
    batch = multiturn_batch(out, np.ones((4, 1), np.float32), np.ones((4, 1), bool), prompt_width=max(
        len(p) for p in out.prompt_ids), completion_width=max(len(x.tokens) for x in h))  # fmt: skip
    assert check_batch(batch, AlgoConfig(), 1) == (4, 1)
    am = np.asarray(batch.action_mask)
    assert am[0].sum() == sum(h[0].action) and not am[0, len(h[0].tokens) :].any()


def test_an_answer_cut_at_max_new_tokens_is_scored_as_written_and_truncated(tok):
    """Row 0 answers in 8 tokens and its end-of-turn token; row 1's answer runs past max_new_tokens = 12 (no
    end-of-turn token): scored as written (its first 12 tokens), truncated, as a single-turn completion that hits
    max_new_tokens; row 2's call is cut off the same way: still a call (answered as malformed), so the trajectory goes
    on to its answer and is not truncated."""
    long = "Twelve times seven: first add twelve seven times over, which gives eighty-four in the end."
    script = [[ANSWER], [long], [CALL, ANSWER]]
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert len(enc(ANSWER)) + 1 <= 12 < min(len(enc(long)), len(enc(CALL)))
    box = Toolbox(None, [calculator])
    examples = [{"prompt": f"What is 12 times 7? ({i})", "answer": "84"} for i in range(len(script))]
    generate, starts = scripted_generate(tok, script)
    chat = ChatFormat(tok, box.episodes(examples[:1])[0].schemas)
    for r, ex in enumerate(examples):
        starts[r] = chat.prompt_tokens(chat.prompt_messages(ex["prompt"]))
    config = models.ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                                num_kv_heads=1, max_position_embeddings=2048)  # fmt: skip
    out = MT.rollout(config, None, tok, box, ToolRunner(workers=1, timeout=5.0), examples, group_size=1,
                     settings=MT.TurnSettings(max_turns=3, max_new_tokens=12, max_total_tokens=400),
                     eos_token_ids=[tok.convert_tokens_to_ids("<|im_end|>")], key=jax.random.key(0),
                     generate=generate)  # fmt: skip
    h = out.histories
    assert [x.truncated for x in h] == [False, True, False] and [x.turns for x in h] == [1, 1, 2]
    assert out.answers == [ANSWER, tok.decode(enc(long)[:12]), ANSWER]
    assert h[2].tool_calls == h[2].tool_errors == 1 and out.messages[2][-2]["content"].startswith("Error: invalid JSON")


@pytest.mark.slow
def test_turn_loop_on_the_real_sampler(tok):
    """Tiny random model with SmolLM2's vocabulary: the loop runs `sampling.generate` turn after turn."""
    config = models.ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                                num_kv_heads=1, max_position_embeddings=1024)  # fmt: skip
    params = models.init_params(config, jax.random.key(0))
    settings = MT.TurnSettings(max_turns=2, max_new_tokens=8, temperature=1.0)
    out = MT.rollout(config, params, tok, Toolbox(None, [calculator]), ToolRunner(workers=1),
                     [{"prompt": "What is 3 + 4?"}], group_size=2, settings=settings,
                     eos_token_ids=[tok.convert_tokens_to_ids("<|im_end|>")], key=jax.random.key(1))  # fmt: skip
    assert len(out.prompt_ids) == 1 and len(out.histories) == 2
    for x in out.histories:
        assert x.done and 1 <= x.turns <= 2 and 1 <= sum(x.action) <= 16 and len(x.tokens) <= settings.budget
        assert all(lp < 0 for lp, a in zip(x.logprobs, x.action) if a)


def test_regroup_takes_the_shared_prompt_again_and_pads_each_group():
    """`multiturn.regroup` of sub-groups of 2 (prompt A: two sub-groups whose first observations differ, so each
    sub-group's shared prompt is longer than what all four share; prompt B: one sub-group) into groups of G = 4: A's
    shared prompt is the common prefix of all four, the rest of each row's prompt is context (not an action) before
    its tokens; B's rows 2-3 are padding (an empty trajectory with B's prompt, no message, answer "")."""
    def traj(prompt, tokens, answer):
        h = MT.TurnHistory(prompt=list(prompt))
        h.add_policy(tokens, [-0.5] * len(tokens))
        return h, [{"role": "assistant", "content": answer}], answer

    rows = [traj([1, 2, 3, 7], [10], "a0"), traj([1, 2, 3, 7], [11], "a1"),  # A, observation 7
            traj([1, 2, 3, 8, 9], [12], "a2"), traj([1, 2, 3, 8, 9], [13], "a3"),  # A, observation 8 9
            traj([5, 6], [14], "b0"), traj([5, 6], [15], "b1")]  # fmt: skip
    hist = [h for h, _, _ in rows]
    subgroups = MT._shared_prompts(hist, [2, 2, 2])  # as each sub-group's rollout leaves them
    assert subgroups == [[1, 2, 3, 7], [1, 2, 3, 8, 9], [5, 6]]
    out = MT.MultiTurnRollout(subgroups, hist, [], [m for _, m, _ in rows], [a for _, _, a in rows])
    got, real = MT.regroup(out, [4, 2], 4)
    np.testing.assert_array_equal(real, [[True] * 4, [True, True, False, False]])
    assert got.prompt_ids == [[1, 2, 3], [5, 6]] and got.episodes == []
    h = got.histories
    assert [(x.tokens, x.action, x.logprobs) for x in h[:4]] == [
        ([7, 10], [False, True], [0.0, -0.5]), ([7, 11], [False, True], [0.0, -0.5]),
        ([8, 9, 12], [False, False, True], [0.0, 0.0, -0.5]), ([8, 9, 13], [False, False, True], [0.0, 0.0, -0.5])]
    assert [(x.prompt, x.tokens) for x in h[4:]] == [([5, 6], [14]), ([5, 6], [15]), ([5, 6], []), ([5, 6], [])]
    # the budget counts tokens after each row's own prompt: the moved rest of A's rows is not among them
    assert multiturn_step.trajectory_lengths(h).tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert got.answers == ["a0", "a1", "a2", "a3", "b0", "b1", "", ""] and got.messages[6:] == [[], []]
    batch = multiturn_batch(got, np.zeros((2, 4), np.float32), real, 4, 4)  # padding rows: nothing in the loss
    np.testing.assert_array_equal(np.asarray(batch.completion_mask).sum(-1), [2, 2, 3, 3, 1, 1, 0, 0])
    with pytest.raises(ValueError, match="6 trajectories in groups of \\[4, 4\\]"):
        MT.regroup(out, [4, 4], 4)
