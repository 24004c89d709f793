# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Runs that survive what schedulers and users do to them (issue 34): a damaged newest checkpoint (four kinds) is
moved aside and the run resumes from the previous step to the uninterrupted run's metrics; preemption exit codes;
a fatal reward error checkpoints first; the run lock; the resume-config check; checks that run before the model
loads and leave no empty run directory; ``--help`` without JAX."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from jaxgrpo import build, metrics_log, trainer
from jaxgrpo import checkpoint as ckpt_lib
from jaxgrpo import config as config_lib
from jaxgrpo import run_dir as run_dir_lib
from jaxgrpo import train as train_cli

REPO = pathlib.Path(__file__).resolve().parents[1]

# The tiny demo of tests/test_train.py (same shapes: its compilations are the suite's already), scored by `flaky`,
# which is the arithmetic reward until the file named by $JAXGRPO_TEST_REWARD_FAIL exists and its first step is over.
FLAKY = """
import os
from jaxgrpo.reward_fns import arithmetic_correct

calls = 0

def flaky(completion, example):
    global calls
    calls += 1
    flag = os.environ.get("JAXGRPO_TEST_REWARD_FAIL")
    if flag and os.path.exists(flag) and calls > 32:  # one step: 8 prompts x 4 samples
        raise RuntimeError("the reward service is down")
    return arithmetic_correct(completion, example)
"""
SMALL = ["rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=2", "log.progress=false",
         "log.tensorboard=false", "log.sample_every=0", "checkpoint.export_final=false", "checkpoint.keep=5",
         "data.rewards.arithmetic=null", "data.rewards.faults_flaky:flaky=1.0"]


def small(*extra: str) -> config_lib.Config:
    return config_lib.load_config("default", [*SMALL, *extra])


@pytest.fixture(scope="module", autouse=True)
def flaky_module(tmp_path_factory):
    """Makes `faults_flaky` importable (the reward of every config here)."""
    root = tmp_path_factory.mktemp("faults")
    (root / "faults_flaky.py").write_text(FLAKY)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


@pytest.fixture(scope="module")
def reference(flaky_module):
    """An uninterrupted 2-step run with a checkpoint after each step: the run every damaged copy must get back to."""
    run = flaky_module / "reference"
    trainer.run(small("train.steps=2", "checkpoint.every=1"), run)
    return run


def data_files(step_dir: pathlib.Path) -> list[pathlib.Path]:
    return [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]


def corrupt(step_dir: pathlib.Path, kind: str) -> None:
    """Damages a complete checkpoint step the ways disks, copies and users do (issue 34's four kinds)."""
    if kind == "truncated":
        for f in data_files(step_dir):
            os.truncate(f, f.stat().st_size // 2)
    elif kind == "overwritten":
        for f in data_files(step_dir):
            f.write_bytes(np.random.default_rng(0).bytes(f.stat().st_size))
    elif kind == "empty_metadata":
        (step_dir / "state" / "_METADATA").write_text("")
    elif kind == "no_extra":
        (step_dir / "extra" / "metadata").unlink()
    else:
        raise ValueError(kind)


KINDS = ["truncated", "overwritten", "empty_metadata", "no_extra", "shape_mismatch"]


@pytest.mark.parametrize("kind", KINDS)
def test_manager_walks_back_past_a_damaged_step(tmp_path, kind):
    """restore_newest: the damaged step 2 is renamed to 2.unrestorable (one line naming it and why) and step 1's
    values come back; a shape mismatch is step 2 overwritten by another model's checkpoint."""
    state = {"w": np.arange(32, dtype=np.float32).reshape(8, 4), "b": np.ones(3, np.float32)}
    directory = tmp_path / "ck"
    with ckpt_lib.CheckpointManager(directory, keep=5) as mgr:
        mgr.save(1, state, {"at": 1})
        mgr.save(2, {k: v + 1 for k, v in state.items()}, {"at": 2})
    if kind == "shape_mismatch":
        with ckpt_lib.CheckpointManager(tmp_path / "other", keep=5) as other:
            other.save(2, {"w": np.zeros((4, 4), np.float32), "b": np.ones(3, np.float32)}, {"at": 2})
        shutil.rmtree(directory / "2")
        shutil.copytree(tmp_path / "other" / "2", directory / "2")
    else:
        corrupt(directory / "2", kind)
    lines = []
    with ckpt_lib.CheckpointManager(directory, keep=5) as mgr:
        step, (restored, extra) = mgr.restore_newest(lambda s: mgr.restore(s, state), say=lines.append)
        assert step == 1 and extra == {"at": 1} and mgr.all_steps() == [1]
    np.testing.assert_array_equal(restored["w"], state["w"])
    assert (directory / "2.unrestorable" / "state").is_dir() and not (directory / "2").exists()
    assert len(lines) == 1 and "checkpoint step 2 does not restore" in lines[0] and "2.unrestorable" in lines[0]


class RaisesOnCollection:
    """An object whose finalizer raises: CPython hands that exception to `sys.unraisablehook`, as it does the
    callback a damaged step's failed read leaves on orbax's closed event loop."""

    def __init__(self, exc: Exception):
        self.exc = exc

    def __del__(self):
        raise self.exc


def test_the_walk_back_drops_the_closed_loop_callback_and_nothing_else(tmp_path, monkeypatch):
    """While `restore_newest` walks back, the unraisable "Event loop is closed" (orbax's loop, closed by a failed
    read while another read finished) is not printed; any other unraisable exception still reaches the installed
    hook, and after the walk back the hook is the installed one again."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: seen.append(repr(args.exc_value)))
    with ckpt_lib.CheckpointManager(tmp_path / "ck", keep=5) as mgr:
        mgr.save(1, {"w": np.ones(3, np.float32)}, {})

        def attempt(step):
            RaisesOnCollection(RuntimeError("Event loop is closed"))  # collected at once: reference count 0
            RaisesOnCollection(ValueError("a finalizer of the user's"))
            return step

        assert mgr.restore_newest(attempt) == (1, 1)
    assert seen == ["ValueError(\"a finalizer of the user's\")"]
    RaisesOnCollection(RuntimeError("Event loop is closed"))
    assert seen[1:] == ["RuntimeError('Event loop is closed')"]


def test_no_restorable_step_is_one_error_and_nothing_moves(tmp_path):
    directory = tmp_path / "ck"
    with ckpt_lib.CheckpointManager(directory, keep=5) as mgr:
        for s in (1, 2):
            mgr.save(s, {"w": np.ones(3, np.float32)}, {})
    for s in (1, 2):
        corrupt(directory / str(s), "no_extra")
    # every step fails (no extra/metadata): one error lists both, nothing moves
    with ckpt_lib.CheckpointManager(directory, keep=5) as mgr:
        with pytest.raises(ckpt_lib.CheckpointError, match=r"no checkpoint under .* restores: step 2: .*; step 1: "):
            mgr.restore_newest(lambda s: mgr.restore(s, {"w": np.ones(3, np.float32)}))
        assert mgr.all_steps() == [1, 2]
    assert sorted(p.name for p in directory.iterdir()) == ["1", "2"]
    with ckpt_lib.CheckpointManager(tmp_path / "empty", keep=5) as mgr:
        assert mgr.restore_newest(lambda s: s) is None


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_resumes_from_the_previous_step_and_finishes(reference, tmp_path):
    """For each of the four kinds: step 2 of a copy of the reference run is damaged; re-running moves it aside,
    resumes from step 1 and finishes step 2 with the reference's metrics (the resume is exact); eval walks back the
    same way."""
    want = metrics_log.read_metrics(reference)
    for kind in ["truncated", "overwritten", "empty_metadata", "no_extra"]:
        run = tmp_path / kind
        shutil.copytree(reference, run)
        corrupt(run / "checkpoints" / "2", kind)
        history = trainer.run(small("train.steps=2", "checkpoint.every=1"), run)
        assert len(history) == 1, kind  # step 2 again, from step 1
        assert (run / "checkpoints" / "2.unrestorable").is_dir() and (run / "checkpoints" / "2").is_dir(), kind
        got = metrics_log.read_metrics(run)
        assert [r["step"] for r in got] == [1, 2], kind
        for k, v in want[1].items():
            if not k.startswith(("time/", "throughput/")) and not k.endswith("_per_s"):  # timings
                np.testing.assert_allclose(got[1][k], v, rtol=1e-5, atol=1e-6, err_msg=f"{kind}: {k}")
    from jaxgrpo import eval as eval_lib

    run = tmp_path / "eval"
    shutil.copytree(reference, run)
    corrupt(run / "checkpoints" / "2", "truncated")
    policy = eval_lib.load_policy_for_eval(small("train.steps=2", "checkpoint.every=1"), run, None)
    assert policy.step == 1 and (run / "checkpoints" / "2.unrestorable").is_dir()


@pytest.mark.slow
def test_a_checkpoint_of_the_former_optimizer_layout_resumes_exactly(reference, tmp_path, capsys):
    """Checkpoints written before the learning rate became a runtime argument hold the state of
    ``optax.chain(clip_by_global_norm, optax.adamw(schedule))`` (a schedule count after Adam's and the decay's
    states). Step 1 of the reference run is rewritten in that layout, built here by optax itself; the resume says so
    in one line, restores the same moments, and its step 2 equals the reference's."""
    import optax

    from jaxgrpo.learner import optim as optim_lib

    cfg = small("train.steps=2", "checkpoint.every=1")
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    shutil.rmtree(run / "checkpoints" / "2")
    t = trainer.Trainer(small("train.steps=1", "checkpoint.every=1"), run)  # restores step 1 (current layout)
    try:
        state, extra = t.saved_state(), t.checkpoint_extra()
    finally:
        t.close()
    o = cfg.optim
    former = optax.chain(optax.clip_by_global_norm(o.max_grad_norm), optax.adamw(
        lambda count: 0.0, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=optim_lib._decay_mask))
    old = former.init(state.params)
    clip, adam, decay = state.opt_state  # the current layout: make_direction's chain
    old = (clip, (adam, decay, old[1][2]._replace(count=np.int32(1))))  # one optimizer update so far
    shutil.rmtree(run / "checkpoints" / "1")
    with ckpt_lib.CheckpointManager(run / "checkpoints", keep=5) as mgr:
        mgr.save(1, state.replace(opt_state=old), extra, force=True)
    capsys.readouterr()
    (rec,) = trainer.run(cfg, run)
    err = capsys.readouterr().err
    assert "checkpoint step 1 holds the optimizer state of jaxgrpo before the runtime learning rate" in err, err
    want = metrics_log.read_metrics(reference)[1]
    for k in ("loss", "reward/mean", "grad_norm", "lr", "kl"):
        np.testing.assert_allclose(rec[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.slow
def test_a_fatal_reward_error_checkpoints_first_and_the_resume_is_exact(reference, tmp_path, monkeypatch):
    """The reward raises during step 2 (checkpoint.every=0: no cadence save): step 1 is checkpointed with the prompt
    iterator put back, the error says so in one line, and the resumed run's step 2 equals the reference's."""
    flag = tmp_path / "fail"
    flag.touch()
    monkeypatch.setenv("JAXGRPO_TEST_REWARD_FAIL", str(flag))
    import faults_flaky

    monkeypatch.setattr(faults_flaky, "calls", 0)
    run = tmp_path / "run"
    cfg = small("train.steps=2", "checkpoint.every=0")
    with pytest.raises(trainer.rewards.RewardError, match="step 1 is checkpointed") as info:
        trainer.run(cfg, run)
    assert "\n" not in str(info.value)
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()] == ["1"]
    flag.unlink()
    (rec,) = trainer.run(cfg, run)
    want = metrics_log.read_metrics(reference)[1]
    for k in ("loss", "reward/mean", "grad_norm", "kl"):
        np.testing.assert_allclose(rec[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.slow
def test_sigint_checkpoints_and_stops_with_130(reference, tmp_path):
    """SIGINT during step 1 of 2: the step finishes, is checkpointed, and Preempted carries exit code 130 and the
    resume command; the CLI turns it into that exit status with one line."""
    run = tmp_path / "run"
    cfg = small("train.steps=2", "checkpoint.every=0")
    original = trainer.Trainer.step

    def step_then_signal(self, step):
        out = original(self, step)
        threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT)).start()
        threading.Event().wait(0.5)  # the handler runs in the main thread, between bytecodes
        return out

    trainer.Trainer.step = step_then_signal
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(ckpt_lib.Preempted) as info:
            trainer.run(cfg, run)
    finally:
        trainer.Trainer.step = original
    assert info.value.exit_code == 130 and info.value.step == 1
    assert "SIGINT after step 1" in str(info.value) and f"--run-dir {run}" in str(info.value)
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()] == ["1"]
    assert signal.getsignal(signal.SIGINT) is before  # the handlers were put back


def test_cli_exit_status_of_preemption(monkeypatch, capsys, tmp_path):
    for signum, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        def stopped(cfg, run_dir, allow_config_change=False, signum=signum):
            raise ckpt_lib.Preempted(signum, 7, run_dir)

        monkeypatch.setattr(trainer, "run", stopped)
        assert train_cli.main(["--run-dir", str(tmp_path / "r")]) == code
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "after step 7" in err and "resume with: python -m jaxgrpo.train --config" in err


def test_the_run_lock(tmp_path):
    """A held lock stops a second trainer before its model loads; a lock file left by a dead pid is taken over."""
    run = tmp_path / "run"
    run.mkdir()
    with run_dir_lib.RunLock(run):
        assert (run / ".lock").read_text().strip() == str(os.getpid())
        with pytest.raises(config_lib.ConfigError, match=rf"in use by another trainer \(pid {os.getpid()}"):
            run_dir_lib.RunLock(run).acquire()
        with pytest.raises(config_lib.ConfigError, match="in use by another trainer"):
            trainer.Trainer(small(), run)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / ".lock").write_text(f"{dead.pid}\n")
    said = []
    lock = run_dir_lib.RunLock(run).acquire(say=said.append)
    assert said == [f"jaxgrpo: took over the lock of {run} left by pid {dead.pid}, which is gone"]
    lock.release()
    assert (run / ".lock").read_text() == ""


def test_a_resume_with_another_config_is_refused_unless_allowed(reference, tmp_path):
    changed = small("train.steps=2", "checkpoint.every=1", "optim.learning_rate=0.5", "algo.estimator=rloo")
    with pytest.raises(config_lib.ConfigError, match=r"algo.estimator: 'grpo' -> 'rloo', optim.learning_rate: "
                       r"[0-9.e-]+ -> 0.5; .*--allow-config-change") as info:
        trainer.Trainer(changed, reference)
    assert "\n" not in str(info.value)
    saved = __import__("yaml").safe_load((reference / "config.yaml").read_text())
    free = small("train.steps=9", "checkpoint.every=1", "log.every=3", "log.tensorboard=true", "perf.precompile=off")
    assert run_dir_lib.config_changes(saved, free) == {}  # the step budget, logging and precompiling may change
    assert set(run_dir_lib.config_changes(saved, changed)) == {"algo.estimator", "optim.learning_rate"}
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    t = trainer.Trainer(changed, run, allow_config_change=True)
    t.close()
    rec = __import__("json").loads((run / "config_changes.jsonl").read_text())
    assert rec["step"] == 2 and rec["changes"]["algo.estimator"] == ["grpo", "rloo"]
    assert config_lib.load_config(str(run / "config.yaml")) == changed


def test_resume_compares_what_loading_keeps_and_mappings_whole(reference, tmp_path):
    """A saved config holding a retired key at its off value resumes (loading drops the key); a reward added at its
    default weight is a change (the rewards are compared whole); a URL as a run directory and a damaged config.yaml
    are one-line errors."""
    saved = __import__("yaml").safe_load((reference / "config.yaml").read_text())
    same = config_lib.load_config(str(reference / "config.yaml"))
    assert run_dir_lib.config_changes({**saved, "perf": {**saved["perf"], "reuse_projections": False}}, same) == {}
    more = dataclasses.replace(same, data=dataclasses.replace(same.data, rewards={**same.data.rewards,
                                                                                 "arithmetic": 1.0}))  # fmt: skip
    assert more.data.rewards != same.data.rewards
    assert set(run_dir_lib.config_changes(saved, more)) == {"data.rewards"}
    with pytest.raises(config_lib.ConfigError, match="a run directory is a filesystem path, not a URL"):
        run_dir_lib.check_path("gs://bucket/run")
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    (run / "config.yaml").write_text("train: {steps: [\n")
    with pytest.raises(config_lib.ConfigError, match=r"config.yaml is not valid YAML .*pass a new --run-dir") as e:
        run_dir_lib.check_resume_config(same, run, allow=False)
    assert "\n" not in str(e.value)


def _no_model(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the model was loaded before a check that needs none")

    monkeypatch.setattr(build, "build_policy", refuse)


@pytest.mark.parametrize("extra, match", [
    (["data.num_examples=6"], r"the data set has 6 prompts but rollout.prompts_per_step=8: .*"
                              r"set rollout.prompts_per_step=6"),
    (["data.num_examples=6", "algo.grad_accum_steps=4"], r"set rollout.prompts_per_step=4 \(a multiple of 4"),
    (["data.source=gsm8k", "data.path=/nonexistent/gsm8k", "data.rewards={gsm8k: 1.0}"], "/nonexistent/gsm8k"),
    (["data.tools=[jaxgrpo.rollout.tools:calculator]", "data.template=plain"],
     "multi-turn rollouts need the chat template"),
    (["data.tools=[json:dumps]"], "tool dumps has no usable JSON schema"),
])
def test_data_checks_run_before_the_model_and_leave_no_run_dir(tmp_path, monkeypatch, extra, match):
    _no_model(monkeypatch)
    run = tmp_path / "new" / "run"
    with pytest.raises(config_lib.ConfigError, match=match):
        trainer.Trainer(config_lib.load_config("default", [*SMALL[:3], *extra]), run)
    assert not (tmp_path / "new" / "run").exists()


def test_a_start_that_fails_after_creating_the_run_dir_removes_it(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(config_lib.ConfigError, match="model.name_or_path"):
        trainer.Trainer(small(f"model.name_or_path={tmp_path / 'missing.gguf'}"), run)
    assert not run.exists()


def test_divisibility_error_names_the_value_to_set():
    with pytest.raises(config_lib.ConfigError, match=r"set rollout.prompts_per_step=8 or algo.grad_accum_steps=3"):
        config_lib.load_config("default", ["rollout.prompts_per_step=6", "algo.grad_accum_steps=4"])


@pytest.mark.parametrize("text, says", [
    ('{"model_type": "mistral", "architectures": ["MistralForCausalLM"], "vocab_size": 64, "hidden_size": 32, '
     '"intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4}', "unsupported architecture"),
    ('{"model_type": "llama",', "config.json is not valid JSON"),
])  # fmt: skip
def test_a_model_of_another_architecture_or_a_damaged_config_is_one_line(tmp_path, capsys, text, says):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(text)
    assert train_cli.main([f"model.name_or_path={model}", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and says in err and "Traceback" not in err


def test_run_dir_naming_a_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert train_cli.main(["--run-dir", str(f)]) == 2
    assert capsys.readouterr().err == f"error: --run-dir {f} is a file, not a directory; pass a directory (new or a " \
                                      "run's)\n"
    with pytest.raises(config_lib.ConfigError, match="is a file"):
        trainer.Trainer(small(), f)


def test_help_imports_no_jax():
    """`python -m jaxgrpo.train --help` answers without importing JAX (python -X importtime lists every import)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAXGRPO_MALLOC": "default"}
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "jaxgrpo.train", "--help"], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert "--allow-config-change" in out.stdout and "143 SIGTERM" in out.stdout
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "jaxgrpo" in imported and not {m for m in imported if m == "jax" or m.startswith("jax.")}
    assert list(train_cli.SECTION_NAMES) == list(config_lib.SECTIONS)


@pytest.mark.slow
def test_exports_travel(tmp_path):
    """A 1-step LoRA run's exports: files with the user's umask (not safetensors' 0600), a tokenizer_config.json
    class that transformers 4.x and 5.x both have, loaded here by the installed transformers (same ids as the run's
    tokenizer), and a PEFT adapter whose base AutoPeftModel resolves by itself, giving the merged export's logits."""
    import json

    import peft
    import torch
    import transformers

    old = os.umask(0o027)
    try:
        run = tmp_path / "run"
        trainer.run(config_lib.load_config("default", [*SMALL[:8], "train.steps=1", "checkpoint.every=0",
                                                       "checkpoint.export_final=true", "lora.rank=4"]), run)
    finally:
        os.umask(old)
    for f in ("final/model.safetensors", "final/tokenizer.json", "final_adapter/adapter_model.safetensors",
              "final_base/model.safetensors"):
        assert (run / f).stat().st_mode & 0o777 == 0o640, f
    assert json.loads((run / "final" / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "PreTrainedTokenizerFast"
    tok, ours = transformers.AutoTokenizer.from_pretrained(run / "final"), build.load_tokenizer("builtin:arithmetic")
    text = "<|system|>12+3=15<eos>"
    assert tok(text).input_ids == ours(text).input_ids and tok.all_special_tokens == ours.all_special_tokens
    other = os.environ.get("JAXGRPO_OTHER_TRANSFORMERS_PYTHON")  # e.g. a venv with transformers<5 (.ci/run)
    if other:  # the same ids and special tokens from the other major version of transformers
        code = ("import sys, transformers as t; k = t.AutoTokenizer.from_pretrained(sys.argv[1]); "
                "t.AutoConfig.from_pretrained(sys.argv[1]); print(t.__version__, k(sys.argv[2]).input_ids, "
                "k.all_special_tokens)")
        out = subprocess.run([other, "-c", code, str(run / "final"), text], capture_output=True, text=True,
                             check=True).stdout.split(" ", 1)
        assert out[0].split(".")[0] != transformers.__version__.split(".")[0], out
        assert out[1].strip() == f"{ours(text).input_ids} {ours.all_special_tokens}"
    base = json.loads((run / "final_adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str((run / "final_base").absolute())
    tokens = torch.tensor([[1, 5, 7, 9, 11]])
    with torch.no_grad():
        adapted = peft.AutoPeftModelForCausalLM.from_pretrained(run / "final_adapter")(tokens).logits
        merged = transformers.AutoModelForCausalLM.from_pretrained(run / "final")(tokens).logits
    np.testing.assert_allclose(adapted.numpy(), merged.numpy(), rtol=1e-4, atol=1e-4)


def test_packaged_configs_state_their_divisibility_rule():
    """A packaged config whose train step splits the prompts (grad_accum_steps × data × fsdp > 1) says so in a
    comment, naming the product, so that an override of rollout.prompts_per_step is no surprise."""
    for path in sorted(config_lib.PACKAGED_CONFIGS.glob("*.yaml")):
        cfg, text = config_lib.load_config(str(path)), path.read_text()
        a, m = cfg.algo, cfg.mesh
        parts = a.num_minibatches * a.grad_accum_steps * m.data * m.fsdp
        if parts > 1:
            assert "Hidden constraint: rollout.prompts_per_step must be a multiple of" in text, path.name
            assert f"({a.grad_accum_steps} here" in text or f"= {parts} " in text, path.name


def test_cli_errors_are_one_line(monkeypatch, capsys, tmp_path):
    """CheckpointError and RewardError from the run reach the user as one `error:` line with exit status 2."""
    for err in (ckpt_lib.CheckpointError("no checkpoint under x restores: step 2: ValueError: bad"),
                trainer.rewards.RewardError("reward 'f' raised ZeroDivisionError; step 3 is checkpointed")):
        def fail(cfg, run_dir, allow_config_change=False, err=err):
            raise err

        monkeypatch.setattr(trainer, "run", fail)
        assert train_cli.main(["--run-dir", str(tmp_path / "r")]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"error: {err}"
