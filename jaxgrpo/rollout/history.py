# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Token in, token out: a multi-turn trajectory as one exact token history, and its record for the learner.

The policy's sampled tokens are never decoded and re-tokenized. After a policy turn, only the template tokens of the
new messages are appended (`ChatFormat.reply_tokens`), computed as the difference of two renderings of a fixed
stand-in conversation by the tokenizer's own chat template::

    A  = render(prompt + [assistant "<stand-in>"])                          (no generation prompt)
    B  = render(prompt + [assistant "<stand-in>"] + tool messages, add_generation_prompt=True)
    delta = B after the stand-in's content, less the end-of-turn token the policy already sampled

This needs the template to write the stand-in's content as it is and to close it the same way whether it is the last
message (A: ``close``, the text after the content, e.g. ``<|im_end|>\\n``, whose first token ends a policy turn) or
followed by tool messages (B after the content starts with ``close``; checked). It does not need the conversation to
be prefix-stable: what the template writes before the content changes nothing already in the history, which is what
the policy saw -- Qwen3's drops earlier turns' reasoning, and writes an empty ``<think></think>`` block into the
last assistant turn only. Where the template is prefix-stable over the whole conversation, the history equals a
from-scratch tokenization of it (when the policy's tokens are the tokenizer's own encoding of its text).

`TurnHistory` keeps the completion region (everything after the first prompt) with an action mask (True: the policy
sampled the token) and the sampler's log-probs (0 on context tokens); `to_rows` pads a group of them into the
train step's ``Batch`` fields (``completion_mask``: every real token, attended; ``action_mask``: the loss's tokens).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxgrpo.errors import ConfigError
from jaxgrpo.rollout.tools import CallFormat, call_format

_STANDIN = "Stand-in reply 7f3a."
Message = dict[str, Any]


def tool_instructions(schemas: Sequence[dict[str, Any]], fmt: CallFormat) -> str:
    """The tools' description for a template that has no tool syntax of its own (SmolLM2): put in the system turn."""
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    if fmt == "llama3":
        how = 'To call a tool, answer only with {"name": <tool name>, "parameters": <JSON object of arguments>}.'
    else:
        how = 'To call a tool, write <tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>.'
    return (f"You can use these tools, described as JSON schemas:\n{lines}\n{how} "
            "The result comes back in a tool message. Answer without a tool call when you are done.")  # fmt: skip


class ChatFormat:
    """A tokenizer's chat template applied to tool conversations, as token sequences.

    ``schemas``: the tools' JSON schemas, passed as ``apply_chat_template(..., tools=schemas)``; when the template
    ignores them (renders the same with and without), they are described in the system turn instead
    (`tool_instructions`). ``call_format``: how calls are parsed (default: what the template teaches).
    """

    def __init__(self, tokenizer: Any, schemas: Sequence[dict[str, Any]], system_prompt: str | None = None,
                 fmt: CallFormat | None = None, template_kwargs: dict[str, Any] | None = None):  # fmt: skip
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("multi-turn rollouts need a tokenizer with a chat template (data.template=chat)")
        self.tok, self.schemas, self.kwargs = tokenizer, list(schemas), dict(template_kwargs or {})
        self.format: CallFormat = fmt or call_format(tokenizer.chat_template)
        probe = [{"role": "user", "content": "x"}]
        self.template_has_tools = bool(self.schemas) and self.render(probe, False, tools=True) != self.render(
            probe, False, tools=False
        )
        self.system_prompt = system_prompt
        if self.schemas and not self.template_has_tools:
            extra = tool_instructions(self.schemas, self.format)
            self.system_prompt = f"{system_prompt}\n\n{extra}" if system_prompt else extra

    def render(self, messages: Sequence[Message], add_generation_prompt: bool, tools: bool = True) -> str:
        tools_arg = self.schemas if (tools and self.schemas) else None
        return self.tok.apply_chat_template(list(messages), tools=tools_arg, tokenize=False,
                                            add_generation_prompt=add_generation_prompt, **self.kwargs)  # fmt: skip

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def prompt_messages(self, prompt: str, observation: str | None = None) -> list[Message]:
        """The first messages: the system turn (with the tools' description where needed), the user's prompt and
        the environment's first observation (appended to the user turn, as TRL does)."""
        msgs: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        content = prompt if observation is None else f"{prompt}\n\n{observation}"
        return msgs + [{"role": "user", "content": content}]

    def prompt_tokens(self, messages: Sequence[Message]) -> list[int]:
        return self.encode(self.render(messages, True))

    def _closed_turn(self, prompt: Sequence[Message]) -> tuple[str, str]:
        """The rendering of ``prompt`` with the generation prompt, and the text the template writes after a last
        stand-in assistant turn's content (``close``)."""
        a0 = self.render(prompt, True)
        a = self.render([*prompt, {"role": "assistant", "content": _STANDIN}], False)
        at = a.find(_STANDIN, len(a0) if a.startswith(a0) else 0)
        if at < 0:
            raise ConfigError("the chat template does not write an assistant message's content as it is; "
                              "multi-turn token histories need it to")  # fmt: skip
        return a0, a[at + len(_STANDIN) :]

    def end_of_turn(self, prompt: Sequence[Message], eos_token_ids: Sequence[int]) -> int:
        """The token that ends an assistant turn in this template (the policy samples it, and generation stops on
        it): the first token of ``close``, which must be one of ``eos_token_ids``."""
        close = self.encode(self._closed_turn(prompt)[1])
        if not close or close[0] not in eos_token_ids:
            raise ConfigError(f"the chat template ends an assistant turn with {self.tok.decode(close[:1])!r}, which is "
                              f"not an end-of-sequence token of the model ({list(eos_token_ids)})")  # fmt: skip
        return close[0]

    def reply_tokens(self, prompt: Sequence[Message], replies: Sequence[Message], last_token: int | None) -> list[int]:
        """The tokens that follow a policy turn ending in ``last_token``: the end of the assistant turn the policy did
        not write itself, the ``replies`` (tool or user messages) and the next generation prompt."""
        turn = {"role": "assistant", "content": _STANDIN}
        a0, close = self._closed_turn(prompt)
        b = self.render([*prompt, turn, *replies], True)
        at = b.find(_STANDIN, len(a0) if b.startswith(a0) else 0)
        after = b[at + len(_STANDIN) :] if at >= 0 else ""
        if at < 0 or not after.startswith(close):
            raise ConfigError(f"the chat template closes an assistant turn followed by tool messages differently from "
                              f"a last one ({after[: len(close)]!r}, not {close!r}); multi-turn rollouts cannot "
                              "append replies to the token history with it")  # fmt: skip
        if last_token is not None:
            last = self.tok.decode([last_token])
            if last and close.startswith(last):  # the policy already wrote the end-of-turn token
                after = after[len(last) :]
        return self.encode(after)


@dataclasses.dataclass
class TurnHistory:
    """One trajectory's exact tokens after its first prompt, with who wrote each (``action``) and counters."""

    prompt: list[int]
    tokens: list[int] = dataclasses.field(default_factory=list)
    action: list[bool] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    done: bool = False
    truncated: bool = False  # stopped by a limit (max_turns, the token budget, the context), or its answer cut off
    prompt_rest: int = 0  # the first tokens of `tokens`: its own prompt past the group's shared one (context)

    def add_policy(self, tokens: Sequence[int], logprobs: Sequence[float]) -> None:
        """Appends a policy turn's sampled tokens (never re-tokenized) and their sampler log-probs."""
        if len(tokens) != len(logprobs):
            raise ValueError(f"{len(tokens)} tokens but {len(logprobs)} log-probs")
        self.tokens += [int(t) for t in tokens]
        self.action += [True] * len(tokens)
        self.logprobs += [float(x) for x in logprobs]
        self.turns += 1

    def add_context(self, tokens: Sequence[int]) -> None:
        """Appends template, tool or environment tokens: attended, never trained on."""
        self.tokens += [int(t) for t in tokens]
        self.action += [False] * len(tokens)
        self.logprobs += [0.0] * len(tokens)

    @property
    def total_tokens(self) -> int:
        return len(self.prompt) + len(self.tokens)

    def context(self) -> list[int]:
        """What the policy reads next: the prompt and everything after it."""
        return self.prompt + self.tokens


def to_rows(histories: Sequence[TurnHistory], width: int | None = None) -> dict[str, np.ndarray]:
    """The completion regions right-padded to ``width`` (default: the longest): ``completion`` int32,
    ``completion_mask``, ``action_mask`` bool, ``old_logprobs`` float32 (0 off actions), all ``[B, width]``."""
    width = max((len(h.tokens) for h in histories), default=0) if width is None else width
    B = len(histories)
    out = dict(completion=np.zeros((B, width), np.int32), completion_mask=np.zeros((B, width), bool),
               action_mask=np.zeros((B, width), bool), old_logprobs=np.zeros((B, width), np.float32))  # fmt: skip
    for i, h in enumerate(histories):
        if len(h.tokens) > width:
            raise ValueError(f"trajectory {i} has {len(h.tokens)} tokens after its prompt, more than width={width}")
        n = len(h.tokens)
        out["completion"][i, :n] = h.tokens
        out["completion_mask"][i, :n] = True
        out["action_mask"][i, :n] = h.action
        out["old_logprobs"][i, :n] = h.logprobs
    return out


def metrics(histories: Sequence[TurnHistory]) -> dict[str, float]:
    """Per-trajectory means of turns and tool calls, tool error and timeout rates, and the action-token share."""
    n = max(len(histories), 1)
    calls = sum(h.tool_calls for h in histories)
    tokens = sum(len(h.tokens) for h in histories)
    return {
        "multiturn/turns": sum(h.turns for h in histories) / n,
        "multiturn/tool_calls": calls / n,
        "multiturn/tool_error_rate": sum(h.tool_errors for h in histories) / max(calls, 1),
        "multiturn/tool_timeout_rate": sum(h.tool_timeouts for h in histories) / max(calls, 1),
        "multiturn/action_token_share": sum(sum(h.action) for h in histories) / max(tokens, 1),
        "multiturn/truncated_rate": sum(h.truncated for h in histories) / n,
    }
