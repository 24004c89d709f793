# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""A multi-turn rollout over `jaxgrpo.sampling.generate`: one generate call per turn for the trajectories still
running, tools run in between; `jaxgrpo.learner.batch.multiturn_batch` packs the result into the train step's `Batch`
with its action mask.

Per trajectory (G per example, each with its own environment instance, `jaxgrpo.rollout.env.Episode`):

1. the prompt: the chat template's rendering of the system turn, the user prompt and the environment's first
   observation (`history.ChatFormat.prompt_messages`);
2. a policy turn of up to ``max_new_tokens`` sampled tokens, appended as they are (`history.TurnHistory`);
3. its text parsed for tool calls in the template's format; none: the trajectory is done (its answer is this turn's
   text); else the calls run (`tools.ToolRunner`, ``tool_timeout``) and the template tokens of the tool messages
   are appended as context (`history.ChatFormat.reply_tokens`); back to 2;
4. stop at ``max_turns`` policy turns, or when the next step would pass ``max_total_tokens`` tokens after the
   prompt or the model's ``max_position_embeddings`` (``truncated``).

This is the simple loop (the whole batch waits for each turn's slowest row, and each turn re-encodes its
contexts; ``rollout.turn_engine=false``, the default). The multi-turn engine (`jaxgrpo.rollout.turn_driver`) runs the
same turns with per-row caches: a row waiting on its tools leaves the decode batch and comes back with its cache. Both
apply the same turn rules (`Trajectories`) and return the same `MultiTurnRollout` with its `TurnHistory` record.

Randomness: trajectory ``b`` (of the ``P * G``, prompt-major; ``row_offset + b`` in a larger rollout split over
hosts) draws turn ``t``'s tokens with the keys of row ``b`` under the ``t``-th key split from ``key``
(`sampling.generate`'s ``key_ids``), so its tokens depend neither on which other trajectories are still running nor
on how a rollout is split over hosts.

The trainer runs the simple loop's turns with `fixed_generate` (one device): the engine at the run's `LoopShapes`
whatever the number of rows still running and the length of their contexts, so a run compiles a bounded set of
sampler programs, all of them known after its first step (`jaxgrpo.multiturn_precompile`). Same keys, same tokens
as over `sampling.generate`. What it costs: a turn with few rows left decodes ``P * G`` rows (the finished ones
masked) against the widest prefix cache; on an accelerator a decode step is bound by reading the weights, so the
rows and cache columns a small model adds cost little (on a CPU, compute-bound, the later turns cost more).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxgrpo import padding, sampling
from jaxgrpo.models.attention import DENSE, Kernel
from jaxgrpo.rollout import driver
from jaxgrpo.rollout.env import Episode, Toolbox
from jaxgrpo.rollout.history import ChatFormat, TurnHistory
from jaxgrpo.rollout.params import SamplingParams
from jaxgrpo.rollout.record import Completions
from jaxgrpo.rollout.tools import ToolRunner, parse_tool_calls


@dataclasses.dataclass(frozen=True)
class TurnSettings:
    """``rollout.*`` keys of a multi-turn rollout (see the configuration reference)."""

    max_turns: int = 4
    max_new_tokens: int = 64
    max_total_tokens: int | None = None  # after the prompt; None = max_turns * max_new_tokens
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def budget(self) -> int:
        return self.max_total_tokens if self.max_total_tokens is not None else self.max_turns * self.max_new_tokens


@dataclasses.dataclass
class MultiTurnRollout:
    """``B = P * G`` trajectories, prompt-major: their histories (after the group's shared prompt), episodes (empty
    once a rollout sampled on several hosts is gathered: they stay where their tools ran), conversations (messages,
    for logs) and answers (the text of the last policy turn, for reward functions)."""

    prompt_ids: list[list[int]]  # [P] the group's shared prompt
    histories: list[TurnHistory]  # [B]
    episodes: list[Episode]
    messages: list[list[dict[str, Any]]]
    answers: list[str]


def _shared_prompts(histories: list[TurnHistory], sizes: Sequence[int]) -> list[list[int]]:
    """Each group's longest common prompt prefix (group ``p``: the next ``sizes[p]`` rows); the rest of a row's prompt
    becomes context in its completion."""
    prompts, start = [], 0
    for p, size in enumerate(sizes):
        rows = histories[start : start + size]
        start += size
        n = min(len(h.prompt) for h in rows)
        while n and any(h.prompt[:n] != rows[0].prompt[:n] for h in rows):
            n -= 1
        if n == 0:
            raise ValueError(f"the {size} trajectories of example {p} share no prompt token")
        for h in rows:
            rest, h.prompt = h.prompt[n:], h.prompt[:n]
            h.tokens, h.action = rest + h.tokens, [False] * len(rest) + h.action
            h.logprobs, h.prompt_rest = [0.0] * len(rest) + h.logprobs, h.prompt_rest + len(rest)
        prompts.append(rows[0].prompt)
    return prompts


def regroup(out: MultiTurnRollout, sizes: Sequence[int], group_size: int) -> tuple[MultiTurnRollout, np.ndarray]:
    """A rollout sampled in sub-groups (prompt ``p``'s ``sizes[p]`` trajectories consecutive, prompt-major) as groups
    of ``group_size`` rows: each prompt's shared prompt taken again over all its trajectories (sub-groups whose first
    observations differ share less of it), then rows ``sizes[p]..group_size - 1`` padding: an empty trajectory of
    that prompt, no message, answer "". Returns the rollout and the ``[P, group_size]`` mask of its real rows. The
    episodes are dropped (as a rollout gathered from several hosts: its rewards are scored by then)."""
    if sum(sizes) != len(out.histories) or max(sizes, default=0) > group_size:
        raise ValueError(f"{len(out.histories)} trajectories in groups of {list(sizes)} (at most {group_size} each)")
    prompts = _shared_prompts(out.histories, sizes)
    real = np.arange(group_size)[None, :] < np.asarray(sizes)[:, None]
    rows, start = [], 0
    for size in sizes:
        rows += [start + j if j < size else None for j in range(group_size)]
        start += size
    hist = [out.histories[i] if i is not None else TurnHistory(prompt=list(prompts[k // group_size]), done=True)
            for k, i in enumerate(rows)]  # fmt: skip
    pick = lambda items, empty: [items[i] if i is not None else empty for i in rows]  # noqa: E731
    return MultiTurnRollout(prompts, hist, [], pick(out.messages, []), pick(out.answers, "")), real


@dataclasses.dataclass
class Trajectories:
    """The host side of ``B = P * G`` trajectories in flight, shared by the simple loop and the engine
    (`jaxgrpo.rollout.turn_driver`): environments, chat format, conversations and token histories."""

    episodes: list[Episode]
    chat: ChatFormat
    messages: list[list[dict[str, Any]]]
    base: list[list[dict[str, Any]]]  # each trajectory's first messages
    hist: list[TurnHistory]
    answers: list[str]

    @classmethod
    def start(cls, tokenizer: Any, toolbox: Toolbox | None, examples: Sequence[Any], group_size: int,
              system_prompt: str | None) -> Trajectories:  # fmt: skip
        rows = [ex for ex in examples for _ in range(group_size)]
        episodes = toolbox.episodes(rows) if toolbox is not None else [Episode(None, {}, []) for _ in rows]
        chat = ChatFormat(tokenizer, episodes[0].schemas, system_prompt)
        messages = [chat.prompt_messages(_prompt_of(ex), ep.observation) for ex, ep in zip(rows, episodes)]
        hist = [TurnHistory(prompt=chat.prompt_tokens(m)) for m in messages]
        return cls(episodes, chat, messages, [list(m) for m in messages], hist, [""] * len(hist))

    def no_room(self, i: int, settings: TurnSettings, limit: int) -> bool:
        """Whether trajectory ``i`` has no room for another turn (then it is marked truncated)."""
        h = self.hist[i]
        if len(h.tokens) >= settings.budget or h.total_tokens + settings.max_new_tokens > limit:
            h.done = h.truncated = True
        return h.done

    def end_turn(self, i: int, tokens: Sequence[int], logprobs: Sequence[float], settings: TurnSettings,
                 eos_token_ids: Sequence[int]) -> tuple[list[Any], int | None] | None:  # fmt: skip
        """Append a policy turn (cut at the token budget) to trajectory ``i``; returns its tool calls and its
        end-of-turn token (None: cut off) when tools are to run, None when the trajectory is done. A turn without a
        call is the answer; cut off before its end-of-turn token (``max_new_tokens`` or the budget), it is scored as
        written and the trajectory is truncated, as a single-turn completion that hits ``max_new_tokens``."""
        h = self.hist[i]
        n = min(len(tokens), settings.budget - len(h.tokens))
        toks = [int(t) for t in tokens[:n]]
        h.add_policy(toks, logprobs[:n])
        text = self.chat.tok.decode(toks, skip_special_tokens=True)
        found = parse_tool_calls(text, self.chat.format)
        self.messages[i].append({"role": "assistant", "content": text})
        last = toks[-1] if n > 0 and toks[-1] in eos_token_ids else None
        if not found:
            h.done, h.truncated, self.answers[i] = True, last is None, text
        elif h.turns >= settings.max_turns or len(h.tokens) >= settings.budget:
            h.done = h.truncated = True
        if h.done:
            return None
        return found, last

    def add_replies(self, i: int, found: Sequence[Any], results: Sequence[Any], last: int | None,
                    settings: TurnSettings) -> list[int] | None:  # fmt: skip
        """Count trajectory ``i``'s tool results and append their template tokens; returns them, or None when they
        pass the token budget (the trajectory is then truncated)."""
        h = self.hist[i]
        h.tool_calls += len(found)
        h.tool_errors += sum(r.error for r in results)  # malformed calls, unknown tools, raises, timeouts
        h.tool_timeouts += sum(r.timed_out for r in results)
        replies = [r.message() for r in results]
        self.messages[i] += replies
        delta = self.chat.reply_tokens(self.base[i], replies, last)
        if len(h.tokens) + len(delta) >= settings.budget:
            h.done = h.truncated = True
            return None
        h.add_context(delta)
        return delta

    def finish(self, group_size: int) -> MultiTurnRollout:
        for h in self.hist:
            if not h.done:
                h.done = h.truncated = True
        prompts = _shared_prompts(self.hist, [group_size] * (len(self.hist) // group_size))
        return MultiTurnRollout(prompts, self.hist, self.episodes, self.messages, self.answers)


def rollout(
    model_config: Any,
    params: Any,
    tokenizer: Any,
    toolbox: Toolbox | None,
    runner: ToolRunner,
    examples: Sequence[Any],
    *,
    group_size: int,
    settings: TurnSettings,
    eos_token_ids: Sequence[int],
    key: jax.Array,
    system_prompt: str | None = None,
    generate: Callable[..., sampling.Completions] = sampling.generate,
    row_offset: int = 0,
) -> MultiTurnRollout:
    """Runs G trajectories per example to the end (see the module docstring). ``generate``: the sampler, with
    `sampling.generate`'s signature (a test may script the policy). ``toolbox=None``: no tools (one answer turn).
    ``row_offset``: the first trajectory's row in a larger rollout (this host's share of one split over hosts)."""
    t = Trajectories.start(tokenizer, toolbox, examples, group_size, system_prompt)
    hist = t.hist
    limit = int(model_config.max_position_embeddings)
    for _ in range(settings.max_turns):
        live = [i for i, h in enumerate(hist) if not h.done and not t.no_room(i, settings, limit)]
        if not live:
            break
        key, sub = jax.random.split(key)
        out = generate(model_config, params, [hist[i].context() for i in live], max_new_tokens=settings.max_new_tokens,
                       temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                       eos_token_ids=tuple(eos_token_ids), key=sub, key_ids=[row_offset + i for i in live])  # fmt: skip
        toks, lps, lens = np.asarray(out.tokens), np.asarray(out.logprobs), np.asarray(out.lengths)
        pending = []
        for r, i in enumerate(live):
            ended = t.end_turn(i, toks[r, : lens[r]], lps[r, : lens[r]], settings, eos_token_ids)
            if ended is not None:
                pending.append((i, *ended))
        tools = [t.episodes[i].tools for i, _, _ in pending]
        results = runner.run([c for _, c, _ in pending], tools) if pending else []
        for (i, found, last), res in zip(pending, results):
            t.add_replies(i, found, res, last, settings)
    return t.finish(group_size)


def _prompt_of(example: Any) -> str:
    return example["prompt"] if isinstance(example, dict) else example.prompt


@dataclasses.dataclass(frozen=True)
class LoopShapes:
    """The run-fixed shapes of the simple loop's sampler on one device (`fixed_generate`): every turn's contexts go
    into ``slots`` engine slots (the run's ``P * G`` rows, padded to a power of two) with a prefix cache of
    ``prompt_width`` columns (the longest context a turn can start from: the run's longest prompt + the token budget
    - 1, at most the model's context less a turn), their prefill packed in one row on the ladder
    ``MIN_PROMPT_BUCKET, 2x, 4x, ...`` up to ``slots * prompt_width``."""

    slots: int
    prompt_width: int

    @classmethod
    def for_run(cls, rows: int, prompt_width: int, settings: TurnSettings, limit: int) -> LoopShapes:
        longest = min(prompt_width + settings.budget - 1, limit - settings.max_new_tokens)
        return cls(padding.batch_bucket(rows), padding.prompt_bucket(max(longest, 1)))

    @property
    def ladder(self) -> tuple[int, int]:
        return 0, self.slots * self.prompt_width

    def packed_rungs(self) -> list[int]:
        """Every packed prefill width a turn can take (each of the slots holds at least one token)."""
        cap = self.ladder[1]
        rungs, rung = {cap}, padding.ladder_bucket(self.slots, padding.MIN_PROMPT_BUCKET, cap)
        while rung < cap:
            rungs.add(rung)
            rung *= 2
        return sorted(rungs)


def fixed_generate(shapes: LoopShapes, block: int = driver.DEFAULT_BLOCK, attention: Kernel = DENSE
                   ) -> Callable[..., Completions]:  # fmt: skip
    """A `sampling.generate` stand-in (one sample per prompt, one device) for `rollout`'s turns that runs the engine
    at ``shapes`` whatever the number of live rows or the length of their contexts, and returns host arrays (no
    transfer program per row count). The same keys as `sampling.generate` (live row ``r`` of a turn draws token
    ``i`` with ``fold_in(fold_in(key, key_ids[r]), i)``), so the same trajectories; a turn with more rows or a longer
    context than ``shapes`` (an evaluation's batch, a prompt longer than the run's estimate) runs wider, at a new
    program.
    ``attention``: the prefill's attention kernel (a run's resolved ``perf.attention``)."""

    def generate(config: Any, params: Any, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 eos_token_ids: Sequence[int] = (), key: jax.Array, key_ids: Sequence[int] | None = None,
                 **kw: Any) -> Completions:  # fmt: skip
        sp = SamplingParams(max_new_tokens, 1, temperature, top_p, top_k, tuple(eos_token_ids))
        n = len(prompts)
        slots = max(shapes.slots, padding.batch_bucket(n))
        width = max(shapes.prompt_width, padding.prompt_bucket(max(len(p) for p in prompts)))
        # every slot's row prefilled (the missing ones padding), packed on the run's one ladder
        groups, _ = driver.run(config, params, prompts, sp, key, slots=slots, block=block, prompt_width=width,
                               packed_ladder=(0, slots * width), first_rows=slots, attention=attention,
                               key_ids=key_ids)  # fmt: skip
        return driver.completions(groups, range(n))

    return generate
