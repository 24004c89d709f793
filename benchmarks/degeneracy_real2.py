# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The real-model degeneracy study, second edition (issue 35): pre-registered (``results/degeneracy/real2/
PREREGISTRATION.md``, ``claims.json``), powered, free of the clipping confound. SmolLM2-135M-Instruct on
`jaxgrpo.word_arithmetic`'s pair splits (a test problem's commuted twin is never trained on), resumable by parts.

``python benchmarks/degeneracy_real2.py --part PART [--out DIR] [--work DIR] [--cache-dir DIR]``, PART in order:

1. ``audit``: the first edition's figures recomputed from its files -> ``first_edition_audit.json``, and the tiny-model
   study's orderings tested (§1 of docs/degeneracy.md) -> ``tiny_study_audit.json``; ``power``: the
   seeds each pre-registered claim needs (`degeneracy_real2_analysis.power_plan`) -> ``power.json`` (no model).
2. ``warmup``: the shared format warm-up: one GRPO run on level `Design.warmup_level` (pair-train), the first
   edition's settings, exported to ``<work>/warmup/final`` (weights, not committed) -> ``warmup.json``. Every arm
   starts from these weights, so the levels below differ by skill, not by output format (the base model is cut at 12
   tokens on 68-81% of samples).
3. ``levels``: the warmed-up model on every level's pair-test split (`LEVEL_PROMPTS` x `LEVEL_SAMPLES`) ->
   ``levels.json`` (written level by level; a rerun measures only the missing levels), with the pick rule of
   `pick_levels`.
4. ``pilot``: each arm at each learning rate of `LR_GRID` (`LORA_LR_GRID` for the LoRA arms), one seed, `pilot_steps`
   steps on the matched level with clipping off -> ``pilot/<arm>/lr<lr>/``; then ``design``: the lr per arm (highest
   mean reward over the last half of the pilot, ties to the smaller lr) and the clip threshold (`CLIP_FACTOR` x the
   largest 99th-percentile pre-clip gradient norm of the chosen pilot runs) -> ``design.json``.
5. ``<cond>-seed<k>`` (every arm of a condition of `CONDITIONS` at seed k), ``<cond>`` (all its seeds) or ``grid``
   (every part, seed by seed: ``m4-seed0, m8-seed0, hard-seed0, lora-seed0, m4pool-seed0, hardpool-seed0,
   m4-seed1, ...``, so a partial grid stays balanced across conditions): the grid.
   Each run writes ``<cond>/<arm>/seed<k>/{config.yaml, metrics.jsonl, result.json}``; result.json holds the
   config, seed, commit, steps, sampled tokens, the fraction of steps clipped and with an exactly zero gradient,
   gradient-norm percentiles, the training-log Jensen gap, the held-out evaluation (pair-test, >= 200 problems x
   `EVAL_SAMPLES`) and the retention of the held skill at the same sampled-token point (the budget) for every arm.
6. ``analyze``: ``verdicts.json`` from ``claims.json`` and the finished runs (`degeneracy_real2_analysis`).

A run is finished when its result.json exists (written atomically); an interrupted part rerun skips finished runs
and resumes an interrupted one from its checkpoint (deleted once the result is written). Several processes may run
parts side by side on one results directory (one per core, say, each started with ``taskset -c K``): a process
holds a run's ``.study.lock`` (`jaxgrpo.run_dir.RunLock`) while it trains and evaluates it, and the others skip
that run.

Time: the grid is 226 runs (m4: 6 arms x 8 seeds; m8: 6 x 8; hard: 6 x 10; lora: 2 x 8; m4pool: 3 x 8; hardpool:
3 x 10, amendments 5 and 6) of ~34-140 steps plus a 256 x 8 held-out evaluation. m4 seed 0's runs took 10-73
minutes of wall time each on 2 cores shared with other work (resumed runs compile again), so the grid is of the order
of 100 CPU-hours; the pilot is 24 runs of 20 steps; the warm-up 40 steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # this checkout's jaxgrpo, whatever else is installed
import degeneracy_real2_analysis as analysis  # noqa: E402

OUT = HERE / "results" / "degeneracy" / "real2"
WORK = HERE.parent / "runs" / "degeneracy_real2"  # warm-up weights (~0.5 GB), ignored by git
MAX_NEW_TOKENS, REWARD, TEMPLATE = 12, "gsm8k_lenient", "chat"
LEVEL_PROMPTS, LEVEL_SAMPLES = 64, 16
EVAL_PROMPTS, EVAL_SAMPLES = 256, 8
LR_GRID, LORA_LR_GRID = (3e-6, 1e-5, 3e-5), (3e-5, 1e-4, 3e-4)
CLIP_FACTOR = 2.0

ARMS: dict[str, dict[str, Any]] = {
    "grpo": {"estimator": "grpo"},
    "dr_grpo": {"estimator": "dr_grpo", "aggregation": "seq-mean-token-sum-norm"},  # Dr. GRPO's own aggregation
    "sign": {"estimator": "sign"},
    "grpo_mask": {"estimator": "grpo", "degenerate_groups": "mask"},
    "grpo_resample": {"estimator": "grpo", "degenerate_groups": "resample"},
    "avspo": {"estimator": "avspo"},
    # amendment 3 (issue 37): GRESO-style skipping of predicted-degenerate prompts, streamed with resample
    "grpo_skip": {"estimator": "grpo", "degenerate_groups": "resample"},
}
ARM_ROLLOUT: dict[str, dict[str, Any]] = {"grpo_skip": {"schedule": "skip"}}  # an arm's rollout keys
LR_FROM = {"grpo_skip": "grpo_resample"}  # an arm with no pilot of its own takes this arm's lr (amendment 3)
FIRST_ARMS = ("grpo", "dr_grpo", "sign", "grpo_mask", "grpo_resample", "avspo")
PROBE_EVERY, PROBE_PROMPTS = 10, 64  # amendment 3: the held-out probe of the m4 and hard runs (train.eval_every)
POOL = 64  # amendment 5: the pool conditions' training problems per seed (GRPO draws 400 prompts at the budget)


@dataclasses.dataclass(frozen=True)
class Condition:
    level: str  # "matched" | "hard": resolved by levels.json
    group: int
    arms: tuple[str, ...]
    seeds: int
    lora_rank: int = 0
    probe: bool = False  # amendment 3: held-out accuracy every PROBE_EVERY steps (tokens and seconds to a target)
    pool: int = 0  # amendment 5: train on a fixed pool of this many pair-train problems (data.num_examples); 0: all


CONDITIONS: dict[str, Condition] = {
    "m4": Condition("matched", 4, FIRST_ARMS, 8, probe=True),
    "m8": Condition("matched", 8, FIRST_ARMS, 8),
    "hard": Condition("hard", 4, FIRST_ARMS, 10, probe=True),  # escape is yes/no: more seeds
    "lora": Condition("matched", 4, ("sign", "dr_grpo"), 8, lora_rank=64),  # the paper's LoRA setting
    # amendment 5: the skip arm where prompts recur (a pool of POOL problems, ~6 visits each at the budget)
    "m4pool": Condition("matched", 4, ("grpo", "grpo_resample", "grpo_skip"), 8, probe=True, pool=POOL),
    # amendment 6: plain GRPO at the too-hard level too (issue 37 compares skip with GRPO and with resample)
    "hardpool": Condition("hard", 4, ("grpo", "grpo_resample", "grpo_skip"), 10, probe=True, pool=POOL),
}


@dataclasses.dataclass(frozen=True)
class Design:
    """Fixed before the runs; the levels, learning rates and clip threshold come from the pilot (design.json)."""

    warmup_level: int = 1
    warmup_steps: int = 40
    warmup_lr: float = 1e-5
    rows: int = 16  # P x G completions per step
    steps: int = 100  # budget = steps * rows * MAX_NEW_TOKENS sampled tokens; every arm stops there (or at 2 * steps)
    pilot_steps: int = 20
    pilot_seed: int = 100
    matched: int | None = None
    hard: int | None = None
    retain: int | None = None
    lr: dict[str, float] = dataclasses.field(default_factory=dict)  # "<arm>" / "<arm>@lora" -> lr
    max_grad_norm: float | None = None


@dataclasses.dataclass(frozen=True)
class RunSpec:
    cond: str
    arm: str
    seed: int


def git_commit() -> str:
    """HEAD of the checkout, with ``+dirty`` when tracked files differ from it."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "HEAD") + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


@functools.cache
def warmup_sha256(work: pathlib.Path) -> str | None:
    """SHA-256 of the warm-up weights a run starts from (``<work>/warmup/final/model.safetensors``; None when absent):
    the weights are not committed, and a warm-up re-created on another machine differs in its last digits
    (PREREGISTRATION.md, amendment 2), so every result records which one it used."""
    path = work / "warmup" / "final" / "model.safetensors"
    if not path.exists():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def load_design(out: pathlib.Path) -> Design:
    """`Design` with design.json's choices; a clear error naming the missing step when the pilot has not run."""
    path = out / "design.json"
    if not path.exists():
        sys.exit(f"error: {path} is missing: run --part warmup, levels, pilot, design first (module docstring)")
    return dataclasses.replace(Design(), **json.loads(path.read_text())["design"])


def check_recurrence(design: Design) -> None:
    """Amendment 5: a scheduling arm skips a prompt on its own earlier groups, so it is inert unless prompts recur
    within the budget. Refuses a condition holding one whose training pool is not visited at least twice on average
    by plain GRPO's draws (``steps x P``; resampling draws more)."""
    for name, cond in CONDITIONS.items():
        scheduled = [a for a in cond.arms if ARM_ROLLOUT.get(a, {}).get("schedule", "none") != "none"]
        prompts = design.steps * design.rows // cond.group  # plain GRPO's prompt draws at the budget
        if scheduled and not (cond.pool and prompts >= 2 * cond.pool):
            raise ValueError(f"condition {name!r}: arm {scheduled[0]!r} schedules on prompt history, but its prompts "
                             f"do not recur within the budget ({prompts} drawn); give it a pool of at most "
                             f"{prompts // 2} problems (amendment 5)")


def parts(design: Design) -> dict[str, list[RunSpec]]:
    """``<cond>-seed<k>`` -> every arm of the condition at seed k (a part finishes a balanced slice of the grid)."""
    check_recurrence(design)
    return {f"{c}-seed{k}": [RunSpec(c, a, k) for a in cond.arms] for c, cond in CONDITIONS.items()
            for k in range(cond.seeds)}  # fmt: skip


def lr_key(arm: str, lora_rank: int) -> str:
    return f"{arm}@lora" if lora_rank else arm


def base_config(design: Design, model: str, level: int, group: int, seed: int) -> dict[str, Any]:
    """The trainer config shared by warm-up, pilot and grid runs (a dict for `config.from_dict`)."""
    budget = design.steps * design.rows * MAX_NEW_TOKENS
    return {
        "model": {"name_or_path": model, "dtype": "float32"},
        "data": {"source": "words", "difficulty": level, "split": "pair-train", "template": TEMPLATE,
                 "rewards": {REWARD: 1.0}, "max_prompt_tokens": 64},
        "rollout": {"prompts_per_step": design.rows // group, "group_size": group, "max_new_tokens": MAX_NEW_TOKENS,
                    "temperature": 1.0},
        "algo": {"estimator": "grpo"},
        "optim": {"learning_rate": design.warmup_lr, "max_grad_norm": 1.0},
        "train": {"steps": 2 * design.steps, "max_sampled_tokens": budget},
        "checkpoint": {"every": 10**9, "keep": 1, "export_final": False},
        "log": {"tensorboard": False, "progress": False, "sample_every": 0},
        "seed": seed,
    }  # fmt: skip


def run_config(spec: RunSpec, design: Design, work: pathlib.Path) -> Any:
    """One grid run's config: the warmed-up weights, the condition's level and G, the arm's lr, the clip threshold,
    retention of the held skill at token 0 and at the budget (``retain_every`` past the last step)."""
    from jaxgrpo import config as config_lib

    cond = CONDITIONS[spec.cond]
    level = getattr(design, cond.level)
    if level is None:
        sys.exit(f"error: design.json has no {cond.level} level for condition {spec.cond!r}: no level met the "
                 "pick rule (levels.json); add a harder level to jaxgrpo/word_arithmetic.py and rerun --part levels")
    raw = base_config(design, str(work / "warmup" / "final"), level, cond.group, spec.seed)
    raw["algo"] = dict(ARMS[spec.arm])
    raw["rollout"].update(ARM_ROLLOUT.get(spec.arm, {}))
    raw["optim"] = {"learning_rate": design.lr[lr_key(LR_FROM.get(spec.arm, spec.arm), cond.lora_rank)],
                    "max_grad_norm": design.max_grad_norm}  # fmt: skip
    if cond.lora_rank:
        raw["lora"] = {"rank": cond.lora_rank}
    raw["train"].update(retain={"held": {"source": "words", "difficulty": design.retain, "split": "pair-test"}},
                        retain_every=10 * design.steps)  # fmt: skip
    if cond.pool:  # amendment 5: the seed's first `pool` problems of its pair-train permutation, cycled by epoch
        raw["data"]["num_examples"] = cond.pool
    if cond.probe:  # the trainer's held-out evaluation: pair-test after pair-train (jaxgrpo.data.held_out_split)
        raw["train"].update(eval_every=PROBE_EVERY, eval_examples=PROBE_PROMPTS)
    return config_lib.from_dict(raw)


def _write_json(path: pathlib.Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def evaluate_level(cfg: Any, run_dir: pathlib.Path | None, level: int, prompts: int, samples: int, group: int,
                   key: int) -> dict[str, Any]:
    """Accuracy, pass@k and measured vs i.i.d. degeneracy of a policy on a level's pair-test split (distinct
    problems: at most the split's size)."""
    import jax

    from jaxgrpo import eval as eval_lib
    from jaxgrpo.word_arithmetic import default_size, word_arithmetic

    policy = eval_lib.load_policy_for_eval(cfg, run_dir, None)
    examples = word_arithmetic(min(prompts, default_size(level, "pair-test")), level, 0, "pair-test")
    data_cfg = dataclasses.replace(cfg.data, difficulty=level, split="pair-test")
    res = eval_lib.evaluate(policy.model_config, policy.params, policy.tokenizer, examples, REWARD,
                            num_samples=samples, group_sizes=sorted({min(group, samples), min(4, samples)}),
                            key=jax.random.key(key), max_new_tokens=MAX_NEW_TOKENS, data_config=data_cfg,
                            ks=[k for k in (1, 2, 4, 8, 16) if k <= samples])  # fmt: skip
    return {"level": level, "prompts": len(examples), "samples": samples, "accuracy": res["mean_success_rate"],
            "pass@k": res["pass@k"], "degeneracy": res["degeneracy"], "success_counts": res["success_counts"],
            "truncated_frac": res["truncated_frac"], "examples": res["samples"][:2]}  # fmt: skip


def train_stats(records: list[dict[str, Any]], max_grad_norm: float | None) -> dict[str, Any]:
    """Per-run training statistics from the metrics: clip and zero-gradient fractions, pre-clip gradient-norm
    percentiles, the training-log Jensen gap (mean over steps of measured minus i.i.d. degeneracy), mean reward."""
    steps = [r for r in records if "time/train_s" in r]
    g = np.asarray([r["grad_norm"] for r in steps], dtype=np.float64)
    gap = [r["degeneracy/collapse_rate"] - r["degeneracy/iid_rate"] for r in steps]
    return {"steps": len(steps), "zero_grad_frac": float(np.mean(g == 0)) if len(g) else None,
            "clip_frac": float(np.mean(g > max_grad_norm)) if len(g) and max_grad_norm else 0.0,
            "grad_norm_pcts": {str(q): float(np.percentile(g, q)) for q in (50, 90, 99)} if len(g) else {},
            "jensen_gap_train": float(np.mean(gap)) if gap else None,
            "reward_mean": float(np.mean([r["reward/mean"] for r in steps])) if steps else None,
            "reward_last_half": float(np.mean([r["reward/mean"] for r in steps[len(steps) // 2:]])) if steps else None}


def sampling_stats(records: list[dict[str, Any]], prompts: int) -> dict[str, Any]:
    """Amendment 3's measures: informative groups sampled per 1,000 sampled tokens over the run, and the held-out
    probe (``eval/pass@1`` every `PROBE_EVERY` steps) with the sampled tokens and the step seconds (sampling, scoring
    and update; evaluations not counted) spent when it was taken."""
    steps = [r for r in records if "time/train_s" in r]
    tokens = sum(float(r["tokens/sampled"]) for r in steps)
    probe, seconds = [], 0.0
    for r in steps:
        seconds += float(r["time/sample_s"]) + float(r["time/train_s"])
        if "eval/pass@1" in r:
            probe.append({"step": int(r["step"]), "tokens": int(r["tokens/sampled_total"]),
                          "seconds": round(seconds, 2), "accuracy": float(r["eval/pass@1"])})
    informative = sum(analysis.informative_groups(r, prompts) for r in steps)
    return {"informative_groups": informative, "informative_per_1k_tokens": 1000.0 * informative / max(tokens, 1.0),
            "step_seconds": round(seconds, 2), "probe": probe}


def _train(cfg: Any, run_dir: pathlib.Path) -> list[dict[str, Any]]:
    from jaxgrpo import metrics_log
    from jaxgrpo import trainer as trainer_lib

    trainer_lib.run(cfg, run_dir)
    records = metrics_log.read_metrics(run_dir)
    last = [r for r in records if "time/train_s" in r][-1:] or [{"step": 0, "tokens/sampled_total": 0}]
    budget = cfg.train.max_sampled_tokens
    if not (last[0]["step"] >= cfg.train.steps or (budget is not None and last[0]["tokens/sampled_total"] >= budget)):
        sys.exit(f"interrupted at step {last[0]['step']} of {run_dir}; rerun the part to resume it")
    return records


STUDY_LOCK = ".study.lock"  # held around the trainer, which takes the run directory's own ``.lock``


def run_one(spec: RunSpec, design: Design, out: pathlib.Path, work: pathlib.Path) -> dict[str, Any] | None:
    """Trains and evaluates one grid run unless its result.json exists; returns the result, or None when another
    live process holds the run's `STUDY_LOCK` (a worker beside this one): it is that process's to finish. The kernel
    drops a dead process's lock, so a killed worker leaves nothing stale."""
    from jaxgrpo.errors import ConfigError
    from jaxgrpo.run_dir import RunLock

    run_dir = out / spec.cond / spec.arm / f"seed{spec.seed}"
    if (run_dir / "result.json").exists():
        return json.loads((run_dir / "result.json").read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir, STUDY_LOCK)
    try:
        lock.acquire(say=lambda line: None)  # a dead worker's pid: the trainer's own lock says so already
    except ConfigError:
        print(f"{run_dir}: held by another process, skipped", file=sys.stderr)
        return None
    try:
        if (run_dir / "result.json").exists():  # finished by the holder between the check above and the lock
            return json.loads((run_dir / "result.json").read_text())
        return _run_held(spec, design, run_dir, work)
    finally:
        lock.release()


def _run_held(spec: RunSpec, design: Design, run_dir: pathlib.Path, work: pathlib.Path) -> dict[str, Any]:
    from jaxgrpo import config as config_lib

    cfg, t0, cond = run_config(spec, design, work), time.time(), CONDITIONS[spec.cond]
    records = _train(cfg, run_dir)
    level = getattr(design, cond.level)
    result = {**dataclasses.asdict(spec), "level": level, "group": cond.group, "lora_rank": cond.lora_rank,
              "commit": git_commit(), "warmup_sha256": warmup_sha256(work), "config": config_lib.to_dict(cfg),
              "budget": cfg.train.max_sampled_tokens,
              "sampled_tokens": int([r for r in records if "time/train_s" in r][-1]["tokens/sampled_total"]),
              **train_stats(records, design.max_grad_norm),
              **sampling_stats(records, cfg.rollout.prompts_per_step),
              "retain_trainer": {str(r["step"]): r["retain/held/accuracy"] for r in records
                                 if "retain/held/accuracy" in r},
              "heldout": evaluate_level(cfg, run_dir, level, EVAL_PROMPTS, EVAL_SAMPLES, cond.group,
                                        10_000 + spec.seed),
              "retention": evaluate_level(cfg, run_dir, design.retain, EVAL_PROMPTS, 16, 4, 20_000 + spec.seed),
              "total_wall_s": round(time.time() - t0, 1)}  # fmt: skip
    _write_json(run_dir / "result.json", result)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    print(f"{run_dir}: held-out {result['heldout']['accuracy']:.3f}, retention {result['retention']['accuracy']:.3f}",
          file=sys.stderr)
    return result


def warmup(design: Design, out: pathlib.Path, work: pathlib.Path) -> dict[str, Any]:
    """The shared format warm-up (module docstring, step 2)."""
    from jaxgrpo import config as config_lib

    raw = base_config(design, "smollm2", design.warmup_level, 4, 0)
    raw["train"] = {"steps": design.warmup_steps}
    raw["checkpoint"]["export_final"] = True
    cfg = config_lib.from_dict(raw)
    run_dir = work / "warmup"
    if not (run_dir / "final" / "config.json").exists():
        records = _train(cfg, run_dir)
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    else:
        from jaxgrpo import metrics_log
        records = metrics_log.read_metrics(run_dir)
    res = {"commit": git_commit(), "config": config_lib.to_dict(cfg), "weights": str(run_dir / "final"),
           **train_stats(records, 1.0),
           "reward_curve": [r["reward/mean"] for r in records if "reward/mean" in r],
           "truncated_curve": [r["completion/truncated_frac"] for r in records if "completion/truncated_frac" in r]}
    _write_json(out / "warmup.json", res)
    return res


def levels(design: Design, out: pathlib.Path, work: pathlib.Path) -> dict[str, Any]:
    """The warmed-up model on every level's pair-test split, and the levels picked from it (module docstring)."""
    from jaxgrpo import config as config_lib
    from jaxgrpo.word_arithmetic import WORDS_LEVELS, default_size

    cfg = config_lib.from_dict(base_config(design, str(work / "warmup" / "final"), 1, 4, 0))
    path = out / "levels.json"  # resumable: levels measured by a stopped call are kept
    res = json.loads(path.read_text()) if path.exists() else {"commit": git_commit(), "levels": {}}
    for level in sorted(WORDS_LEVELS):
        if str(level) in res["levels"]:
            continue
        res["levels"][str(level)] = {**evaluate_level(cfg, None, level, LEVEL_PROMPTS, LEVEL_SAMPLES, 8, level),
                                     "commit": git_commit()}  # levels added later record their own commit
        _write_json(out / "levels.json", res)  # level by level: a stopped part keeps what it measured
        print(f"level {level}: {res['levels'][str(level)]['accuracy']:.3f}", file=sys.stderr)
    res["pick"] = analysis.pick_levels({int(k): v["accuracy"] for k, v in res["levels"].items()},
                                       {int(k): default_size(int(k), "pair-test") for k in res["levels"]})
    _write_json(out / "levels.json", res)
    return res


def pilot(design: Design, out: pathlib.Path, work: pathlib.Path, arms: list[str]) -> None:
    """Each arm x lr (module docstring, step 4), clipping off; skips finished pilot runs."""
    from jaxgrpo import config as config_lib

    pick = json.loads((out / "levels.json").read_text())["pick"]
    if pick.get("matched") is None:
        sys.exit(f"error: {out / 'levels.json'} picked no matched level: the pilot needs one (see its pick rule)")
    arms = [a for a in arms if a not in LR_FROM]  # an arm that takes another's lr has no pilot
    for arm, rank, grid in [(a, 0, LR_GRID) for a in arms] + [(a, 64, LORA_LR_GRID) for a in CONDITIONS["lora"].arms
                                                               if a in arms]:
        for lr in grid:
            run_dir = out / "pilot" / lr_key(arm, rank) / f"lr{lr:g}"
            if (run_dir / "pilot.json").exists():
                continue
            raw = base_config(design, str(work / "warmup" / "final"), pick["matched"], 4, design.pilot_seed)
            raw["algo"], raw["optim"] = dict(ARMS[arm]), {"learning_rate": lr, "max_grad_norm": 0.0}
            raw["train"] = {"steps": design.pilot_steps}
            if rank:
                raw["lora"] = {"rank": rank}
            cfg = config_lib.from_dict(raw)
            stats = train_stats(_train(cfg, run_dir), None)
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
            _write_json(run_dir / "pilot.json", {"arm": arm, "lora_rank": rank, "lr": lr, "commit": git_commit(),
                                                 "config": config_lib.to_dict(cfg), **stats})  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", required=True,
                   help="audit | power | warmup | levels | pilot | design | <cond>[-seed<k>] | grid | analyze")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--work", default=str(WORK), help="where the warm-up weights live (not committed)")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="pilot / grid: only these arms")
    p.add_argument("--cache-dir", default=None, help="JAX persistent compilation cache")
    args = p.parse_args(argv)
    out, work = pathlib.Path(args.out), pathlib.Path(args.work)
    if args.cache_dir:
        import jax

        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    simple = {"audit": lambda: (_write_json(out / "first_edition_audit.json", analysis.audit_first_edition()),
                                _write_json(out / "tiny_study_audit.json", analysis.audit_tiny_study())),
              "warmup": lambda: warmup(Design(), out, work), "levels": lambda: levels(Design(), out, work),
              "pilot": lambda: pilot(Design(), out, work, args.arms),
              "design": lambda: _write_json(out / "design.json", analysis.resolve_design(out, CLIP_FACTOR)),
              "power": lambda: _write_json(out / "power.json", analysis.power_json(out)),
              "analyze": lambda: _write_json(out / "verdicts.json", analysis.verdicts(out))}  # fmt: skip
    if args.part in simple:
        simple[args.part]()
        return 0
    design = load_design(out)
    grid = parts(design)
    if args.part == "grid":
        names = sorted(grid, key=lambda n: (int(n.rsplit("-seed", 1)[1]), list(CONDITIONS).index(n.split("-")[0])))
    elif args.part in CONDITIONS:
        names = [n for n in grid if n.startswith(args.part + "-seed")]
    else:
        names = [args.part]
    if not names or names[0] not in grid:
        print(f"error: unknown part {args.part!r}; valid: {', '.join(simple)}, grid, {', '.join(CONDITIONS)}, "
              f"<cond>-seed<k> (k < the condition's seeds)", file=sys.stderr)  # fmt: skip
        return 2
    skipped = [spec for name in names for spec in grid[name]
               if spec.arm in args.arms and run_one(spec, design, out, work) is None]  # fmt: skip
    if skipped:
        print(f"{len(skipped)} run(s) were held by other processes and skipped; rerun --part {args.part} once those "
              "processes end to finish any they left", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
