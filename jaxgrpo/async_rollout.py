# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Asynchronous rollouts: the next steps' groups are sampled while the learner trains, under a bounded staleness, on
the learner's devices or on a device group of their own (``mesh.rollout``). Design: docs/async-design.md.

**Fixed lag.** With ``rollout.max_staleness = k`` the rollout of step s is sampled with policy version
``v(s) = max(s − k, s0)`` (version v = the weights after v updates; s0 = the step the run started or resumed at),
exactly, never a newer one: a producer thread samples step s as soon as the learner has published version v(s),
so it runs at most k + 1 steps ahead and the staleness of every trained sample is ``s − v(s) = min(k, s − s0)``.
The bound is kept by pacing (the producer waits for weights), never by discarding samples, and because the version
is a function of the step, a run is deterministic: k = 0 is the synchronous run (the producer samples step s with
version s), and the same seed gives the same run whatever the two sides' speeds. This is the one-step-off-policy
schedule of verl's ``one_step_off_policy`` recipe and AReaL's bounded staleness η (Fu et al. 2025,
arXiv:2505.24298), made exact in the step; the importance ratio of the step is against the sampler's own log-probs
(the behaviour policy), as in the synchronous trainer, and ``algo.sampler_correction`` bounds it where set.

**Device groups.** ``mesh.rollout = R`` gives the last R devices to the rollout (the engine on one device; the sampler
over an ``R / F × F`` data × fsdp mesh otherwise, ``F = mesh.rollout_fsdp``: each rollout device holds 1/F of the
weights, split by the learner's rules, `jaxgrpo.sharding.RULES`, and the engine splits its decode layers and LM head
over that axis, `jaxgrpo.rollout.engine`) and the others to the learner's ``mesh.data × fsdp × tensor``; 0 keeps
both on the same devices. After each update the learner publishes its weights in the compute dtype, copied onto the
rollout devices (`jax.device_put`; a copy also when colocated, since the train step donates its state); with LoRA
the frozen base once, then only the adapters. On several processes (hosts) each host samples its block of every
round on rollout devices of its own and the hosts swap rows through the coordinator's key-value store
(`process_groups`, `sample_across_processes`).

**Multi-turn** runs (``data.environment`` / ``data.tools``): ``trainer.rollout`` is the multi-turn rollout
(`jaxgrpo.multiturn_step.rollout`), so the thread runs the turns, their tool calls (in the tool workers) and the
rewards with the lagged weights; the multi-turn engine uses one device (``mesh.rollout`` ≤ 1, or one per host), the
simple turn loop samples over the ``mesh.rollout`` devices; on several hosts each runs its block of the trajectories
(`jaxgrpo.multiturn_step.sample_across_processes`).

**Resume.** A checkpoint holds the prompt iterator's position (and the schedule's history) as of the last *trained*
step, so the rollouts sampled ahead are dropped and drawn again after a resume: no prompt is lost or duplicated. The
older weights are not checkpointed, so the first k steps after a resume at s0 sample with version s0 (less stale than
in the uninterrupted run); the trainer says so in one line.
"""

from __future__ import annotations

import io
import itertools
import json
import sys
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import models

Params = Any


class Producer:
    """The rollout side of an asynchronous run: a thread that calls ``trainer.rollout(s)`` for s = s0, s0 + 1, ...
    with the sampler reading the published weights of version ``max(s − k, s0)`` (module docstring)."""

    def __init__(self, trainer: Any, start_step: int, end_step: int, max_staleness: int, place: Any):
        self.tr, self.k, self.start, self.end = trainer, int(max_staleness), int(start_step), int(end_step)
        self.place = place  # params (compute dtype) -> a copy on the rollout devices
        self.base: Params | None = None  # LoRA: the frozen base's copy on the rollout devices
        self.cond = threading.Condition()
        self.versions: dict[int, Params] = {}
        self.ready: dict[int, tuple] = {}  # step -> (rollout, metrics, iterator state, schedule state) or exception
        self.stopping = False
        self.timeline: list[tuple[str, int, float, float]] = []  # (side, step, start, end) busy intervals
        self.thread: threading.Thread | None = None

    def version_for(self, step: int) -> int:
        return max(step - self.k, self.start)

    def publish(self, version: int, params: Params) -> None:
        """The learner's weights after ``version`` updates (master params; cast and copied here). With LoRA only
        the adapters travel: the frozen base is copied to the rollout once, and the sampler's weights (adapters
        merged, or beside the base, `models.compute_params`) are made from the two where the rollout reads them."""
        mcfg = self.tr.model_config
        if models.lora.has_adapters(params):
            base, adapters = models.lora.split(params)
            if self.base is None:  # its values never change: one copy for the whole run
                self.base = self.place(base, mcfg)
            adapters = self.place(adapters, mcfg, models.lora.ADAPTERS_PATH)
            copy = models.compute_params(mcfg, models.lora.join(self.base, adapters))
        else:
            copy = self.place(models.compute_params(mcfg, params), mcfg)
        with self.cond:
            self.versions[int(version)] = copy
            self.cond.notify_all()

    def begin(self) -> None:
        self.thread = threading.Thread(target=self._run, name="jaxgrpo-rollout", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        tr = self.tr
        for step in range(self.start, self.end):
            v = self.version_for(step)
            t0 = time.perf_counter()
            with self.cond:
                while v not in self.versions and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
                for old in [u for u in self.versions if u < v]:  # no later step samples with an older version
                    del self.versions[old]
                params = self.versions[v]
            t1 = time.perf_counter()
            try:
                tr.sampler_params_override = params
                roll, extra = tr.rollout(step)
                # (the rollout's own reward/* figures win: on several hosts, the hosts' shares summed)
                extra = {**(tr.scorer.take_stats() if tr.scorer is not None else {}), **extra}
                sched = tr.scheduler.state() if tr.scheduler is not None else None
                item: tuple | BaseException = (roll, extra, tr.iterator.state(), sched, v, t1 - t0)
            except BaseException as e:  # handed to the learner, which raises it at this step
                item = e
            t2 = time.perf_counter()
            with self.cond:
                self.timeline.append(("rollout", step, t1, t2))
                self.ready[step] = item
                self.cond.notify_all()
                if isinstance(item, BaseException):
                    return

    def take(self, step: int) -> tuple[Any, dict[str, float], dict[str, Any], dict[str, Any] | None]:
        """The rollout of ``step`` (waiting for it), its metrics with ``async/*`` added, and the iterator and schedule
        states as of it (what a checkpoint after this step saves)."""
        t0 = time.perf_counter()
        with self.cond:
            while step not in self.ready:
                if self.thread is None or not self.thread.is_alive():
                    raise RuntimeError(f"the rollout thread stopped before step {step}")
                self.cond.wait(timeout=1.0)
            item = self.ready.pop(step)
        if isinstance(item, BaseException):
            raise item
        roll, extra, iterator, sched, v, waited = item
        extra = {**extra, "async/policy_version": float(v), "async/staleness_mean": float(step - v),
                 "async/staleness_max": float(step - v),  # (every sample of a step has version v: the lag is fixed)
                 "async/learner_wait_s": time.perf_counter() - t0, "async/rollout_wait_s": float(waited)}
        return roll, extra, iterator, sched

    def mark(self, side: str, step: int, t0: float, t1: float) -> None:
        with self.cond:
            self.timeline.append((side, step, t0, t1))

    def close(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=600)


def device_groups(cfg: Any) -> tuple[Any, Any, Any]:
    """(learner mesh, rollout mesh, place) for a config: the learner's ``mesh.data × fsdp × tensor`` mesh (None on
    one device) over the first devices, the rollout's (None: the engine on one device; else an ``R / F × F`` data ×
    fsdp mesh, ``F = mesh.rollout_fsdp``) over the last ``mesh.rollout = R``, and ``place(params, model_config,
    prefix=())``, a copy of compute-dtype params where the rollout reads them, split over the rollout's fsdp axis by
    the rules (``prefix``: where ``params`` sits in the whole params tree, `sharding.part_shardings`). Without
    ``mesh.rollout`` the rollout shares the learner's mesh and devices. On several processes see `process_groups`."""
    from jaxgrpo import sharding
    from jaxgrpo.errors import ConfigError

    m, devices = cfg.mesh, jax.devices()
    size, r = m.data * m.fsdp * m.tensor, m.rollout
    turns = cfg.data.multiturn
    if (r or cfg.rollout.max_staleness) and jax.process_count() > 1:  # (jax.distributed set up by the caller)
        return process_groups(cfg)
    copy = lambda p, *_: jax.tree.map(lambda x: jnp.array(x, copy=True), p)  # noqa: E731 (the step donates its state)
    if jax.process_count() > 1 and not r and turns:
        raise ConfigError(f"multi-turn rollouts on {jax.process_count()} processes need rollout devices on every host "
                          "(each host runs its share of the trajectories and their tools): set mesh.rollout to a "
                          "multiple of the process count")  # fmt: skip
    if not r:
        mesh = sharding.make_mesh(m.data, m.fsdp, m.tensor) if size > 1 else None
        return mesh, mesh, copy
    if size + r > len(devices):
        raise ConfigError(f"mesh.rollout={r} + the learner's mesh.data × fsdp × tensor = {size} devices > the "
                          f"{len(devices)} available; lower mesh.rollout or the learner's mesh")
    learner = sharding.make_mesh(m.data, m.fsdp, m.tensor, devices=devices[:size]) if size > 1 else None
    if r == 1:  # (a put onto other devices is a copy)
        return learner, None, lambda p, *_: jax.device_put(p, devices[-1])
    rollout = sharding.make_mesh(r // m.rollout_fsdp, m.rollout_fsdp, 1, devices=devices[-r:])

    def place(params: Params, model_config: Any, prefix: tuple[str, ...] = ()) -> Params:
        return jax.device_put(params, sharding.part_shardings(params, model_config, rollout, prefix))

    return learner, rollout, place


def process_groups(cfg: Any) -> tuple[Any, Any, Any]:
    """The device groups of an asynchronous run on several JAX processes (hosts). ``mesh.rollout = R`` takes the
    last R / n local devices of each of the n processes: each host samples its share of every step's prompts on a
    data × fsdp mesh of its own (``R / n / F × F``, ``F = mesh.rollout_fsdp``; `sample_across_processes`), so the
    rollout thread never launches a program that spans processes (two threads launching cross-process programs in an
    order that differs between hosts can wait on each other forever); the learner's mesh spans the other devices of
    every host. ``place`` spreads the learner's compute-dtype weights so that each host's learner devices hold a whole
    copy between them, split over them by the rules (a collective of the learner's devices, run by the learner thread
    in its program order: a learner device holds ``1 / (its host's learner devices)`` of the weights, never the
    whole), and copies this host's copy onto its rollout devices, split over their fsdp axis. ``mesh.rollout = 0``
    with ``max_staleness > 0`` is refused: the two threads would launch cross-process programs on the same devices."""
    from jax.sharding import Mesh, NamedSharding

    from jaxgrpo import config as config_lib
    from jaxgrpo import sharding
    from jaxgrpo.errors import ConfigError

    m, n = cfg.mesh, jax.process_count()
    size, r = m.data * m.fsdp * m.tensor, m.rollout
    if why := config_lib.async_hosts_refusal(cfg):
        raise ConfigError(why)
    if not r or r % n:
        raise ConfigError(f"an asynchronous run on {n} processes needs rollout devices on every host: set "
                          f"mesh.rollout to a multiple of {n} (each host samples its share on mesh.rollout / {n} "
                          "devices of its own), or rollout.max_staleness=0 mesh.rollout=0 for synchronous steps")
    local = jax.local_devices()
    per = r // n
    if size + r > len(jax.devices()) or size % n:
        raise ConfigError(f"mesh.rollout={r} + the learner's mesh.data × fsdp × tensor = {size} devices on {n} "
                          f"processes of {len(local)} devices: the learner takes {len(local) - per} devices of each "
                          f"host, so set mesh.data × fsdp × tensor = {n * (len(local) - per)}")
    if per > 1 and cfg.rollout.turn_engine and cfg.data.multiturn:
        raise ConfigError(f"rollout.turn_engine=true samples on one device of each host, but mesh.rollout={r} gives "
                          f"each of the {n} hosts {per}; set mesh.rollout={n} or rollout.turn_engine=false")
    if per % m.rollout_fsdp:
        raise ConfigError(f"mesh.rollout_fsdp={m.rollout_fsdp} must divide each host's {per} rollout devices "
                          f"(mesh.rollout / {n} processes); set it to a divisor of {per}")
    by_process = [sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id) for p in range(n)]
    learner_devices = [d for devs in by_process for d in devs[: size // n]]
    mine = sorted(local, key=lambda d: d.id)[-per:]
    learner = sharding.make_mesh(m.data, m.fsdp, m.tensor, devices=learner_devices)
    rollout = sharding.make_mesh(per // m.rollout_fsdp, m.rollout_fsdp, 1, devices=mine)  # this host's own
    # the learner's devices as n hosts x their own devices: the weights whole on each host, split within it
    hosts = Mesh(np.asarray(learner_devices, dtype=object).reshape(n, size // n, 1), sharding.MESH_AXES)
    my_learner = Mesh(hosts.devices[jax.process_index()][None], sharding.MESH_AXES)
    spreads: dict[Any, Any] = {}  # (prefix, tree structure) -> its jitted spread, compiled once

    def place(params: Params, model_config: Any, prefix: tuple[str, ...] = ()) -> Params:
        within = sharding.part_shardings(params, model_config, hosts, prefix)
        key = (prefix, jax.tree.structure(params))
        if key not in spreads:
            spreads[key] = jax.jit(lambda p: p, out_shardings=within)
        spread = spreads[key](params)
        local_copy = jax.tree.map(  # this host's whole copy, as an array of its own devices
            lambda x, s: jax.make_array_from_single_device_arrays(
                x.shape, NamedSharding(my_learner, s.spec), [a.data for a in x.addressable_shards]), spread, within)
        return jax.device_put(local_copy, sharding.part_shardings(params, model_config, rollout, prefix))

    return learner, rollout, place


def sample_across_processes(tr: Any, prompt_ids: list[list[int]], key: jax.Array, num_samples: int | None = None
                            ) -> Any:  # fmt: skip
    """One round of an asynchronous run on several processes: this host samples its share of ``prompt_ids`` (a
    contiguous block, `numpy.array_split`) on its rollout mesh, with the rollout driver over its share of the run's
    slots and the prompts' keys of the whole batch (``prompt_offset``); the hosts swap their completions through the
    coordinator's key-value store (`jaxgrpo.host.exchange`: no device, no program across processes) and every host
    returns the whole round's host-side `sampling.Completions`, the same on every host, as a synchronous step's
    sampler gives (``num_samples`` rows per prompt, default G). A host whose share failed still takes part in the
    swap, so every host raises at the same round."""
    from jaxgrpo import sampling
    from jaxgrpo.rollout import driver

    mine = host_share(len(prompt_ids))

    def sample() -> bytes:
        if not len(mine):
            return b""
        groups, _ = tr.drive([prompt_ids[i] for i in mine], key, num_samples, share=jax.process_count(),
                             prompt_offset=int(mine[0]))  # fmt: skip
        return _pack(driver.completions(groups, range(len(mine))))

    got = [_unpack(b) for b in swap(tr, sample) if b]
    return sampling.Completions(**{f: np.concatenate([c[f] for c in got]) for f in _FIELDS})


def score_across_processes(tr: Any, texts: list[str], rows: list[Any], ids: list[list[int]], sizes: list[int]
                           ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Rewards and validity of a round's rows (prompt-major, ``sizes[i]`` rows per group) on several processes: each
    host scores its contiguous block of groups (`host_share`) with the trainer's scorer and the hosts swap the scores
    (`swap`), so every host trains on the same rewards even where a reward's outcome can differ from host to host (a
    timeout, a flaky service), a reward that fails or hangs stops every host at the same round, and the reward
    functions run once per row, not once per host. Each host's ``reward/*`` statistics then count every row (its
    ``time/reward_s`` the slowest host's)."""
    groups = host_share(len(sizes))
    ends = np.cumsum([0, *sizes])
    a, b = (int(ends[groups[0]]), int(ends[groups[-1] + 1])) if len(groups) else (0, 0)
    keys = ("samples", "invalid", "timeouts", "seconds")

    def make() -> bytes:
        if a == b:
            return b""
        before = tr.scorer.stats()
        rw, valid, _ = tr.scorer(texts[a:b], rows[a:b], ids[a:b], group_sizes=[sizes[i] for i in groups])
        after = tr.scorer.stats()
        buf = io.BytesIO()
        np.savez(buf, rewards=np.asarray(rw), valid=np.asarray(valid),
                 stats=np.asarray([after[k] - before[k] for k in keys], np.float64))  # fmt: skip
        return buf.getvalue()

    got = [np.load(io.BytesIO(p)) if p else None for p in swap(tr, make)]  # in process order
    stats = np.asarray([g["stats"] if g is not None else np.zeros(len(keys)) for g in got])
    mine, others = stats[jax.process_index()], stats.sum(0) - stats[jax.process_index()]
    tr.scorer.add_stats({"samples": others[0], "invalid": others[1], "timeouts": others[2],
                         "seconds": stats[:, 3].max() - mine[3]})  # fmt: skip
    real = [g for g in got if g is not None]
    return np.concatenate([g["rewards"] for g in real]), np.concatenate([g["valid"] for g in real])


def host_share(count: int) -> np.ndarray:
    """This process's contiguous block of ``count`` prompts (`numpy.array_split` over the processes)."""
    return np.array_split(np.arange(count), jax.process_count())[jax.process_index()]


def swap(tr: Any, make: Any) -> list[bytes]:
    """Every process's ``make()`` (its share of a round, as bytes), in process order, through the coordinator's
    key-value store (`jaxgrpo.host.exchange`: no device, no program across processes). A host whose ``make`` failed
    still takes part in the swap, so every host raises at the same round: this host its own exception, the others
    one line naming the process that failed (`raise_failed`)."""
    from jaxgrpo import host

    payload, failure = own_share(make)
    i = next_exchange("rollout")  # the same sequence on every process: each makes the same calls in the same order
    stopping = lambda: tr.producer is not None and tr.producer.stopping  # noqa: E731 (a stopping run: see `exchange`)
    parts = host.exchange(exchange_name("rollout", i), payload, should_stop=stopping)
    if i >= 2:  # every process has sent round i, so it has read this process's rounds before
        host.delete_exchanged(exchange_name("rollout", i - 2))
    settle(parts, failure)
    return parts


def own_share(make: Any) -> tuple[bytes, Exception | None]:
    """``(make(), None)``, or when ``make`` fails, what the other hosts get in its place (`failure_part`: they must
    not wait for this host's share forever) and the exception, to raise once the exchange is done (`settle`)."""
    try:
        return make(), None
    except Exception as e:
        return failure_part(e), e


def settle(parts: list[bytes], failure: Exception | None) -> None:
    """After an exchange of shares made by `own_share`: raises for the first process whose share failed, on every
    host alike, so that every host raises at the same exchange and handles it the same way (a `RewardError`
    everywhere, or none: `raise_failed`). That process raises its own exception (its traceback); a host whose own
    share failed later chains its failure as the cause."""
    first = next((p for p, b in enumerate(parts) if b.startswith(b"!")), None)
    if first is None:
        return
    if failure is not None and first == jax.process_index():
        raise failure
    try:
        raise_failed(parts)
    except Exception as e:
        raise e from failure


def failure_part(e: Exception) -> bytes:
    """What a host whose share failed sends in its place: ``b"!"`` and the failure as JSON (`raise_failed`)."""
    return b"!" + json.dumps({"type": type(e).__name__, "text": str(e), "message": getattr(e, "message", None),
                              "advice": getattr(e, "advice", None)}).encode()  # fmt: skip


def raise_failed(parts: list[bytes]) -> None:
    """Raises for the first process whose share failed (its part `failure_part`): a `RewardError` as
    a `RewardError` (every host then handles it alike: the trainer checkpoints the last completed step, a collective
    every host must join), anything else as a `RuntimeError` naming the process."""
    from jaxgrpo.errors import RewardError

    for p, b in enumerate(parts):
        if b.startswith(b"!"):
            e = json.loads(b[1:].decode())
            if e["type"] == "RewardError":
                raise RewardError(f"process {p}: {e['message']}", e["advice"])
            raise RuntimeError(f"the rollout of process {p} failed: {e['type']}: {e['text']}")


_RUNS = itertools.count(1)  # runs started in this process (`start_run`), the same count on every process
_run = 0
_sequences: dict[str, itertools.count] = {}  # this run's exchanges of each kind ("rollout", "eval"), in order


def start_run() -> None:
    """At every run's start, on every process: the exchanges' names start again under a new run number. A run that
    stopped while one host's producer had begun its next round leaves the hosts one exchange apart; without this a
    second run in the same processes would pair one host's round with another's next."""
    global _run
    _run = next(_RUNS)
    _sequences.clear()


def next_exchange(kind: str) -> int:
    """The index of this run's next exchange of ``kind`` (0, 1, ...)."""
    return next(_sequences.setdefault(kind, itertools.count()))


def exchange_name(kind: str, i: int) -> str:
    """The key-value store name of this run's exchange ``i`` of ``kind``."""
    return f"jaxgrpo/{kind}/{_run}/{i}"


_FIELDS = ("tokens", "logprobs", "mask", "lengths", "truncated", "entropy")


def _pack(comp: Any) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{f: np.asarray(getattr(comp, f)) for f in _FIELDS})
    return buf.getvalue()


def _unpack(payload: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(payload)) as data:
        return {f: data[f] for f in _FIELDS}


def start(trainer: Any, step: int) -> Producer:
    """The producer of an asynchronous run that starts (or resumed) at ``step``, its thread running."""
    k = trainer.cfg.rollout.max_staleness
    say_resume(step, k)
    trainer.consumed = [trainer.iterator.state(),
                        trainer.scheduler.state() if trainer.scheduler is not None else None]  # fmt: skip
    prod = Producer(trainer, step, trainer.cfg.train.steps, k, trainer.place_rollout)
    prod.publish(step, trainer.state.params)
    prod.begin()
    return prod


def timeline_summary(timeline: list[tuple[str, int, float, float]]) -> dict[str, float]:
    """Busy seconds of each side and the overlap of their intervals (both busy at once), over a run's timeline."""
    spans = {side: sorted((a, b) for s, _, a, b in timeline if s == side) for side in ("rollout", "learner")}
    busy = {side: float(sum(b - a for a, b in v)) for side, v in spans.items()}
    overlap = 0.0
    for a, b in spans["rollout"]:
        for c, d in spans["learner"]:
            overlap += max(0.0, min(b, d) - max(a, c))
    start = min((a for _, _, a, _ in timeline), default=0.0)
    end = max((b for _, _, _, b in timeline), default=0.0)
    return {"rollout_busy_s": busy["rollout"], "learner_busy_s": busy["learner"], "overlap_s": overlap,
            "wall_s": end - start}


def say_resume(start: int, k: int) -> None:
    if start > 0 and k > 0:
        print(f"jaxgrpo: asynchronous run resumed at step {start}: steps {start}..{start + k - 1} sample with the "
              f"restored weights (version {start}; the older versions are not checkpointed), the prompts drawn again "
              "from the checkpointed position (none lost or repeated)", file=sys.stderr)

