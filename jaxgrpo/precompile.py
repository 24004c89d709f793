# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Ahead-of-time compilation, in a background thread, of every shape a run's step path can take after its first step;
and the count of compilations that still happen on the step path.

What varies over a single-turn run (everything else is fixed at startup):

* the train step's batch (`jaxgrpo.step_batch`, ``perf.trim_batch``): the completion width on the ladder
  ``completion_width(1 .. max_new_tokens)``, the groups per step on the rung ladder of `step_batch.kept_groups` (when
  masked degenerate groups are left out) and the packed prompt width ``max(ladder_bucket(need), floor)`` of the run's
  ``"train"`` ladder over every row the data can make (0 where packing would not save; `padding.packed_width`);
  with ``algo.kl_coef > 0`` the reference log-prob program at the same batch shapes;
* the rollout engine (`jaxgrpo.rollout.engine`): one ``decode_block`` per decode window ``window(spec, s)``,
  ``s = 1 .. max_new_tokens - 1``; one ``resize`` per window change a run makes (up by one block's steps; down,
  when slots are refilled, to any narrower window); the first ``prefill`` per packed width of the ``"engine"`` ladder,
  and, when slots are refilled, one later ``prefill`` per (admission size, window); on one device and on the
  learner's mesh (arguments placed as the driver places them), not on rollout devices of their own;
* the host-to-device transfers of each batch shape (``jnp.asarray`` compiles a small program per shape and dtype);
* the in-training evaluations (`jaxgrpo.in_training`: the held-out set every ``train.eval_every`` steps, the
  ``train.retain`` sets), sampled through `sampling.generate` at their own shapes: per evaluation batch
  (`eval.prompt_batches` of the set's encoded prompts), the engine's init, decode windows, window changes and packed
  prefill at that batch's spec (``driver.DEFAULT_BLOCK``, one slot per prompt; on the run's mesh if it has one) and
  the transfer of its completions; and the held-out statistics' eager scalar programs (`eval.summarize` run on a
  zero success matrix).

After the first step, when the first real arguments exist, `start` lowers each of these with
``jitted.lower(*abstract_args).compile()`` in a daemon thread, nearest to the first step's shapes first, the
evaluations' last (the held-out set's first batch first). Such an ahead-of-time compile fills jax's in-memory
executable cache, so the first real call at that shape runs the compiled program -- provided the abstract arguments
lower to the same program: the same shapes, dtypes, static arguments and donation, and the same *placement* (a
committed array's sharding; ``sharding=None`` for an uncommitted one, which jit lowers as unspecified: `abstract`).
A shape the thread has not reached yet is compiled by the step itself, as without this module. Nothing here reads or
writes the run's state, so results do not change. A multi-turn run's jobs are `jaxgrpo.multiturn_precompile`'s.

`CompileCounter` counts XLA compilations (and reads from the persistent compilation cache, which also make a new
program) per thread, from ``jax.monitoring`` events: the trainer's ``time/compiles`` is the count of the step's own
(every thread but the precompile thread's) and ``time/compile_s`` their seconds. They sit under ``time/``: like the
timings, they depend on the process's history (a resumed run compiles again), not on the config, seed and step.
"""

from __future__ import annotations

import atexit
import itertools
import math
import sys
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import models, padding
from jaxgrpo import step_batch as step_batch_lib
from jaxgrpo.learner.batch import Batch

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/compile_time_saved_sec"  # a program read from the persistent cache
_local = threading.local()  # .background: this thread is a precompile thread


def enabled(setting: str, platform: str) -> bool:
    """``perf.precompile`` for ``platform``: background = on, off = off, auto = on accelerators, off on CPU (there
    the background compile takes CPU cores from the step: measured in BENCHMARKS §5)."""
    return setting == "background" or (setting == "auto" and platform != "cpu")


class CompileCounter:
    """XLA compilations since construction, split into ``step_path`` (every thread but a precompile thread; its
    backend compile seconds in ``step_path_s``) and ``background`` (`Precompiler` threads). ``close()`` unregisters
    the listener."""

    def __init__(self) -> None:
        self.step_path = 0
        self.step_path_s = 0.0
        self.background = 0
        self._lock = threading.Lock()
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, secs: float, **kw: Any) -> None:
        if event in (COMPILE_EVENT, CACHE_HIT_EVENT):
            with self._lock:
                if getattr(_local, "background", False):
                    self.background += 1
                else:
                    self.step_path += 1
                    self.step_path_s += float(secs) if event == COMPILE_EVENT else 0.0

    def close(self) -> None:
        jax.monitoring.unregister_event_duration_listener(self._on_event)


class Precompiler:
    """Runs ``jobs`` (``(name, thunk)``; a thunk lowers and compiles one program) one at a time in a daemon thread.
    A job that raises is reported once (stderr) and skipped: the step compiles that shape itself when it needs it.
    ``close()`` stops before the next job and waits for the one in flight (a compile cannot be interrupted); it also
    runs at interpreter exit, before jax's own exit handlers tear the backend down under a compile."""

    def __init__(self, jobs: list[tuple[str, Callable[[], Any]]], quiet: bool = False):
        self.jobs = list(jobs)
        self.compiled = 0
        self.failed: list[str] = []
        self.quiet = quiet
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jaxgrpo-precompile", daemon=True)

    def start(self) -> Precompiler:
        atexit.register(self.close)  # an interpreter exiting without `close` waits for the compile in flight
        self._thread.start()
        return self

    def _run(self) -> None:
        _local.background = True
        for name, job in self.jobs:
            if self._stop.is_set():
                return
            try:
                job()
            except Exception as e:  # noqa: BLE001 (never fatal: the step compiles the shape itself)
                self.failed.append(name)
                if not self.quiet:
                    print(f"jaxgrpo: precompiling {name} failed ({type(e).__name__}: {str(e)[:200]}); the step "
                          "compiles it if it needs it", file=sys.stderr)  # fmt: skip
            else:
                self.compiled += 1

    @property
    def pending(self) -> int:
        return len(self.jobs) - self.compiled - len(self.failed)

    def join(self, timeout: float | None = None) -> bool:
        """Waits for every job (or ``timeout`` seconds); True when the thread has finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        atexit.unregister(self.close)
        if self._thread.is_alive():
            self._thread.join()


def abstract(x: Any) -> jax.ShapeDtypeStruct | None:
    """``x`` as jit lowers it: shape, dtype, weak type, and its sharding if committed (None when uncommitted: jit
    lowers an uncommitted argument as unspecified, a different cache entry from the same sharding given)."""
    if x is None:
        return None
    committed = getattr(x, "committed", False)
    weak = bool(getattr(getattr(x, "aval", None), "weak_type", False))
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if committed else None, weak_type=weak)


def _like(x: jax.ShapeDtypeStruct | None, shape: tuple[int, ...]) -> jax.ShapeDtypeStruct | None:
    if x is None:
        return None
    return jax.ShapeDtypeStruct(shape, x.dtype, sharding=x.sharding, weak_type=x.weak_type)


def batch_struct(template: Batch, groups: int, width: int) -> Batch:
    """The abstract train-step batch of ``groups`` groups and completion width ``width``, laid out (dtypes,
    placement) like ``template`` (an abstract batch of the same run: `abstract` of each leaf)."""
    G = template.rewards.shape[1]
    B, Tp = groups * G, template.prompt_mask.shape[1]
    wide = lambda x: _like(x, (B, width))  # noqa: E731
    return Batch(tokens=_like(template.tokens, (B, Tp + width)), prompt_mask=_like(template.prompt_mask, (B, Tp)),
                 completion_mask=wide(template.completion_mask), rewards=_like(template.rewards, (groups, G)),
                 valid=_like(template.valid, (groups, G)), old_logprobs=wide(template.old_logprobs),
                 ref_logprobs=wide(template.ref_logprobs),
                 truncated=_like(template.truncated, (B,)), action_mask=wide(template.action_mask))  # fmt: skip


def group_rungs(shapes: step_batch_lib.StepShapes, prompts_per_step: int) -> list[int]:
    """Every group count the run's train-step batch can have (`step_batch.kept_groups`)."""
    if not shapes.drops_rows():
        return [prompts_per_step]
    splits = int(shapes.algo.num_minibatches) * int(shapes.algo.grad_accum_steps)
    n = prompts_per_step // splits
    unit = step_batch_lib.row_unit(n, shapes.shards)
    return sorted({splits * padding.ladder_bucket(k, unit, n) for k in range(1, n + 1)})


def width_rungs(shapes: step_batch_lib.StepShapes) -> list[int]:
    """Every completion width the run's train-step batch can have (`step_batch.completion_width`)."""
    M = shapes.max_new_tokens
    if not shapes.perf.trim_batch or shapes.algo.objective == "clip_cov":
        return [M]
    return sorted({step_batch_lib.completion_width(n, M) for n in range(1, M + 1)})


def packed_rungs(shapes: step_batch_lib.StepShapes, prompt_lengths: list[int], groups: int) -> list[int]:
    """Every packed prompt width (`perf.packed_prompt_width` on the run's ``"train"`` ladder) a batch of ``groups``
    groups drawn from prompts of these lengths can have: each row holds ``groups / parts`` prompts, so its need lies
    between the sum of that many shortest and of that many longest lengths."""
    perf, algo = shapes.perf, shapes.algo
    if not (perf.prefix_sharing and perf.prompt_packing):
        return [0]
    parts = int(algo.num_minibatches) * int(algo.grad_accum_steps) * shapes.shards
    per_row = max(groups // parts, 1)
    lengths = np.sort(np.asarray(prompt_lengths, np.int64))
    lo, hi = int(lengths[:per_row].sum()), int(lengths[-per_row:].sum())
    floor, cap = shapes.ladders["train"]
    out = set()
    for need in range(lo, min(hi, cap) + 1):
        w = max(padding.ladder_bucket(need, padding.PACK_BUCKET, cap), floor)
        out.add(0 if w >= per_row * shapes.prompt_width else max(w, padding.PACK_BUCKET))
    return sorted(out)


def place_batch(tr: Any, groups: int, width: int) -> Batch:
    """A zero batch of ``groups`` groups and completion width ``width`` made and placed as `StepShapes.batch` makes
    and places a step's (``jnp.asarray`` of a host array compiles a transfer program per shape and dtype)."""
    from jaxgrpo.groups import Rollout, make_batch, process_share
    from jaxgrpo.learner.batch import global_batch
    from jaxgrpo.rollout.record import Completions

    G = tr.cfg.rollout.group_size
    B = groups * G
    cols = lambda dt: np.zeros((B, width), dt)  # noqa: E731
    comp = Completions(tokens=cols(np.int32), logprobs=cols(np.float32), mask=cols(bool),
                       lengths=np.zeros(B, np.int32), truncated=np.zeros(B, bool), entropy=cols(np.float32))
    roll = Rollout([[tr.pad_id]] * groups, [None] * groups, comp, [""] * B, np.zeros((groups, G), np.float32),
                   np.ones((groups, G), bool))  # fmt: skip
    batch = make_batch(roll, tr.prompt_width, tr.pad_id)
    if tr.cfg.algo.overlong_filter:
        batch = batch.replace(truncated=jnp.asarray(np.asarray(comp.truncated), bool))
    if tr.mesh is not None:
        batch = global_batch(process_share(batch, groups), tr.mesh)
    return batch


def train_step_jobs(tr: Any, template: Batch, first: tuple[int, int, int]) -> list[tuple[str, Callable[[], Any]]]:
    """One job per train-step shape ``(groups, completion width, packed width)`` the run can take but ``first`` (the
    first step's), nearest to it first; with ``algo.kl_coef > 0`` the reference log-probs' program of each batch
    shape too. ``tr``: the `Trainer` after its first step (its state and step function)."""
    P = tr.cfg.rollout.prompts_per_step
    lengths = [len(x) for x in tr.encoded]
    shapes = [(g, w, p) for g in group_rungs(tr.shapes, P) for w in width_rungs(tr.shapes)
              for p in packed_rungs(tr.shapes, lengths, g)]  # fmt: skip
    g1, w1, p1 = first
    shapes.sort(key=lambda s: (s[2] != p1, abs(math.log2(s[1] / w1)), abs(s[0] - g1)))
    state = jax.tree.map(abstract, tr.state)
    hparams = abstract(tr.step_fn._placed)
    jobs: list[tuple[str, Callable[[], Any]]] = []
    ref = None
    if tr.cfg.algo.kl_coef > 0:
        from jaxgrpo.models import lora

        ref = jax.tree.map(abstract, lora.split(tr.state.params)[0] if tr.lora else tr.ref_params)
    seen = {(g1, w1)}
    for g, w, p in shapes:
        batch = batch_struct(template, g, w)
        if (g, w) not in seen:
            seen.add((g, w))
            jobs.append((f"batch transfer {g}x{w}", lambda g=g, w=w: place_batch(tr, g, w)))
            if ref is not None:
                no_ref = batch.replace(ref_logprobs=None)
                jobs.append((f"reference log-probs {g}x{w}", lambda b=no_ref: tr.ref_logprobs.lower(ref, b).compile()))
        if (g, w, p) != first:
            jobs.append((f"train step {g} groups x {w} tokens, packed {p}",
                         lambda b=batch, p=p: tr.step_fn.jitted.lower(state, b, hparams,
                                                                      packed_prompt_width=p).compile()))
    return jobs


def engine_jobs(tr: Any) -> list[tuple[str, Callable[[], Any]]]:
    """One job per rollout-engine program the run can take (module docstring), as the driver calls them
    (`jaxgrpo.rollout.driver`): ``decode_block`` at every window first, then the window changes, then the prefills.
    On one device, and on the learner's mesh (the arguments placed as the driver places them: `engine_programs`);
    not on a separate rollout device."""
    from jaxgrpo.rollout import engine

    cfg, r, mesh = tr.cfg, tr.cfg.rollout, tr.rollout_mesh
    if not tr.use_engine or r.max_new_tokens < 2 or (committed(tr) and mesh is None) or cfg.mesh.rollout:
        return []
    P = r.prompts_per_step
    slots = (padding.batch_bucket(P, engine.row_shards(mesh)) if r.engine == "static"
             else engine.split_slots(r.slots or P, mesh))  # fmt: skip
    spec = engine.make_spec(tr.model_config, _sampling_params(tr), slots, padding.prompt_bucket(tr.prompt_width),
                            r.decode_block, mesh=mesh, attention=tr.prefill_attention)  # fmt: skip
    first = padding.batch_bucket(min(slots, P))
    lengths = np.sort([len(x) for x in tr.encoded])
    floor, cap = tr.ladders["engine"]
    lo = int(lengths[: min(slots, P)].sum()) + first - min(slots, P)
    hi = min(int(lengths[-min(slots, P):].sum()) + first - min(slots, P), cap)
    packs = sorted({max(padding.ladder_bucket(n, padding.MIN_PROMPT_BUCKET, cap), floor) for n in range(lo, hi + 1)})
    refills = slots < P or cfg.algo.degenerate_groups == "resample" or tr.scheduler is not None
    return engine_programs(tr, spec, first, packs, refills)


def committed(tr: Any) -> bool:
    """Whether the run's params are committed arrays (placed on a mesh or a rollout device): then the engine jobs,
    lowered for uncommitted arguments, would not be the step's programs."""
    return bool(getattr(jax.tree.leaves(tr.state.params)[0], "committed", False))


def _sampling_params(tr: Any) -> Any:
    """The rollouts' `SamplingParams`; `in_training`'s evaluations sample with the same."""
    from jaxgrpo.rollout.params import SamplingParams

    r = tr.cfg.rollout
    return SamplingParams(r.max_new_tokens, r.group_size, r.temperature, r.top_p, r.top_k, tr.eos_token_ids)


def engine_programs(tr: Any, spec: Any, first: int, packs: list[int], refills: bool,
                     init: bool = False, label: str = "") -> list[tuple[str, Callable[[], Any]]]:  # fmt: skip
    """The engine's programs at ``spec``: (with ``init``, `engine.init`), ``decode_block`` at every window, the window
    changes (up by a block; with ``refills`` down to any narrower window), the first prefill of ``first`` prompts at
    each packed width of ``packs`` and, with ``refills``, one prefill per later admission size and window."""
    from jaxgrpo.models.attention import KVCache
    from jaxgrpo.rollout import engine

    mcfg = tr.model_config
    if spec.sharding is None:
        params = jax.eval_shape(lambda p: models.compute_params(mcfg, p), tr.state.params)
        weights = jax.eval_shape(lambda p: engine.prepare_weights(mcfg, p), params)
    else:  # on a mesh: placed as the rollout's are (the weights' placement is what XLA gives `prepare_weights`)
        placed = tr.sampler_params()
        params = jax.tree.map(abstract, placed)
        weights = jax.tree.map(abstract, engine.prepare_weights(mcfg, placed, spec))
        del placed
    caches, state = engine.placed(spec, jax.eval_shape(lambda: engine.init(mcfg, spec)))
    f32 = jax.ShapeDtypeStruct((), jnp.float32)
    key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype)

    def at(w: int) -> Any:  # the decode cache at window w
        resized = lambda x, axis: _like(x, x.shape[:axis] + (w,) + x.shape[axis + 1:])  # noqa: E731
        return caches.replace(decode=[KVCache(resized(c.k, 2), resized(c.v, 3)) for c in caches.decode])

    M, k = spec.max_new_tokens, spec.block
    wins = sorted({engine.window(spec, s) for s in range(1, M)})
    jobs: list[tuple[str, Callable[[], Any]]] = []
    if init:
        jobs.append((f"{label}engine init", lambda: engine.init.lower(mcfg, spec).compile()))
    decode = lambda w: engine.decode_block.lower(mcfg, spec, weights, at(w), state, f32, f32).compile()  # noqa: E731
    jobs += [(f"{label}decode window {w}", lambda w=w: decode(w)) for w in wins]
    ups = {(engine.window(spec, s), engine.window(spec, s + k)) for s in range(1, M)}
    downs = {(b, a) for a in wins for b in wins if a < b} if refills else set()
    for a, b in sorted(p for p in ups | downs if p[0] != p[1]):
        jobs.append((f"{label}decode cache {a} -> {b}",
                     lambda a=a, b=b: engine.resize.lower(at(a).decode, b).compile()))  # fmt: skip

    def prefill(n: int, packed: int, w: int) -> Any:
        rows = lambda dt, *shape: jax.ShapeDtypeStruct((n, *shape), dt)  # noqa: E731
        return engine.prefill.lower(mcfg, spec, packed, params, weights, at(w), state,
                                    rows(jnp.int32, spec.prompt_width), rows(jnp.bool_, spec.prompt_width),
                                    rows(jnp.int32), rows(jnp.int32), key, f32, f32).compile()  # fmt: skip

    for packed in packs:
        jobs.append((f"{label}prefill {first} prompts packed {packed}",
                     lambda p=packed: prefill(first, p, engine.window(spec, 1))))  # fmt: skip
    if refills:
        for n in sorted({padding.batch_bucket(i) for i in range(1, spec.slots + 1)}):
            jobs += [(f"{label}prefill {n} prompts at window {w}", lambda n=n, w=w: prefill(n, 0, w)) for w in wins]
    return jobs


def eval_jobs(tr: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The programs of the trainer's evaluations (`jaxgrpo.in_training`: the held-out ``train.eval_every`` set, then
    the ``train.retain`` sets), in the order a step runs them: each set's prompts encoded and cut into the batches
    `eval.evaluate` samples (`eval.prompt_batches`), each batch's shapes taken as `sampling.generate` takes them:
    the engine in static mode (`engine_programs` at the batch's spec, on the run's mesh if it has one: init, every
    decode window, the window changes, the prefill of its prompts at its packed width) and the transfer of its
    completions. Before them the eager scalar programs of the held-out set's statistics."""
    from jaxgrpo import data as data_lib
    from jaxgrpo import eval as eval_lib
    from jaxgrpo import in_training
    from jaxgrpo.rollout import driver, engine

    sets = in_training.eval_sets(tr)
    if not sets:
        return []
    G, M = tr.cfg.rollout.group_size, tr.cfg.rollout.max_new_tokens
    jobs: list[tuple[str, Callable[[], Any]]] = []
    if tr.cfg.train.eval_every:  # its degeneracy at G: a few eager scalar programs (`degeneracy.iid_rate`)
        jobs.append(("evaluation statistics", lambda: eval_lib.summarize(np.zeros((1, G), bool), [G])))
    mesh = tr.mesh
    if mesh is None and committed(tr):
        return []
    sp, shards = _sampling_params(tr), engine.row_shards(mesh)
    # (spec, prompts admitted) -> (packed widths, prompts per batch), first seen first
    specs: dict[tuple[Any, int], tuple[list[int], list[int]]] = {}
    for _, examples, data_cfg in sets:
        for batch in eval_lib.prompt_batches(data_lib.encode_prompts(tr.tokenizer, examples, data_cfg)):
            slots, width = padding.batch_bucket(len(batch), shards), padding.prompt_bucket(max(len(p) for p in batch))
            first = padding.batch_bucket(len(batch))  # as `driver.run` admits them: all at once
            _, mask = engine.left_pad(batch, width, first)
            packed = padding.sampler_packed_width([int(m.sum()) for m in mask], 1)
            spec = engine.make_spec(tr.model_config, sp, slots, width, driver.DEFAULT_BLOCK, mesh=mesh,
                                    attention=tr.prefill_attention)  # fmt: skip
            packs, sizes = specs.setdefault((spec, first), ([], []))
            packs += [packed] if packed not in packs else []
            sizes += [len(batch)] if len(batch) not in sizes else []
    for (spec, first), (packs, sizes) in specs.items():
        label = f"evaluation ({first} prompts of {spec.prompt_width}): "
        jobs += engine_programs(tr, spec, first, packs, False, init=True, label=label)
        jobs += [(f"{label}completions transfer {n}", lambda n=n: _completions_transfer(n * G, M)) for n in sizes]
    return jobs


def _completions_transfer(rows: int, width: int) -> Any:
    """`sampling.generate`'s ``jnp.asarray`` of the driver's host completions, run on zeros of their shapes and dtypes
    (a transfer program per shape and dtype)."""
    from jaxgrpo.rollout.record import Completions

    cols = lambda dt: np.zeros((rows, width), dt)  # noqa: E731
    comp = Completions(tokens=cols(np.int32), logprobs=cols(np.float32), mask=cols(bool),
                       lengths=np.zeros(rows, np.int32), truncated=np.zeros(rows, bool), entropy=cols(np.float32))
    return jax.block_until_ready(jax.tree.map(jnp.asarray, comp))


def start(tr: Any, template: Batch, first: tuple[int, int, int]) -> Precompiler | None:
    """The background precompiler of a single-turn `Trainer` after its first step (``template``: that step's batch as
    `abstract` structs; ``first``: its ``(groups, width, packed)``), started; None when nothing is left to compile. A
    multi-turn run's is `jaxgrpo.multiturn_precompile.start`."""
    train, rollout = train_step_jobs(tr, template, first), engine_jobs(tr)
    jobs = [j for pair in itertools.zip_longest(train, rollout) for j in pair if j is not None]  # both, nearest first
    jobs += eval_jobs(tr)  # the evaluations' programs, after every step's
    return run(jobs)


def run(jobs: list[tuple[str, Callable[[], Any]]]) -> Precompiler | None:
    """A started `Precompiler` of ``jobs`` (quiet on every process but the first); None when there are none."""
    return Precompiler(jobs, quiet=jax.process_index() != 0).start() if jobs else None
