# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""End-to-end trainer tests: a tiny run on CPU, kill-and-resume equality, 8-device equality, bad-input messages."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxgrpo import build, groups, metrics_log, rewards, trainer
from jaxgrpo import config as config_lib
from jaxgrpo import train as train_cli

REPO = pathlib.Path(__file__).resolve().parents[1]

# A few steps of the default demo, small enough for CI: 8 prompts x 4 samples, 2 new tokens.
SMALL = [
    "train.steps=4",
    "rollout.prompts_per_step=8",
    "rollout.group_size=4",
    "rollout.max_new_tokens=2",
    "checkpoint.every=2",
    "log.progress=false",
    "log.tensorboard=false",
    "log.sample_every=2",
]

REQUIRED_METRICS = [
    "reward/mean", "degeneracy/collapse_rate", "degeneracy/all_pass", "degeneracy/all_fail", "degeneracy/iid_rate",
    "advantage/abs_max", "loss", "kl", "entropy", "clip/low_frac", "clip/high_frac", "grad_norm",
    "completion/len_mean", "completion/truncated_frac", "time/sample_s", "time/train_s", "throughput/tokens_per_s",
]

# Metrics that are a deterministic function of (config, seed, step): everything but wall-clock timings.
def deterministic(rec: dict) -> dict:
    # rollout/: the engine's scheduling counters (they depend on its slot count) and its tokens/s
    return {k: v for k, v in rec.items() if not k.startswith(("time/", "throughput/", "rollout/"))}


def small_config(*extra: str) -> config_lib.Config:
    return config_lib.load_config("default", [*SMALL, *extra])


def assert_records_close(a: list[dict], b: list[dict], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        da, db = deterministic(ra), deterministic(rb)
        assert da.keys() == db.keys()
        for k in da:
            np.testing.assert_allclose(da[k], db[k], rtol=rtol, atol=atol, err_msg=f"step {ra['step']} {k}")


def test_tiny_run_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    history = trainer.run(small_config(), run_dir)
    assert len(history) == 4
    recs = metrics_log.read_metrics(run_dir)
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    for rec in recs:
        missing = [k for k in REQUIRED_METRICS if k not in rec]
        assert not missing, f"metrics.jsonl lacks {missing}"
        assert all(np.isfinite(v) for v in rec.values())
        assert 0.0 <= rec["degeneracy/collapse_rate"] <= 1.0
        assert rec["degeneracy/all_pass"] + rec["degeneracy/all_fail"] <= rec["degeneracy/collapse_rate"] + 1e-6
    # the resolved config is written and loads back to the same Config
    assert config_lib.load_config(str(run_dir / "config.yaml"), []) == small_config()
    # checkpoints at steps 2 and 4, the exported policy loads back
    from jaxgrpo import checkpoint as ckpt_lib
    from jaxgrpo import models

    with ckpt_lib.CheckpointManager(ckpt_lib.run_checkpoint_dir(run_dir), keep=10, save_interval=0) as mgr:
        assert mgr.all_steps() == [2, 4]
    mcfg, params = models.load_pretrained(str(run_dir / "final"))
    assert mcfg.vocab_size == len(build.load_tokenizer("builtin:arithmetic"))
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [2, 4]


def test_kl_to_the_initial_policy(tmp_path):
    """algo.kl_coef > 0: the reference forward runs on a copy of the initial params, so the KL is 0 at the first
    step (same params) and grows as the policy moves. (Step 1's groups are all degenerate here: its gradient is 0 or
    float noise, which Adam may or may not turn into a move, so step 2's KL is 0 or tiny; step 3 follows a real
    update.)"""
    history = trainer.run(small_config("algo.kl_coef=0.5", "optim.learning_rate=1e-2", "train.steps=3",
                                       "checkpoint.every=0", "checkpoint.export_final=false"), tmp_path / "run")
    kl = [rec["kl"] for rec in history]
    assert abs(kl[0]) < 1e-6 and 0 <= kl[1] < kl[2] and kl[2] > 1e-3, kl
    assert all(np.isfinite(rec["loss"]) for rec in history)


def test_a_perf_switch_that_does_not_apply_is_reported_once(tmp_path, capsys):
    """perf.prompt_packing=true without prefix sharing: turned off, said once on stderr at startup (not again per
    step), and written with the applied switches to <run_dir>/perf.yaml."""
    import yaml

    cfg = small_config("perf.prefix_sharing=false", "perf.prompt_packing=true", "train.steps=2", "checkpoint.every=0",
                       "checkpoint.export_final=false")
    trainer.run(cfg, tmp_path / "run")
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "perf.prompt_packing=true does not apply" in line]
    assert len(notes) == 1 and notes[0].startswith("jaxgrpo: ") and "prefix_sharing" in notes[0], err
    info = yaml.safe_load((tmp_path / "run" / trainer.PERF_FILE).read_text())
    assert info["applied"]["prompt_packing"] is False and info["applied"]["remat"] == "projections"
    assert info["applied"]["matmul_backward"] in ("explicit", "xla")  # "auto" resolved for the platform
    assert info["notes"] == [notes[0].removeprefix("jaxgrpo: ")]
    trainer.Trainer(small_config(), tmp_path / "quiet")  # everything applies: nothing said
    assert "does not apply" not in capsys.readouterr().err
    assert yaml.safe_load((tmp_path / "quiet" / trainer.PERF_FILE).read_text())["notes"] == []


@pytest.mark.slow
def test_default_demo_learns(tmp_path):
    """`python -m jaxgrpo.train` with no arguments: reward from near chance to >= 0.9; the collapse rate starts
    high (all-fail groups), falls while groups are mixed, and rises again as they turn all-pass."""
    cfg = config_lib.load_config("default", ["log.progress=false", "log.tensorboard=false"])
    trainer.run(cfg, tmp_path / "run")
    recs = metrics_log.read_metrics(tmp_path / "run")
    reward = np.array([r["reward/mean"] for r in recs])
    collapse = np.array([r["degeneracy/collapse_rate"] for r in recs])
    all_fail = np.array([r["degeneracy/all_fail"] for r in recs])
    all_pass = np.array([r["degeneracy/all_pass"] for r in recs])
    assert len(recs) == cfg.train.steps
    assert reward[:5].mean() < 0.1  # chance is 1/60
    assert reward[-20:].mean() >= 0.9
    lowest = int(np.argmin(np.convolve(collapse, np.ones(10) / 10, mode="valid")))
    assert collapse[:10].mean() > 0.4 and all_fail[:10].mean() > 0.4
    assert collapse[lowest:lowest + 10].mean() < 0.1
    assert collapse[-20:].mean() > 0.4 and all_pass[-20:].mean() > 0.4


@pytest.mark.parametrize("every", [2, 0])  # 0: no periodic checkpoint, the one at the end still written
def test_second_run_in_same_dir_resumes_and_does_nothing_more(tmp_path, every):
    run_dir = tmp_path / "run"
    cfg = small_config(f"checkpoint.every={every}")
    trainer.run(cfg, run_dir)
    assert trainer.run(cfg, run_dir) == []  # already at train.steps: nothing to do
    assert [r["step"] for r in metrics_log.read_metrics(run_dir)] == [1, 2, 3, 4]


def _train_cmd(run_dir: pathlib.Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "jaxgrpo.train", "--run-dir", str(run_dir), *SMALL, *extra]


def _env() -> dict:
    env = dict(os.environ)
    env.pop("JAXGRPO_MALLOC", None)  # the CLI's default malloc mode, whatever the developer's shell exports
    env["XLA_FLAGS"] = os.environ.get("JAXGRPO_TEST_XLA_EXTRA", "")  # one CPU device, like a laptop (conftest)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


KILL_STEPS = ["train.steps=6", "checkpoint.every=2"]


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """The uninterrupted 6-step CLI run both kill/resume tests compare against (run once per module)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    ref = subprocess.run(_train_cmd(tmp / "ref", *KILL_STEPS), check=True, env=_env(), cwd=tmp, capture_output=True)
    return ref, metrics_log.read_metrics(tmp / "ref")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_killed_run_resumes_to_the_uninterrupted_metrics(tmp_path, how, uninterrupted_run):
    """Kill a run after its step-2 checkpoint (SIGKILL: no chance to save; SIGTERM: preemption, it saves and
    exits), re-run with the same --run-dir: the later steps' metrics equal those of an uninterrupted run."""
    steps = KILL_STEPS
    ref, reference = uninterrupted_run
    # the CLI re-executed itself with the default (keep) malloc tunables where they apply (jaxgrpo.train docstring):
    # the resumed run below runs under them too
    want = train_cli.malloc_env(_env())
    assert want is None or f"GLIBC_TUNABLES={want['GLIBC_TUNABLES']} ".encode() in ref.stderr
    assert (b"glibc.malloc.mmap_max=0" in ref.stderr) == (want is not None)
    assert len(reference) == 6

    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(_train_cmd(run_dir, *steps, "checkpoint.keep=10"), env=_env(), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpt_dir = run_dir / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline:
        done = [p for p in ckpt_dir.glob("*") if p.name.isdigit()] if ckpt_dir.exists() else []
        if any(int(p.name) >= 2 for p in done) or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL if how == "sigkill" else signal.SIGTERM)
    rc = proc.wait(timeout=120)
    if how == "sigterm":  # preempted: checkpointed, then the shell's 128 + SIGTERM with one line saying how to resume
        err = proc.stderr.read().decode()
        assert rc == 143, err[-2000:]
        assert "jaxgrpo: stopped by SIGTERM after step" in err and f"--run-dir {run_dir}" in err
    first = metrics_log.read_metrics(run_dir)
    assert 2 <= len(first) < 6, f"killed too late to test a resume ({len(first)} steps logged)"

    resumed = subprocess.run(_train_cmd(run_dir, *steps, "checkpoint.keep=10"), env=_env(), cwd=tmp_path,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_records_close(metrics_log.read_metrics(run_dir), reference)


@pytest.mark.slow
def test_eight_device_run_equals_one_device_run(tmp_path):
    """mesh data=4 x fsdp=2 on 8 fake CPU devices: the same metrics as the single-device run."""
    one = trainer.run(small_config("train.steps=3", "checkpoint.every=0", "checkpoint.export_final=false"),
                      tmp_path / "one")
    eight = trainer.run(small_config("train.steps=3", "checkpoint.every=0", "checkpoint.export_final=false",
                                     "mesh.data=4", "mesh.fsdp=2"), tmp_path / "eight")
    for a, b in zip(one, eight):
        for k in deterministic(a):
            np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5, err_msg=k)


# -- bad input ------------------------------------------------------------------------------------------------------


def test_malloc_env():
    # JAX_PLATFORMS=cpu: the CPU backend whatever accelerator plugins are installed (CI installs libtpu and the CUDA
    # plugin for the compile checks, and without JAX_PLATFORMS an installed plugin means an accelerator backend)
    env, glibc = {"PATH": "/bin", "JAX_PLATFORMS": "cpu"}, ("glibc", "2.36")
    keep_tunables = f"glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold={2**62}"
    got = train_cli.malloc_env(env, thp_mode="madvise", libc=glibc)  # the default mode is keep
    assert got == {**env, "GLIBC_TUNABLES": f"glibc.malloc.hugetlb=1:{keep_tunables}"}
    assert train_cli.malloc_env(got, thp_mode="madvise", libc=glibc) is None  # after the re-exec: nothing to add
    assert train_cli.malloc_env(env, thp_mode="never", libc=glibc)["GLIBC_TUNABLES"] == keep_tunables
    huge = {"JAXGRPO_MALLOC": "hugepages", "JAX_PLATFORMS": "cpu"}
    assert train_cli.malloc_env(huge, thp_mode="always", libc=glibc)["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    keep = train_cli.malloc_env({"JAXGRPO_MALLOC": "keep", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2",
                                 "JAX_PLATFORMS": "cpu"}, thp_mode="always", libc=glibc)  # fmt: skip
    assert keep["GLIBC_TUNABLES"] == ("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:"
                                      f"glibc.malloc.trim_threshold={2**62}")  # the user's arena_max is kept
    # nothing to do: opted out, THP off (hugepages mode), musl or an older glibc
    assert train_cli.malloc_env({"JAXGRPO_MALLOC": "default"}, thp_mode="always", libc=glibc) is None
    assert train_cli.malloc_env(huge, thp_mode="never", libc=glibc) is None
    assert train_cli.malloc_env(env, thp_mode="madvise", libc=("", "")) is None
    assert train_cli.malloc_env(env, thp_mode="madvise", libc=("glibc", "2.34")) is None
    # a CPU-only workaround: nothing with an accelerator backend
    assert train_cli.malloc_env(env, thp_mode="madvise", libc=glibc, cpu=False) is None
    assert train_cli.malloc_env({**env, "JAX_PLATFORMS": "cuda"}, thp_mode="madvise", libc=glibc) is None
    assert train_cli.malloc_env({**env, "JAX_PLATFORMS": "cpu"}, thp_mode="madvise", libc=glibc) is not None
    assert train_cli.cpu_backend({"JAX_PLATFORMS": "tpu,cpu"}) is False
    assert train_cli.cpu_backend({"JAX_PLATFORMS": "cpu"}) is True
    with pytest.raises(ValueError, match="JAXGRPO_MALLOC='huge' is not one of"):
        train_cli.malloc_env({"JAXGRPO_MALLOC": "huge"}, thp_mode="always", libc=glibc)
    out = subprocess.run([sys.executable, "-m", "jaxgrpo.train"], capture_output=True, text=True,
                         env={**_env(), "JAXGRPO_MALLOC": "huge"}, cwd=REPO)  # fmt: skip
    assert out.returncode == 2 and "JAXGRPO_MALLOC='huge'" in out.stderr and "Traceback" not in out.stderr


def test_bad_config_key_is_a_clean_error():
    out = subprocess.run([sys.executable, "-m", "jaxgrpo.train", "algo.estimatr=sign"], capture_output=True,
                         text=True, env=_env(), cwd=REPO)
    assert out.returncode == 2
    assert "algo.estimator" in out.stderr and "Traceback" not in out.stderr


def test_missing_model_file_is_a_clean_error(tmp_path):
    cfg = small_config(f"model.name_or_path={tmp_path / 'nope.gguf'}")
    with pytest.raises(config_lib.ConfigError,
                       match=r"neither 'tiny', 'smollm2', a Hugging Face Hub id \(org/name\) nor an existing"):
        trainer.Trainer(cfg, tmp_path / "run")


@pytest.mark.parametrize("where, match", [
    ("nope", r"model.tokenizer='.*nope' is neither 'builtin:arithmetic', a Hugging Face Hub id"),
    ("nope.gguf", r"model.tokenizer='.*nope.gguf' is neither"),
    ("", r"no tokenizer could be loaded from '.*' \((OSError|ValueError): .*\); "
         r"set model.tokenizer to an HF tokenizer"),
])
def test_a_tokenizer_that_is_not_there_is_a_clean_error(tmp_path, where, match):
    (tmp_path / "empty").mkdir()
    cfg = small_config(f"model.tokenizer={tmp_path / 'empty' / where}")
    with pytest.raises(config_lib.ConfigError, match=match):
        trainer.Trainer(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_missing_gguf_tokenizer_named_like_a_hub_id_is_not_fetched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "missing/tok.gguf" reads as org/name but is a file name: never sent to the Hub
    monkeypatch.setattr(build, "download_from_hub", lambda *a, **k: pytest.fail("a .gguf file was fetched"))
    with pytest.raises(config_lib.ConfigError, match=r"model.tokenizer='missing/tok.gguf' is neither"):
        build.load_tokenizer("missing/tok.gguf")


def test_prompt_longer_than_the_context_is_a_clean_error(tmp_path):
    cfg = small_config("model.max_position_embeddings=12", "rollout.max_new_tokens=8")
    with pytest.raises(config_lib.ConfigError, match="exceeds the model's context"):
        trainer.Trainer(cfg, tmp_path / "run")


def test_greedy_rollouts_are_a_clean_error(tmp_path):
    with pytest.raises(config_lib.ConfigError, match="rollout.temperature=0.0"):
        trainer.Trainer(small_config("rollout.temperature=0"), tmp_path / "run")


FAILING_REWARDS = """
def raising_reward(completion, example):
    raise ZeroDivisionError("boom")

def nan_reward(completion, example):
    return float("nan")
"""


@pytest.fixture
def failing_rewards(tmp_path, monkeypatch):
    (tmp_path / "failing_rewards.py").write_text(FAILING_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize("fn", ["raising_reward", "nan_reward"])
def test_failing_reward_names_the_function(tmp_path, failing_rewards, fn):
    cfg = small_config("data.rewards.arithmetic=null", f"data.rewards.failing_rewards:{fn}=1.0")
    with pytest.raises(rewards.RewardError, match=fn):
        trainer.run(cfg, tmp_path / "run")


def test_failing_reward_can_invalidate_instead(tmp_path, failing_rewards):
    cfg = small_config("data.rewards.failing_rewards:nan_reward=1.0", "algo.on_reward_error=invalidate",
                       "train.steps=1", "checkpoint.every=0", "checkpoint.export_final=false")
    (rec,) = trainer.run(cfg, tmp_path / "run")
    assert rec["tokens/loss"] == 0.0  # every sample invalid: nothing enters the loss
    assert np.isfinite(rec["loss"])


# -- dynamic sampling -----------------------------------------------------------------------------------------------


def _fake_rollout(rewards: np.ndarray, tag: int) -> groups.Rollout:
    """A rollout whose completions encode (tag, prompt, sample) so merged rows can be traced back."""
    from jaxgrpo import sampling
    from jaxgrpo.data import Example

    p, g = rewards.shape
    ids = np.array([[tag * 100 + i] for i in range(p * g)], np.int32)
    comp = sampling.Completions(tokens=ids, logprobs=np.zeros(ids.shape, np.float32), mask=np.ones(ids.shape, bool),
                                lengths=np.ones(p * g, np.int32), truncated=np.ones(p * g, bool))
    return groups.Rollout(prompt_ids=[[tag, i] for i in range(p)],
                           examples=[Example(f"{tag}.{i}", "0") for i in range(p)], completions=comp,
                           texts=[f"{tag}.{i // g}.{i % g}" for i in range(p * g)], rewards=rewards.astype(np.float32),
                           valid=np.ones((p, g), bool))


def test_dynamic_sampling_keeps_informative_groups_until_full(tmp_path, monkeypatch):
    tr = trainer.Trainer(small_config("algo.degenerate_groups=resample", "algo.resample_max_rounds=5"), tmp_path)
    monkeypatch.setattr(trainer.Trainer, "use_engine", False)  # round-level resampling (the engine's: test_engine_*)
    flat, mixed = [0, 0, 0, 0], [1, 0, 0, 0]
    rounds = [  # 8 prompts per round; informative groups: 2, then 3, then 4 (only 3 of them needed)
        np.array([mixed, flat, flat, mixed, flat, flat, flat, flat]),
        np.array([flat, mixed, flat, flat, mixed, mixed, flat, flat]),
        np.array([mixed, mixed, flat, mixed, flat, mixed, flat, flat]),
    ]
    calls = []

    def fake_sample(indices, key):
        calls.append(list(indices))
        return _fake_rollout(rounds[len(calls) - 1], len(calls))

    monkeypatch.setattr(tr, "sample", fake_sample)
    roll, extra = tr.rollout(0)
    assert len(calls) == 3 and all(len(c) == 8 for c in calls)
    assert extra["resample/rounds"] == 3.0
    assert extra["resample/informative_frac"] == 1.0
    assert extra["resample/discarded_groups"] == 3 * 8 - 8  # sampled but not trained on
    assert extra["resample/degenerate_frac"] == (6 + 5 + 4) / 24
    assert extra["tokens/sampled"] == 3 * 8 * 4  # every round's completions (1 token each), discarded ones too
    assert roll.prompt_ids == [[1, 0], [1, 3], [2, 1], [2, 4], [2, 5], [3, 0], [3, 1], [3, 3]]
    assert roll.rewards.shape == (8, 4) and (roll.rewards[:, 0] == 1).all()
    assert roll.texts[4:8] == ["1.3.0", "1.3.1", "1.3.2", "1.3.3"]  # whole groups move together, in order
    np.testing.assert_array_equal(np.asarray(roll.completions.tokens)[4:8, 0], [112, 113, 114, 115])


def test_dynamic_sampling_round_limit_fills_with_degenerate_groups(tmp_path, monkeypatch):
    tr = trainer.Trainer(small_config("algo.degenerate_groups=resample", "algo.resample_max_rounds=2"), tmp_path)
    monkeypatch.setattr(trainer.Trainer, "use_engine", False)  # round-level resampling (the engine's: test_engine_*)
    flat, mixed = [1, 1, 1, 1], [1, 0, 1, 0]
    rounds = [np.array([mixed] + [flat] * 7), np.array([flat, mixed] + [flat] * 6)]
    monkeypatch.setattr(tr, "sample", lambda indices, key: _fake_rollout(rounds.pop(0), 2 - len(rounds)))
    roll, extra = tr.rollout(0)
    assert extra["resample/rounds"] == 2.0 and extra["resample/discarded_groups"] == 8
    assert extra["resample/degenerate_frac"] == 14 / 16
    assert roll.prompt_ids[:2] == [[1, 0], [2, 1]]  # the informative groups first, then degenerate fill
    assert extra["resample/informative_frac"] == 2 / 8
    assert extra["tokens/sampled"] == 2 * 8 * 4


def test_token_budget_stops_at_the_first_step_boundary_past_it(tmp_path):
    budget = 100  # 8 prompts x 4 samples of 1-2 tokens: 32-64 tokens a step, so 2-4 steps
    cfg = small_config("train.steps=50", f"train.max_sampled_tokens={budget}", "checkpoint.every=0",
                       "checkpoint.export_final=false")
    history = trainer.run(cfg, tmp_path / "run")
    per_step = [rec["tokens/sampled"] for rec in history]
    # independent count: the completion lengths of each step's 32 rows
    np.testing.assert_allclose(per_step, [rec["completion/len_mean"] * 32 for rec in history])
    totals = np.cumsum(per_step)
    assert totals[-1] >= budget and (len(totals) == 1 or totals[-2] < budget)
    assert 2 <= len(history) <= 4
    assert [rec["tokens/sampled_total"] for rec in history] == totals.tolist()


TWO_PROCESS_TRAIN = r"""
from jaxgrpo import config as config_lib, trainer
from test_train import SMALL
cfg = config_lib.load_config("default", [*SMALL, "train.steps=2", "checkpoint.every=0",
                                         "checkpoint.export_final=false", "mesh.data=4", "mesh.fsdp=2"])
history = trainer.run(cfg, os.path.join(os.path.dirname(out), "run"))
if pid == 0:
    np.savez(out, **{f"{i}:{k}": v for i, rec in enumerate(history) for k, v in rec.items()})
"""


@pytest.mark.slow
def test_two_process_run_equals_one_process_run(tmp_path):
    """Multi-host trainer: two jax.distributed processes (4 CPU devices each) sample the global rollout, score it,
    and each feeds its share of groups to the step; the metrics equal the single-process 8-device run."""
    from multihost import run_two_processes

    got = run_two_processes(TWO_PROCESS_TRAIN, tmp_path)
    want = trainer.run(small_config("train.steps=2", "checkpoint.every=0", "checkpoint.export_final=false",
                                    "mesh.data=4", "mesh.fsdp=2"), tmp_path / "one")
    for i, rec in enumerate(want):
        for k, v in deterministic(rec).items():
            np.testing.assert_allclose(got[f"{i}:{k}"], v, rtol=1e-4, atol=1e-5, err_msg=f"step {i + 1} {k}")


STEP_IMPORTS = r"""
import json, sys
import jax
from jaxgrpo import config as config_lib, trainer

def context_names():
    try:
        return list(jax._src.config.trace_context_names())
    except (AttributeError, NotImplementedError):  # a jaxlib that cannot name them
        return []

step, seen = trainer.Trainer.step, []

def recorded(self, s):
    modules, names = set(sys.modules), context_names()
    out = step(self, s)
    seen.append({"jax_modules": sorted(m for m in set(sys.modules) - modules if m.split(".")[0].startswith("jax")),
                 "new_context": [n for n in context_names() if n not in names]})
    return out

trainer.Trainer.step = recorded
trainer.run(config_lib.load_config("default", json.loads(sys.argv[1])), sys.argv[2])
print(json.dumps(seen))
"""


def test_a_training_step_imports_nothing_of_jax(tmp_path):
    """Every module of jax (and of jaxgrpo that imports jax) that a step uses is imported before the first step
    traces. A module imported in the middle of a step can register a jax config state that jit's tracing keys carry:
    every key traced before it then misses and the next step retraces and recompiles (on jax 0.11 the Pallas TPU
    import in the vocabulary draw did, 7 programs recompiled at step 2 on a GPU; on jax 0.10 the same import registers
    no state, so this checks the import itself). A fresh interpreter: this test process has imported everything."""
    steps = [*SMALL, "train.steps=2", "checkpoint.every=0", "checkpoint.export_final=false"]
    out = subprocess.run([sys.executable, "-c", STEP_IMPORTS, json.dumps(steps), str(tmp_path / "run")], env=_env(),
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(seen) == 2
    for i, step in enumerate(seen, 1):
        assert step == {"jax_modules": [], "new_context": []}, f"step {i}: {step}"
