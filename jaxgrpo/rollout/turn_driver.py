# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Multi-turn rollouts on the engine (`jaxgrpo.rollout.turn_engine`): rows leave the decode batch while their tools
run and come back with their caches; the other rows keep decoding.

The same trajectories as the simple loop (`jaxgrpo.rollout.multiturn.rollout`): the same prompt, turn, tool,
budget and truncation rules (`multiturn.Trajectories`, shared by both), the same `MultiTurnRollout` with its
`TurnHistory` record. What differs is the schedule:

* each group's longest common prompt prefix less its last token is prefilled once (the prefix cache); the rest of
  each row's prompt is its first known tokens, fed by forcing;
* the host runs decode blocks of ``block`` steps; after each, every row that ended a turn in it is handed to
  `multiturn.Trajectories.end_turn` (its sampled tokens, never re-tokenized); the block's tool calls go, as one
  batch, to a thread of their own (`tools.ToolRunner`'s workers, ``rollout.tool_timeout``; batches run side by side)
  and run while the following blocks decode the other rows; after each block the host takes the results that are
  ready (it waits only when no row is left to decode), appends the tool messages' template tokens to their rows'
  buffers and puts the rows back (`turn_engine.resume`).

A row's tokens do not depend on the schedule: its token ``n`` is drawn with ``fold_in(fold_in(key, row), n)`` (``row``
counted in the whole rollout when it is split over hosts: ``row_offset``) and
computed from its own cache alone, so a slow tool delays its row, never changes a trajectory, and a resumed training
run redraws the same trajectories. What a tool's duration does change is when its row returns, and so
``rollout/decode_steps`` and ``rollout/row_utilization`` (timings, like ``decode_tokens_per_s``). Taking each
result after a fixed one block instead made the schedule reproducible but stalled every other row behind the
slowest tool: on an H200, with tools of up to 200 ms, that ran at 0.49x the simple loop (BENCHMARKS §9), and so
did one tool thread for all batches (0.40x: each block's calls queued behind the earlier blocks').

Metrics (`TurnStats`): ``rollout/row_utilization`` = row-steps on rows in the batch / (decode steps * B);
``rollout/forced_tokens`` = tokens prefilled by forcing (the rows' prompt rests and the appended template and tool
tokens); ``rollout/decode_steps``; ``rollout/decode_tokens_per_s`` = tokens sampled / decode seconds.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import models, padding
from jaxgrpo.models.attention import DENSE, Kernel
from jaxgrpo.rollout import engine
from jaxgrpo.rollout import turn_engine as TE
from jaxgrpo.rollout.env import Toolbox
from jaxgrpo.rollout.multiturn import MultiTurnRollout, Trajectories, TurnSettings
from jaxgrpo.rollout.tools import ToolRunner

DEFAULT_BLOCK = 8
_BATCH_THREADS = 64  # batches of tool calls in flight at once (a block's ended rows make one batch)


@dataclasses.dataclass
class TurnStats:
    decode_steps: int = 0
    active_steps: int = 0
    forced_tokens: int = 0
    sampled_tokens: int = 0
    decode_seconds: float = 0.0
    rows: int = 1

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/row_utilization": self.active_steps / max(self.decode_steps * self.rows, 1),
            "rollout/forced_tokens": float(self.forced_tokens),
            "rollout/decode_steps": float(self.decode_steps),
            "rollout/decode_tokens_per_s": self.sampled_tokens / max(self.decode_seconds, 1e-9),
        }


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """The length of the longest common prefix of ``prompts``."""
    n = min(len(p) for p in prompts)
    while n and any(list(p[:n]) != list(prompts[0][:n]) for p in prompts):
        n -= 1
    return n


def _layout(hist: Sequence[Any], group_size: int, budget: int) -> tuple[list[list[int]], list[list[int]], int]:
    """Each group's prefix (its common prompt prefix less the last token) and each row's first known tokens (the
    rest of its prompt), and the rows' width (they hold at most the first tokens and ``budget`` more)."""
    prefixes, firsts = [], []
    for p in range(len(hist) // group_size):
        prompts = [h.prompt for h in hist[p * group_size : (p + 1) * group_size]]
        n = common_prefix(prompts)
        if n == 0:
            raise ValueError(f"the {group_size} trajectories of example {p} share no prompt token")
        prefixes.append(list(prompts[0][: n - 1]))
        firsts += [list(x[n - 1 :]) for x in prompts]
    return prefixes, firsts, engine.cache_slots(max(len(f) for f in firsts) + budget + 1)


class _Run:
    """Host state of one engine rollout."""

    def __init__(self, config: models.ModelConfig, params: Any, t: Trajectories, settings: TurnSettings,
                 eos: tuple[int, ...], key: jax.Array, group_size: int, block: int, prompt_width: int,
                 attention: Kernel, row_offset: int = 0):  # fmt: skip
        self.config, self.t, self.settings, self.eos = config, t, settings, eos
        self.limit = int(config.max_position_embeddings)
        prefixes, firsts, W = _layout(t.hist, group_size, settings.budget)
        greedy = settings.temperature <= 0
        top_k, use_top_p = engine.truncation(config, greedy, settings.top_k, settings.top_p)
        tp = padding.prompt_bucket(max(max(len(p) for p in prefixes), prompt_width, 1))
        self.spec = TE.TurnSpec(len(prefixes), group_size, W, tp, int(block), greedy, top_k, use_top_p, eos,
                                attention)  # fmt: skip
        B = self.spec.rows
        self.weights = engine.prepare_weights(config, params)
        tok, mask = engine.left_pad(prefixes, tp, len(prefixes))  # an empty prefix: no real token
        real = mask.copy()
        mask[:, -1] = True  # ... but one encoded (a dummy that no row attends)
        self.caches = TE.prefill_prefix(config, self.spec, params, tok, mask, real)
        self.seq = np.zeros((B, W), np.int32)
        self.known = np.array([len(f) for f in firsts], np.int32)
        for b, f in enumerate(firsts):
            self.seq[b, : len(f)] = f
        base = np.repeat([len(p) for p in prefixes], group_size).astype(np.int32)
        live = np.array([not t.no_room(b, settings, self.limit) for b in range(B)])
        limits = np.full(B, min(settings.max_new_tokens, settings.budget), np.int32)
        self.state = TE.init_state(self.spec, key, self.seq, self.known, base, limits, live, row_offset)
        self.active = live.copy()
        self.temp = jnp.float32(settings.temperature if not greedy else 1.0)
        self.top_p = jnp.float32(settings.top_p)
        self.stats = TurnStats(rows=B)

    def decode(self) -> np.ndarray:
        """One decode block; returns the rows whose turn ended in it."""
        t0 = time.perf_counter()
        self.caches, self.state = TE.decode_block(self.config, self.spec, self.weights, self.caches, self.state,
                                                  self.temp, self.top_p)  # fmt: skip
        active = np.array(self.state.active)
        self.stats.decode_seconds += time.perf_counter() - t0
        self.stats.decode_steps += self.spec.block
        ended = np.flatnonzero(self.active & ~active)
        self.active = active
        return ended

    def end_turns(self, rows: np.ndarray) -> list[tuple[int, list[Any], int | None]]:
        """Hand the turns that ended to the trajectories; returns the rows whose tools are to run."""
        if not len(rows):
            return []
        seq, lps, known, n = jax.device_get((self.state.seq, self.state.logprobs, self.state.known,
                                             self.state.turn_len))  # fmt: skip
        calls = []
        for b in rows:
            k, m = int(known[b]), int(n[b])
            self.seq[b, k - m : k] = seq[b, k - m : k]
            self.known[b] = k
            self.stats.sampled_tokens += m
            ended = self.t.end_turn(int(b), seq[b, k - m : k].tolist(), lps[b, k - m : k].tolist(), self.settings,
                                    self.eos)  # fmt: skip
            if ended is not None:
                calls.append((int(b), *ended))
        return calls

    def resume(self, done: list[tuple[int, list[Any], int | None]], results: list[Any]) -> None:
        """Append the tool replies' template tokens of the rows ``done`` and put the rows with room back."""
        on = np.zeros(self.spec.rows, bool)
        limits = np.zeros(self.spec.rows, np.int32)
        for (b, found, last), res in zip(done, results, strict=True):
            delta = self.t.add_replies(b, found, res, last, self.settings)
            if delta is None or self.t.no_room(b, self.settings, self.limit):
                continue
            k = int(self.known[b])
            self.seq[b, k : k + len(delta)] = delta
            self.known[b] = k + len(delta)
            limits[b] = min(self.settings.max_new_tokens, self.settings.budget - len(self.t.hist[b].tokens))
            on[b] = True
        if on.any():
            self.state = TE.resume(self.state, on, self.seq, self.known, limits)
            self.active |= on


def rollout(
    model_config: models.ModelConfig,
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
    block: int = DEFAULT_BLOCK,
    prompt_width: int = 0,
    attention: Kernel = DENSE,
    row_offset: int = 0,
) -> tuple[MultiTurnRollout, TurnStats]:
    """G trajectories per example on the engine (module docstring); `multiturn.rollout`'s arguments (``params``:
    compute-dtype params, `models.compute_params`), ``block``, decode steps per block, and ``prompt_width``, the least
    prefix-cache width (a run's longest prompt: one decode program for the run, not one per prompt bucket met), and
    ``attention``, the prefix prefill's attention kernel (a run's resolved ``perf.attention``), and ``row_offset``,
    the first trajectory's row in a larger rollout (this host's share of one split over hosts: its rows draw what
    they would in the whole). Returns the rollout and the engine's stats."""
    if block < 1:
        raise ValueError(f"decode block ({block}) must be >= 1")
    t = Trajectories.start(tokenizer, toolbox, examples, group_size, system_prompt)
    eos = tuple(int(e) for e in eos_token_ids)
    run = _Run(model_config, params, t, settings, eos, key, group_size, block, prompt_width, attention, row_offset)
    # one thread per batch of calls in flight, so batches run side by side (each call on the runner's workers, which
    # bound how many run at once): one thread would queue a block's calls behind every earlier block's
    pool = concurrent.futures.ThreadPoolExecutor(_BATCH_THREADS, thread_name_prefix="jaxgrpo-tools")
    pending: list[tuple[concurrent.futures.Future, list[Any]]] = []
    try:
        while run.active.any() or pending:
            ended = run.decode() if run.active.any() else np.zeros(0, int)
            calls = run.end_turns(ended)
            if pending and not run.active.any() and not calls:  # nothing to decode: wait for a batch
                concurrent.futures.wait([f for f, _ in pending], return_when=concurrent.futures.FIRST_COMPLETED)
            for future, done in [p for p in pending if p[0].done()]:  # the batches whose tools have finished
                pending.remove((future, done))
                run.resume(done, future.result())
            if calls:
                tools = [t.episodes[b].tools for b, _, _ in calls]
                pending.append((pool.submit(runner.run, [c for _, c, _ in calls], tools), calls))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    st = jax.device_get((run.state.active_steps, run.state.forced_steps))
    run.stats.active_steps, run.stats.forced_tokens = int(st[0]), int(st[1])
    return t.finish(group_size), run.stats
