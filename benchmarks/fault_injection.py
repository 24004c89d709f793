# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Fault injection: kill, damage and restart a tiny training run many times; no step may be lost or duplicated.

One uninterrupted run of the CLI (``python -m jaxgrpo.train``, the default demo shrunk to seconds per step) is the
reference. The faulted run is started in the same way again and again: each attempt is killed with SIGKILL at a random
time (with probability ``--early-prob`` during start-up, uniform over the first ``--kill-min``..``--kill-max`` × the
reference's wall time; otherwise a uniform 0..``--kill-window`` seconds after the attempt logged its first step, so that
every such attempt makes progress; every ``--sigterm-every``-th attempt gets SIGTERM instead and must exit 143 (or
-15 when it lands before the training loop installs its handler)), and after a kill, with probability
``--corrupt-prob`` and when at least two complete checkpoints exist, the newest checkpoint is damaged in one of the
four ways of issue 34 (data files truncated or overwritten, ``state/_METADATA`` emptied, ``extra/metadata``
deleted). After ``--kills`` attempts the run is left to
finish. Then:

* ``metrics.jsonl`` holds steps 1..N exactly once each, in order, and every deterministic metric (all but timings)
  equals the reference's (rtol 1e-5);
* the exported ``final/model.safetensors`` equals the reference's (max |difference| reported; required ≤ 1e-6);
* every damaged checkpoint was moved aside (``<step>.unrestorable*``), none deleted.

The summary (attempts, kills, SIGTERMs, damages by kind, walk-backs, seconds) is printed and written as JSON
(``--out``, default ``benchmarks/results/fault_injection.json``). Exit status 0 iff every check holds.

    nice -n 15 python benchmarks/fault_injection.py --kills 8 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jaxgrpo import metrics_log  # noqa: E402

RUN = ["rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=2", "log.progress=false",
       "log.tensorboard=false", "log.sample_every=0", "checkpoint.keep=3", "checkpoint.export_final=true"]
KINDS = ("truncated", "overwritten", "empty_metadata", "no_extra")


def command(run_dir: pathlib.Path, steps: int, every: int) -> list[str]:
    return [sys.executable, "-m", "jaxgrpo.train", "--run-dir", str(run_dir), *RUN, f"train.steps={steps}",
            f"checkpoint.every={every}"]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("JAX_PLATFORMS", "cpu")
    return e


def complete_steps(run_dir: pathlib.Path) -> list[int]:
    d = run_dir / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def damage(step_dir: pathlib.Path, kind: str, rng: random.Random) -> None:
    """One of issue 34's four kinds of damage to a complete checkpoint step."""
    data = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    if kind == "truncated":
        for f in data:
            os.truncate(f, f.stat().st_size // 2)
    elif kind == "overwritten":
        for f in data:
            f.write_bytes(rng.randbytes(f.stat().st_size))
    elif kind == "empty_metadata":
        (step_dir / "state" / "_METADATA").write_text("")
    else:
        (step_dir / "extra" / "metadata").unlink()


def logged_steps(run_dir: pathlib.Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def wait_for_kill(proc: subprocess.Popen, run_dir: pathlib.Path, rng: random.Random, args: argparse.Namespace,
                  ref_wall: float) -> None:
    """Returns when the attempt should be killed (see the module docstring) or has ended by itself."""
    if rng.random() < args.early_prob:
        try:
            proc.wait(timeout=rng.uniform(args.kill_min, args.kill_max) * ref_wall)
        except subprocess.TimeoutExpired:
            pass
        return
    low = logged_steps(run_dir)  # the attempt first truncates the lines past its checkpoint: wait for a new record
    while proc.poll() is None:
        now = logged_steps(run_dir)
        if now > low:
            break
        low = min(low, now)
        time.sleep(0.2)
    try:
        proc.wait(timeout=rng.uniform(0, args.kill_window))
    except subprocess.TimeoutExpired:
        pass


def deterministic(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if not k.startswith(("time/", "throughput/"))}


def compare(ref_dir: pathlib.Path, run_dir: pathlib.Path, steps: int) -> dict:
    from safetensors.numpy import load_file

    got, want = metrics_log.read_metrics(run_dir), metrics_log.read_metrics(ref_dir)
    logged = [r["step"] for r in got]
    metric_diffs = []
    for a, b in zip(got, want):
        da, db = deterministic(a), deterministic(b)
        for k in set(da) | set(db):
            if k not in da or k not in db or not np.allclose(da[k], db[k], rtol=1e-5, atol=1e-6, equal_nan=True):
                metric_diffs.append(f"step {a['step']} {k}: {da.get(k)} vs {db.get(k)}")
    pa, pb = load_file(str(run_dir / "final" / "model.safetensors")), load_file(str(ref_dir / "final" /
                                                                                 "model.safetensors"))
    param_diff = max(float(np.max(np.abs(pa[k].astype(np.float64) - pb[k]))) for k in pb) if pa.keys() == pb.keys() \
        else float("inf")
    return {
        "steps_logged": logged,
        "steps_contiguous_once": logged == list(range(1, steps + 1)),
        "metric_mismatches": metric_diffs[:10],
        "final_params_max_abs_diff": param_diff,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--every", type=int, default=2, help="checkpoint.every")
    p.add_argument("--kills", type=int, default=8, help="faulted attempts before the run is left to finish")
    p.add_argument("--early-prob", type=float, default=0.25, help="probability of a kill during start-up")
    p.add_argument("--kill-min", type=float, default=0.05, help="earliest start-up kill, × the reference's wall time")
    p.add_argument("--kill-max", type=float, default=0.3, help="latest start-up kill, × the reference's wall time")
    p.add_argument("--kill-window", type=float, default=20.0, help="seconds after an attempt's first logged step")
    p.add_argument("--reuse-reference", action="store_true",
                   help="keep a finished reference run in --work-dir (its wall time from reference_wall_s.txt)")
    p.add_argument("--sigterm-every", type=int, default=4, help="every k-th attempt gets SIGTERM (0 = never)")
    p.add_argument("--corrupt-prob", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", default=None, help="default: a temporary directory, removed afterwards")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fault_injection.json"))
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    work = pathlib.Path(args.work_dir or tempfile.mkdtemp(prefix="jaxgrpo-faults-"))
    ref_dir, run_dir = work / "reference", work / "faulted"
    wall_file = work / "reference_wall_s.txt"
    reuse = args.reuse_reference and wall_file.is_file() and (ref_dir / "final" / "model.safetensors").is_file()
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.time()
    if reuse:
        ref_wall = float(wall_file.read_text())
    else:
        shutil.rmtree(ref_dir, ignore_errors=True)
        subprocess.run(command(ref_dir, args.steps, args.every), env=env(), check=True, capture_output=True)
        ref_wall = time.time() - t0
        wall_file.write_text(f"{ref_wall:.1f}\n")
    print(f"reference: {args.steps} steps in {ref_wall:.1f} s{' (reused)' if reuse else ''}", flush=True)

    log: list[dict] = []
    damaged: dict[str, int] = dict.fromkeys(KINDS, 0)
    failures: list[str] = []
    for attempt in range(args.kills + 1):
        final = attempt == args.kills
        proc = subprocess.Popen(command(run_dir, args.steps, args.every), env=env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        sig = None
        if not final:
            sig = signal.SIGTERM if args.sigterm_every and (attempt + 1) % args.sigterm_every == 0 else signal.SIGKILL
            wait_for_kill(proc, run_dir, rng, args, ref_wall)
            if proc.poll() is None:
                proc.send_signal(sig)
        rc = proc.wait()
        err = proc.stderr.read()
        entry = {"attempt": attempt, "signal": signal.Signals(sig).name if sig else None, "rc": rc,
                 "checkpoints": complete_steps(run_dir),
                 "walk_backs": err.count("does not restore"), "took_over_lock": "took over the lock" in err}
        if rc == 0:
            log.append(entry)
            print(json.dumps(entry), flush=True)
            break
        # SIGTERM before the training loop (while JAX and the model load) takes the default action: -15
        expected = {signal.SIGKILL: (-signal.SIGKILL,), signal.SIGTERM: (143, -signal.SIGTERM)}.get(sig, ())
        if rc not in expected:
            failures.append(f"attempt {attempt}: exit {rc} (expected {expected}): {err.strip()[-500:]}")
        steps = complete_steps(run_dir)
        if len(steps) >= 2 and rng.random() < args.corrupt_prob:
            kind = rng.choice(KINDS)
            damage(run_dir / "checkpoints" / str(steps[-1]), kind, rng)
            damaged[kind] += 1
            entry["damaged"] = f"{steps[-1]}:{kind}"
        log.append(entry)
        print(json.dumps(entry), flush=True)
    else:
        failures.append("the run did not finish")

    result = compare(ref_dir, run_dir, args.steps) if not failures else {}
    moved = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if ".unrestorable" in p.name)
    if result:
        if not result["steps_contiguous_once"]:
            failures.append(f"metrics.jsonl steps {result['steps_logged']}")
        if result["metric_mismatches"]:
            failures.append(f"metrics differ: {result['metric_mismatches']}")
        if not result["final_params_max_abs_diff"] <= 1e-6:
            failures.append(f"final params differ by {result['final_params_max_abs_diff']}")
    if len(moved) != sum(damaged.values()):
        failures.append(f"{sum(damaged.values())} checkpoints damaged but {len(moved)} moved aside: {moved}")
    summary = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seed": args.seed, "steps": args.steps,
        "checkpoint_every": args.every, "reference_wall_s": round(ref_wall, 1), "attempts": len(log),
        "sigkills": sum(e["signal"] == "SIGKILL" and e["rc"] != 0 for e in log),
        "sigterms": sum(e["signal"] == "SIGTERM" and e["rc"] != 0 for e in log), "damaged": damaged,
        "moved_aside": moved, "walk_backs": sum(e["walk_backs"] for e in log),
        "lock_takeovers": sum(e["took_over_lock"] for e in log), **result, "failures": failures, "log": log,
        "total_wall_s": round(time.time() - t0, 1), "ok": not failures,
    }
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k not in ("log", "steps_logged")}, indent=2))
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
