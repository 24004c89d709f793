# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`python -m jaxgrpo.compile --config FILE [--topology v5e:4x8] [section.key=value ...]`: does a config fit?

Compiles the config's train step ahead of time for a TPU slice (compile-only devices; needs libtpu: ``pip install
jaxgrpo[tpu]``) or for the local devices, and prints per chip: weights, optimizer state, the rollout's caches,
XLA's temporaries, the total against the chip's memory, FLOPs per step and a roofline step time (`jaxgrpo.aot`).
Exits 1 when the train step or the rollout does not fit, 2 on a bad config.
"""

from __future__ import annotations

import argparse
import sys

from jaxgrpo import config as config_lib
from jaxgrpo.errors import ConfigError, cli_error


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxgrpo.compile", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=config_lib.DEFAULT_CONFIG, help="YAML file or packaged config name")
    ap.add_argument("--topology", default=None, help="TPU slice, e.g. v5e:4x8 (default: the local devices)")
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = config_lib.load_config(args.config, args.overrides)
        from jaxgrpo import aot  # after validation: a bad key fails before JAX starts

        m = cfg.mesh
        devices = aot.topology_devices(args.topology, m.data * m.fsdp * m.tensor)
        mcfg = aot.model_config(cfg)
        chip_name, chip = aot.chip_of(devices)
        if m.data * m.fsdp * m.tensor != len(devices):
            raise ConfigError(f"mesh data x fsdp x tensor = {m.data * m.fsdp * m.tensor} but {args.topology} has "
                              f"{len(devices)} devices; set mesh.* to match")  # fmt: skip
        step = aot.compile_train_step(cfg, mcfg, devices)
    except ConfigError as e:
        return cli_error(str(e))
    except Exception as e:  # XLA refuses to compile a program that cannot fit the chip: report it as "does not fit"
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        print(f"train step DOES NOT FIT: {str(e).splitlines()[0]}")
        return 1
    rollout = aot.rollout_bytes(mcfg, cfg, len(devices), int(step["batch_shards"]))
    train_total = step["arguments"] + step["outputs"] - step["aliased"] + step["temporaries"]
    rollout_total = step["weights"] + step["optimizer"] + sum(rollout.values())  # the train state stays resident
    flops = step["flops"]
    hbm = f"{chip.hbm_bytes / aot.GiB:.2f} GiB" if chip else "unknown"
    print(f"{len(devices)} x {chip_name} ({hbm} per chip), mesh data={m.data} fsdp={m.fsdp} tensor={m.tensor}, "
          f"{mcfg.num_layers}-layer model, {cfg.model.param_dtype} masters / {cfg.model.dtype} compute")
    rows = [("weights (masters)", step["weights"]), ("optimizer state", step["optimizer"]),
            ("train step temporaries", step["temporaries"]), ("train step total", train_total),
            ("sampler compute-dtype copy", rollout["compute_copy"]), ("prefix cache", rollout["prefix_cache"]),
            ("decode cache", rollout["decode_cache"]), ("recorded projections", rollout["record"]),
            ("rollout total", rollout_total)]  # fmt: skip
    for name, value in rows:
        print(f"  {name:<28s}{aot.human(value)}")
    seconds = aot.roofline_seconds(flops, step["bytes_accessed"], chip)
    print(f"  train step: {flops / 1e12:.2f} TFLOP per chip, roofline {seconds:.3f} s")
    ok = aot.fits(train_total, chip) and aot.fits(rollout_total, chip)
    print("fits" if ok else f"DOES NOT FIT in {hbm} per chip")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
