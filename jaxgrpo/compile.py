# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`python -m jaxgrpo.compile --config FILE [--topology v5e:4x8 | --platform cuda --chip h100] [--dump-hlo DIR]
[section.key=value ...]`: does a config fit, and how close is its decode to the memory roofline?

Compiles the config's train step, its KL reference pass (with ``algo.kl_coef > 0``) and its rollout (the engine's
prefill and decode block) ahead of time for a TPU slice (``--topology``, else the config's ``mesh.topology``;
compile-only devices, needs libtpu: ``pip install jaxgrpo[tpu]``),
for NVIDIA GPUs without one (``--platform cuda --chip h100|h200``: `aot.gpu_devices`, needs ``pip install
"jax[cuda13-local]==<jax version>"`` and ptxas) or for the local devices, and prints per chip: weights, optimizer
state, each program's temporaries and total against the chip's memory, FLOPs per step and a roofline step time
(`jaxgrpo.aot`); the train step's HBM bytes per step (`jaxgrpo.hlo.program_bytes` of its optimized HLO, loops by
trip count) and roofline time, its heaviest kernels and every float32 ``[*, vocab]`` buffer it writes; then the
decode loop's bytes moved per token step against the ideal (weights once + the KV attended,
`jaxgrpo.decode_report`), its kernels per step and the copies/transposes/pads/sorts inside it (`jaxgrpo.hlo`).
``--dump-hlo DIR`` writes each program's optimized HLO (``DIR/train.hlo.txt``, ``DIR/decode.hlo.txt``,
``DIR/prefill.hlo.txt``). With ``mesh.rollout = R`` (asynchronous rollouts on devices of their own) the train step
compiles on the first ``data × fsdp × tensor`` devices and the rollout on the last R, each judged with what its own
chips hold (the rollout's: its compute-dtype weights, caches and temporaries). Exits 1 when the train step, the
reference pass, the prefill or the decode loop does not fit (a rollout whose KV caches cannot fit even spread over
every chip is refused before anything compiles), 2 on a bad config or a missing compiler.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NamedTuple

from jaxgrpo import config as config_lib
from jaxgrpo.errors import ConfigError, cli_error
from jaxgrpo.files import output_dir_error


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m jaxgrpo.compile", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=config_lib.DEFAULT_CONFIG, help="YAML file or packaged config name")
    ap.add_argument("--topology", default=None, help="TPU slice, e.g. v5e:4x8 (default: the config's mesh.topology, "
                                                      "else the local devices)")  # fmt: skip
    ap.add_argument("--platform", choices=("tpu", "cuda"), default=None,
                    help="cuda: compile for --chip (h100, h200) without a GPU; tpu: for --topology (the default when "
                         "a topology is named)")  # fmt: skip
    ap.add_argument("--dump-hlo", default=None, metavar="DIR", help="write the optimized HLO of each program here")
    ap.add_argument("--chip", default=None,
                    help="judge the totals against this chip's memory and speed instead of the target's (e.g. a TPU "
                         "compile standing in for h100)")  # fmt: skip
    ap.add_argument("overrides", nargs="*", help="section.key=value")
    return ap


class _Target(NamedTuple):
    """What the programs compile for: the config (perf.attention lowered where cuDNN is missing), the devices, the
    learner's and the rollout's share of them (the same devices unless mesh.rollout), the chip they are judged as."""

    cfg: Any
    devices: list
    learner: list
    rollout: list
    chip_name: str
    chip: Any


def _target(args: argparse.Namespace, cfg: Any) -> _Target:
    from jaxgrpo import aot

    m = cfg.mesh
    size, split = m.data * m.fsdp * m.tensor, m.rollout  # mesh.rollout: the rollout's own devices, the last ones
    topology = args.topology or m.topology
    if args.platform == "cuda" and args.topology:
        raise ConfigError(f"--topology {args.topology} is a TPU slice but --platform cuda compiles for --chip; drop "
                          "one of them")
    if args.platform == "tpu" and topology is None:
        raise ConfigError("--platform tpu needs a TPU slice: pass --topology (e.g. v5e:4x8) or set mesh.topology")
    if args.platform == "cuda":
        devices = aot.gpu_devices(args.chip or "h100", size + split)
        if cfg.perf.attention in ("auto", "cudnn") and not aot.has_cudnn():  # its library builds the kernel
            cfg = config_lib.load_config(args.config, [*args.overrides, "perf.attention=chunked"])
            print("cuDNN is not installed: the train step, the reference pass and the prefill compile with "
                  "perf.attention=chunked")
    else:
        devices = aot.topology_devices(topology, size + split)
    chip_name, chip = aot.chip_of(devices)
    if args.chip and args.platform != "cuda":
        if args.chip not in aot.CHIPS:
            raise ConfigError(f"--chip {args.chip!r} is not known; valid choices: {', '.join(aot.CHIPS)}")
        chip_name, chip = f"{chip_name} judged as {args.chip}", aot.CHIPS[args.chip]
    if size + split != len(devices):
        plus = f" + mesh.rollout {split}" if split else ""
        raise ConfigError(f"mesh data x fsdp x tensor = {size}{plus} but {topology} has {len(devices)} devices; "
                          "set mesh.* to match")
    # with mesh.rollout the learner compiles on the first devices and the rollout on the others, over a data x
    # fsdp mesh of its own, the weights split over mesh.rollout_fsdp (`async_rollout.device_groups`); on n hosts
    # each host samples 1/n of the prompts on 1/n of those devices: the same per-chip figures
    hosts = len({d.process_index for d in devices})
    if split and hosts > 1 and (split % hosts or split // hosts % m.rollout_fsdp):
        raise ConfigError(f"{topology} has {hosts} hosts and each samples on mesh.rollout / {hosts} devices of its "
                          f"own: set mesh.rollout ({split}) to a multiple of {hosts} and mesh.rollout_fsdp "
                          f"({m.rollout_fsdp}) to a divisor of mesh.rollout / {hosts}")
    learner, rollout = (devices[:size], devices[size:]) if split else (devices, devices)
    return _Target(cfg, devices, learner, rollout, chip_name, chip)


def _describe(t: _Target, mcfg: Any, turns: Any) -> str:
    from jaxgrpo import aot

    cfg, m = t.cfg, t.cfg.mesh
    longest = cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens
    if longest > mcfg.max_position_embeddings:
        raise ConfigError(f"data.max_prompt_tokens + rollout.max_new_tokens = {longest} exceeds the model's "
                          f"context ({mcfg.max_position_embeddings}); lower one of them")  # fmt: skip
    hbm = f"{t.chip.hbm_bytes / aot.GiB:.2f} GiB" if t.chip else "unknown"
    own = f", the rollout on {m.rollout} chips of its own (mesh.rollout)" if m.rollout else ""
    own += f", its weights split {m.rollout_fsdp} ways (mesh.rollout_fsdp)" if m.rollout and m.rollout_fsdp > 1 else ""
    print(f"{len(t.devices)} x {t.chip_name} ({hbm} per chip), mesh data={m.data} fsdp={m.fsdp} tensor={m.tensor}"
          f"{own}, {mcfg.num_layers}-layer model, {cfg.model.param_dtype} masters / {cfg.model.dtype} compute")
    if turns is not None:
        print(turns.note)
    return hbm


def _memory_rows(resident: dict, step: dict, reference: dict | None, rollout: dict, totals: dict,
                 shared: float) -> list[tuple[str, float]]:  # fmt: skip
    rows = [("weights (masters)", resident["weights"]), ("optimizer state", resident["optimizer"]),
            ("reference weights (KL)", resident["reference"]), ("train step temporaries", step["temporaries"]),
            ("train step total", totals["train step"])]
    if reference is not None:
        rows += [("reference pass temporaries", reference["temporaries"]),
                 ("reference pass total", totals["reference pass"])]  # fmt: skip
    rows += [("rollout weights (compute)", rollout["weights"]["total"] - shared),
             ("prefill temporaries", rollout["prefill"]["temporaries"]), ("prefill total", totals["prefill"])]
    if "decode" in rollout:
        d = rollout["decode"]
        rows += [("decode KV caches and state", d["arguments"] - rollout["weights"]["total"]),
                 ("decode temporaries", d["temporaries"]), ("decode total", totals["decode"])]  # fmt: skip
    # no KL term, or a sampler that reads the masters themselves: nothing to show
    return [(n, v) for n, v in rows if v or n not in ("reference weights (KL)", "rollout weights (compute)")]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_intermixed_args(sys.argv[1:] if argv is None else argv)  # (as train and eval)
    program = "train step"
    try:
        bad_out = output_dir_error(args.dump_hlo, "--dump-hlo")  # before minutes of compiling, not after
        if bad_out:
            raise ConfigError(bad_out)
        cfg = config_lib.load_config(args.config, args.overrides)
        # after validation: a bad key fails before JAX starts
        from jaxgrpo import aot, aot_multiturn, train_report
        from jaxgrpo import decode_report as dr

        t = _target(args, cfg)
        cfg, devices, chip = t.cfg, t.devices, t.chip
        mcfg = aot.model_config(cfg)
        tcfg, rcfg, turns = cfg, aot.rollout_config(cfg), aot_multiturn.shapes(cfg, mcfg, devices[0].platform)
        if turns is not None:  # the shapes the multi-turn run takes
            tcfg, rcfg = turns.train, aot.rollout_config(turns.loop)
        hbm = _describe(t, mcfg, turns)
        resident = aot.resident_bytes(cfg, mcfg, t.learner)
        kept = 0.0 if cfg.mesh.rollout else sum(resident.values())
        engine = turns is not None and turns.turn_spec is not None  # the multi-turn engine, on one device
        on = t.rollout[:1] if engine else t.rollout
        caches = (turns.cache_bytes(mcfg) if engine else aot.rollout_cache_bytes(mcfg, rcfg)) / len(on)
        if not aot.fits(kept + caches, chip):  # no sharding can fit it: refuse before compiling anything
            beside = f", beside {kept / aot.GiB:.2f} GiB of weights and optimizer state" if kept else ""
            print(f"rollout DOES NOT FIT: its KV caches alone need {caches / aot.GiB:.2f} GiB per chip spread over "
                  f"all {len(on)} of its chips{beside} (a bound from the shapes, nothing compiled); "
                  "lower rollout.prompts_per_step, group_size or max_new_tokens, or use more chips")
            return 1
        texts: dict[str, str] = {}
        step = aot.compile_train_step(tcfg, mcfg, t.learner, texts)
        program = "KL reference pass"
        reference = aot.compile_reference(tcfg, mcfg, t.learner)
        program = "rollout"
        if engine:
            rollout = aot_multiturn.compile_turn_engine(mcfg, turns.turn_spec, t.rollout[-1])
        else:
            rollout = aot.compile_rollout(rcfg, mcfg, t.rollout, texts)
    except ConfigError as e:
        return cli_error(str(e))
    except Exception as e:  # XLA refuses to compile a program that cannot fit the chip: report it as "does not fit"
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        print(f"{program} DOES NOT FIT: {str(e).splitlines()[0]}")
        return 1
    totals = aot.totals(cfg, resident, step, rollout, reference)
    shared = aot.shared_rollout_weights(cfg, rollout)  # the state's own arrays, as `aot.totals` counts them
    for name, value in _memory_rows(resident, step, reference, rollout, totals, shared):
        print(f"  {name:<28s}{aot.human(value)}")
    print("\n".join(train_report.format_train_report(step, texts["train"], mcfg.vocab_size, chip)))
    if "decode" in texts:
        w = rollout["weights"]
        ideal = dr.decode_ideal_bytes(rcfg, mcfg, w["share"], int(w["row_shards"]))
        report = dr.decode_report(rcfg, mcfg, texts, ideal, devices[0].platform)
        report["host"] = {k: rollout["decode"][k] for k in ("launches", "graphs", "graphed", "thunks")
                          if k in rollout["decode"]}  # fmt: skip
        print("\n".join(dr.format_decode_report(report)))
    if args.dump_hlo:
        aot.dump_hlo(args.dump_hlo, texts)
    over = [name for name, total in totals.items() if not aot.fits(total, chip)]
    print("fits" if not over else f"DOES NOT FIT in {hbm} per chip: {', '.join(over)}")
    return 0 if not over else 1


if __name__ == "__main__":
    sys.exit(main())
