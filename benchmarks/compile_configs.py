# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Does every packaged accelerator config fit its hardware? Each is compiled ahead of time (`jaxgrpo.aot`: the train
step, the rollout's prefill and decode loop, on abstract weights; nothing is downloaded) for the TPU topology it is
checked on, and its per-chip memory, FLOPs, train-step HBM traffic (`jaxgrpo.hlo.program_bytes`) and roofline step
time go to a JSON file and a Markdown table (the
BENCHMARKS.md compile table).

The checks (`CHECKS`): the 8B pod config on the slice its first comment names; the single-GPU configs (Qwen2.5-0.5B,
Qwen3-1.7B) on one v5p chip, judged against an H100's 80 GB and its peak rates (the closest memory to an H100 that
the compile-only TPU devices offer; XLA's TPU buffer assignment stands in for the GPU's).

  python benchmarks/compile_configs.py [--only NAME ...] [--out benchmarks/results/compile_configs.json]

Needs libtpu (``pip install "jaxgrpo[tpu]"``; it runs on any host, CPU only). The 8B compile takes several minutes of
CPU. Exit status 1 when a config does not fit.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the TPU devices are compile-only; nothing runs on them

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (packaged config, TPU topology (None: the config's mesh.topology), chip judged against (None: the topology's), why)
CHECKS = [
    ("llama3.1-8b_gsm8k_pod", None, None, "the slice it names (mesh.topology)"),
    ("qwen2.5-0.5b-instruct_gsm8k", "v5p:2x2x1", "h100", "one GPU: an H100's 80 GB, compiled for one v5p chip"),
    ("qwen3-1.7b_gsm8k", "v5p:2x2x1", "h100", "one GPU: an H100's 80 GB, compiled for one v5p chip"),
    ("llama3.1-8b_gsm8k_lora", "v5p:2x2x1", "h100", "one GPU: an H100's 80 GB, compiled for one v5p chip"),
]  # the smallest v5p topology libtpu describes is 2x2x1; a one-device mesh compiles for its first chip


def check(name: str, topology: str | None, judge: str | None) -> dict:
    """Compile one config for ``topology``; its per-chip figures (bytes), totals and the verdict."""
    from jaxgrpo import aot, models
    from jaxgrpo import config as config_lib

    cfg = config_lib.load_config(name, [])
    m = cfg.mesh
    topology = topology or m.topology
    devices = aot.topology_devices(topology)[: m.data * m.fsdp * m.tensor]
    chip_name, chip = aot.chip_of(devices)
    if judge:
        chip_name, chip = judge, aot.CHIPS[judge]
    mcfg = aot.model_config(cfg)
    t0 = time.perf_counter()
    resident = aot.resident_bytes(cfg, mcfg, devices)
    step = aot.compile_train_step(cfg, mcfg, devices)
    rollout = aot.compile_rollout(cfg, mcfg, devices)
    totals = aot.totals(cfg, resident, step, rollout)
    decode = rollout.get("decode", {})
    return dict(
        config=name, topology=topology, chips=len(devices), judged_as=chip_name, hbm=chip.hbm_bytes,
        model_params=models.count_params(mcfg), resident=resident,
        caches=decode.get("arguments", 0.0) - rollout["weights"]["total"],
        rollout_weights=rollout["weights"]["total"], train_step=step, rollout=rollout, totals=totals,
        fits=all(aot.fits(t, chip) for t in totals.values()), tflop=step["counted_flops"] / 1e12,
        hbm_gib=step["hbm_bytes"] / 2**30,  # the train step's HBM traffic per chip (optimized HLO, loops by trip count)
        roofline_s=aot.roofline_seconds(step["counted_flops"], step["hbm_bytes"], chip),
        compile_s=time.perf_counter() - t0,
    )  # fmt: skip


def table(rows: list[dict], commit: str) -> str:
    gib = lambda b: f"{b / 2**30:.2f}"  # noqa: E731
    lines = ["| config | compiled for (judged as) | weights | optimizer | KV caches | train temporaries | train total "
             "| prefill total | decode total | HBM | fits | TFLOP/step/chip | train GiB/step/chip | roofline s/step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        t = r["totals"]
        lines.append(
            f"| {r['config']} | {r['topology']} ({r['judged_as']}) | {gib(r['resident']['weights'])} | "
            f"{gib(r['resident']['optimizer'])} | {gib(r['caches'])} | {gib(r['train_step']['temporaries'])} | "
            f"{gib(t['train step'])} | {gib(t['prefill'])} | {gib(t.get('decode', 0.0))} | {gib(r['hbm'])} | "
            f"{'yes' if r['fits'] else 'NO'} | {r['tflop']:.1f} | {r['hbm_gib']:.0f} | {r['roofline_s']:.2f} |"
        )
    return "\n".join(lines) + f"\n\nGiB per chip; commit {commit}; `python benchmarks/compile_configs.py`."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="config names to check (default: all of CHECKS)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "compile_configs.json"))
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "unknown"  # fmt: skip
    rows = []
    for name, topology, judge, why in CHECKS:
        if args.only and name not in args.only:
            continue
        print(f"{name} on {topology} ({why}) ...", file=sys.stderr, flush=True)
        rows.append(check(name, topology, judge))
    import jax

    out = dict(commit=commit, jax=jax.__version__, rows=rows, checks=[list(c) for c in CHECKS])
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print(table(rows, commit))
    return 0 if all(r["fits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
