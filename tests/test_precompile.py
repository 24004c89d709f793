# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Background ahead-of-time compilation (`jaxgrpo.precompile`, issue 34: no compilation on the step path after the
first step). Compilations are counted from ``jax.monitoring`` events in the calling thread (`CompileCounter`): the
precompile thread's are its own, so a step path that compiles nothing counts 0 however much the thread compiled."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import jax
import numpy as np
import pytest
from test_recompile import TRIM_SCHEDULE, trimmed_rollouts  # that test's (longest completion, informative) steps

from jaxgrpo import checkpoint as ckpt_lib
from jaxgrpo import config as config_lib
from jaxgrpo import padding, precompile, trainer
from jaxgrpo import step_batch as step_batch_lib
from jaxgrpo.config_sections import AlgoConfig, PerfConfig
from jaxgrpo.models.attention import DENSE
from jaxgrpo.rollout import driver as rollout_driver
from jaxgrpo.rollout import engine
from jaxgrpo.rollout.params import SamplingParams


def test_rungs_of_a_run_closed_form():
    """The shapes `precompile` compiles are the ladders' rungs, by hand: completion widths 16, 32, 64 of
    max_new_tokens 64 (unit 64 / 8 = 8, rounded up to 16, doubling); groups 2, 4, 8 of 8 groups in one part (unit a
    quarter of 8), times the 2 parts of grad_accum_steps=2 (unit 1: 1, 2, 4 per part); the packed width of prompts
    of 30..40 tokens on the ladder (64, 192): 1 prompt a row (30..40 tokens) at prompt width 128: 64 only; 4 a row
    (120..160 tokens) at prompt width 64: 128 or the cap 192; at prompt width 32, 0 (packing would not save: 4 x 32 =
    128 tokens padded)."""
    algo = AlgoConfig(degenerate_groups="mask")
    shapes = step_batch_lib.StepShapes(algo, PerfConfig(), None, 64, 32, {"train": (64, 192)})
    assert precompile.width_rungs(shapes) == [16, 32, 64]
    assert precompile.group_rungs(shapes, 8) == [2, 4, 8]
    two = dataclasses.replace(shapes, algo=dataclasses.replace(algo, grad_accum_steps=2))
    assert precompile.group_rungs(two, 8) == [2, 4, 8]
    keep = dataclasses.replace(shapes, algo=AlgoConfig())
    assert precompile.group_rungs(keep, 8) == [8]
    untrimmed = dataclasses.replace(shapes, perf=PerfConfig(trim_batch=False))
    assert precompile.width_rungs(untrimmed) == [64]
    lengths = list(range(30, 41))
    assert precompile.packed_rungs(dataclasses.replace(shapes, prompt_width=128), lengths, 1) == [64]
    assert precompile.packed_rungs(dataclasses.replace(shapes, prompt_width=64), lengths, 4) == [128, 192]
    assert precompile.packed_rungs(shapes, lengths, 4) == [0]
    unpacked = dataclasses.replace(shapes, prompt_width=128, perf=PerfConfig(prompt_packing=False))
    assert precompile.packed_rungs(unpacked, lengths, 1) == [0]
    # every width the step can take is a rung listed (the step's own rule over every longest completion)
    assert {step_batch_lib.completion_width(n, 64) for n in range(1, 65)} == set(precompile.width_rungs(shapes))
    assert precompile.enabled("auto", "gpu") and precompile.enabled("auto", "tpu")
    assert not precompile.enabled("auto", "cpu")
    assert precompile.enabled("background", "cpu") and not precompile.enabled("off", "gpu")


def test_precompiler_reports_failures_and_stops_between_jobs(capsys):
    """A job that raises is skipped with one line and the next runs; `close` stops before the next job and returns
    once the job in flight ends."""
    ran, gate = [], threading.Event()

    def boom():
        raise RuntimeError("out of memory")

    def slow():
        ran.append("slow")
        gate.wait(5)

    p = precompile.Precompiler([("bad", boom), ("ok", lambda: ran.append("ok")), ("slow", slow),
                                ("never", lambda: ran.append("never"))]).start()  # fmt: skip
    while "slow" not in ran:
        time.sleep(0.01)
    closer = threading.Thread(target=p.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()  # waits for the job in flight
    gate.set()
    closer.join(5)
    assert not closer.is_alive() and p.join(0)
    assert ran == ["ok", "slow"] and p.failed == ["bad"] and p.compiled == 2 and p.pending == 1
    err = capsys.readouterr().err
    assert "precompiling bad failed (RuntimeError: out of memory)" in err and err.count("\n") == 1


def _trim_config(tmp_path, precompile_mode: str) -> config_lib.Config:
    return config_lib.load_config("default", [
        "rollout.prompts_per_step=8", "rollout.group_size=2", "rollout.max_new_tokens=64",
        "model.max_position_embeddings=96", "algo.degenerate_groups=mask", "algo.kl_coef=0.01", "log.progress=false",
        "log.tensorboard=false", "log.sample_every=0", "checkpoint.every=0", "checkpoint.export_final=false",
        f"train.steps={len(TRIM_SCHEDULE)}", f"perf.precompile={precompile_mode}"])  # fmt: skip


@pytest.mark.slow
def test_no_compilation_after_the_first_step_and_same_metrics(tmp_path):
    """`TRIM_SCHEDULE`'s steps reach three (completion width, groups) rungs, two of them after step 1: with
    ``perf.precompile=background`` and the thread joined after step 1, steps 2..6 compile nothing on the step path
    (``time/compiles`` = 0: the thread compiled the train steps, the batch transfers and, with ``algo.kl_coef > 0``,
    the reference log-probs), and every metric but the timings equals the run with
    ``perf.precompile=off`` step for step, where steps 2 and 3 compile (the count has teeth)."""
    runs = {}
    for mode in ("background", "off"):
        cfg = _trim_config(tmp_path, mode)
        t = trainer.Trainer(cfg, tmp_path / mode)
        t.rollout = trimmed_rollouts(t)
        out = []
        try:
            for step in range(cfg.train.steps):
                out.append(t.step(step))
                if step == 0 and mode == "background":
                    assert t.precompiler is not None and t.precompiler.join(300)
                    assert t.precompiler.failed == [] and t.precompiler.compiled >= 2
        finally:
            t.close()
        runs[mode] = out
    on, off = runs["background"], runs["off"]
    assert [(m["batch/completion_width"], m["batch/groups"]) for m in on] == [(16, 8), (32, 2), (64, 4)] * 2
    assert on[0]["time/compiles"] > 0 and [m["time/compiles"] for m in on[1:]] == [0.0] * 5, on
    assert [m["time/compile_s"] for m in on[1:]] == [0.0] * 5
    assert off[1]["time/compiles"] > 0 and off[2]["time/compiles"] > 0 and "time/precompiled" not in off[1]
    timing = ("time/", "throughput/", "rollout/prefill_tokens_per_s", "rollout/decode_tokens_per_s")
    for a, b in zip(on, off):
        keys = {k for k in a if not k.startswith(timing)}
        assert keys == {k for k in b if not k.startswith(timing)}
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}


@pytest.mark.slow
def test_preemption_stops_the_precompile_thread(tmp_path, monkeypatch):
    """SIGTERM after step 1 of 3 while the precompiler still has jobs: the run checkpoints and raises `Preempted`
    (143), and the thread has stopped (it finished the job in flight and started no other)."""
    started = []
    real_start = precompile.start

    def start(tr, template, first):
        p = real_start(tr, template, first)
        if p is not None:
            p.close()  # its real jobs do not matter here: slow ones stand for them
        slow = precompile.Precompiler([(f"slow {i}", lambda: time.sleep(0.2)) for i in range(200)]).start()
        started.append(slow)
        return slow

    monkeypatch.setattr(precompile, "start", start)
    original = trainer.Trainer.step

    def step_then_signal(self, step):
        out = original(self, step)
        threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM)).start()
        threading.Event().wait(0.5)
        return out

    monkeypatch.setattr(trainer.Trainer, "step", step_then_signal)
    cfg = config_lib.load_config("default", ["train.steps=3", "log.progress=false", "log.tensorboard=false",
                                             "checkpoint.every=0", "perf.precompile=background"])  # fmt: skip
    with pytest.raises(ckpt_lib.Preempted) as info:
        trainer.run(cfg, tmp_path / "run")
    assert info.value.exit_code == 143 and info.value.step == 1
    (p,) = started
    assert p.join(0) and 0 < p.compiled < 200 and p.failed == []


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [None, (2, 1)], ids=["one_device", "mesh_data2"])
def test_engine_windows_compile_in_the_background(mesh):
    """The engine's programs for every decode window, window change and admission (`precompile.engine_jobs`):
    after a warm-up of one block (what a run's first, short rollout compiles) and the jobs, a continuous-batching
    rollout whose rows all run to max_new_tokens (no EOS: every window, two windows per row) with refills (3 slots,
    8 prompts: admissions of 1 and 2 prompts, windows shrinking) compiles nothing on this thread; without the jobs
    the same rollout compiles (the count has teeth). On a mesh of 2 batch shards (the slots rounded up to 4, the
    weights sharded as the trainer shards them), the jobs' arguments are placed as the driver places them."""
    from jaxgrpo import sharding
    cfg = config_lib.load_config("default", ["rollout.prompts_per_step=8", "rollout.group_size=2",
                                             "rollout.max_new_tokens=140", "model.max_position_embeddings=160",
                                             "rollout.slots=3", "rollout.decode_block=8"])  # fmt: skip
    from jaxgrpo import build, models

    mcfg, params, _ = build.build_policy(cfg, jax.random.key(0))
    if mesh is not None:
        mesh = sharding.make_mesh(*mesh, 1, devices=jax.devices()[: mesh[0] * mesh[1]])
        params = sharding.shard_params(params, mcfg, mesh)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, mcfg.vocab_size, n)) for n in (5, 9, 7, 12, 6, 8, 10, 4)]
    encoded = prompts
    lengths = [len(p) for p in encoded]
    r = cfg.rollout
    ladders = {"engine": (padding.ladder_bucket(sum(sorted(lengths)[-3:]), 16, 64), 64)}
    compute = models.compute_params(mcfg, params)
    tr = type("Run", (), dict(cfg=cfg, model_config=mcfg, use_engine=True, eos_token_ids=(), prompt_width=32,
                              encoded=encoded, ladders=ladders, rollout_mesh=mesh, sampler_params=lambda self: compute,
                              prefill_attention=DENSE, state=type("S", (), {"params": params})()))()  # fmt: skip
    sp = SamplingParams(r.max_new_tokens, r.group_size, r.temperature, r.top_p, r.top_k, ())
    slots = r.slots if mesh is None else 4

    def rollout(max_blocks=None, key=0):
        return rollout_driver.run(mcfg, compute, prompts, sp, jax.random.key(key), slots=r.slots,
                                  block=r.decode_block, prompt_width=32, packed_ladder=ladders["engine"],
                                  max_blocks=max_blocks, mesh=mesh)  # fmt: skip

    counter = precompile.CompileCounter()
    try:
        spec = engine.make_spec(mcfg, sp, slots, padding.prompt_bucket(32), r.decode_block, mesh=mesh)
        assert sorted({engine.window(spec, s) for s in range(1, 140)}) == [128, 256]  # CPU: windows of 128
        rollout(max_blocks=1)
        before = counter.step_path
        rollout(key=1)
        cold = counter.step_path - before
        jax.clear_caches()
        rollout(max_blocks=1)
        jobs = precompile.engine_jobs(tr)
        names = [n for n, _ in jobs]
        assert "decode window 128" in names and "decode window 256" in names and "decode cache 128 -> 256" in names
        assert "decode cache 256 -> 128" in names and any(n.startswith("prefill 2 prompts") for n in names)
        p = precompile.Precompiler(jobs).start()
        assert p.join(300) and p.failed == []
        before = counter.step_path
        groups, _ = rollout(key=1)
        warm = counter.step_path - before
    finally:
        counter.close()
    assert len(groups) == 8 and all(g.mask.all() for g in groups.values())  # every row ran max_new_tokens
    assert cold > 0 and warm == 0, (cold, warm)


def test_interpreter_exit_stops_the_thread(tmp_path):
    """A process that exits without `close` (a script that never closes its trainer) stops the thread at exit: it
    finishes the job in flight, starts no other, and the process exits 0 without waiting for the rest."""
    import subprocess
    import sys

    log = tmp_path / "jobs.txt"
    code = ("import os, time; from jaxgrpo import precompile\n"
            f"def job(i):\n    open({str(log)!r}, 'a').write(f'start{{i}} ')\n    time.sleep(0.3)\n"
            f"    open({str(log)!r}, 'a').write(f'end{{i}} ')\n"
            "precompile.Precompiler([(str(i), lambda i=i: job(i)) for i in range(100)]).start()\n"
            f"while not os.path.exists({str(log)!r}):\n    time.sleep(0.01)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert log.read_text().split() == ["start0", "end0"]  # the job in flight at exit finished; none started after


@pytest.mark.slow
def test_trainer_samples_on_the_engine_on_a_mesh(tmp_path):
    """With a mesh (data 4 x fsdp 2) in one process the trainer samples on the rollout engine (its slots split over
    the 8 devices): the same rollouts as the same run on one device (tokens sampled, rewards, degeneracy), the
    engine's metrics reported, and with the background precompiler joined after step 1, step 2 compiles nothing."""
    base = ["rollout.prompts_per_step=8", "rollout.group_size=2", "rollout.max_new_tokens=3", "log.progress=false",
            "log.tensorboard=false", "log.sample_every=0", "checkpoint.every=0", "checkpoint.export_final=false",
            "train.steps=2", "perf.precompile=background"]  # fmt: skip
    runs = {}
    for name, mesh in (("mesh", ["mesh.data=4", "mesh.fsdp=2"]), ("one", [])):
        t = trainer.Trainer(config_lib.load_config("default", [*base, *mesh]), tmp_path / name)
        out = []
        try:
            assert t.use_engine and (t.rollout_mesh is not None) == (name == "mesh")
            for step in range(2):
                out.append(t.step(step))
                if step == 0:
                    assert t.precompiler is not None and t.precompiler.join(300) and t.precompiler.failed == []
        finally:
            t.close()
        runs[name] = out
    assert runs["mesh"][1]["time/compiles"] == 0, runs["mesh"][1]
    for a, b in zip(runs["mesh"], runs["one"]):
        assert "rollout/slot_utilization" in a
        for k in ("tokens/sampled", "rollout/slot_utilization", "degeneracy/collapse_rate", "degeneracy/success_rate"):
            assert a[k] == b[k], (k, a[k], b[k])
        assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-6)


@pytest.mark.slow
def test_a_rollout_mesh_samples_on_the_engine_within_its_ladder(tmp_path):
    """``mesh.rollout=2`` (the rollouts on a data mesh of 2 of their own, the learner on data 2 x fsdp 2): the engine
    in static mode admits the step's 8 prompts in one packed row, on the ``"engine"`` ladder. 2,000 prompts of 8-14
    tokens and one of 26 put the long one in step 2's batch, whose row fits the ladder's cap (128). (The
    previous sampler split the row over the mesh's shards: sized for the learner's 4 instead of the rollout mesh's 2,
    its cap was 40 and step 2 raised "a packed prompt row of 44 tokens is wider than the run's widest row".)"""
    import json

    data = tmp_path / "data"
    data.mkdir()
    ks = [1 + i % 4 for i in range(2000)]
    ks[8] = 10  # the second batch's first prompt: "1+" x 10 "1=" is 26 tokens
    (data / "train.jsonl").write_text("".join(json.dumps({"question": "1+" * k + "1=", "answer": f"#### {k + 1}"})
                                              + "\n" for k in ks))  # fmt: skip
    cfg = config_lib.load_config("default", [
        "rollout.prompts_per_step=8", "rollout.group_size=2", "rollout.max_new_tokens=2", "log.progress=false",
        "log.tensorboard=false", "log.sample_every=0", "checkpoint.every=0", "checkpoint.export_final=false",
        "train.steps=2", "data.source=gsm8k", f"data.path={data}", "data.shuffle=false", "data.max_prompt_tokens=32",
        "data.rewards={gsm8k: 1.0}", "mesh.data=2", "mesh.fsdp=2", "mesh.rollout=2"])  # fmt: skip
    t = trainer.Trainer(cfg, tmp_path / "run")
    try:
        assert t.use_engine and t.ladders["engine"] == (128, 128), t.ladders
        out = [t.step(step) for step in range(2)]
    finally:
        t.close()
    assert [m["tokens/sampled"] > 0 for m in out] == [True, True]


EVAL_RUN = ["train.steps=2", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=3",
            "checkpoint.every=0", "checkpoint.export_final=false", "log.progress=false", "log.tensorboard=false",
            "log.sample_every=0", "train.eval_every=2", "train.eval_examples=6", "train.retain_every=2",
            "train.retain={copy: {difficulty: 0, split: test, num_examples: 6}, "
            "sums: {difficulty: 2, split: test, num_examples: 5, reward: arithmetic_lenient}}"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [[], ["mesh.data=4", "mesh.fsdp=2", "rollout.prompts_per_step=8",
                                       "rollout.group_size=2"]], ids=["engine", "mesh"])
def test_evaluations_compile_in_the_background(tmp_path, mesh):
    """``train.eval_every=2`` and two ``train.retain`` sets: the second step evaluates the held-out set and both
    retain sets, whose sampling programs (other batch sizes and prompt widths than the rollouts': on one device the
    engine's init, prefill, decode block and transfers; with a mesh the sampler's prefill, decode and output slicing)
    the run has not compiled before. With the thread joined after step 1 that step compiles nothing on the step path
    (``time/compiles`` = 0); with ``perf.precompile=off`` it compiles (the count has teeth); every metric but the
    timings, the ``eval/*`` and ``retain/*`` ones included, is the same in both runs."""
    runs = {}
    for mode in ("off", "background"):
        jax.clear_caches()  # the evaluation's programs are module-level: each run compiles (or reads) its own
        cfg = config_lib.load_config("default", [*EVAL_RUN, *mesh, f"perf.precompile={mode}"])
        t = trainer.Trainer(cfg, tmp_path / mode)
        out = []
        try:
            for step in range(2):
                out.append(t.step(step))
                if step == 0 and mode == "background":
                    assert t.precompiler is not None and t.precompiler.join(300) and t.precompiler.failed == []
                    assert any(n.startswith("evaluation") for n, _ in t.precompiler.jobs)
        finally:
            t.close()
        runs[mode] = out
    on, off = runs["background"], runs["off"]
    assert "eval/pass@1" in on[1] and "retain/sums/accuracy" in on[1] and "eval/pass@1" not in on[0]
    assert on[1]["time/compiles"] == 0 and off[1]["time/compiles"] > 0, (on[1], off[1])
    for a, b in zip(on, off):
        keys = {k for k in a if not k.startswith(("time/", "throughput/", "rollout/prefill_tokens_per_s",
                                                  "rollout/decode_tokens_per_s"))}  # fmt: skip
        assert keys == {k for k in b if not k.startswith(("time/", "throughput/", "rollout/prefill_tokens_per_s",
                                                          "rollout/decode_tokens_per_s"))}  # fmt: skip
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
