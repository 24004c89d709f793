# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""`python -m jaxgrpo.compile`: the train step and the rollout's prefill and decode loop compiled ahead of time on
abstract weights, per-chip memory against the chip, exit code 1 when one of them does not fit (an impossible rollout
refused before compiling); the model architecture found without loading weights, Hub ids included."""

from __future__ import annotations

import importlib.util
import re

import pytest

from jaxgrpo import aot, models, padding, sharding
from jaxgrpo import compile as compile_cli
from jaxgrpo import config as config_lib
from jaxgrpo.learner import train_step as ts


def test_default_config_fits_the_local_device(capsys):
    assert compile_cli.main([]) == 0
    out = capsys.readouterr().out
    assert "train step total" in out and "prefill total" in out and out.strip().endswith("fits")
    # max_new_tokens=1: the prefill samples the only token (no decode loop); no KL term, float32 compute
    assert "decode total" not in out and "reference" not in out and "rollout weights" not in out


def test_programs_over_a_small_chip_fail_with_exit_code_1(capsys, monkeypatch):
    # a chip just larger than the shape-only bound (resident state + caches): only the compiled programs exceed it
    overrides = ["train.steps=3", "rollout.max_new_tokens=3", "model.dtype=bfloat16", "algo.kl_coef=0.01"]
    cfg = config_lib.load_config("default", overrides)
    mcfg, devices = aot.model_config(cfg), aot.topology_devices(None, 1)
    bound = sum(aot.resident_bytes(cfg, mcfg, devices).values()) + aot.rollout_cache_bytes(mcfg, cfg)
    monkeypatch.setattr(aot, "chip_of", lambda devices: ("tiny-chip", aot.Chip(bound + 1, 1e12, 1e11)))
    assert compile_cli.main(overrides) == 1
    out = capsys.readouterr().out
    for row in ("reference weights (KL)", "reference pass total", "rollout weights (compute)", "prefill total",
                "decode KV caches and state", "decode total"):  # fmt: skip
        assert row in out
    assert "nothing compiled" not in out and "DOES NOT FIT" in out
    assert out.strip().endswith("per chip: train step, reference pass, prefill, decode")


def test_rollout_programs_compiled_with_donated_kv_cache():
    # bfloat16 compute over float32 masters, rows split over 2 x 2 devices, 5 new tokens
    cfg = config_lib.load_config("default", ["rollout.max_new_tokens=5", "model.dtype=bfloat16", "mesh.data=2",
                                             "mesh.fsdp=2", "rollout.prompts_per_step=8"])  # fmt: skip
    mcfg = aot.model_config(cfg)
    out = aot.compile_rollout(cfg, mcfg, aot.topology_devices(None, 4))
    from jaxgrpo import models, padding

    # the engine's decode weights (on the learner's mesh): every parameter once in bfloat16, FSDP-sharded as XLA
    # places `prepare_weights`'s outputs (at most half of them whole on a device)
    assert out["weights"]["total"] < models.count_params(mcfg) * 2
    assert out["weights"]["total"] >= models.count_params(mcfg) * 2 / 2
    # closed form of a lower bound of one device's KV caches (the engine's slots split over the 4 devices): prefix
    # cache of the 8 prompts at their bucketed width, decode cache of at least M - 1 = 4 slots per row
    kv = 2 * mcfg.num_layers * mcfg.num_kv_heads * mcfg.head_dim * 2
    prefix = kv * 8 * padding.prompt_bucket(cfg.data.max_prompt_tokens) / 4
    decode = kv * 8 * cfg.rollout.group_size * 4 / 4
    d = out["decode"]
    assert d["arguments"] - out["weights"]["total"] >= prefix + decode  # caches + loop state + keys
    assert d["aliased"] >= decode  # the donated decode cache is updated in place, not copied
    assert out["prefill"]["outputs"] >= prefix + decode
    assert min(d["temporaries"], out["prefill"]["temporaries"]) > 0
    # the decode's roofline ideal per chip: each chip reads its FSDP half of the weights (every matrix of the default
    # model splits over fsdp 2, data 2 replicates) and a quarter of the caches, not the whole model and all rows
    from jaxgrpo import decode_report

    assert (out["weights"]["share"], out["weights"]["row_shards"]) == (0.5, 4)
    ideal = decode_report.decode_ideal_bytes(cfg, mcfg, out["weights"]["share"], 4)
    rows, width = 8 * cfg.rollout.group_size, padding.prompt_bucket(cfg.data.max_prompt_tokens)
    assert ideal["weights"] == models.count_params(mcfg) * 2 / 2  # tied embedding: the whole table is the LM head
    assert ideal["prefix_kv"] == kv * 8 * width / 4 and ideal["decode_kv"] == kv * rows * 5 / 2 / 4


def test_absurd_rollout_of_the_pod_config_refused_before_compiling(capsys, monkeypatch):
    monkeypatch.setattr(aot, "chip_of", lambda devices: ("v5e", aot.CHIPS["v5e"]))
    monkeypatch.setattr(aot, "compile_train_step", lambda *a: pytest.fail("compiled although the bound refuses"))
    pod = ["--config", "llama3.1-8b_gsm8k_pod", "mesh.data=1", "mesh.fsdp=8", "mesh.topology=null"]  # 8 local
    assert compile_cli.main([*pod, "rollout.prompts_per_step=8192"]) == 1
    out = capsys.readouterr().out
    # 8192 prompts x (384 prompt slots + 16 rows x 1023 decode slots) x (k and v of 32 layers x 8 kv heads x 128, bf16)
    per_chip = 8192 * (384 + 16 * 1023) * (2 * 32 * 8 * 128 * 2) / 8 / 2**30
    assert "rollout DOES NOT FIT" in out and "nothing compiled" in out and f"{per_chip:.2f} GiB per chip" in out
    assert compile_cli.main([*pod, "rollout.max_new_tokens=1000000"]) == 2  # beyond the model's context
    assert "exceeds the model's context (131072)" in capsys.readouterr().err


def test_compiled_weights_match_the_parameter_count():
    cfg = config_lib.load_config("default", [])
    mcfg = aot.model_config(cfg)
    step = aot.compile_train_step(cfg, mcfg, aot.topology_devices(None, 1))
    from jaxgrpo import models

    assert step["weights"] == models.count_params(mcfg) * 4  # float32 masters, one device
    assert step["optimizer"] >= 2 * step["weights"]  # AdamW's two moments (plus its step counter)
    assert step["temporaries"] > 0 and step["flops"] > 0


@pytest.mark.parametrize("perf", [["perf.remat=none"], ["perf.remat=full", "perf.prefix_sharing=false"]])
def test_counted_flops_match_xla_on_a_loop_free_step(perf):
    # XLA counts a loop body once; with one layer, one accumulation step and one LM-head chunk nothing loops, so its
    # count is the step's own and the count from the shapes must agree with it (norms and element-wise work aside)
    cfg = config_lib.load_config("default", ["model.hidden_size=256", "model.intermediate_size=1024",
                                             "model.num_layers=1", "rollout.max_new_tokens=8", *perf])  # fmt: skip
    step = aot.compile_train_step(cfg, aot.model_config(cfg), aot.topology_devices(None, 1))
    assert 0.85 < step["flops"] / step["counted_flops"] < 1.15


def test_model_config_from_a_preset_named_directory():
    cfg = config_lib.load_config("default", ["model.name_or_path=models/llama-3.1-8b-instruct", "model.dtype=bfloat16"])
    mcfg = aot.model_config(cfg)
    assert (mcfg.num_layers, mcfg.hidden_size, mcfg.dtype, mcfg.param_dtype) == (32, 4096, "bfloat16", "float32")


@pytest.mark.parametrize("hub_id, shape", [
    # (layers, hidden, MLP, heads, kv heads, tied head) from each model's config.json on the Hugging Face Hub
    ("Qwen/Qwen2.5-0.5B-Instruct", (24, 896, 4864, 14, 2, True)),
    ("Qwen/Qwen3-1.7B", (28, 2048, 6144, 16, 8, True)),
    ("meta-llama/Llama-3.1-8B-Instruct", (32, 4096, 14336, 32, 8, False)),
])  # fmt: skip
def test_model_config_of_a_hub_id_without_downloading(hub_id, shape, monkeypatch):
    from jaxgrpo import build

    monkeypatch.setattr(build, "resolve_model_path", lambda *a, **k: pytest.fail("tried to fetch the checkpoint"))
    mcfg = aot.model_config(config_lib.load_config("default", [f"model.name_or_path={hub_id}"]))
    got = (mcfg.num_layers, mcfg.hidden_size, mcfg.intermediate_size, mcfg.num_heads, mcfg.num_kv_heads,
           mcfg.tie_word_embeddings)  # fmt: skip
    assert got == shape


def test_model_config_of_a_gguf_from_its_metadata(smollm2_gguf):
    # SmolLM2-135M-Instruct's config.json on the Hugging Face Hub: 30 layers, hidden 576, MLP 1536, 9 heads, 3 kv
    # heads, vocabulary 49152, tied head
    cfg = config_lib.load_config("default", [f"model.name_or_path={smollm2_gguf}", "model.dtype=bfloat16"])
    mcfg = aot.model_config(cfg)
    got = (mcfg.num_layers, mcfg.hidden_size, mcfg.intermediate_size, mcfg.num_heads, mcfg.num_kv_heads,
           mcfg.vocab_size, mcfg.tie_word_embeddings, mcfg.dtype, mcfg.param_dtype)  # fmt: skip
    assert got == (30, 576, 1536, 9, 3, 49152, True, "bfloat16", "float32")


def test_bad_input_is_one_line(capsys):
    assert compile_cli.main(["mesh.fsdp=16"]) == 2  # 8 local (fake) devices, a mesh of 16
    assert "the mesh needs 16 devices" in capsys.readouterr().err
    assert compile_cli.main(["--chip", "h1000"]) == 2
    assert "--chip 'h1000' is not known" in capsys.readouterr().err


@pytest.mark.parametrize("libtpu", [True, False])
def test_an_undescribable_topology_is_one_line_with_the_fix_that_applies(capsys, monkeypatch, libtpu):
    from jax.experimental import topologies

    def unknown(**kwargs):
        raise RuntimeError("Invalid TPU external name: TPU v9")

    monkeypatch.setattr(topologies, "get_topology_desc", unknown)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if libtpu else None)
    assert compile_cli.main(["--topology", "v9:2x2"]) == 2
    err = capsys.readouterr().err
    assert "cannot describe TPU topology 'v9:2x2'" in err and "name a slice such as v5e:4x8" in err
    assert ("install libtpu" in err) != libtpu and len(err.strip().splitlines()) == 1


def test_the_pod_config_names_its_slice():
    cfg = config_lib.load_config("llama3.1-8b_gsm8k_pod", [])
    assert cfg.mesh.topology == "v5p:2x4x4" and cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor == 32
    with pytest.raises(config_lib.ConfigError, match="mesh.topology must be a TPU slice name"):
        config_lib.load_config("default", ["mesh.topology=v5p-32"])


def test_sharded_over_local_devices(capsys):
    # 8 fake CPU devices: FSDP over 4 of them, 2-way data parallel
    assert compile_cli.main(["mesh.data=2", "mesh.fsdp=4", "rollout.prompts_per_step=8"]) == 0
    assert "mesh data=2 fsdp=4" in capsys.readouterr().out



def test_rollout_on_chips_of_its_own(capsys):
    """mesh.rollout=4 of 8 local devices: the train step compiles on the first 4 (the same figures as without a
    rollout beside it), the rollout engine on the last 4 over a data mesh, each chip holding the whole bfloat16 decode
    weights (the parameter count × 2 bytes, a tied LM head laid out once more) and no optimizer state beside them; with
    ``mesh.rollout_fsdp = 2`` half of them."""
    base = ["mesh.fsdp=4", "rollout.prompts_per_step=8", "rollout.max_new_tokens=4", "model.dtype=bfloat16"]
    assert compile_cli.main([*base, "mesh.rollout=4"]) == 0
    split = capsys.readouterr().out
    assert "8 x cpu" in split and "the rollout on 4 chips of its own (mesh.rollout)" in split
    row = lambda out, name: next(line for line in out.splitlines() if line.strip().startswith(name))  # noqa: E731
    cfg = config_lib.load_config("default", base)
    mcfg = aot.model_config(cfg)
    alone = aot.compile_train_step(cfg, mcfg, aot.topology_devices(None, 4))  # no rollout beside it: no KL term
    assert row(split, "train step total").endswith(aot.human(alone["total"]))
    from jaxgrpo import models

    # the engine's decode weights: every parameter in bfloat16, and a tied embedding's LM head once more as [D, V]
    head = mcfg.vocab_size * mcfg.hidden_size * 2 if mcfg.tie_word_embeddings else 0
    assert row(split, "rollout weights (compute)").endswith(aot.human(models.count_params(mcfg) * 2 + head))
    decode = float(row(split, "decode total").split()[-2])
    parts = sum(float(row(split, name).split()[-2]) for name in ("rollout weights (compute)",
                                                                 "decode KV caches and state", "decode temporaries"))
    assert decode == pytest.approx(parts, abs=0.02), "the rollout's chips: its weights, caches and temporaries only"
    # mesh.rollout_fsdp=2: the 4 rollout chips as 2 x 2, each holding half of every decode weight (the tiny model's
    # sizes all split in two)
    assert compile_cli.main([*base, "mesh.rollout=4", "mesh.rollout_fsdp=2"]) == 0
    halves = capsys.readouterr().out
    assert "its weights split 2 ways (mesh.rollout_fsdp)" in halves
    assert row(halves, "rollout weights (compute)").endswith(aot.human((models.count_params(mcfg) * 2 + head) / 2))
    assert compile_cli.main([*base, "mesh.rollout=8"]) == 2
    assert "the mesh needs 12 devices but 8 are local" in capsys.readouterr().err

@pytest.mark.slow
def test_a_multiturn_config_compiles_at_the_shapes_its_run_takes(smollm2_gguf, capsys):
    """A multi-turn config (the calculator environment; P = G = 2, turns of 32 tokens): the train step compiles at the
    token budget's completion width (max_turns x max_new_tokens, here 2 x 32 and then 4 x 32) and the rollout as the
    simple loop runs a turn, each trajectory a row of its own (P x G = 4 rows, contexts up to the prompt and the
    budget); single-turn, the same model's step takes the 32-token completions alone; with the multi-turn engine,
    its own programs."""
    base = ["model.name_or_path=tiny", f"model.tokenizer={smollm2_gguf}", "model.hidden_size=32",
            "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
            "model.max_position_embeddings=1024", "data.source=words", "data.difficulty=1",
            "data.max_prompt_tokens=128", "rollout.prompts_per_step=2", "rollout.group_size=2",
            "rollout.max_new_tokens=32", "data.rewards={gsm8k_lenient: 1.0}"]  # fmt: skip
    env = ["data.environment=jaxgrpo.rollout.arithmetic_env:CalculatorEnv"]
    def total(out: str) -> float:  # the train step's total in MiB
        value, unit = next(x for x in out.splitlines() if "train step total" in x).split()[-2:]
        return float(value) * (1024 if unit == "GiB" else 1)

    note = r"the token budget's completion width \((\d+)\); the rollout as the simple loop runs a turn \((\d+) rows, " \
           r"contexts up to (\d+) tokens, 32 new\)"  # fmt: skip
    outs = []
    for turns in (2, 4):
        assert compile_cli.main([*base, *env, f"rollout.max_turns={turns}"]) == 0
        outs.append(capsys.readouterr().out)
        completion, rows, context = map(int, re.search(note, outs[-1]).groups())
        assert (completion, rows) == (32 * turns, 4) and context >= 32 * turns + 32
    assert compile_cli.main(base) == 0
    single = capsys.readouterr().out
    assert "multi-turn" not in single and total(single) < total(outs[0]) < total(outs[1])
    # the multi-turn engine: its own programs, P x G = 4 rows each caching the budget (2 x 32) and its first token in
    # 128 slots (a multiple of 128), and the 2 groups' prefixes
    assert compile_cli.main([*base, *env, "rollout.turn_engine=true", "rollout.max_turns=2"]) == 0
    engine = capsys.readouterr().out
    assert "the rollout as the multi-turn engine runs it (4 rows of 128 cache slots, prefixes of" in engine
    prefix = int(re.search(r"prefixes of (\d+)\)", engine).group(1))
    assert prefix == padding.prompt_bucket(int(re.search(r"rendered with the tools \((\d+) tokens", engine).group(1)))
    kv = 2 * 1 * 1 * 16 * 4  # k and v, 1 layer, 1 kv head of 16, float32
    caches = float(next(x for x in engine.splitlines() if "decode KV caches and state" in x).split()[-2])
    assert caches >= kv * (4 * 128 + 2 * prefix) / 2**20 and engine.strip().endswith("fits")


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (pip install jaxgrpo[tpu])")
def test_tpu_topology_compiles_train_step_and_rollout(capsys):
    # 4 prompts x 2 samples: libtpu's compile time grows with the batch (the train step of 16 x 16 rows took 45 s to
    # compile on a 2-core host, of 4 x 2 rows 14 s); the path through libtpu is the same
    small = ["rollout.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=4"]
    assert compile_cli.main(["--topology", "v5e:2x2", "mesh.fsdp=4", *small, "model.dtype=bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "4 x v5e" in out and "prefill total" in out and "decode total" in out and out.strip().endswith("fits")


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (pip install jaxgrpo[tpu])")
def test_rollout_split_must_fit_each_host_of_the_slice(capsys, monkeypatch):
    """v5p:2x4x4 is 8 hosts of 4 chips: mesh.rollout=16 gives each host 2 rollout chips of its own, so their weights
    split at most 2 ways; 4 is refused in one line before anything compiles."""
    monkeypatch.setattr(aot, "compile_train_step", lambda *a: pytest.fail("compiled although the split is refused"))
    pod = ["--config", "llama3.1-8b_gsm8k_pod", "mesh.data=1", "mesh.fsdp=16", "mesh.rollout=16"]
    assert compile_cli.main([*pod, "mesh.rollout_fsdp=4"]) == 2
    err = capsys.readouterr().err
    assert "v5p:2x4x4 has 8 hosts" in err and "mesh.rollout_fsdp (4) to a divisor of mesh.rollout / 8" in err
    assert err.count("\n") == 1


def test_lora_state_holds_optimizer_moments_for_the_adapters_only():
    """With lora.rank = r: the optimizer state is AdamW's two float32 moments of the adapters, r·(in + out) per
    targeted projection and layer (closed form from the model's sizes); the base is stored in the compute dtype; the
    KL reference is the base itself (no copy); the base has no weight-gradient FLOPs."""
    over = ["lora.rank=4", "lora.targets=[q, o, down]", "model.dtype=bfloat16", "algo.kl_coef=0.01"]
    cfg = config_lib.load_config("default", over)
    mcfg = aot.model_config(cfg)
    assert mcfg.lora is not None and mcfg.lora.rank == 4
    c, r = mcfg, 4
    adapters = c.num_layers * r * ((c.hidden_size + c.num_heads * c.head_dim)  # q: D -> N·H
                                   + (c.num_heads * c.head_dim + c.hidden_size)  # o: N·H -> D
                                   + (c.intermediate_size + c.hidden_size))  # down: F -> D  # fmt: skip
    res = aot.resident_bytes(cfg, mcfg, aot.topology_devices(None, 1))
    assert 2 * 4 * adapters <= res["optimizer"] <= 2 * 4 * adapters + 64  # + optax's step counts
    full = config_lib.load_config("default", ["model.dtype=bfloat16"])
    base_bytes = aot.resident_bytes(full, aot.model_config(full), aot.topology_devices(None, 1))["weights"]
    assert res["weights"] == pytest.approx(base_bytes / 2 + 4 * adapters)  # bf16 base + f32 adapters
    assert res["reference"] == 0.0
    assert aot.train_step_flops(cfg, mcfg, 16) < aot.train_step_flops(full, aot.model_config(full), 16)


@pytest.mark.parametrize("over,shared", [
    ([], True),  # float32 compute = float32 masters: the sampler reads them
    (["model.dtype=bfloat16"], False),  # a bf16 copy of float32 masters
    (["model.dtype=bfloat16", "lora.rank=4"], True),  # LoRA: the bf16 base itself, adapters unmerged
    (["lora.rank=4"], True),  # float32 LoRA: compute = master dtype
    (["mesh.rollout=2", "mesh.data=2"], False),  # the rollout's chips hold their own copy
])  # fmt: skip
def test_rollout_weights_shared_with_the_state(over, shared):
    """What the CLI's "rollout weights (compute)" row and `aot.totals` subtract: one rule for both."""
    cfg = config_lib.load_config("default", over)
    rollout = {"weights": {"total": 1000.0}, "prefill": {"total": 300.0}}
    assert aot.shared_rollout_weights(cfg, rollout) == (1000.0 if shared else 0.0)
    resident = {"weights": 50.0, "optimizer": 20.0, "reference": 0.0}
    totals = aot.totals(cfg, resident, {"total": 10.0}, rollout)
    assert totals["prefill"] == (300.0 if cfg.mesh.rollout else 70.0 + 300.0 - (1000.0 if shared else 0.0))


@pytest.mark.parametrize("lora", [False, True])
def test_the_kl_reference_pass_is_compiled_and_judged(capsys, lora):
    """``algo.kl_coef > 0``: the KL reference pass (the trainer's `reference_logprobs_fn`, with the run's perf) is
    compiled beside the train step and judged with the train state resident: its total is the masters, the optimizer
    state and its own program (whose arguments hold the reference weights: a compute-dtype copy, or LoRA's frozen base,
    which is the state's own and counted once)."""
    over = ["algo.kl_coef=0.01", "rollout.max_new_tokens=3", "model.dtype=bfloat16", "mesh.fsdp=4",
            *(["lora.rank=4"] if lora else [])]  # fmt: skip
    assert compile_cli.main(over) == 0
    out = capsys.readouterr().out
    cfg = config_lib.load_config("default", over)
    mcfg, devices = aot.model_config(cfg), aot.topology_devices(None, 4)
    ref = aot.compile_reference(cfg, mcfg, devices)
    resident = aot.resident_bytes(cfg, mcfg, devices)
    base = aot.per_chip_bytes(models.lora.split(ts.abstract_state(mcfg, cfg.algo, cfg.optim, sharding.make_mesh(
        1, 4, 1, devices=devices), cfg.train.steps).params)[0]) if lora else 0.0  # fmt: skip
    assert ref["shared"] == base and ref["arguments"] >= (base or resident["reference"])
    want = resident["weights"] + resident["optimizer"] + ref["total"] - base
    row = next(line for line in out.splitlines() if line.strip().startswith("reference pass total"))
    assert row.endswith(aot.human(want)) and "reference pass temporaries" in out
    assert aot.compile_reference(config_lib.load_config("default", over[1:]), mcfg, devices) is None  # no KL term


def test_bad_dump_dir_and_platform_topology_mixups_are_one_line_before_compiling(tmp_path, capsys, monkeypatch):
    """--dump-hlo naming a file is refused before anything compiles (it failed after minutes, with a traceback);
    --platform tpu without a slice compiled for the local CPU and said "fits"; --platform cuda ignored --topology.
    Overrides may come after the options, as in train and eval."""
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled")

    monkeypatch.setattr(aot, "compile_train_step", no_compile)
    afile = tmp_path / "afile"
    afile.write_text("")
    for argv, says in ((["--dump-hlo", str(afile)], "is a file, not a directory"),
                       (["--platform", "tpu"], "--platform tpu needs a TPU slice: pass --topology"),
                       (["--platform", "cuda", "--topology", "v5e:4x8"], "drop one of them"),
                       (["rollout.group_size=8", "--config", "default", "perf.nonsense=1", "--platform", "tpu"],
                        "perf.nonsense")):  # fmt: skip
        assert compile_cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
