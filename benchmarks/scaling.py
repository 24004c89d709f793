# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Scaling of one GRPO step: time and peak memory against group size G, completion length and model size; plus a
long run that asserts no recompilation and flat memory.

Grid mode (default): for each (model, G, completion length) — models ``tiny`` (2 layers, hidden 64, vocab 512) and
``135m`` (the SmolLM2-135M config, random weights) — one subprocess builds ``--prompts`` random prompts of
``--prompt-len`` tokens × G completions of exactly L tokens and runs the jitted train step
(`jaxgrpo.learner.train_step.make_train_step`, ``perf.prefix_sharing`` per ``--prefix-sharing``, ``perf.remat`` per
``--remat``) on them, ``--steps`` times. The completions are uniform random tokens with random old log-probs by default
(the train step's cost does not depend on token values); ``--sample`` draws them with `jaxgrpo.sampling.generate` (no
stop token) instead and reports the sampling time too. Reported per cell: median seconds of the train step (first
call = compile, excluded), and peak memory: the process's peak RSS (``ru_maxrss``, CPU; includes the parameters,
AdamW state and the Python/XLA runtime) and, where the device reports it, ``peak_bytes_in_use`` (GPU/TPU). One
subprocess per cell, so each peak is that cell's own. ``--skip MODEL,G,L ...`` records cells as skipped (with
``--skip-reason``) without running them; a cell running past ``--cell-timeout`` seconds is recorded as timed out.

Long-run mode (``--long-run N``): the real `jaxgrpo.trainer.Trainer` on the default synthetic-arithmetic config
(tiny model, varying completion lengths with EOS stops), or on ``--config NAME`` with ``--set key=value ...``, for N
steps. Asserted: after the warm-up steps (``--warmup``, default 1: issue 34 asks for no recompilation after the first
step) no XLA compilation happens on the step path (the trainer's ``time/compiles``: ``jax.monitoring`` compile
events in every thread but the background precompile thread's, `jaxgrpo.precompile`; ``compiles_total`` counts every
thread), and the resident memory is flat (mean RSS of the last quarter of the run <= mean of the second quarter ×
1.05 + 64 MiB). ``--set perf.precompile=background`` compiles the run's other shapes in the background after step 1;
``--wait-precompile`` waits for that thread after the warm-up (on a 2-core CPU the thread is slower than the tiny
model's steps, so later steps would otherwise compile rungs it has not reached yet). ``--multiturn``: a multi-turn
run instead (`MULTITURN`: a tiny random model with SmolLM2's tokenizer on the packaged arithmetic environment,
4 prompts x 2, 3 turns; ``--set rollout.turn_engine=true`` for the multi-turn engine); a random model writes no tool
calls, so the turn parser is patched to call the calculator on about half the turns (deterministic in the turn's
text), which makes the live rows and the contexts' lengths vary from turn to turn and step to step.

  python benchmarks/scaling.py --models tiny 135m --prompts 1 --groups 4 8 16 --lengths 64 256 1024   # the grid
  python benchmarks/scaling.py --long-run 200                                           # leak / recompile check
  python benchmarks/scaling.py --long-run 60 --set rollout.max_new_tokens=64 model.max_position_embeddings=96 \
      algo.degenerate_groups=mask perf.precompile=background --wait-precompile      # varying shapes, precompiled
  python benchmarks/scaling.py --long-run 20 --config smollm2_gsm8k --set data.path=../shared/data/gsm8k   # GPU
  python benchmarks/scaling.py --long-run 12 --multiturn --set perf.precompile=background --wait-precompile

Results go to ``--out`` (JSON) and a table on stdout. On a 2-core CPU the 135M × 1024-token cells take many minutes
each; run the grid on an accelerator or restrict it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import types

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def model_config(name: str):
    from jaxgrpo import models

    if name == "135m":
        return models.get_preset("smollm2-135m")
    if name == "tiny":
        return models.ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                                  num_kv_heads=2, max_position_embeddings=4096, tie_word_embeddings=True)  # fmt: skip
    raise SystemExit(f"unknown model {name!r}; choose tiny or 135m")


def run_cell(
    model: str, G: int, L: int, prompts: int, prompt_len: int, steps: int, prefix_sharing: bool, remat: str,
    sample: bool,
) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxgrpo import models, sampling
    from jaxgrpo.config import AlgoConfig, OptimConfig, PerfConfig
    from jaxgrpo.learner import train_step as ts

    cfg = model_config(model)
    params = models.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    lens = rng.integers(prompt_len // 2, prompt_len + 1, prompts)
    prompt_ids = [rng.integers(1, cfg.vocab_size, n).tolist() for n in lens]
    perf, _ = ts.resolve_perf(AlgoConfig(), PerfConfig(prefix_sharing=prefix_sharing, remat=remat), num_shards=1,
                              platform=jax.default_backend())  # fmt: skip
    init_fn, step_fn = ts.make_train_step(cfg, AlgoConfig(), OptimConfig(learning_rate=1e-6), perf=perf,
                                          total_steps=steps)  # fmt: skip
    state = init_fn(params, jax.random.key(1))
    pm = np.arange(prompt_len)[None] >= (prompt_len - lens)[:, None]
    ptok = np.zeros((prompts, prompt_len), np.int32)
    for p, ids in enumerate(prompt_ids):
        ptok[p, prompt_len - len(ids) :] = ids
    sample_s, train_s = [], []
    for s in range(steps):
        t = time.perf_counter()
        if sample:
            comp = jax.block_until_ready(
                sampling.generate(cfg, state.params, prompt_ids, num_samples=G, max_new_tokens=L,
                                  key=jax.random.key(s), eos_token_ids=())  # fmt: skip
            )
            sample_s.append(time.perf_counter() - t)
        else:
            comp = types.SimpleNamespace(
                tokens=jnp.asarray(rng.integers(1, cfg.vocab_size, (prompts * G, L)), jnp.int32),
                logprobs=jnp.asarray(-rng.exponential(3.0, (prompts * G, L)), jnp.float32),
                mask=jnp.ones((prompts * G, L), bool),
            )
        batch = ts.Batch(
            tokens=jnp.concatenate([jnp.asarray(np.repeat(ptok, G, 0)), comp.tokens], 1),
            prompt_mask=jnp.asarray(np.repeat(pm, G, 0)), completion_mask=comp.mask,
            rewards=jnp.asarray(rng.integers(0, 2, (prompts, G)), jnp.float32), valid=jnp.ones((prompts, G), bool),
            old_logprobs=comp.logprobs,
        )  # fmt: skip
        t = time.perf_counter()
        state, metrics = step_fn(state, batch)
        jax.block_until_ready(metrics)
        train_s.append(time.perf_counter() - t)
    dev_stats = jax.devices()[0].memory_stats() or {}
    return {
        "model": model, "G": G, "L": L, "prompts": prompts, "prompt_len": prompt_len, "prefix_sharing": prefix_sharing,
        "remat": remat, "sampled": sample,
        "sample_s": statistics.median(sample_s[1:]) if sample and steps > 1 else None,
        "train_s": statistics.median(train_s[1:]) if steps > 1 else None, "train_steps_s": train_s,
        "first_sample_s": sample_s[0] if sample else None, "first_train_s": train_s[0],
        "peak_rss_mib": _peak_rss_bytes() / 2**20,
        "device_peak_mib": dev_stats.get("peak_bytes_in_use", 0) / 2**20 or None,
    }  # fmt: skip


MULTITURN = ["model.name_or_path=tiny", "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
             "model.num_heads=2", "model.num_kv_heads=1", "model.max_position_embeddings=1024", "data.source=words",
             "data.difficulty=4", "data.max_prompt_tokens=128", "data.rewards={gsm8k_lenient: 1.0, environment: 0.2}",
             "data.environment=jaxgrpo.rollout.arithmetic_env:CalculatorEnv", "rollout.prompts_per_step=4",
             "rollout.group_size=2", "rollout.max_new_tokens=16", "rollout.max_turns=3",
             "rollout.max_total_tokens=64", "log.progress=false", "log.sample_every=0",
             "checkpoint.export_final=false"]  # fmt: skip


def force_tool_calls() -> None:
    """Patch the multi-turn parser: a turn without a call calls the calculator when its text's code points sum to an
    odd number (a random model writes no calls; deterministic in the text)."""
    from jaxgrpo.rollout import multiturn, tools

    def parse(text, fmt):
        found = tools.parse_tool_calls(text, fmt)
        return found or ([tools.ToolCall("calculator", {"expression": "1 + 2"})] if sum(map(ord, text)) % 2 else [])

    multiturn.parse_tool_calls = parse


def long_run(steps: int, warmup: int, config: str | None = None, overrides: tuple[str, ...] = (),
             wait_precompile: bool = False, multiturn: bool = False) -> dict:
    import jax

    from jaxgrpo import build
    from jaxgrpo import config as config_lib
    from jaxgrpo import trainer as trainer_lib

    if multiturn:
        force_tool_calls()
        overrides = (*MULTITURN, f"model.tokenizer={build.resolve_model_path('smollm2')}", *overrides)

    compiles = {"n": 0}

    def on_event(event: str, duration: float, **kw) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles["n"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_event)
    cfg = config_lib.load_config(config, [*overrides, f"train.steps={steps}", "checkpoint.every=0",
                                          "log.tensorboard=false"])
    rss, compiled_after_warmup, compile_steps, shapes, waited, turns = [], 0, {}, {}, 0.0, []
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = trainer_lib.Trainer(cfg, run_dir)
        try:
            t0 = time.perf_counter()
            for s in range(steps):
                m = trainer.step(s)
                step_path = int(m["time/compiles"])  # this step's own: the precompile thread's are not counted
                if step_path:
                    compile_steps[s] = step_path
                compiled_after_warmup += step_path if s >= warmup else 0
                if wait_precompile and s == warmup - 1 and trainer.precompiler is not None:
                    t = time.perf_counter()
                    trainer.precompiler.join()
                    waited = time.perf_counter() - t
                shape = f"{m.get('batch/completion_width', 0):.0f}x{m.get('batch/groups', 0):.0f}"  # perf.trim_batch
                shapes[shape] = shapes.get(shape, 0) + 1
                if "multiturn/turns" in m:
                    turns.append([round(m["multiturn/turns"], 3), round(m["multiturn/tool_calls"], 3)])
                rss.append(_rss_bytes())
            wall = time.perf_counter() - t0
            pre = trainer.precompiler
            background = {"precompile": trainer.perf.precompile, "precompiled": pre.compiled if pre else 0,
                          "precompile_failed": pre.failed if pre else [],
                          "compiles_background": trainer.compiles.background, "precompile_wait_s": waited}  # fmt: skip
        finally:
            trainer.close()
    q = max(len(rss) // 4, 1)
    second, last = statistics.mean(rss[q : 2 * q]), statistics.mean(rss[-q:])
    result = {
        "config": config or "default", "overrides": list(overrides), "steps": steps, "warmup": warmup,
        "wall_s": wall, "compiles_total": compiles["n"],
        "compiles_after_warmup": compiled_after_warmup, "compiles_by_step": compile_steps, **background,
        "steps_by_width_x_groups": shapes, "multiturn_turns_and_calls_by_step": turns,
        "rss_second_quarter_mib": second / 2**20, "rss_last_quarter_mib": last / 2**20,
        "peak_rss_mib": _peak_rss_bytes() / 2**20,
    }  # fmt: skip
    print(json.dumps(result), flush=True)
    assert compiled_after_warmup == 0, f"{compiled_after_warmup} XLA compilations after step {warmup}: a recompile"
    assert last <= second * 1.05 + 64 * 2**20, f"memory grows: {second / 2**20:.0f} -> {last / 2**20:.0f} MiB"
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny"], choices=["tiny", "135m"])
    ap.add_argument("--groups", nargs="+", type=int, default=[4, 8, 16])
    ap.add_argument("--lengths", nargs="+", type=int, default=[64, 256, 1024])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3, help="per cell; the first (compile) is excluded from medians")
    ap.add_argument("--prefix-sharing", choices=["on", "off"], default="on")
    ap.add_argument("--remat", choices=["auto", "none", "projections", "full"], default="auto",
                    help="perf.remat; auto: full for 135m, projections for tiny")
    ap.add_argument("--sample", action="store_true", help="sample the completions (default: random tokens)")
    ap.add_argument("--skip", nargs="*", default=[], help="cells MODEL,G,L recorded as skipped, not run")
    ap.add_argument("--skip-reason", default="not run: estimated beyond this CPU's time budget")
    ap.add_argument("--cell-timeout", type=float, default=0, help="seconds per cell (0 = none)")
    ap.add_argument("--long-run", type=int, default=0, help="run the leak/recompile check for this many steps")
    ap.add_argument("--warmup", type=int, default=1, help="long run: steps before compilations are counted")
    ap.add_argument("--wait-precompile", action="store_true",
                    help="long run: wait after the warm-up for the background precompile thread (perf.precompile)")
    ap.add_argument("--config", default=None, help="long run: a packaged config name or YAML file (default: the demo)")
    ap.add_argument("--set", nargs="*", default=[], help="long run: config overrides (key=value ...)")
    ap.add_argument("--multiturn", action="store_true", help="long run: the tiny multi-turn run (MULTITURN)")
    ap.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "scaling.json"))
    args = ap.parse_args()
    if args.cell:
        model, G, L = args.cell.split(",")
        remat = args.remat if args.remat != "auto" else "full" if model == "135m" else "projections"
        res = run_cell(model, int(G), int(L), args.prompts, args.prompt_len, args.steps, args.prefix_sharing == "on",
                       remat, args.sample)  # fmt: skip
        print("RESULT " + json.dumps(res), flush=True)
        return
    out = {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
           "machine": f"{platform.machine()} {os.cpu_count()} CPUs", "load_before": list(os.getloadavg())}  # fmt: skip
    if args.long_run:
        out["long_run"] = long_run(args.long_run, args.warmup, args.config, tuple(args.set), args.wait_precompile,
                                   args.multiturn)  # fmt: skip
    else:
        cells = []
        print(f"{'model':<6}{'G':>4}{'L':>6}{'sample s':>10}{'train s':>9}{'peak RSS MiB':>14}", flush=True)
        for model, G, L in itertools.product(args.models, args.groups, args.lengths):
            if f"{model},{G},{L}" in args.skip:
                cells.append({"model": model, "G": G, "L": L, "skipped": args.skip_reason})
                print(f"{model:<6}{G:>4}{L:>6}  skipped: {args.skip_reason}", flush=True)
                continue
            cmd = [sys.executable, __file__, "--cell", f"{model},{G},{L}", "--prompts", str(args.prompts),
                   "--prompt-len", str(args.prompt_len), "--steps", str(args.steps),
                   "--prefix-sharing", args.prefix_sharing, "--remat", args.remat]  # fmt: skip
            if args.sample:
                cmd.append("--sample")
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.cell_timeout or None)
            except subprocess.TimeoutExpired:
                reason = f"timed out after {args.cell_timeout:.0f} s on this machine"
                cells.append({"model": model, "G": G, "L": L, "skipped": reason})
                print(f"{model:<6}{G:>4}{L:>6}  {reason}", flush=True)
                continue
            lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not lines:
                sys.stderr.write(proc.stderr[-4000:])
                raise SystemExit(f"cell {model},{G},{L} failed")
            r = json.loads(lines[-1][7:])
            cells.append(r)
            print(f"{model:<6}{G:>4}{L:>6}{r['sample_s'] or 0:>10.2f}{r['train_s'] or 0:>9.2f}"
                  f"{r['peak_rss_mib']:>14.0f}", flush=True)  # fmt: skip
        out["cells"] = cells
    out["load_after"] = list(os.getloadavg())
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(path.read_text()) if path.exists() else {}
    prev.update({("long_run" if args.long_run else "grid"): out})
    path.write_text(json.dumps(prev, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
