# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests of jaxgrpo.rollout.history: token-in-token-out histories of tool conversations.

The reference for a prefix-stable template (SmolLM2-135M-Instruct's own, from its GGUF) is a from-scratch
tokenization of the whole conversation rendered by ``apply_chat_template``. For a template that is not
prefix-stable (a Qwen3-style one that drops earlier turns' reasoning) the reference is the policy's sampled token
ids themselves, deliberately non-canonical (one token per character), which must appear unchanged.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from jaxgrpo.errors import ConfigError
from jaxgrpo.rollout import history as H
from jaxgrpo.rollout.tools import ToolCall, parse_tool_calls, tool_schema


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. 12*7.
    """
    return str(eval(expression, {"__builtins__": {}}))  # test helper: trusted input


SCHEMAS = [tool_schema(calculator)]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>'

# A Hermes-style template that renders tools, and one that drops earlier turns' <think> blocks (as Qwen3's does).
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
THINK_DROPPING_TEMPLATE = (
    "{% for m in messages %}{% set c = m.content %}"
    "{% if m.role == 'assistant' and not loop.last and '</think>' in c %}{% set c = c.split('</think>')[-1] %}"
    "{% endif %}<|im_start|>{{ m.role }}\n{{ c }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def with_template(tok, template):
    t = copy.deepcopy(tok)
    t.chat_template = template
    return t


def policy_turn(tok, text: str, eos: bool = True) -> list[int]:
    """What a policy that writes ``text`` samples: its canonical tokens, then <|im_end|> unless cut off."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids + ([tok.convert_tokens_to_ids("<|im_end|>")] if eos else [])


def run_conversation(fmt, tok, turns, replies, eos=True):
    """Builds a history turn by turn the way the rollout does; returns it and the messages for a reference."""
    msgs = fmt.prompt_messages("What is 12 times 7?")
    hist = H.TurnHistory(prompt=fmt.prompt_tokens(msgs))
    for i, ids in enumerate(turns):
        hist.add_policy(ids, [-0.5] * len(ids))
        if i < len(replies):
            hist.add_context(fmt.reply_tokens(msgs, replies[i], ids[-1] if eos else None))
    return hist, msgs


def test_prefix_stable_template_history_equals_from_scratch_tokenization(tok):
    fmt = H.ChatFormat(tok, SCHEMAS)
    assert not fmt.template_has_tools and '"name": "calculator"' in fmt.system_prompt  # SmolLM2: no tool syntax
    tool_msgs = [{"role": "tool", "name": "calculator", "content": "84"}]
    t1, t2 = policy_turn(tok, CALL), policy_turn(tok, "12 times 7 is 84.")
    hist, msgs = run_conversation(fmt, tok, [t1, t2], [tool_msgs])
    answer = {"role": "assistant", "content": "12 times 7 is 84."}
    conv = [*msgs, {"role": "assistant", "content": CALL}, *tool_msgs, answer]
    ref = fmt.encode(fmt.render(conv, False))
    # the template closes the last turn with "<|im_end|>\n"; the history ends at the policy's <|im_end|>
    assert hist.context() == ref[: hist.total_tokens] and tok.decode(ref[hist.total_tokens :]) == "\n"
    assert hist.action == [True] * len(t1) + [False] * (len(hist.tokens) - len(t1) - len(t2)) + [True] * len(t2)
    ctx = [t for t, a in zip(hist.tokens, hist.action) if not a]
    assert tok.decode(ctx) == "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n"
    assert parse_tool_calls(tok.decode(t1, skip_special_tokens=True), fmt.format) == [
        ToolCall("calculator", {"expression": "12*7"})
    ]


def test_two_tool_replies_and_a_cut_off_turn(tok):
    fmt = H.ChatFormat(tok, SCHEMAS)
    replies = [{"role": "tool", "name": "calculator", "content": "84"}, {"role": "tool", "name": "x", "content": "?"}]
    t1 = policy_turn(tok, CALL, eos=False)  # the turn hit its token limit before <|im_end|>
    hist, msgs = run_conversation(fmt, tok, [t1], [replies], eos=False)
    conv = [*msgs, {"role": "assistant", "content": CALL}, *replies]
    assert hist.context() == fmt.encode(fmt.render(conv, True))  # the missing <|im_end|> is context, not action
    assert sum(hist.action) == len(t1) and hist.tokens[len(t1)] == tok.convert_tokens_to_ids("<|im_end|>")


def test_policy_tokens_are_never_retokenized_where_the_template_is_not_prefix_stable(tok):
    fmt = H.ChatFormat(with_template(tok, THINK_DROPPING_TEMPLATE), SCHEMAS)
    text1 = "<think>multiply</think>" + CALL
    # non-canonical: one token per character of the reasoning (a sampler may well produce such splits)
    think = [i for ch in "<think>multiply</think>" for i in tok(ch, add_special_tokens=False)["input_ids"]]
    assert think != tok("<think>multiply</think>", add_special_tokens=False)["input_ids"]
    t1 = think + policy_turn(tok, CALL)
    t2 = policy_turn(tok, "84")
    tool_msgs = [{"role": "tool", "name": "calculator", "content": "84"}]
    hist, msgs = run_conversation(fmt, tok, [t1, t2], [tool_msgs])
    assert hist.tokens[: len(t1)] == t1 and hist.tokens[-len(t2) :] == t2  # exactly what was sampled
    assert hist.logprobs[: len(t1)] == [-0.5] * len(t1) and set(hist.logprobs[len(t1) : -len(t2)]) == {0.0}
    conv = [*msgs, {"role": "assistant", "content": text1}, *tool_msgs, {"role": "assistant", "content": "84"}]
    scratch = fmt.encode(fmt.render(conv, False))
    assert "multiply" not in tok.decode(scratch) and "multiply" in tok.decode(hist.context())  # template dropped it
    ctx = [t for t, a in zip(hist.tokens, hist.action) if not a]
    assert tok.decode(ctx) == "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n"


def test_tools_go_to_a_template_that_renders_them(tok):
    fmt = H.ChatFormat(with_template(tok, TOOLS_TEMPLATE), SCHEMAS, system_prompt="Be brief.")
    assert fmt.template_has_tools and fmt.system_prompt == "Be brief."
    text = tok.decode(fmt.prompt_tokens(fmt.prompt_messages("hi", observation="Initial observation")))
    assert text.startswith('<|im_start|>system\nTOOLS:{"type": "function", "function": {"name": "calculator"')
    assert "<|im_start|>user\nhi\n\nInitial observation<|im_end|>" in text


def test_templates_that_rewrite_what_precedes_the_turn_append_the_same_reply(tok):
    # Qwen3 writes an empty think block into the last assistant turn only, so the stand-in conversation is not
    # prefix-stable (A has the block, B does not); a template may also rewrite the conversation's start. Neither
    # touches what the policy saw, and the tokens after its turn are the same as under SmolLM2's template.
    last_turn_think = THINK_DROPPING_TEMPLATE.replace(
        "<|im_start|>{{ m.role }}\n{{ c }}",
        "<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and loop.last %}<think>\n\n</think>\n\n{% endif %}"
        "{{ c }}")
    assert last_turn_think != THINK_DROPPING_TEMPLATE
    tool_msgs = [{"role": "tool", "name": "calculator", "content": "84"}]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for template in (last_turn_think, "{{ messages | length }}" + THINK_DROPPING_TEMPLATE):
        fmt = H.ChatFormat(with_template(tok, template), SCHEMAS)
        msgs = fmt.prompt_messages("What is 12 times 7?")
        a = fmt.render([*msgs, {"role": "assistant", "content": "x"}], False)
        assert not fmt.render([*msgs, {"role": "assistant", "content": "x"}, *tool_msgs], True).startswith(a)
        reply = fmt.reply_tokens(msgs, tool_msgs, end)
        assert tok.decode(reply) == "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n"
        assert tok.decode(fmt.reply_tokens(msgs, tool_msgs, None)).startswith("<|im_end|>\n<|im_start|>tool")


def test_template_that_closes_a_turn_before_tool_messages_differently_is_rejected(tok):
    # a last assistant turn ends with <|im_end|> (what the policy samples), one followed by tools with <|endoftext|>
    closing = THINK_DROPPING_TEMPLATE.replace(
        "{{ c }}<|im_end|>", "{{ c }}{% if m.role == 'assistant' and not loop.last %}<|endoftext|>{% else %}<|im_end|>"
        "{% endif %}")
    fmt = H.ChatFormat(with_template(tok, closing), SCHEMAS)
    with pytest.raises(ConfigError, match="closes an assistant turn followed by tool messages differently"):
        fmt.reply_tokens(fmt.prompt_messages("q"), [{"role": "tool", "content": "1"}], None)


def test_rows_and_metrics_closed_form():
    a = H.TurnHistory(prompt=[1, 2], tool_calls=2, tool_errors=1, tool_timeouts=1)
    a.add_policy([5, 6], [-1.0, -2.0])
    a.add_context([7])
    a.add_policy([8], [-3.0])
    b = H.TurnHistory(prompt=[1, 2], truncated=True)
    b.add_policy([9], [-0.25])
    rows = H.to_rows([a, b], width=5)
    np.testing.assert_array_equal(rows["completion"], [[5, 6, 7, 8, 0], [9, 0, 0, 0, 0]])
    np.testing.assert_array_equal(rows["completion_mask"], [[1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(rows["action_mask"], [[1, 1, 0, 1, 0], [1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(rows["old_logprobs"], np.float32([[-1, -2, 0, -3, 0], [-0.25, 0, 0, 0, 0]]))
    m = H.metrics([a, b])
    assert m == {"multiturn/turns": 1.5, "multiturn/tool_calls": 1.0, "multiturn/tool_error_rate": 0.5,
                 "multiturn/tool_timeout_rate": 0.5, "multiturn/action_token_share": 4 / 5,
                 "multiturn/truncated_rate": 0.5}  # fmt: skip
    with pytest.raises(ValueError, match="more than width=3"):
        H.to_rows([a], width=3)
