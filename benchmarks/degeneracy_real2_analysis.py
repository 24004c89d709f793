# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The degeneracy study's second edition, analysis side (numpy only, no model): the first edition's audit, the level
and design picks, the power calculation and the pre-registered verdicts, all read from the committed files.

Verdicts (``verdicts.json``): each claim of ``claims.json`` is tested on its metric per seed,
``a > b`` claims by Welch's two-sided test of the two arms' per-seed values (``accuracy``: held-out accuracy;
``escape``: 1 if the run's held-out accuracy is at least ``ESCAPE_MARGIN`` above the warmed-up model's, else 0, by the
exact permutation test), ``start > end`` retention claims (the warmed-up model's retention, or each run's own before
its first step: amendment 8) and ``measured > iid`` degeneracy claims by the one-sample t-test of the per-seed
differences. Holm's correction runs over all claims of a family: a condition, or a claim's own ``family``. A verdict
is ``true`` when the adjusted p is < ``ALPHA`` and the difference has the claimed sign, ``false`` otherwise, and stays
``null`` ("pending") until every arm of the claim has the pre-registered number of seeds. Tests in
benchmarks/study_stats.py.
"""

from __future__ import annotations

import itertools
import json
import math
import pathlib
import sys
from typing import Any

import numpy as np
import study_stats as st

HERE = pathlib.Path(__file__).resolve().parent
FIRST = HERE / "results" / "degeneracy" / "real"
ALPHA, ESCAPE_MARGIN = 0.05, 0.2
ONE_SAMPLE = ("retention_drop", "retention_drop_paired", "train_jensen_gap")  # per-seed differences, tested against 0
PERMUTATION = ("escape", "tokens_to_target")  # yes/no or censored outcomes: the exact permutation test
# amendment 2's warm-up weights: the runs made before results recorded `warmup_sha256` (commit 820ca3f) used them
REWARM_SHA256 = "beccf58408e200485621cd9d9bb979b8ed33179ffbbacbddf4bcbce8ca1a6167"
COND_LEVEL = {"m4": "matched", "m8": "matched", "hard": "hard", "lora": "matched", "m4pool": "matched",
              "hardpool": "hard"}  # the runner's CONDITIONS
FIRST_CONDITIONS = {"matched-g4": ("matched-g4-a", "matched-g4-b", "matched-g4-c"),
                    "matched-g8": ("matched-g8-a", "matched-g8-b", "matched-g8-c"), "hard-g4": ("hard-g4",)}


def warmup_of(result: dict[str, Any]) -> str:
    """The SHA-256 of the warm-up weights a grid run started from (amendment 4)."""
    return result.get("warmup_sha256") or REWARM_SHA256


def informative_groups(record: dict[str, Any], prompts: int) -> float:
    """Informative groups sampled in a step (one metrics record), every round counted: the schedule's own count;
    with resampling, P x ``resample/informative_frac`` (on the engine admission stops at the P-th informative group,
    so at most P are sampled; fewer only when the rounds ran out); otherwise the step's ``groups/informative``."""
    if "schedule/informative_groups" in record:
        return float(record["schedule/informative_groups"])
    if "resample/informative_frac" in record:
        return prompts * float(record["resample/informative_frac"])
    return float(record["groups/informative"])


def _first_runs(root: pathlib.Path, parts: tuple[str, ...]) -> dict[str, list[tuple[dict, list[dict]]]]:
    out: dict[str, list[tuple[dict, list[dict]]]] = {}
    for part in parts:
        for result in sorted((root / part).glob("*/seed*/result.json")):
            recs = [json.loads(line) for line in (result.parent / "metrics.jsonl").read_text().splitlines()]
            out.setdefault(result.parent.parent.name, []).append((json.loads(result.read_text()), recs))
    return out


def audit_first_edition(root: pathlib.Path = FIRST) -> dict[str, Any]:
    """Per condition: every pairwise Welch test of held-out accuracy with Holm's adjustment over the condition's 15
    pairs; per arm the fraction of steps with an exactly zero gradient and of steps (and of nonzero-gradient steps)
    clipped at the first edition's ``max_grad_norm = 1``, per seed; same-seed GRPO vs grpo + mask differences."""
    out: dict[str, Any] = {}
    for cond, parts in FIRST_CONDITIONS.items():
        runs = _first_runs(root, parts)
        acc = {arm: [r["heldout"]["accuracy"] for r, _ in v] for arm, v in runs.items()}
        pairs = list(itertools.combinations(sorted(acc), 2))
        raw = [st.welch(acc[a], acc[b])["p"] for a, b in pairs]
        adj = st.holm(raw)
        arms = {}
        for arm, v in runs.items():
            g = [np.asarray([x["grad_norm"] for x in recs if "grad_norm" in x]) for _, recs in v]
            arms[arm] = {"accuracy": acc[arm], "zero_grad_frac": [float(np.mean(x == 0)) for x in g],
                         "clip_frac": [float(np.mean(x > 1.0)) for x in g],
                         "clip_frac_nonzero": [float(np.mean(x[x > 0] > 1.0)) for x in g],
                         "grad_norm_median_nonzero": float(np.median(np.concatenate([x[x > 0] for x in g])))}
        same_seed = [abs(a - b) for a, b in zip(acc.get("grpo", []), acc.get("grpo_mask", []))]
        out[cond] = {"pairs": [{"a": a, "b": b, "p": p, "p_holm": q} for (a, b), p, q in zip(pairs, raw, adj)],
                     "min_p_holm": min(adj), "min_p": min(raw), "arms": arms,
                     "grpo_vs_mask_same_seed_abs_diff": same_seed}  # fmt: skip
    return out


TINY = HERE / "results" / "degeneracy" / "synthetic" / "runs.csv"
TINY_MODES = (("resample", "keep"), ("resample", "mask"), ("mask", "keep"))


def audit_tiny_study(path: pathlib.Path = TINY) -> dict[str, Any]:
    """The tiny-model study's (§1) orderings tested on its final sampled accuracy (``final_acc_sampled``, 3 seeds):
    per regime and pair of degenerate-group modes, the (estimator, seed) differences a - b (same seed, same
    estimator), tested two ways: the one-sample t over the 18 pairs (estimators as replicates), and over the 3 seeds'
    mean differences (seeds as the unit); per regime and estimator, its keep runs against GRPO's by Welch (n = 3).
    Holm over each family (the 9 mode comparisons per test; the 15 estimator comparisons)."""
    import csv

    rows = list(csv.DictReader(path.open()))
    acc = {(r["regime"], r["estimator"], r["mode"], int(r["seed"])): float(r["final_acc_sampled"]) for r in rows}
    regimes = sorted({r["regime"] for r in rows})
    ests, seeds = sorted({r["estimator"] for r in rows}), sorted({int(r["seed"]) for r in rows})
    modes = []
    for regime, (a, b) in itertools.product(regimes, TINY_MODES):
        d = {(e, s): acc[(regime, e, a, s)] - acc[(regime, e, b, s)] for e in ests for s in seeds}
        per_seed = [float(np.mean([d[(e, s)] for e in ests])) for s in seeds]
        modes.append({"regime": regime, "a": a, "b": b, "diff": float(np.mean(list(d.values()))),
                      "a_above": sum(x > 0 for x in d.values()), "pairs": len(d),
                      "p_pairs": st.one_sample(list(d.values()))["p"], "p_seeds": st.one_sample(per_seed)["p"]})
    for key in ("p_pairs", "p_seeds"):
        for m, q in zip(modes, st.holm([m[key] for m in modes])):
            m[key + "_holm"] = q
    estimators = []
    for regime, e in itertools.product(regimes, [e for e in ests if e != "grpo"]):
        x, y = ([acc[(regime, k, "keep", s)] for s in seeds] for k in (e, "grpo"))
        w = st.welch(x, y)
        estimators.append({"regime": regime, "estimator": e, "mean": float(np.mean(x)), "grpo": float(np.mean(y)),
                           "diff": w["diff"], "p": w["p"]})
    for m, q in zip(estimators, st.holm([m["p"] for m in estimators])):
        m["p_holm"] = q
    return {"metric": "final_acc_sampled", "seeds": len(seeds), "modes": modes, "estimators_vs_grpo_keep": estimators}


def pick_levels(accuracy: dict[int, float], test_size: dict[int, int]) -> dict[str, Any]:
    """The second edition's levels from the warmed-up model's pair-test accuracy: matched = a level with >= 256 test
    problems and accuracy in [0.2, 0.6], the closest to 0.4; hard = such a level with accuracy in (0, 0.1], the
    highest (escape must be possible); retain = the level (not matched or hard) with accuracy >= 0.8, the highest."""
    big = [k for k in accuracy if test_size[k] >= 256]
    matched = [k for k in big if 0.2 <= accuracy[k] <= 0.6]
    hard = [k for k in big if 0 < accuracy[k] <= 0.1]
    pick = {"matched": min(matched, key=lambda k: abs(accuracy[k] - 0.4)) if matched else None,
            "hard": max(hard, key=lambda k: accuracy[k]) if hard else None}
    held = [k for k in accuracy if accuracy[k] >= 0.8 and k not in pick.values()]
    pick["retain"] = max(held, key=lambda k: accuracy[k]) if held else None
    pick["rule"] = pick_levels.__doc__.split(": ", 1)[1].replace("\n    ", " ")
    return pick


def resolve_design(out: pathlib.Path, clip_factor: float) -> dict[str, Any]:
    """design.json: the levels (levels.json) and, from the pilot runs, the lr per arm (highest mean reward over the
    pilot's last half, ties to the smaller lr) and the clip threshold (`clip_factor` x the largest 99th-percentile
    gradient norm among the chosen runs). Errors name what is missing; without a too-hard level only the ``hard``
    condition cannot run (`degeneracy_real2.run_config` says so)."""
    levels = json.loads((out / "levels.json").read_text())["pick"]
    missing = [k for k in ("matched", "retain") if levels.get(k) is None]  # no hard level: only "hard" waits
    if missing:
        raise SystemExit(f"error: levels.json picked no {', '.join(missing)} level; add a level or change the rule")
    chosen: dict[str, dict[str, Any]] = {}
    for path in sorted((out / "pilot").glob("*/lr*/pilot.json")):
        run = json.loads(path.read_text())
        key = path.parent.parent.name
        best = chosen.get(key)
        if best is None or (run["reward_last_half"], -run["lr"]) > (best["reward_last_half"], -best["lr"]):
            chosen[key] = run
    if not chosen:
        raise SystemExit(f"error: no pilot runs under {out / 'pilot'}; run --part pilot first")
    p99 = max(r["grad_norm_pcts"]["99"] for r in chosen.values())
    design = {"matched": levels["matched"], "hard": levels["hard"], "retain": levels["retain"],
              "lr": {k: r["lr"] for k, r in chosen.items()}, "max_grad_norm": float(clip_factor * p99)}
    return {"design": design, "pilot_p99_grad_norm": p99,
            "pilot": {k: {"lr": r["lr"], "reward_last_half": r["reward_last_half"]} for k, r in chosen.items()}}


def plan_sds(audit: dict[str, Any], root: pathlib.Path = FIRST) -> dict[str, dict[str, Any]]:
    """The planning SD of each metric's per-seed values, with its source (PREREGISTRATION.md)."""
    acc = max(float(math.sqrt(np.mean([np.var(v["accuracy"], ddof=1) for v in audit[c]["arms"].values()])))
              for c in ("matched-g4", "matched-g8"))  # fmt: skip
    gaps = []
    for result in sorted((root / "matched-g4-a" / "grpo").glob("seed*/result.json")):
        recs = [json.loads(x) for x in (result.parent / "metrics.jsonl").read_text().splitlines()]
        gaps.append(np.mean([r["degeneracy/collapse_rate"] - r["degeneracy/iid_rate"] for r in recs
                             if "degeneracy/iid_rate" in r]))  # fmt: skip
    info = []  # amendment 3: informative groups per 1,000 sampled tokens, per run (P = 4 prompts a step)
    for arm in ("grpo", "grpo_resample"):
        for cond in ("matched-g4", "hard-g4"):
            per_run = []
            for part in FIRST_CONDITIONS[cond]:
                for path in sorted((root / part / arm).glob("seed*/metrics.jsonl")):
                    steps = [r for r in map(json.loads, path.read_text().splitlines()) if "time/train_s" in r]
                    per_run.append(1000 * sum(informative_groups(r, 4) for r in steps)
                                   / sum(r["tokens/sampled"] for r in steps))  # fmt: skip
            if len(per_run) > 1:
                info.append(np.var(per_run, ddof=1))
    return {
        "informative_per_1k_tokens": {"sd": float(math.sqrt(np.mean(info))), "source": "first edition, G = 4, grpo "
                                      "and grpo_resample on the matched and too-hard levels: the pooled between-seed "
                                      "SD of informative groups per 1,000 sampled tokens"},
        "tokens_to_target": {"sd": 6400.0, "source": "assumed: a third of the 19,200-token budget (no first-edition "
                             "run probed held-out accuracy during training)"},
        "accuracy": {"sd": acc, "source": "first edition, matched level: the larger of the G = 4 and G = 8 pooled "
                     "between-seed SDs of held-out accuracy (both at the 0.9-1.0 ceiling, so likely low)"},
        "escape": {"sd": 0.5, "source": "a yes/no outcome's largest SD (p = 0.5)"},
        "retention_drop": {"sd": 0.05, "source": "assumed: eval noise of ~28 problems x 16 samples at ~0.85 "
                           "(binomial 0.017) plus between-seed spread; no first-edition set started >= 0.8"},
        "retention_drop_paired": {"sd": 0.055, "source": "amendment 8: retention_drop's 0.05 with the run's own "
                                  "start (28 problems x 4 samples at 0.94: binomial 0.022) added in quadrature"},
        "train_jensen_gap": {"sd": float(np.std(gaps, ddof=1)), "source": "first edition, matched level, GRPO at "
                             "G = 4: between-seed SD of the per-run mean of collapse_rate - iid_rate"},
    }  # fmt: skip


def power_plan(claims: list[dict[str, Any]], sds: dict[str, dict[str, Any]], alpha: float = ALPHA) -> list[dict]:
    """Per claim: the seeds needed for its expected effect at power 0.8 (at alpha / family, Holm's first step, and
    at alpha, its last) and the smallest effect its pre-registered seeds detect at alpha / family."""
    family = {family_of(c): sum(family_of(x) == family_of(c) for x in claims) for c in claims}
    out = []
    for c in claims:
        sd, m = sds[c["metric"]]["sd"], family[family_of(c)]
        k = 1 if c["metric"] in ONE_SAMPLE else 2
        out.append({"id": c["id"], "cond": c["cond"], "family": m, "effect": c["effect"], "sd": sd,
                    "seeds_holm_first": st.seeds_needed(c["effect"], sd, alpha / m, samples=k),
                    "seeds_holm_last": st.seeds_needed(c["effect"], sd, alpha, samples=k),
                    "seeds": c["seeds"], "detectable_at_seeds": st.detectable(c["seeds"], sd, alpha / m, samples=k)})
    return out


def power_json(out: pathlib.Path) -> dict[str, Any]:
    """power.json: the planning SDs (from the first edition's files) and every claim's `power_plan` row."""
    sds = plan_sds(audit_first_edition())
    return {"alpha": ALPHA, "power": 0.8, "plan_sds": sds,
            "claims": power_plan(read_claims(out), sds)}


def read_claims(out: pathlib.Path) -> list[dict[str, Any]]:
    """``out/claims.json``; a missing file is a one-line exit naming it (``--out`` must be the study's directory).
    Every claim is directional, "a>b" (its test two-sided, supported only with a positive difference)."""
    path = out / "claims.json"
    if not path.exists():
        sys.exit(f"error: {path} is missing: --out must name the study's results directory (it holds claims.json)")
    claims = json.loads(path.read_text())
    for c in claims:
        if c.get("claim", "a>b") != "a>b":
            sys.exit(f"error: {path}: claim {c.get('id')!r} is {c['claim']!r}; write it as a>b (swap a and b)")
    return claims


def pooled_train_gap(records: list[dict[str, Any]], group_size: int) -> float | None:
    """Amendment 7: the training-log Jensen gap, mean over steps of the measured collapse rate minus the i.i.d. rate
    estimated without bias from the step's pooled samples, ``[C(S,G) + C(N-S,G)] / C(N,G)`` with N = groups x G and
    S = success rate x N (`jaxgrpo.degeneracy.pooled_iid_rate`; the runs' logged ``degeneracy/iid_rate`` plugged
    the step's success rate into ``p^G + (1-p)^G``, which is biased up by as much as the effect sought). Steps with
    an invalid sample give None: their groups' sizes are not in the log."""
    gaps = []
    for r in records:
        if "time/train_s" not in r:
            continue
        if r.get("reward/invalid_frac", 0.0) != 0.0:
            return None  # (`_values` refuses it for an H5 run: the pooled rate needs each group's size)
        n = round(r["groups/num"] * group_size)
        s = round(r["degeneracy/success_rate"] * n)
        iid = (math.comb(s, group_size) + math.comb(n - s, group_size)) / math.comb(n, group_size)
        gaps.append(r["degeneracy/collapse_rate"] - iid)
    return float(np.mean(gaps))


def load_runs(out: pathlib.Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """cond -> arm -> finished results (sorted by seed); with the run's metrics beside it, each also carries
    ``jensen_gap_train_pooled`` (`pooled_train_gap`, amendment 7)."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for path in sorted(out.glob("*/*/seed*/result.json")):
        r = json.loads(path.read_text())
        metrics = path.parent / "metrics.jsonl"
        if metrics.exists():
            records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
            r["jensen_gap_train_pooled"] = pooled_train_gap(records, r["config"]["rollout"]["group_size"])
        runs.setdefault(r["cond"], {}).setdefault(r["arm"], []).append(r)
    for arms in runs.values():
        for v in arms.values():
            v.sort(key=lambda r: r["seed"])
    return runs


def tokens_to_target(result: dict[str, Any], target: float) -> float:
    """Sampled tokens at the run's first held-out probe at or above ``target``; a run that never reaches it counts
    as twice its budget (censored: above every run that reached it). The permutation test compares means, so the
    censored value enters the statistic as registered (amendment 3: twice the budget), not as a rank."""
    for point in result["probe"]:
        if point["accuracy"] >= target:
            return float(point["tokens"])
    return 2.0 * result["budget"]


def _values(claim: dict[str, Any], runs: dict[str, list[dict[str, Any]]], base: dict[str, float]) -> tuple:
    metric = claim["metric"]
    if metric == "accuracy":
        return [r["heldout"]["accuracy"] for r in runs.get(claim["a"], [])], \
               [r["heldout"]["accuracy"] for r in runs.get(claim["b"], [])]
    if metric == "escape":
        esc = lambda arm: [float(r["heldout"]["accuracy"] >= base[claim["cond"]] + ESCAPE_MARGIN)  # noqa: E731
                           for r in runs.get(arm, [])]
        return esc(claim["a"]), esc(claim["b"])
    if metric == "informative_per_1k_tokens":  # amendment 3
        return [r[metric] for r in runs.get(claim["a"], [])], [r[metric] for r in runs.get(claim["b"], [])]
    if metric == "tokens_to_target":  # amendment 3: "a > b" = a needs more sampled tokens than b
        target = base[claim["cond"]] + ESCAPE_MARGIN
        return ([tokens_to_target(r, target) for r in runs.get(claim["a"], [])],
                [tokens_to_target(r, target) for r in runs.get(claim["b"], [])])
    arm = claim["a"].split("@")[0].split(":")[0]
    if metric == "retention_drop":  # "<arm>@start" > "<arm>@end": the warmed-up model's retention minus the run's
        return [base["retain"] - r["retention"]["accuracy"] for r in runs.get(arm, [])], None
    if metric == "retention_drop_paired":  # amendment 8: each run's own start, the trainer's retention at step 0
        return [r["retain_trainer"]["0"] - r["retention"]["accuracy"] for r in runs.get(arm, [])], None
    if metric == "train_jensen_gap":  # "<arm>:measured" > "<arm>:iid": per run, mean over steps (amendment 7)
        gaps = [r["jensen_gap_train_pooled"] for r in runs.get(arm, [])]
        if any(g is None for g in gaps):
            raise ValueError(f"{claim['id']}: a run has steps with invalid samples, where the pooled i.i.d. rate "
                             "(amendment 7) is not defined")
        return gaps, None
    raise ValueError(f"claims.json: unknown metric {metric!r}")


def family_of(claim: dict[str, Any]) -> str:
    """A claim's Holm family: its ``family`` (amendment 3's scheduling claims: ``sched-<cond>``), else its condition."""
    return claim.get("family", claim["cond"])


def verdict_text(row: dict[str, Any], alpha: float = ALPHA) -> str:
    """The report's words for a verdict row: "pending" until its family is complete, "supported" (Holm p < alpha in
    the claim's direction), "the other way" when the two-sided test is significant against the claim's direction
    (e.g. retention that rose where H4 registered erosion), else "not distinguishable at n = <n>"."""
    if row["significant"] is None:
        return "pending"
    if row["significant"]:
        return "supported"
    if row["p_holm"] < alpha and row["diff"] < 0:
        return f"not supported: the other way (two-sided Holm p < {alpha:g})"
    return f"not distinguishable at n = {row['n']}"


def verdicts(out: pathlib.Path) -> dict[str, Any]:
    """Every claim's test, Holm-adjusted within its family, and its words (`verdict_text`); null until its seeds
    exist."""
    claims = read_claims(out)
    runs = load_runs(out)
    base = _base_accuracy(out)
    rows = []
    for c in claims:
        a, b = _values(c, runs.get(c["cond"], {}), base)
        n = min(len(a), len(b)) if b is not None else len(a)
        row = {**c, "n": n, "diff": None, "p": None, "p_holm": None, "significant": None}
        if n >= c["seeds"]:
            if b is None:
                res = st.one_sample(a)
                row.update(diff=res["mean"], p=res["p"])
            elif c["metric"] in PERMUTATION:
                row.update(diff=float(np.mean(a) - np.mean(b)), p=st.permutation_p(a, b))
            else:
                res = st.welch(a, b)
                row.update(diff=res["diff"], p=res["p"])
        rows.append(row)
    for family in {family_of(r) for r in rows}:
        fam = [r for r in rows if family_of(r) == family]
        if all(r["p"] is not None for r in fam):  # the family is adjusted once every claim in it has its seeds
            for r, q in zip(fam, st.holm([r["p"] for r in fam])):
                r["p_holm"], r["significant"] = q, bool(q < ALPHA and r["diff"] > 0)
        else:  # nothing of an incomplete family is shown: no claim is read before its family is complete
            for r in fam:
                r["diff"] = r["p"] = None
    for r in rows:
        r["verdict"] = verdict_text(r)
    return {"alpha": ALPHA, "claims": rows}


def _base_accuracy(out: pathlib.Path) -> dict[str, float]:
    """cond -> the warmed-up model's accuracy on the condition's level, and "retain" -> on the held skill's level
    (levels.json): the escape threshold and the retention start point."""
    path = out / "rewarm" / "levels.json"  # amendment 2: the re-created warm-up's levels, once measured
    path = path if path.exists() else out / "levels.json"
    if not path.exists():
        return {}
    lv = json.loads(path.read_text())
    pick = lv.get("pick") or {}
    out_ = {c: lv["levels"][str(pick[name])]["accuracy"] for c, name in COND_LEVEL.items() if pick.get(name)}
    if pick.get("retain"):
        out_["retain"] = lv["levels"][str(pick["retain"])]["accuracy"]
    return out_
