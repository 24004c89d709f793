# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The real-model degeneracy study: SmolLM2-135M-Instruct on arithmetic asked in words, on CPU, resumable.

``python benchmarks/degeneracy_real.py --part PART [--pilot] [--out DIR] [--cache-dir DIR]`` with PART one of

* ``base``: the base model's per-prompt success distribution at every level of `jaxgrpo.word_arithmetic`
  (``BASE_PROMPTS`` train-split prompts x ``BASE_SAMPLES`` samples, the rollout settings below); writes
  ``<out>/base_success.json``. The matched level (mean success in 0.2-0.6) and the too-hard level (mean < 0.05) of
  `GRID` were picked from that file.
* ``base-heldout``: the base model's held-out evaluation on the matched and the too-hard level, exactly as each
  run's final policy is evaluated (the reference for the arms); writes ``<out>/base_heldout.json``.
* ``matched-g4-a`` ... ``matched-g4-c``, ``matched-g8-a`` ... ``matched-g8-c``: the training runs on the matched
  level (`parts`: two arms x the seeds each), each part a list of (arm, seed) runs (``--arms A B`` runs only those
  arms of it); ``all`` runs the six in turn. ``hard-g4`` (the six arms at G = 4 on the too-hard level, for
  capability retention) is a seventh part;
* ``base-retain``: the base model's accuracy on the runs' retention sets (``<out>/base_retain.json``);
* ``summary``: aggregates every finished run into ``<out>/grid_summary.json`` and ``<out>/grid_curves.csv``.

Arms (`ARMS`): grpo, dr_grpo, sign, grpo + mask (``algo.degenerate_groups=mask``), grpo + resample (DAPO's dynamic
sampling) and avspo, all from the same pretrained weights, at an equal budget of sampled completion tokens
(``train.max_sampled_tokens``; resampling rounds count, so resample makes fewer optimizer steps), G = 4 and G = 8 at
the same P x G. Each run writes ``<out>/<part>/<arm>/seed<k>/``: ``config.yaml`` and ``metrics.jsonl`` (the trainer's:
every step's reward, ``degeneracy/all_fail``, ``degeneracy/iid_rate``, ``diversity/*``, ``retain/*``, timings) and
``result.json``: the held-out evaluation of the final policy (``EVAL_PROMPTS`` test-split prompts of the level, at
most its distinct ones: 25 at level 1, x ``EVAL_SAMPLES`` samples: accuracy = mean success rate, the unbiased pass@k
of Chen et al. 2021 for k = 1..16, measured vs i.i.d. degeneracy at G, i.e. the Jensen gap, `jaxgrpo.eval.summarize`),
steps, tokens and wall time.

Resuming: a run is finished when its ``result.json`` exists (written to a temporary file and renamed, so it is
never partial); an interrupted part rerun skips finished runs. A run stopped by SIGINT/SIGTERM checkpoints and
resumes from there; its checkpoints are deleted once its result is written (a SmolLM2 checkpoint with AdamW state is
~1.6 GB). ``--pilot`` is a tiny version (``PILOT``: two arms, one seed, a few steps) under ``<out>/pilot/``.

Grid and time (2-core CPU, float32). `GRID` is the smallest grid the study asks for: 6 arms x G in {4, 8} x 3 seeds
= 36 runs of at least 100 steps (budget 100 x 16 rows x 12 tokens = 19,200 sampled tokens), P x G = 16 (P = 4 at
G = 4, P = 2 at G = 8). The ``--pilot`` plan (files under ``<out>/pilot/``: ~3.5 s per step at 8 rows) underestimated
it. Measured on the finished runs (``result.json``: ``step_s_median``, ``total_wall_s``): 125-138 steps of 3.0-3.9 s
on a quiet machine, 6-9 s beside other jobs, so one run (compilation, two retention evaluations and the held-out
evaluation included) takes 7-14 min quiet and up to 23 min under load; a part (2 arms x 3 seeds) ~1 h quiet. The 6
matched parts take ~6 h and ``hard-g4`` (18 runs) ~3 h: **more than the 3-hour budget**. The knobs are the step
count (``--steps``) and the seeds (``--seeds``); P is at its minimum for G = 8. On the H100 of BENCHMARKS.md §9
a 30-step bfloat16 run of this shape (16 rows x 12 tokens) took ~45 s, compilation included.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import pathlib
import shutil
import sys
import time
from typing import Any

import jax
import numpy as np

from jaxgrpo import config as config_lib
from jaxgrpo import data as data_lib
from jaxgrpo import eval as eval_lib
from jaxgrpo import metrics_log
from jaxgrpo import trainer as trainer_lib
from jaxgrpo.word_arithmetic import WORDS_LEVELS, default_size, word_arithmetic

OUT = pathlib.Path(__file__).resolve().parent / "results" / "degeneracy" / "real"
MAX_NEW_TOKENS = 12  # "Reply with just the number": the answer comes within a few tokens (or never)
BASE_PROMPTS, BASE_SAMPLES = 32, 16
EVAL_PROMPTS, EVAL_SAMPLES = 32, 16
REWARD = "gsm8k_lenient"  # the last number of the completion (the model restates the question first)

ARMS: dict[str, dict[str, Any]] = {
    "grpo": {"estimator": "grpo"},
    "dr_grpo": {"estimator": "dr_grpo"},
    "sign": {"estimator": "sign"},
    "grpo_mask": {"estimator": "grpo", "degenerate_groups": "mask"},
    "grpo_resample": {"estimator": "grpo", "degenerate_groups": "resample"},
    "avspo": {"estimator": "avspo"},
}


@dataclasses.dataclass(frozen=True)
class Grid:
    """The study's settings. ``rows`` = P x G completions per step (P = rows / G); ``steps`` is the nominal number of
    steps at G = 4 and sets the token budget ``steps * rows * TOKENS_PER_ROW`` (every arm stops at that budget or at
    ``2 * steps``, whichever comes first)."""

    matched: int = 1
    hard: int = 3
    rows: int = 16
    large_group: int = 8
    steps: int = 100
    seeds: tuple[int, ...] = (0, 1, 2)
    learning_rate: float = 1e-5
    retain_every: int = 50
    eval_prompts: int = EVAL_PROMPTS
    eval_samples: int = EVAL_SAMPLES
    arms: tuple[str, ...] = tuple(ARMS)
    hard_arms: tuple[str, ...] = tuple(ARMS)


# The budget's tokens per completion: the maximum, so keep/mask arms make at least `steps` steps (the pilot measured a
# mean completion length of ~11 of 12 tokens: SmolLM2 rarely stops right after the number).
TOKENS_PER_ROW = MAX_NEW_TOKENS
GRID = Grid()
PILOT = Grid(rows=8, steps=6, seeds=(0,), retain_every=3, eval_prompts=8, eval_samples=8,
             arms=("grpo", "grpo_resample"), hard_arms=())  # the grid's step shape (P x G rows), a few steps: timing


@dataclasses.dataclass(frozen=True)
class RunSpec:
    part: str
    arm: str
    seed: int
    level: int
    group: int


ARMS_PER_PART = 2  # 2 arms x 3 seeds = 6 runs: under an hour at the estimate below


def parts(grid: Grid) -> dict[str, list[RunSpec]]:
    """Part name -> its runs: the arms in chunks of `ARMS_PER_PART` (``-a``, ``-b``, ...) at each G."""
    chunks = [grid.arms[i:i + ARMS_PER_PART] for i in range(0, len(grid.arms), ARMS_PER_PART)]
    out: dict[str, list[RunSpec]] = {}
    for g in (4, grid.large_group):
        for suffix, arms in zip("abcdefgh", chunks):
            name = f"matched-g{g}-{suffix}"
            out[name] = [RunSpec(name, a, s, grid.matched, g) for a in arms for s in grid.seeds]
    if grid.hard_arms:
        out["hard-g4"] = [RunSpec("hard-g4", a, s, grid.hard, 4) for a in grid.hard_arms for s in grid.seeds]
    return {k: v for k, v in out.items() if v}


def run_config(spec: RunSpec, grid: Grid) -> config_lib.Config:
    """The trainer's config for one run: SmolLM2 in float32 on `data.source=words` at the spec's level."""
    budget = grid.steps * grid.rows * TOKENS_PER_ROW
    retain = {"easy": {"source": "words", "difficulty": 1, "split": "test", "num_examples": 16},
              "products": {"source": "words", "difficulty": 2, "split": "test", "num_examples": 16}}  # fmt: skip
    return config_lib.from_dict({
        "model": {"name_or_path": "smollm2", "dtype": "float32"},
        "data": {"source": "words", "difficulty": spec.level, "split": "train", "template": "chat",
                 "rewards": {REWARD: 1.0}, "max_prompt_tokens": 64},
        "rollout": {"prompts_per_step": grid.rows // spec.group, "group_size": spec.group,
                    "max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0},
        "algo": dict(ARMS[spec.arm]),
        "optim": {"learning_rate": grid.learning_rate, "max_grad_norm": 1.0},
        "train": {"steps": 2 * grid.steps, "max_sampled_tokens": budget, "retain": retain,
                  "retain_every": grid.retain_every},
        # one checkpoint at the end (or on SIGINT/SIGTERM) so the final policy can be evaluated; none in between
        "checkpoint": {"every": 10**9, "keep": 1, "export_final": False},
        "log": {"tensorboard": False, "progress": False, "sample_every": 0},
        "seed": spec.seed,
    })  # fmt: skip


def _write_json(path: pathlib.Path, obj: Any) -> None:
    """Atomically: a temporary file in the same directory, then `os.replace`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def heldout_eval(cfg: config_lib.Config, run_dir: pathlib.Path | None, level: int, group: int, grid: Grid,
                 seed: int) -> dict[str, Any]:
    """Accuracy, pass@k (k = 1..n) and measured vs i.i.d. degeneracy at G of the run's final policy (the pretrained
    one when `run_dir` is None) on the level's test split."""
    policy = eval_lib.load_policy_for_eval(cfg, run_dir, None)
    examples = word_arithmetic(min(grid.eval_prompts, default_size(level, "test")), level, 0, "test")  # distinct
    n = grid.eval_samples
    res = eval_lib.evaluate(policy.model_config, policy.params, policy.tokenizer, examples, REWARD, num_samples=n,
                            group_sizes=sorted({min(group, n), min(4, n)}), key=jax.random.key(10_000 + seed),
                            max_new_tokens=MAX_NEW_TOKENS, data_config=cfg.data, ks=list(range(1, n + 1)))  # fmt: skip
    return {"accuracy": res["mean_success_rate"], "pass@k": res["pass@k"], "degeneracy": res["degeneracy"],
            "success_counts": res["success_counts"], "truncated_frac": res["truncated_frac"],
            "samples": res["samples"][:2]}  # fmt: skip


def _step_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of training steps: without the retention measured before the first step (``step`` 0, which
    holds only ``retain/*``)."""
    return [r for r in records if "time/train_s" in r]


def run_one(spec: RunSpec, grid: Grid, root: pathlib.Path) -> dict[str, Any]:
    """Trains and evaluates one run unless its result.json exists; returns the result."""
    run_dir = root / spec.part / spec.arm / f"seed{spec.seed}"
    result_path = run_dir / "result.json"
    if result_path.exists():
        print(f"done already: {run_dir}", file=sys.stderr)
        return json.loads(result_path.read_text())
    cfg = run_config(spec, grid)
    t0 = time.time()
    trainer_lib.run(cfg, run_dir)
    records = _step_records(metrics_log.read_metrics(run_dir))
    last = records[-1] if records else {"step": 0, "tokens/sampled_total": 0}
    if not (last["step"] >= cfg.train.steps or last["tokens/sampled_total"] >= cfg.train.max_sampled_tokens):
        sys.exit(f"interrupted at step {last['step']} of {run_dir}; rerun the part to resume it")
    train_s = time.time() - t0
    heldout = heldout_eval(cfg, run_dir, spec.level, spec.group, grid, spec.seed)
    step_s = [r["time/sample_s"] + r["time/train_s"] for r in records]
    result = {**dataclasses.asdict(spec), "steps": int(last["step"]),
              "sampled_tokens": int(last["tokens/sampled_total"]), "budget": cfg.train.max_sampled_tokens,
              "train_wall_s": round(train_s, 1), "total_wall_s": round(time.time() - t0, 1),
              "step_s_median": float(np.median(step_s)), "heldout": heldout}  # fmt: skip
    _write_json(result_path, result)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    print(f"{run_dir}: {result['steps']} steps, held-out accuracy {heldout['accuracy']:.3f}", file=sys.stderr)
    return result


def base_part(grid: Grid, root: pathlib.Path, levels: list[int]) -> dict[str, Any]:
    """The base model's per-prompt success at every level (train split) and its held-out accuracy (test split)."""
    cfg = run_config(RunSpec("base", "grpo", 0, grid.matched, 4), grid)
    policy = eval_lib.load_policy_for_eval(cfg, None, None)
    out: dict[str, Any] = {"settings": {"prompts": BASE_PROMPTS, "samples": BASE_SAMPLES, "reward": REWARD,
                                        "max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0, "template": "chat",
                                        "split": "train"}, "levels": {}}  # fmt: skip
    for level in levels:
        t0 = time.time()
        data_cfg = dataclasses.replace(cfg.data, difficulty=level)
        res = eval_lib.evaluate(policy.model_config, policy.params, policy.tokenizer,
                                word_arithmetic(BASE_PROMPTS, level, 0, "train"), REWARD, num_samples=BASE_SAMPLES,
                                group_sizes=[4, 8, 16], key=jax.random.key(level), max_new_tokens=MAX_NEW_TOKENS,
                                data_config=data_cfg)  # fmt: skip
        c = np.asarray(res["success_counts"])
        out["levels"][str(level)] = {
            "description": WORDS_LEVELS[level], "mean_success": res["mean_success_rate"],
            "all_fail_prompts": res["all_fail_prompts"], "all_pass_prompts": res["all_pass_prompts"],
            "mixed_prompts": float(np.mean((c > 0) & (c < BASE_SAMPLES))), "success_counts": res["success_counts"],
            "success_histogram": res["success_histogram"]["prompts"], "pass@k": res["pass@k"],
            "degeneracy": res["degeneracy"], "truncated_frac": res["truncated_frac"], "samples": res["samples"][:3],
            "wall_s": round(time.time() - t0, 1)}  # fmt: skip
        print(f"level {level}: mean success {res['mean_success_rate']:.3f}", file=sys.stderr)
    means = {int(k): v["mean_success"] for k, v in out["levels"].items()}
    matched = [k for k, p in means.items() if 0.2 <= p <= 0.6]
    hard = [k for k, p in means.items() if p < 0.05]
    out["pick"] = {"matched": max(matched, key=lambda k: means[k]) if matched else None,
                   "too_hard": min(hard, key=lambda k: means[k]) if hard else None,
                   "rule": "matched: mean success in [0.2, 0.6] (the highest such); too hard: mean < 0.05 (the lowest)"}
    _write_json(root / "base_success.json", out)
    return out


def _ci95(x: np.ndarray) -> list[float] | None:
    """Student-t 95% interval of the mean over seeds (None with one seed)."""
    from scipy import stats

    if len(x) < 2:
        return None
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return [float(x.mean() - half), float(x.mean() + half)]


def base_retain(grid: Grid) -> dict[str, Any]:
    """The pretrained policy's accuracy on each retention set of the runs (`run_config`'s ``train.retain``): the
    level the runs start from, so ``retain/*`` curves read as gains or losses. ``BASE_SAMPLES`` samples per prompt
    (the runs measure G), the rollout's sampler settings and the set's reward, as the trainer measures it."""
    from jaxgrpo import retain as retain_lib

    cfg = run_config(RunSpec("base", "grpo", 0, grid.matched, 4), grid)
    policy = eval_lib.load_policy_for_eval(cfg, None, None)
    out = {}
    for i, rs in enumerate(retain_lib.resolve(cfg)):
        res = eval_lib.evaluate(policy.model_config, policy.params, policy.tokenizer,
                                data_lib.load_dataset(rs.data, cfg.seed), rs.reward, num_samples=BASE_SAMPLES,
                                group_sizes=[], key=jax.random.key(100 + i), max_new_tokens=MAX_NEW_TOKENS,
                                temperature=1.0, data_config=rs.data)  # fmt: skip
        out[f"retain/{rs.name}/accuracy"] = {"accuracy": res["mean_success_rate"], "samples": BASE_SAMPLES,
                                             "prompts": len(res["success_counts"])}  # fmt: skip
        print(f"base retain/{rs.name}: {res['mean_success_rate']:.3f}", file=sys.stderr)
    return out


RETAIN_COLUMNS = ("retain/easy/accuracy", "retain/products/accuracy")
CURVE_COLUMNS = ("reward/mean", "degeneracy/all_fail", "degeneracy/collapse_rate", "degeneracy/iid_rate",
                 "diversity/distinct_frac", "diversity/entropy", "tokens/sampled_total", *RETAIN_COLUMNS)


def summary(root: pathlib.Path, grid: Grid) -> dict[str, Any]:
    """Aggregates finished runs: per (part, arm) held-out accuracy (mean, 95% CI over seeds), mean pass@k, the
    Jensen gap at G, the retention sets' last accuracy; every logged step's curves (reward, all-fail fraction,
    diversity, retention where measured) to grid_curves.csv."""
    rows, curves = [], []
    for name, specs in parts(grid).items():
        for arm in dict.fromkeys(s.arm for s in specs):
            results = [json.loads(p.read_text()) for p in sorted((root / name / arm).glob("seed*/result.json"))]
            if not results:
                continue
            acc = np.asarray([r["heldout"]["accuracy"] for r in results])
            g = results[0]["group"]
            gap = [next(d["gap"] for d in r["heldout"]["degeneracy"] if d["group_size"] == g) for r in results]
            ks = results[0]["heldout"]["pass@k"]
            passk = {k: float(np.mean([r["heldout"]["pass@k"][k] for r in results])) for k in ks}
            retained: dict[str, list[float]] = {}  # each retention set's last measurement, per seed
            for r in results:
                recs = metrics_log.read_metrics(root / name / arm / f"seed{r['seed']}")
                for rec in recs:
                    curves.append({"part": name, "arm": arm, "seed": r["seed"], "step": rec["step"],
                                   **{k: rec.get(k, "") for k in CURVE_COLUMNS}})
                for k in RETAIN_COLUMNS:
                    last = [rec[k] for rec in recs if k in rec and rec["step"] > 0]  # step 0: before training
                    if last:
                        retained.setdefault(k, []).append(last[-1])
            rows.append({"part": name, "arm": arm, "seeds": len(results), "accuracy_mean": float(acc.mean()),
                         "accuracy_ci95": _ci95(acc), "accuracy_seeds": acc.tolist(), "pass@k": passk,
                         "jensen_gap_heldout": float(np.mean(gap)),
                         "steps_mean": float(np.mean([r["steps"] for r in results])),
                         "retain_last": {k: {"mean": float(np.mean(v)), "ci95": _ci95(np.asarray(v))}
                                         for k, v in retained.items()}})  # fmt: skip
    out = {"grid": dataclasses.asdict(grid), "arms": rows}
    _write_json(root / "grid_summary.json", out)
    if curves:
        with open(root / "grid_curves.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(curves[0]))
            w.writeheader()
            w.writerows(curves)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", required=True, help="base | <part name> | all | summary")
    p.add_argument("--pilot", action="store_true", help="a tiny version under <out>/pilot/")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--levels", type=int, nargs="+", default=sorted(WORDS_LEVELS), help="levels for --part base")
    p.add_argument("--cache-dir", default=None, help="JAX persistent compilation cache")
    p.add_argument("--steps", type=int, default=None, help=f"override the grid's nominal steps ({GRID.steps})")
    p.add_argument("--seeds", type=int, default=None, help=f"override the number of seeds ({len(GRID.seeds)})")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=None,
                   help="run only these arms of the part (the others stay for a later call)")
    args = p.parse_args(argv)
    if args.cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    grid, root = (PILOT, pathlib.Path(args.out) / "pilot") if args.pilot else (GRID, pathlib.Path(args.out))
    if args.steps is not None:
        grid = dataclasses.replace(grid, steps=args.steps)
    if args.seeds is not None:
        grid = dataclasses.replace(grid, seeds=tuple(range(args.seeds)))
    all_parts = parts(grid)
    if args.part == "base":
        base_part(grid, root, args.levels)
        return 0
    if args.part == "cpu-time":
        _write_json(root / "cpu_time.json", cpu_time(grid))
        return 0
    if args.part == "base-heldout":
        cfg = run_config(RunSpec("base", "grpo", 0, grid.matched, 4), grid)
        out = {str(level): heldout_eval(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, difficulty=level)),
                                        None, level, 4, grid, 0) for level in (grid.matched, grid.hard)}  # fmt: skip
        _write_json(root / "base_heldout.json", out)
        return 0
    if args.part == "base-retain":
        _write_json(root / "base_retain.json", base_retain(grid))
        return 0
    if args.part == "summary":
        if args.pilot:
            timing(root)
        summary(root, grid)
        return 0
    names = [n for n in all_parts if n.startswith("matched")] if args.part == "all" else [args.part]
    for name in names:
        if name not in all_parts:
            print(f"error: unknown part {name!r}; valid: base, base-heldout, base-retain, {', '.join(all_parts)}, all, "
                  "summary",
                  file=sys.stderr)
            return 2
    for name in names:
        for spec in all_parts[name]:
            if args.arms is None or spec.arm in args.arms:
                run_one(spec, grid, root)
    if args.pilot:
        timing(root)
    summary(root, grid)
    return 0


def cpu_time(grid: Grid, steps: int = 3) -> dict[str, Any]:
    """Wall and process CPU seconds (all threads) of grid-shaped grpo steps at each G, after one compiling step: on a
    shared CPU the wall time depends on the load, while CPU seconds / cores bounds the time on an idle machine."""
    import tempfile

    out: dict[str, Any] = {"load_average_before": [round(x, 2) for x in os.getloadavg()]}
    for g in (4, grid.large_group):
        cfg = run_config(RunSpec("cpu-time", "grpo", 0, grid.matched, g), grid)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, retain={}, retain_every=0))
        with tempfile.TemporaryDirectory() as tmp:
            tr = trainer_lib.Trainer(cfg, tmp)
            tr.step(0)
            wall, cpu = [], []
            for s in range(1, steps + 1):
                w, c = time.perf_counter(), time.process_time()
                tr.step(s)
                wall.append(round(time.perf_counter() - w, 2))
                cpu.append(round(time.process_time() - c, 2))
        out[f"G{g}"] = {"prompts": grid.rows // g, "wall_s": wall, "cpu_s": cpu}
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    out["cores"] = os.cpu_count()
    return out


def timing(root: pathlib.Path) -> dict[str, Any]:
    """Per-step wall time of the pilot's runs (first step, which compiles, apart) -> ``<root>/timing.json``."""
    out = {}
    for path in sorted(root.glob("*/*/seed*/metrics.jsonl")):
        recs = _step_records(metrics_log.read_metrics(path))
        rollout = config_lib.load_config(str(path.parent / "config.yaml")).rollout
        steps = [r["time/sample_s"] + r["time/train_s"] for r in recs]
        out[str(path.parent.relative_to(root))] = {
            "prompts": rollout.prompts_per_step, "group_size": rollout.group_size, "steps": len(recs),
            "first_step_s": steps[0], "later_step_s_mean": float(np.mean(steps[1:])) if len(steps) > 1 else None,
            "later_sample_s_mean": float(np.mean([r["time/sample_s"] for r in recs[1:]])) if len(recs) > 1 else None,
            "resample_rounds_mean": float(np.mean([r.get("resample/rounds", 1.0) for r in recs])),
            "completion_len_mean": float(np.mean([r["completion/len_mean"] for r in recs]))}  # fmt: skip
    out["load_average_1_5_15min"] = [round(x, 2) for x in os.getloadavg()]  # the CPU is shared: read times with it
    _write_json(root / "timing.json", out)
    return out


if __name__ == "__main__":
    sys.exit(main())
