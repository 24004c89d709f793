# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Will a config fit its hardware? Ahead-of-time compilation of the train step for a device topology, on this host.

The train step (`jaxgrpo.learner.train_step.make_train_step`, every perf switch as `jaxgrpo.learner.perf.resolve_perf`
applies it to the target platform) is lowered on abstract weights (`train_step.abstract_state`: shapes, dtypes and
shardings, no checkpoint needed) and a worst-case batch (every prompt ``data.max_prompt_tokens`` long, every completion
``rollout.max_new_tokens``), then compiled by XLA for the target: a TPU slice through libtpu's compile-only devices
(``jax.experimental.topologies.get_topology_desc``, as MaxText's ``train_compile.py`` does; ``pip install
jaxgrpo[tpu]`` brings libtpu), or the local backend. XLA's `memory_analysis` then gives per-chip bytes exactly as the
slice would allocate them: arguments (weights + optimizer state + batch), outputs, temporaries.

The rollout's programs are compiled the same way (`compile_rollout`): the rollout engine's jitted prefill and
decode blocks (`jaxgrpo.rollout.engine`, with the spec and placement the driver gives them for the worst-case
prompts) on abstract compute-dtype weights, so their per-chip figures hold the compute-dtype weight copy, the prefix
and decode KV caches and XLA's temporaries as compiled. The train state stays resident
while the sampler runs, so each rollout program's total adds it. Before anything compiles, `rollout_bytes` bounds the
caches from their shapes alone: a rollout whose caches cannot fit even spread over every chip is refused at once.
FLOPs per step are counted from the shapes (`train_step_flops`: XLA's ``cost_analysis`` counts each loop body once,
and the layers, the gradient accumulation and the LM head are loops); the roofline step time is ``max(flops / peak
FLOP/s, bytes accessed / HBM bandwidth)`` per chip (the roofline model: Williams, Waterman & Patterson, CACM 2009),
with XLA's bytes accessed, a lower bound for the same reason.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgrpo import hlo, models, padding, sharding
from jaxgrpo.config import Config
from jaxgrpo.errors import ConfigError
from jaxgrpo.learner import train_step as ts
from jaxgrpo.learner.perf import attention_kernel, on_gpu, resolve_perf


@dataclasses.dataclass(frozen=True)
class Chip:
    """Per-chip capacity (bytes usable by programs), peak dense bfloat16 FLOP/s and HBM bandwidth (vendor figures)."""

    hbm_bytes: float
    peak_flops: float
    hbm_bandwidth: float


GiB = 1024**3
CHIPS = {  # Google Cloud TPU system-architecture pages; NVIDIA H100/H200 SXM datasheets (dense, no sparsity)
    "v4": Chip(32 * GiB, 275e12, 1.2e12),
    "v5e": Chip(15.75 * GiB, 197e12, 0.82e12),
    "v5p": Chip(95 * GiB, 459e12, 2.76e12),
    "v6e": Chip(31.25 * GiB, 918e12, 1.64e12),
    "h100": Chip(80e9, 989e12, 3.35e12),
    "h200": Chip(141e9, 989e12, 4.8e12),
}


def model_config(cfg: Config) -> models.ModelConfig:
    """The architecture of ``cfg.model`` without loading weights: the tiny model's sizes, an HF ``config.json``, a
    GGUF's metadata, or a preset (`models.PRESETS`) named by ``name_or_path`` or by its directory's name."""
    from jaxgrpo import build

    m = cfg.model
    name = m.name_or_path
    lora = build.lora_spec(cfg)
    if name == "tiny":
        return build.tiny_model_config(cfg, build.policy_tokenizer(cfg)).replace(lora=lora)
    base = pathlib.Path(name).name.lower()
    preset = next((p for p in sorted(models.PRESETS, key=len, reverse=True) if base.startswith(p)), None)
    if not pathlib.Path(name).exists() and name != "smollm2" and preset is not None:
        return models.get_preset(preset, dtype=m.dtype).replace(param_dtype=m.param_dtype, lora=lora)
    path = build.resolve_model_path(name)
    if path.endswith(".gguf"):
        from jaxgrpo.files import gguf_reader
        from jaxgrpo.models.gguf_import import gguf_config

        return gguf_config(gguf_reader(path), m.dtype).replace(param_dtype=m.param_dtype, lora=lora)
    cfg_json = json.loads((pathlib.Path(path) / "config.json").read_text())
    return models.from_hf_config(cfg_json, dtype=m.dtype).replace(param_dtype=m.param_dtype, lora=lora)


def topology_devices(topology: str | None, count: int | None = None) -> list[Any]:
    """Compile-only devices of a TPU slice such as ``"v5e:4x8"``, or (``None``) the first ``count`` local devices."""
    if topology is None:
        local = jax.devices()
        if count is not None and count > len(local):
            raise ConfigError(f"the mesh needs {count} devices but {len(local)} are local; name a --topology or set "
                              "mesh.* to fit")  # fmt: skip
        return local[:count] if count else local
    from jax.experimental import topologies

    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)
    except Exception as e:  # no libtpu, or an unknown name
        fix = "name" if importlib.util.find_spec("libtpu") else "install libtpu (`pip install jaxgrpo[tpu]`) and name"
        raise ConfigError(f"cannot describe TPU topology {topology!r} ({type(e).__name__}: {e}); {fix} a slice such "
                          "as v5e:4x8 or v4:2x2x2") from e  # fmt: skip


GPU_TARGETS = {"h100": "h100_sxm.txtpb", "h200": "h200_sxm.txtpb"}  # XLA GPU target descriptions (openxla/xla's
# h100_sxm.txtpb, trimmed; the H200's differs in memory size and bandwidth only)


def gpu_compiler_missing() -> list[str]:
    """What this host lacks to compile for an NVIDIA GPU (empty when nothing): the CUDA PJRT plugin, ptxas."""
    import importlib.util
    import shutil

    missing = []
    try:
        plugin = importlib.util.find_spec("jax_plugins.xla_cuda13") is not None
    except ModuleNotFoundError:  # no jax_plugins namespace package at all
        plugin = False
    if not plugin:
        missing.append(f'the CUDA plugin (pip install "jax[cuda13-local]=={jax.__version__}")')
    if shutil.which("ptxas") is None:
        missing.append("ptxas of CUDA 13 on PATH (e.g. pip install nvidia-cuda-nvcc, or a CUDA toolkit's bin/)")
    return missing


def gpu_devices(chip: str, count: int = 1) -> list[Any]:
    """Compile-only devices of ``count`` NVIDIA GPUs of kind ``chip`` (``"h100"``, ``"h200"``) on a host without one:
    XLA:GPU compiles against the chip's target description through the CUDA PJRT plugin (no GPU, no driver; ptxas
    assembles the kernels). Nothing runs on them and no autotuning happens: GEMMs are cuBLAS calls (Triton GEMM
    fusion is turned off by `compiler_options`, it needs autotuning), so the optimized HLO's copies, transposes, pads
    and kernel list are real and its times are not."""
    if chip not in GPU_TARGETS:
        raise ConfigError(f"--chip {chip!r} has no GPU target description; valid choices: {', '.join(GPU_TARGETS)}")
    missing = gpu_compiler_missing()
    if missing:
        raise ConfigError(f"cannot compile for {chip} on this host: missing {' and '.join(missing)}")
    from jax.experimental import topologies

    target = (pathlib.Path(__file__).parent / "gpu_targets" / GPU_TARGETS[chip]).read_text()
    return list(topologies.get_topology_desc(platform="cuda", target_config=target, topology=f"1x1x{count}").devices)


def compiler_options(devices: list[Any]) -> dict[str, Any] | None:
    """XLA options for compiling to ``devices``: for GPUs, Triton GEMM fusion off (its tiles are chosen by autotuning,
    which needs a GPU; GEMMs are then cuBLAS calls, as `gpu_devices` says)."""
    return {"xla_gpu_enable_triton_gemm": False} if on_gpu(devices[0].platform) else None


def has_cudnn() -> bool:
    """Whether cuDNN's library is installed (its fused attention cannot compile without it, even for no device)."""
    import importlib.util

    try:
        return importlib.util.find_spec("nvidia.cudnn") is not None
    except ModuleNotFoundError:  # no nvidia namespace package at all
        return False


def chip_of(devices: list[Any]) -> tuple[str, Chip | None]:
    kind = str(devices[0].device_kind).lower().replace(" ", "")
    for name in ("v5e", "v5lite", "v5p", "v6e", "v6lite", "v4", "h100", "h200"):
        if name in kind:
            key = {"v5lite": "v5e", "v6lite": "v6e"}.get(name, name)
            return key, CHIPS[key]
    if kind.endswith("v5"):  # "TPU v5" is the v5p
        return "v5p", CHIPS["v5p"]
    return kind, None


def abstract_batch(cfg: Config, mesh: Mesh, prompt_width: int) -> ts.Batch:
    """A worst-case rollout batch as sharded ``ShapeDtypeStruct``\\s (rows over the batch axes)."""
    P, G, Tc = cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens
    B = P * G
    rows = lambda *shape: NamedSharding(mesh, PartitionSpec(sharding.BATCH_AXES, *[None] * (len(shape) - 1)))  # noqa: E731
    sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rows(*shape))  # noqa: E731
    ref = sds((B, Tc), jnp.float32) if cfg.algo.kl_coef > 0 else None
    turns = cfg.data.multiturn  # multi-turn: the policy's tokens are marked
    return ts.Batch(tokens=sds((B, prompt_width + Tc), jnp.int32), prompt_mask=sds((B, prompt_width), bool),
                    completion_mask=sds((B, Tc), bool), rewards=sds((P, G), jnp.float32), valid=sds((P, G), bool),
                    old_logprobs=sds((B, Tc), jnp.float32), ref_logprobs=ref,
                    truncated=sds((B,), bool) if cfg.algo.overlong_filter else None,
                    action_mask=sds((B, Tc), bool) if turns else None)  # fmt: skip


def _learner(cfg: Config, mcfg: models.ModelConfig, devices: list[Any]) -> tuple[Mesh, int, Any]:
    """The learner's mesh on ``devices``, its batch shards and the perf switches as `resolve_perf` applies them there
    (the train step's and the KL reference pass's)."""
    m = cfg.mesh
    mesh = sharding.make_mesh(m.data, m.fsdp, m.tensor, devices=devices)
    shards = int(mesh.shape["data"] * mesh.shape["fsdp"])
    perf, _ = resolve_perf(cfg.algo, cfg.perf, num_shards=shards * int(mesh.shape["tensor"]),
                           platform=devices[0].platform, compute_dtype=mcfg.dtype)  # fmt: skip
    return mesh, shards, perf


def compile_train_step(cfg: Config, mcfg: models.ModelConfig, devices: list[Any], texts: dict[str, str] | None = None
                       ) -> dict[str, float]:  # fmt: skip
    """Compile the train step for ``devices``; per-chip bytes (arguments, outputs, temporaries) and cost figures:
    ``counted_flops`` (`train_step_flops`) and ``hbm_bytes``, the compulsory HBM traffic of one step by
    `jaxgrpo.hlo.program_bytes` (every loop counted by its trip count). ``texts``, when given, receives the optimized
    HLO text under ``"train"``."""
    mesh, shards, perf = _learner(cfg, mcfg, devices)
    init_fn, step_fn = ts.make_train_step(mcfg, cfg.algo, cfg.optim, perf=perf, mesh=mesh,
                                          temperature=cfg.rollout.temperature, top_k=cfg.rollout.top_k,
                                          top_p=cfg.rollout.top_p, total_steps=cfg.train.steps)  # fmt: skip
    del init_fn
    width = padding.train_prompt_width([cfg.data.max_prompt_tokens])
    packed = ts.packed_prompt_width([cfg.data.max_prompt_tokens] * cfg.rollout.prompts_per_step, width, cfg.algo,
                                    perf, mesh)  # fmt: skip
    state = ts.abstract_state(mcfg, cfg.algo, cfg.optim, mesh, cfg.train.steps)
    lowered = step_fn.lower(state, abstract_batch(cfg, mesh, width), packed_prompt_width=packed)
    compiled = lowered.compile(compiler_options=compiler_options(devices))
    text = compiled.as_text()
    if texts is not None:
        texts["train"] = text
    parts = cfg.algo.num_minibatches * cfg.algo.grad_accum_steps * shards  # one packed row each
    flops = train_step_flops(cfg, mcfg, width, parts * packed if perf.prefix_sharing else 0) / len(devices)
    return dict(weights=per_chip_bytes(state.params), optimizer=per_chip_bytes(state.opt_state), batch_shards=shards,
                **program_figures(compiled), counted_flops=flops,
                hbm_bytes=float(hlo.program_bytes(text).bytes_per_iteration))  # fmt: skip


def compile_reference(cfg: Config, mcfg: models.ModelConfig, devices: list[Any]) -> dict[str, float] | None:
    """With ``algo.kl_coef > 0``, compile the KL reference pass for ``devices`` (`train_step.reference_logprobs_fn`
    with the run's perf switches, on the worst-case batch and the reference weights as the trainer holds them: a
    compute-dtype copy of the initial weights sharded like the masters, or with LoRA the frozen base itself);
    `program_figures` of it, and ``shared``: the bytes of its arguments that are the train state's own (LoRA's base).
    None without a KL term."""
    if cfg.algo.kl_coef <= 0:
        return None
    r = cfg.rollout
    mesh, shards, perf = _learner(cfg, mcfg, devices)
    masters = ts.abstract_state(mcfg, cfg.algo, cfg.optim, mesh, cfg.train.steps).params
    if mcfg.lora is not None:
        ref = models.lora.split(masters)[0]
        shared = per_chip_bytes(ref)
    else:
        ref = jax.tree.map(lambda x, p: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=p.sharding),
                           jax.eval_shape(lambda p: models.compute_params(mcfg, p), masters), masters)  # fmt: skip
        shared = 0.0
    fn = ts.reference_logprobs_fn(mcfg, r.temperature, perf, r.top_k, r.top_p, shards,
                                  cfg.algo.num_minibatches * cfg.algo.grad_accum_steps)  # fmt: skip
    batch = abstract_batch(cfg, mesh, padding.train_prompt_width([cfg.data.max_prompt_tokens])).replace(
        ref_logprobs=None)
    compiled = fn.lower(ref, batch).compile(compiler_options=compiler_options(devices))
    return dict(program_figures(compiled), shared=shared)


def resident_bytes(cfg: Config, mcfg: models.ModelConfig, devices: list[Any]) -> dict[str, float]:
    """Per-chip bytes that stay on the chips through the rollout and the train step: the master weights and the
    optimizer state (`train_step.abstract_state`), and with ``algo.kl_coef > 0`` the reference policy's weights (the
    trainer keeps a compute-dtype copy of the initial weights, sharded like them). From shapes; nothing compiled."""
    m = cfg.mesh
    mesh = sharding.make_mesh(m.data, m.fsdp, m.tensor, devices=devices)
    state = ts.abstract_state(mcfg, cfg.algo, cfg.optim, mesh, cfg.train.steps)
    weights = per_chip_bytes(state.params)
    ref = weights * jnp.dtype(mcfg.dtype).itemsize / jnp.dtype(mcfg.param_dtype).itemsize
    copy = cfg.algo.kl_coef > 0 and mcfg.lora is None  # LoRA's reference is the frozen base itself
    return dict(weights=weights, optimizer=per_chip_bytes(state.opt_state), reference=ref if copy else 0.0)


def per_chip_bytes(tree: Any) -> float:
    """Bytes one chip holds of a tree of sharded ``ShapeDtypeStruct`` leaves (its shard of each)."""
    return float(sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def program_figures(compiled: Any) -> dict[str, float]:
    """XLA's per-chip memory (arguments, outputs, donated bytes aliased between them, temporaries; ``total`` = what
    the program needs at once) and cost (FLOPs, bytes accessed) of a compiled program."""
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
    out = dict(arguments=float(mem.argument_size_in_bytes), outputs=float(mem.output_size_in_bytes),
               aliased=float(mem.alias_size_in_bytes), temporaries=float(mem.temp_size_in_bytes),
               flops=float(cost.get("flops", 0.0)), bytes_accessed=float(cost.get("bytes accessed", 0.0)))  # fmt: skip
    out["total"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
    return out


def compile_rollout(cfg: Config, mcfg: models.ModelConfig, devices: list[Any], texts: dict[str, str] | None = None,
                   windows: int | None = None) -> dict[str, dict[str, float]]:  # fmt: skip
    """Compile the rollout engine's public programs (`jaxgrpo.rollout.engine`: ``prepare_weights``, ``prefill`` of
    ``rollout.slots`` prompts, ``decode_block`` of ``rollout.decode_block`` steps) for one device on abstract
    compute-dtype weights, for prompts of ``data.max_prompt_tokens``; `program_figures` of each, and the optimized HLO
    texts into ``texts`` (``decode``: the block, whose loop body is one token step, at the widest decode window;
    ``decode_w<slots>`` the other windows). ``windows``: compile only that many windows, evenly spread from the
    narrowest to the widest (`jaxgrpo.decode_report` interpolates the others); default all. For a GPU, ``decode``'s
    figures also say how the host launches a token step (`jaxgrpo.hlo.HostLaunches`: CUDA graphs or single kernels).
    On several devices: the config's mesh (for ``mesh.rollout = R``, rollouts on devices of their own: pass
    `rollout_config` and those R devices), the weights sharded as the trainer shards them, the slots split over the
    batch axes (`engine.Spec.sharding`); the decode weights placed as XLA places `prepare_weights`'s outputs when
    compiled as one program (the trainer runs it layer by layer). ``weights``: the per-chip bytes of the
    compute-dtype weights the programs read (``total``), that over their whole size (``share``) and how many ways
    the slots are split (``row_shards``): what `jaxgrpo.decode_report.decode_ideal_bytes` needs per chip."""
    from jaxgrpo.models.attention import KVCache
    from jaxgrpo.rollout import engine

    m, one = cfg.mesh, len(devices) == 1
    sizes = (1, 1, 1) if one else (m.data, m.fsdp, m.tensor)
    mesh = sharding.make_mesh(*sizes, devices=devices[:1] if one else devices)
    put = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(  # noqa: E731
        mesh, PartitionSpec())), tree)  # fmt: skip
    abstract = jax.eval_shape(lambda: models.compute_params(mcfg, models.init_params(mcfg, jax.random.key(0))))
    options = compiler_options(devices)
    spec = engine_spec(cfg, mcfg, devices[0].platform, None if one else mesh)
    slots, width = spec.slots, spec.prompt_width
    if one:
        params = put(abstract)
        weights = put(jax.eval_shape(lambda p: engine.prepare_weights(mcfg, p), params))
    else:
        plain = mcfg if models.lora.has_adapters(abstract) else mcfg.replace(lora=None)
        params = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), abstract,
                              sharding.param_shardings(plain, mesh))  # fmt: skip
        prepare = jax.jit(lambda p: engine.prepare_weights(mcfg, p, spec)).lower(params)
        weights = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), prepare.out_info,
                               prepare.compile(options).output_shardings)  # fmt: skip
    empty = jax.eval_shape(lambda: engine.init(mcfg, spec))
    caches, state = put(empty) if one else engine.placed(spec, empty)
    scalar = lambda dt: jax.ShapeDtypeStruct((), dt, sharding=NamedSharding(mesh, PartitionSpec()))  # noqa: E731
    f32 = scalar(jnp.float32)
    rows = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, PartitionSpec()))  # noqa: E731
    prompts = (rows((slots, width), jnp.int32), rows((slots, width), jnp.bool_), rows((slots,), jnp.int32),
               rows((slots,), jnp.int32), scalar(jax.eval_shape(lambda: jax.random.key(0)).dtype))  # fmt: skip
    texts = {} if texts is None else texts
    mine = per_chip_bytes(weights)
    whole = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(weights))
    out = dict(weights=dict(total=mine, share=mine / whole, row_shards=float(engine.row_shards(None if one else mesh))))
    packed = padding.sampler_packed_width([cfg.data.max_prompt_tokens] * slots, 1)
    prefill = engine.prefill.lower(mcfg, spec, packed, params, weights, caches, state, *prompts, f32, f32)
    programs = dict(prefill=prefill)
    widths = sorted(engine.windows(spec))
    for w in spread(widths, windows):  # one decode program per window (`engine.window`)
        at = caches.replace(decode=[KVCache(_slots(c.k, 2, w), _slots(c.v, 3, w)) for c in caches.decode])
        name = "decode" if w == widths[-1] else f"decode_w{w}"
        programs[name] = engine.decode_block.lower(mcfg, spec, weights, at, state, f32, f32)
    gpu = on_gpu(devices[0].platform)
    for name, lowered in programs.items():
        thunks: str | None = None
        if gpu and name == "decode":  # and how the host launches its token step (`hlo.host_launches`)
            compiled, thunks = hlo.compile_with_thunks(lowered, options)
        else:
            compiled = lowered.compile(options)
        texts[name] = compiled.as_text()
        if not name.startswith("decode_w"):
            out[name] = program_figures(compiled)
        if thunks is not None:
            out[name].update(dataclasses.asdict(hlo.host_launches(thunks)))
    return out


def engine_spec(cfg: Config, mcfg: models.ModelConfig, platform: str, mesh: Any = None) -> Any:
    """The rollout engine's `Spec` for this config on ``platform``'s devices: ``rollout.slots`` prompts of
    ``data.max_prompt_tokens`` (bucketed; on a ``mesh`` rounded up to its batch shards, as the driver rounds them),
    ``rollout.decode_block`` steps per block, the rollout's sampling, the prefill's attention kernel as the run
    resolves ``perf.attention`` on that platform."""
    from jaxgrpo.rollout import engine
    from jaxgrpo.rollout.params import SamplingParams

    r = cfg.rollout
    sp = SamplingParams(max_new_tokens=r.max_new_tokens, num_samples=r.group_size, temperature=r.temperature,
                        top_p=r.top_p, top_k=r.top_k, eos_token_ids=tuple(mcfg.eos_token_ids))  # fmt: skip
    slots = engine.split_slots(r.slots or r.prompts_per_step, mesh)
    perf, _ = resolve_perf(cfg.algo, cfg.perf, num_shards=engine.row_shards(mesh), platform=platform,
                           compute_dtype=mcfg.dtype)  # fmt: skip
    return engine.make_spec(mcfg, sp, slots, padding.prompt_bucket(cfg.data.max_prompt_tokens), r.decode_block,
                            platform, mesh, attention_kernel(perf))  # fmt: skip


def spread(items: list[int], n: int | None) -> list[int]:
    """``n`` (at least 2) of the sorted ``items``, evenly spaced, the first and the last included; all when ``n`` is
    None or not smaller."""
    if n is None or n >= len(items):
        return items
    n = max(n, 2)
    return [items[i] for i in sorted({round(k * (len(items) - 1) / (n - 1)) for k in range(n)})]


def _slots(x: jax.ShapeDtypeStruct, axis: int, width: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape[:axis] + (width,) + x.shape[axis + 1:], x.dtype, sharding=x.sharding)


def dump_hlo(directory: str, texts: dict[str, str]) -> None:
    """Write each program's optimized HLO text to ``directory/<name>.hlo.txt``."""
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (out / f"{name}.hlo.txt").write_text(text)


def rollout_config(cfg: Config) -> Config:
    """The config the rollout's programs compile for: with ``mesh.rollout = R``, an ``R / F × F`` data × fsdp mesh
    (``F = mesh.rollout_fsdp``: the weights split over F, `async_rollout.device_groups`); otherwise the config
    itself."""
    if not cfg.mesh.rollout:
        return cfg
    f = cfg.mesh.rollout_fsdp
    mesh = dataclasses.replace(cfg.mesh, data=cfg.mesh.rollout // f, fsdp=f, tensor=1)
    return dataclasses.replace(cfg, mesh=mesh)


def rollout_cache_bytes(mcfg: models.ModelConfig, cfg: Config) -> float:
    """The rollout's KV caches in bytes, all chips together, from their shapes alone (no compilation): the prefix
    cache (`models.prefill`: keys and values of every prompt's ``Tp`` slots, one copy per prompt) and the decode cache
    (at least ``M - 1`` slots per row, `jaxgrpo.rollout.engine`). Spread evenly over the chips, they are a lower bound
    of what any sharding of the rollout needs per chip."""
    r, kv = cfg.rollout, mcfg.kv_bytes_per_token
    slots_per_prompt = padding.prompt_bucket(cfg.data.max_prompt_tokens) + r.group_size * max(r.max_new_tokens - 1, 1)
    return float(kv * r.prompts_per_step * slots_per_prompt)


def totals(cfg: Config, resident: dict[str, float], step: dict[str, float], rollout: dict[str, dict[str, float]],
           reference: dict[str, float] | None = None) -> dict[str, float]:  # fmt: skip
    """Per-chip peak of each program with what stays resident beside it (`resident_bytes`): the train step (its
    arguments hold the train state; the reference weights come on top), the KL reference pass (``reference``,
    `compile_reference`: the train state beside its total, whose arguments hold the reference weights), the prefill
    and the decode loop (the train state, plus each program's own total; where the compute dtype is the master dtype
    the sampler reads the masters themselves, which are then not counted twice). With ``mesh.rollout`` the rollout's
    programs run on chips of their own: each total alone."""
    out = {"train step": step["total"] + resident["reference"]}
    if reference is not None:
        out["reference pass"] = resident["weights"] + resident["optimizer"] + reference["total"] - reference["shared"]
    if cfg.mesh.rollout:  # the rollout's devices hold only what its programs take (their arguments: the weights)
        out.update({name: p["total"] for name, p in rollout.items() if name != "weights"})
        return out
    kept, shared = sum(resident.values()), shared_rollout_weights(cfg, rollout)
    out.update({name: kept + p["total"] - shared for name, p in rollout.items() if name != "weights"})
    return out


def shared_rollout_weights(cfg: Config, rollout: dict[str, dict[str, float]]) -> float:
    """Bytes of the rollout's weights that are the train state's own arrays (not a copy): the sampler reads the state
    where no cast or LoRA merge makes a copy (compute dtype = master dtype, or LoRA's base, stored in the compute
    dtype, with unmerged adapters), and never with ``mesh.rollout`` (the rollout's chips hold a copy of their own)."""
    if cfg.mesh.rollout:
        return 0.0
    lora_unmerged = cfg.lora.rank > 0 and cfg.model.dtype != "float32"
    return rollout["weights"]["total"] if cfg.model.dtype == cfg.model.param_dtype or lora_unmerged else 0.0


def train_step_flops(cfg: Config, mcfg: models.ModelConfig, prompt_width: int, prompt_tokens: int = 0) -> float:
    """FLOPs of one train step, all chips together, counted from the shapes the step runs (worst case: every prompt
    ``data.max_prompt_tokens`` long, left-padded to ``prompt_width``, every completion ``rollout.max_new_tokens``;
    ``prompt_tokens``: the decoder's prompt tokens per step where prefix sharing packs them, 0 = ``P * prompt_width``).

    XLA's ``cost_analysis`` counts a loop body once (the layer scan, the gradient-accumulation loop and the chunked
    LM head are loops), so the count is analytic, after Kaplan et al. 2020 (arXiv:2001.08361, §2.1: 2 FLOPs per weight
    per token forward, twice that backward) and PaLM (Chowdhery et al. 2022, arXiv:2204.02311, App. B: attention
    ``12 · L · N · H · context`` per token for forward + backward). Per token forward: ``2 · (weights of the layers'
    projections)`` + ``4 · L · N · H · context`` (scores and values, context = the keys before it, causal) and, for
    completion tokens only, ``2 · D · V`` for the LM head. With ``perf.prefix_sharing`` each group's prompt runs once
    (``P`` prompts, not ``P · G`` rows). Forward + backward is 3 forwards; ``perf.remat=full`` recomputes the
    layers' forward once more; ``algo.num_iterations`` passes over the rollout. Not counted: the reference-policy and
    old-policy log-prob passes (separate programs), norms and element-wise work."""
    c, r = mcfg, cfg.rollout
    D, F, H, N, K, L = c.hidden_size, c.intermediate_size, c.head_dim, c.num_heads, c.num_kv_heads, c.num_layers
    layer_weights = L * (D * (N + 2 * K) * H + N * H * D + 3 * D * F)
    Tp, Tc, P, G = prompt_width, r.max_new_tokens, r.prompts_per_step, r.group_size
    if cfg.perf.prefix_sharing:  # (tokens, summed causal context) of the prompts once and of the completions
        n = prompt_tokens or P * Tp
        parts = [(n, n * (Tp - 1) / 2), (P * G * Tc, P * G * Tc * (Tp + (Tc - 1) / 2))]
    else:
        parts = [(P * G * (Tp + Tc), P * G * (Tp + Tc) * (Tp + Tc - 1) / 2)]
    if c.lora is not None:  # the adapters' two rank-r products per targeted projection
        shapes = models.param_shapes(c)["layers"]["lora"]
        layer_weights += sum(math.prod(ab["a"]) + math.prod(ab["b"]) for ab in shapes.values())
    layers_fwd = sum(2 * layer_weights * tokens + 4 * L * N * H * context for tokens, context in parts)
    head_fwd = 2 * D * c.vocab_size * P * G * Tc
    # backward = input gradients + weight gradients (one forward's worth each); a frozen LoRA base has no weight
    # gradients (the adapters' are in layer_weights' share, overcounted by their base's, < 3% at rank 64)
    weight_grads = 0 if c.lora is not None else 1
    passes = 2 + weight_grads + (cfg.perf.remat == "full")
    return float(cfg.algo.num_iterations * (passes * layers_fwd + (2 + weight_grads) * head_fwd))


def fits(total: float, chip: Chip | None) -> bool:
    return chip is None or total <= chip.hbm_bytes


def roofline_seconds(flops: float, bytes_accessed: float, chip: Chip | None) -> float:
    """``max(flops / peak, bytes / bandwidth)`` for one chip (NaN when the chip is unknown)."""
    if chip is None:
        return math.nan
    return max(flops / chip.peak_flops, bytes_accessed / chip.hbm_bandwidth)


def human(nbytes: float) -> str:
    return f"{nbytes / GiB:8.2f} GiB" if nbytes >= GiB / 4 else f"{nbytes / 1024**2:8.2f} MiB"
