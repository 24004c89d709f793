# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The group driver: continuous batching by group over the engine's slots (`jaxgrpo.rollout.engine`).

``S`` group slots of ``G`` rows. All slots are filled with the first pending prompts; then, once per decode block,
the host reads the rows' ``done`` flags: every slot whose ``G`` rows have all finished (EOS or ``max_new_tokens``) is
harvested (its group is returned whole) and refilled with the next pending prompt (its prompt prefilled into the
slot's prefix cache, its rows' state reset: `engine.prefill`). A group's rows are admitted together and returned
together, so group statistics stay local. With ``S >= len(prompts)`` every prompt is admitted at once and the run is
the static batch (``static`` mode: every row decodes until the longest one ends).

``on_group(prompt_index, group) -> bool`` is called as each group completes (in completion order); returning True
stops admitting and drops the groups still in flight (the trainer's streaming dynamic sampling).

Metrics (`RunStats`): ``slot_utilization`` = row-steps spent on unfinished rows / row-steps run (``decode_steps * B``);
``decode_steps`` = token steps run; ``prefill_tokens_per_s`` = real prompt tokens prefilled / prefill seconds;
``decode_tokens_per_s`` = tokens sampled in decode steps / decode seconds.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxgrpo import models, padding
from jaxgrpo.models.attention import DENSE, Kernel
from jaxgrpo.rollout import engine
from jaxgrpo.rollout.params import SamplingParams
from jaxgrpo.rollout.record import Completions

DEFAULT_BLOCK = 8


@dataclasses.dataclass
class Group:
    """One prompt's G rows, host side: tokens, logprobs, entropy, mask ``[G, M]``; eos ``[G]``."""

    tokens: np.ndarray
    logprobs: np.ndarray
    entropy: np.ndarray
    mask: np.ndarray
    eos: np.ndarray


@dataclasses.dataclass
class RunStats:
    slot_utilization: float = 0.0
    decode_steps: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    admitted: int = 0
    dropped_tokens: int = 0  # tokens of the groups dropped when ``on_group`` stopped the run (in flight or unread)

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/slot_utilization": self.slot_utilization,
            "rollout/decode_steps": float(self.decode_steps),
            "rollout/prefill_tokens_per_s": self.prefill_tokens / max(self.prefill_seconds, 1e-9),
            "rollout/decode_tokens_per_s": self.decode_tokens / max(self.decode_seconds, 1e-9),
        }


def host_array(x: jax.Array) -> np.ndarray:
    """``x`` whole on the host. On a mesh spanning several processes each holds only its devices' rows: they are
    gathered from every process (a collective: every process's driver makes the same calls in the same order, its
    decisions taken on the same gathered arrays)."""
    if x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


class _Run:
    """Host state of one driver run (slots -> prompts, pending queue, harvested groups)."""

    def __init__(self, config, params, prompts, sp: SamplingParams, key, slots, block, width, packed_ladder=None,
                 first_rows=0, mesh=None, prompt_offset=0, attention=DENSE, key_ids=None):  # fmt: skip
        self.config, self.params, self.prompts, self.sp, self.key = config, params, list(prompts), sp, key
        self.packed_ladder, self.first_rows, self.prompt_offset = packed_ladder, first_rows, prompt_offset
        self.key_ids = None if key_ids is None else np.asarray(key_ids, np.int64)
        self.spec = engine.make_spec(config, sp, slots, width, block, mesh=mesh, attention=attention)
        self.weights = engine.prepare_weights(config, params, self.spec)
        self.caches, self.state = engine.init(config, self.spec)
        self.temp = jnp.float32(sp.temperature if sp.temperature > 0 else 1.0)
        self.top_p = jnp.float32(sp.top_p)
        self.slot_prompt = np.full(slots, -1)
        self.next = 0
        self.groups: dict[int, Group] = {}
        self.stats = RunStats()

    def admit(self, free: Sequence[int], more) -> None:
        while more is not None and len(self.prompts) - self.next < len(free):
            batch = more()
            if not batch:
                break
            self.sp.check(self.config.vocab_size, self.config.max_position_embeddings, batch)
            self.prompts += list(batch)
        ids = list(range(self.next, min(self.next + len(free), len(self.prompts))))
        if not ids:
            return
        first = self.next == 0
        self.next += len(ids)
        a = max(padding.batch_bucket(len(ids)), self.first_rows if first else 0)
        prompts = [self.prompts[i] for i in ids]
        tok, mask = engine.left_pad(prompts, self.spec.prompt_width, a)
        # the first admission runs packed end to end (no work on padding; static mode's only prefill); later ones,
        # a few prompts each, run padded: one compilation per admission size, not per (size, packed width)
        packed = (padding.sampler_packed_width([int(m.sum()) for m in mask], 1, ladder=self.packed_ladder)
                  if first else 0)
        slot_ids = np.full(a, self.spec.slots, np.int32)
        slot_ids[: len(ids)] = free[: len(ids)]
        pid = np.zeros(a, np.int32)
        pid[: len(ids)] = np.asarray(ids) + self.prompt_offset if self.key_ids is None else self.key_ids[ids]
        t0 = time.perf_counter()
        self.caches, self.state = engine.prefill(self.config, self.spec, packed, self.params, self.weights,
                                                 self.caches, self.state, tok, mask, slot_ids, pid, self.key,
                                                 self.temp, self.top_p)  # fmt: skip
        jax.block_until_ready(self.state.done)
        self.stats.prefill_seconds += time.perf_counter() - t0
        self.stats.prefill_tokens += sum(len(p) for p in prompts)
        self.stats.admitted += len(ids)
        self.slot_prompt[free[: len(ids)]] = ids

    def harvest(self, done: np.ndarray, on_group) -> tuple[list[int], bool]:
        """Collect every busy slot whose rows are all done; returns (freed slots, stop requested)."""
        g = self.spec.num_samples
        fin = [int(s) for s in np.flatnonzero((self.slot_prompt >= 0) & done.reshape(-1, g).all(1))]
        stop = False
        if fin:
            host = [host_array(x) for x in (self.state.tokens, self.state.logprobs, self.state.entropy,
                                            self.state.mask, self.state.eos)]  # fmt: skip
            for s in fin:
                if stop:  # the caller has what it asked for: a group that finished beside it is dropped, unread
                    break
                rows = slice(s * g, (s + 1) * g)
                grp = Group(*(np.asarray(x[rows]) for x in host))
                p = int(self.slot_prompt[s])
                self.groups[p] = grp
                self.slot_prompt[s] = -1
                stop = stop or bool(on_group is not None and on_group(p, grp))
        return fin, stop

    def decode(self) -> None:
        t0 = time.perf_counter()
        before = self.stats.decode_steps
        steps = host_array(self.state.step)[~host_array(self.state.done)]
        width = engine.window(self.spec, int(steps.max(initial=1)))
        if width != self.caches.decode[0].k.shape[2]:  # the block's window of decode slots (`engine.window`)
            self.caches = self.caches.replace(decode=engine.resize(self.caches.decode, width))
        self.caches, self.state = engine.decode_block(self.config, self.spec, self.weights, self.caches, self.state,
                                                      self.temp, self.top_p)  # fmt: skip
        jax.block_until_ready(self.state.done)
        self.stats.decode_seconds += time.perf_counter() - t0
        self.stats.decode_steps = before + self.spec.block


def run(
    config: models.ModelConfig,
    params: Any,
    prompts: Sequence[Sequence[int]],
    sp: SamplingParams,
    key: jax.Array,
    *,
    slots: int | None = None,
    block: int = DEFAULT_BLOCK,
    prompt_buckets: Sequence[int] | None = None,
    on_group: Callable[[int, Group], bool] | None = None,
    more: Callable[[], Sequence[Sequence[int]] | None] | None = None,
    prompt_width: int | None = None,
    max_blocks: int | None = None,
    packed_ladder: tuple[int, int] | None = None,
    first_rows: int = 0,
    mesh: Mesh | None = None,
    prompt_offset: int = 0,
    attention: Kernel = DENSE,
    key_ids: Sequence[int] | None = None,
) -> tuple[dict[int, Group], RunStats]:
    """Sample ``sp.num_samples`` completions for each prompt with ``slots`` group slots (None: one per prompt, padded
    to a power of two: static mode). ``params``: compute-dtype params (`models.compute_params`). Returns the
    completed groups by prompt index (all of them unless ``on_group`` stopped the run: then the ones it was given;
    the tokens of the others, in flight or finished beside the last one, are ``stats.dropped_tokens``) and the run's
    stats.

    ``more()``: called when a slot is free and no prompt is pending; returns further prompts (numbered after the
    ones before) or None when there are none. ``prompt_width``: the prefix cache's width, at least the longest prompt
    ``more`` can return (default: the bucket of the longest of ``prompts``). ``max_blocks``: stop after this many
    decode blocks (groups in flight are dropped; e.g. a warm-up that only compiles). ``packed_ladder``: the caller's
    run's ``(floor, cap)`` (`jaxgrpo.learner.perf.shape_ladders`): the first prefill's packed width climbs
    `padding.ladder_bucket` from ``floor`` to ``cap``, one program for nearly every step, not one per bucket.
    ``first_rows``: the first prefill runs at least this many rows (the extra ones padding, their writes dropped), so
    a caller whose prompt count varies keeps one program (`jaxgrpo.rollout.multiturn.fixed_generate`). ``mesh``:
    the slots and their rows split over its batch axes (`engine.row_sharding`; ``slots`` rounded up to a multiple of
    `engine.row_shards`, the extra ones empty); ``params`` are used as placed (`jaxgrpo.sharding.shard_params`).
    ``prompt_offset``: the prompts' place in a larger list: prompt ``i`` draws with the keys of prompt
    ``prompt_offset + i`` (a share of a batch sampled on several hosts draws what the whole batch would); the
    returned groups are numbered from 0 all the same. ``key_ids``: instead, prompt ``i`` draws with the keys of prompt
    ``key_ids[i]`` (one id per prompt of ``prompts``, no ``more``: e.g. the multi-turn loop's live rows, each with
    its own id in the whole rollout). ``attention``: the prefill's attention kernel (a run's resolved
    ``perf.attention``, `models.attention.Kernel`)."""
    sp.check(config.vocab_size, config.max_position_embeddings, prompts)
    if block < 1 or (slots is not None and slots < 1):
        raise ValueError(f"decode block ({block}) and slots ({slots}) must be >= 1")
    slots = (padding.batch_bucket(len(prompts), engine.row_shards(mesh)) if slots is None
             else engine.split_slots(slots, mesh))  # fmt: skip
    width = padding.prompt_bucket(max([len(p) for p in prompts] + [prompt_width or 1]), prompt_buckets)
    if prompt_offset < 0:
        raise ValueError(f"prompt_offset ({prompt_offset}) must be >= 0")
    if key_ids is not None and (len(key_ids) != len(prompts) or more is not None or min(key_ids) < 0):
        raise ValueError(f"key_ids ({len(key_ids)} ids) must give each of the {len(prompts)} prompts an id >= 0, "
                         "and there can be no more prompts")
    r = _Run(config, params, prompts, sp, key, slots, int(block), width, packed_ladder, first_rows, mesh,
             prompt_offset, attention, key_ids)
    r.admit(list(range(slots)), more)
    while True:
        freed, stop = r.harvest(host_array(r.state.done), on_group)
        if stop:
            break
        if freed:
            r.admit(freed, more)
        if not (r.slot_prompt >= 0).any() or (max_blocks is not None and r.stats.decode_steps >= max_blocks * block):
            break
        r.decode()
    active = int(r.state.active_steps)
    busy = np.flatnonzero(r.slot_prompt >= 0)
    if busy.size:  # groups dropped (in flight or unread): their tokens were sampled all the same (a budget counts them)
        g = r.spec.num_samples
        r.stats.dropped_tokens = int(host_array(r.state.mask).reshape(-1, g, r.state.mask.shape[-1])[busy].sum())
    r.stats.decode_tokens = active
    r.stats.slot_utilization = active / max(r.stats.decode_steps * r.spec.rows, 1)
    return r.groups, r.stats


def completions(groups: dict[int, Group], order: Sequence[int]) -> Completions:
    """The groups ``order`` stacked prompt-major into `Completions` (host arrays)."""
    cat = lambda f: np.concatenate([getattr(groups[p], f) for p in order])  # noqa: E731
    mask = cat("mask")
    return Completions(tokens=cat("tokens"), logprobs=cat("logprobs"), mask=mask,
                       lengths=mask.sum(-1, dtype=np.int32), truncated=~cat("eos"), entropy=cat("entropy"))  # fmt: skip
