# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for jaxgrpo.config: YAML + dotted overrides, type coercion, every bad-input message (unknown keys with
suggestions, choices, ranges), the resolved-config round trip, the packaged configs, and the CLI helpers."""

import dataclasses
import importlib
import pathlib
import pkgutil
import subprocess
import sys
import typing
from typing import Literal

import pytest
import yaml

import jaxgrpo
from jaxgrpo import advantages, coerce, config_sections, degeneracy, losses, objectives, rewards, scheduler
from jaxgrpo import config as C
from jaxgrpo.learner import logprobs
from jaxgrpo.models import attention, gguf_export, layers
from jaxgrpo.rollout import params as rollout_params

REPO = pathlib.Path(__file__).resolve().parents[1]


def write(tmp_path, text, name="run.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_defaults():
    assert C.load_config(None, []) == C.Config()
    assert C.Config().data.rewards == {"arithmetic": 1.0}


def test_a_text_field_read_as_a_number_from_a_file_must_be_quoted(tmp_path):
    """YAML reads ``revision: 1.10`` as the float 1.1 (and a hash prefix 1234e56 as 1.234e+59): the text is lost, so a
    file must quote it; an override keeps the text as written, and a quoted value loads."""
    path = write(tmp_path, "model: {name_or_path: org/name, revision: 1.10}\n")
    with pytest.raises(C.ConfigError, match=r"model.revision: 1.1 was read as a number.*quote it") as e:
        C.load_config(path)
    assert "\n" not in str(e.value)
    quoted = write(tmp_path, 'model: {name_or_path: org/name, revision: "1.10"}\n')
    assert C.load_config(quoted).model.revision == "1.10"
    assert C.load_config("default", ["model.name_or_path=org/name", "model.revision=1.10"]).model.revision == "1.10"


def test_yaml_then_overrides(tmp_path):
    path = write(tmp_path, """
# a comment
data: {source: gsm8k}
algo:
  estimator: pass_at_k
  estimator_args: {k: 4}
  clip_high: 0.28
rollout: {group_size: 4}
seed: 7
""")
    cfg = C.load_config(path, ["data.rewards={gsm8k: 1.0, format: 0.1}", "rollout.group_size=16",
                               "algo.estimator_args.eps=1e-4", "data.rewards.format=null",
                               "data.rewards.calibration=0.5", "seed=3"])
    assert cfg.algo.estimator == "pass_at_k"
    assert cfg.algo.estimator_args == {"k": 4, "eps": 1e-4}
    assert cfg.algo.clip_high == 0.28
    assert cfg.rollout.group_size == 16  # the override wins over the file
    assert cfg.rollout.prompts_per_step == C.RolloutConfig().prompts_per_step  # untouched keys keep defaults
    assert cfg.data.rewards == {"gsm8k": 1.0, "calibration": 0.5}
    assert cfg.seed == 3


@pytest.mark.parametrize(
    "override, getter, expected",
    [
        ("optim.learning_rate=1e-5", lambda c: c.optim.learning_rate, 1e-5),  # YAML 1.1 reads this as a string
        ("optim.learning_rate=3", lambda c: c.optim.learning_rate, 3.0),
        ("train.steps=10.0", lambda c: c.train.steps, 10),
        ("train.steps=1e3", lambda c: c.train.steps, 1000),
        ("algo.clip_high=null", lambda c: c.algo.clip_high, None),
        ("algo.clip_high=0.28", lambda c: c.algo.clip_high, 0.28),
        ("algo.dual_clip=3", lambda c: c.algo.dual_clip, 3.0),
        ("log.tensorboard=false", lambda c: c.log.tensorboard, False),
        ("data.system_prompt=Answer with a number.", lambda c: c.data.system_prompt, "Answer with a number."),
        ("data.system_prompt=null", lambda c: c.data.system_prompt, None),
        ("model.name_or_path=1.10", lambda c: c.model.name_or_path, "1.10"),  # text kept as written
        ("data.hf_config=2020", lambda c: c.data.hf_config, "2020"),
        ("data.num_examples=null", lambda c: c.data.num_examples, None),
        ("data.rewards={gsm8k_lenient: 1, arithmetic: 0.5}", lambda c: c.data.rewards,
         {"gsm8k_lenient": 1.0, "arithmetic": 0.5}),
        ("data.rewards.arithmetic_lenient=0.25", lambda c: c.data.rewards, {"arithmetic": 1.0,
                                                                            "arithmetic_lenient": 0.25}),
        ("algo.estimator_args={k: 2}", lambda c: c.algo.estimator_args, {"k": 2}),
        ("mesh.data=4", lambda c: (c.mesh.data, c.rollout.prompts_per_step), (4, 8)),
        ("mesh.fsdp=8", lambda c: c.mesh.fsdp, 8),
        ("seed=3", lambda c: c.seed, 3),
    ],
)
def test_override_types(override, getter, expected):
    cfg = C.load_config(None, (["algo.estimator=pass_at_k"] if "estimator_args" in override else []) + [override])
    value = getter(cfg)
    assert value == expected and type(value) is type(expected)


def test_choices_agree_with_the_modules_that_use_them():
    """Every module of the package that names a choice (tuple or Literal type) holds the object of the module that
    implements it, not a copy; and the config's choices are those."""
    owners = {"ESTIMATORS": advantages, "Estimator": advantages, "AGGREGATIONS": losses, "Aggregation": losses,
              "RATIO_LEVELS": losses, "RatioLevel": losses, "KL_ESTIMATORS": losses, "KLEstimator": losses,
              "DEGENERATE_MODES": degeneracy, "DegenerateMode": degeneracy, "ON_REWARD_ERROR": rewards,
              "OnRewardError": rewards, "SCHEDULES": config_sections, "Schedule": config_sections,
              "RematPolicy": layers, "MatmulBackward": layers}  # fmt: skip
    seen = set()
    for info in pkgutil.walk_packages(jaxgrpo.__path__, "jaxgrpo."):
        module = importlib.import_module(info.name)
        for name, owner in owners.items():
            if module is not owner and hasattr(module, name):
                assert getattr(module, name) is getattr(owner, name), f"{info.name}.{name} is a second copy"
                seen.add(name)
    assert {"Estimator", "Aggregation", "DegenerateMode", "RematPolicy", "MatmulBackward"} <= seen  # config's own
    assert C.CHOICES[("algo", "aggregation")] == tuple(losses.AGGREGATIONS)
    assert C.CHOICES[("algo", "ratio_level")] == tuple(losses.RATIO_LEVELS)
    assert C.CHOICES[("algo", "kl_estimator")] == tuple(losses.KL_ESTIMATORS)
    assert C.CHOICES[("algo", "degenerate_groups")] == tuple(degeneracy.DEGENERATE_MODES)
    assert C.CHOICES[("optim", "schedule")] == tuple(C.SCHEDULES)


def test_choices_are_the_literal_types_of_the_modules_that_implement_them():
    """Each enum-like field is annotated with its module's Literal type, and CHOICES lists exactly those fields."""
    expected = {
        ("model", "dtype"): config_sections.ModelDtype,
        ("model", "param_dtype"): config_sections.ModelDtype,
        ("data", "source"): config_sections.DataSource,
        ("data", "template"): config_sections.PromptTemplate,
        ("algo", "estimator"): advantages.Estimator,
        ("algo", "degenerate_groups"): degeneracy.DegenerateMode,
        ("algo", "ratio_level"): losses.RatioLevel,
        ("algo", "aggregation"): losses.Aggregation,
        ("algo", "kl_estimator"): losses.KLEstimator,
        ("algo", "on_reward_error"): rewards.OnRewardError,
        ("algo", "sampler_correction"): losses.SamplerCorrection,
        ("algo", "objective"): objectives.Objective,
        ("rollout", "engine"): rollout_params.EngineMode,
        ("rollout", "schedule"): scheduler.RolloutSchedule,
        ("perf", "remat"): layers.RematPolicy,
        ("perf", "matmul_backward"): layers.MatmulBackward,
        ("perf", "attention"): attention.AttentionKind,
        ("perf", "lm_head"): logprobs.LMHead,
        ("perf", "precompile"): config_sections.Precompile,
        ("perf", "layer_loop"): config_sections.LayerLoopSwitch,
        ("optim", "schedule"): config_sections.Schedule,
        ("checkpoint", "export_gguf_dtype"): gguf_export.GgufDtype | None,
    }
    for (section, key), literal in expected.items():
        assert typing.get_type_hints(C.SECTIONS[section])[key] == literal, (section, key)
    assert C.CHOICES == {k: coerce.literal_choices(v) for k, v in expected.items()}
    assert advantages.ESTIMATORS == typing.get_args(advantages.Estimator)
    assert ("auto", *layers.LAYER_LOOPS) == typing.get_args(config_sections.LayerLoopSwitch)
    assert degeneracy.DEGENERATE_MODES == ("keep", "mask", "resample")
    assert rewards.ON_REWARD_ERROR == ("error", "invalidate") and C.SCHEDULES == ("constant", "cosine")
    assert C.CHOICES[("perf", "remat")] == ("none", "projections", "full", "projections+norms")
    assert C.CHOICES[("perf", "matmul_backward")] == ("auto", "explicit", "xla")


def test_literal_coercion():
    policy = Literal["none", "projections", "full"]
    assert coerce.coerce("full", policy, "perf.remat") == "full"
    assert coerce.coerce(None, policy | None, "perf.remat") is None
    assert coerce.type_name(policy | None) == "one of none, projections, full or null"
    for bad in (True, 1, "ful", ["full"]):
        with pytest.raises(C.ConfigError) as info:
            coerce.coerce(bad, policy, "perf.remat")
        msg = str(info.value)
        assert msg.startswith(f"perf.remat={bad!r} is not a valid choice") and "none, projections, full" in msg
    with pytest.raises(C.ConfigError, match="did you mean 'full'"):
        coerce.coerce("ful", policy, "perf.remat")
    with pytest.raises(C.ConfigError, match="perf.remat may not be null"):
        coerce.coerce(None, policy, "perf.remat")
    assert coerce.coerce(2, Literal[1, 2], "k") == 2
    with pytest.raises(C.ConfigError, match="k=True is not a valid choice"):
        coerce.coerce(True, Literal[1, 2], "k")  # True == 1, but it is not the choice 1
    # an override keeps the text of a Literal field as written, so YAML's `true` is the text "true", not a bool
    with pytest.raises(C.ConfigError, match="perf.remat='true' is not a valid choice"):
        C.load_config(None, ["perf.remat=true"])


@pytest.mark.parametrize("key", ["perf.reuse_projections", "algo.reuse_projections"])
def test_a_retired_key_at_its_off_value_loads_and_otherwise_says_it_was_retired(tmp_path, key):
    """Projection reuse was retired: a saved config.yaml holding ``reuse_projections: false`` (what every run wrote
    before) still loads, as file and as override, to the same config; ``true`` is one line naming the key."""
    section, name = key.split(".")
    path = write(tmp_path, f"{section}:\n  {name}: false\n", "config.yaml")
    assert C.load_config(path, []) == C.load_config(None, [f"{key}=false"]) == C.Config()
    for source in ("override", "yaml"):
        with pytest.raises(C.ConfigError, match=f"^{key}=True: projection reuse was retired.*remove the key$"):
            if source == "override":
                C.load_config(None, [f"{key}=true"])
            else:
                C.load_config(write(tmp_path, f"{section}:\n  {name}: true\n", "on.yaml"), [])


def test_perf_section():
    assert C.Config().perf == C.PerfConfig(prefix_sharing=True, prompt_packing=True, remat="projections",
                                           logprob_chunk=0, matmul_backward="auto")
    cfg = C.load_config(None, ["perf.remat=full", "perf.logprob_chunk=64", "perf.prefix_sharing=false",
                               "perf.matmul_backward=xla"])
    assert (cfg.perf.remat, cfg.perf.logprob_chunk, cfg.perf.prefix_sharing) == ("full", 64, False)
    assert cfg.perf.matmul_backward == "xla" and cfg.algo == C.AlgoConfig()
    moved = {"prefix_sharing", "remat", "logprob_chunk"}
    assert not moved & {f.name for f in dataclasses.fields(C.AlgoConfig)}
    assert C.load_config("smollm2_gsm8k", []).perf.remat == "full"
    assert list(C.to_dict(C.Config())).index("perf") == list(C.to_dict(C.Config())).index("algo") + 1


@pytest.mark.parametrize(
    "override, new",
    [
        ("algo.remat=true", "set perf.remat=full instead"),
        ("algo.remat=false", "set perf.remat=projections instead"),
        ("algo.prefix_sharing=false", "set perf.prefix_sharing=false instead"),
        ("algo.logprob_chunk=64", "set perf.logprob_chunk=64 instead"),
    ],
)
def test_moved_keys_name_their_new_place(tmp_path, override, new):
    old, _, value = override.partition("=")
    section, key = old.split(".")
    for source in ("override", "yaml"):
        with pytest.raises(C.ConfigError) as info:
            if source == "override":
                C.load_config(None, [override])
            else:
                C.load_config(write(tmp_path, f"{section}:\n  {key}: {value}\n"), [])
        msg = str(info.value)
        assert msg.startswith(f"{old} moved to perf.{key}") and msg.endswith(new) and "\n" not in msg, msg
    with pytest.raises(C.ConfigError, match=r"algo.remat moved to perf.remat with values none\|projections\|full "
                                            r"\(true was full, false was projections\)"):
        C.load_config(None, ["algo.remat=true"])


def test_every_estimator_of_the_advantages_module_is_accepted():
    for name in advantages.ESTIMATORS:
        assert C.load_config(None, [f"algo.estimator={name}"]).algo.estimator == name


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["algo.estimatr=sign"], ["unknown key 'algo.estimatr'", "did you mean 'algo.estimator'", "valid keys in "
                                  "section 'algo'", "degenerate_groups", "on_reward_error"]),
        (["algoo.estimator=sign"], ["unknown key 'algoo.estimator'", "did you mean 'algo'", "rollout", "seed"]),
        (["sed=3"], ["did you mean 'seed'"]),
        (["rollout.group_size"], ["must look like section.key=value"]),
        (["rollout=3"], ["names a whole section", "group_size"]),
        (["seed.x=3"], ["top-level value"]),
        (["algo.clip_low.x=1"], ["algo.clip_low is float", "not a mapping"]),
        (["algo.estimator=grpoo"], ["algo.estimator='grpoo' is not a valid choice", "did you mean 'grpo'",
                                    "dr_grpo", "avspo"]),
        (["algo.estimator=pass_at_k", "algo.estimator_args.kk=4"], ["algo.estimator_args.kk is not an argument",
                                                                    "did you mean 'k'"]),
        (["algo.estimator_args.k=4"], ["not an argument of the 'grpo' estimator"]),
        (["data.rewards.gsm9k=1"], ["data.rewards", "did you mean 'gsm8k'", "calibration"]),
        (["data.rewards=null"], ["data.rewards may not be null"]),
        (["data.source=gsm8k"], ["data.rewards has 'arithmetic', which is meant for data.source=synthetic",
                                 "data.rewards={gsm8k: 1.0}"]),
        (["data.rewards.gsm8k=1"], ["'gsm8k', which is meant for data.source=gsm8k", "arithmetic, arithmetic_lenient",
                                    "data.rewards={arithmetic: 1.0}"]),
        (["data.rewards.arithmetic=null"], ["data.rewards must be a non-empty mapping"]),
        (["data.rewards={arithmetic:1.0}"], ["'arithmetic:1.0' has no value", "space after the colon",
                                             "data.rewards={arithmetic: 1.0}"]),
        (["data.rewards={my_rewards:fn:0.5}"], ["data.rewards={my_rewards:fn: 0.5}"]),
        (["data.path=../shared/data/gsm8k"], ["data.path must be null for data.source=synthetic",
                                              "data.source=gsm8k or hf"]),
        (["data.source=words", "data.path=x.jsonl"], ["data.path must be null for data.source=words"]),
        (["model.tokenizer=builtin:arithmetc"], ["model.tokenizer", "builtin:arithmetic"]),
        (["rollout.group_size=1"], ["rollout.group_size must be >= 2", "got 1"]),
        (["rollout.prompts_per_step=0"], ["rollout.prompts_per_step must be >= 1"]),
        (["rollout.temperature=-0.5"], ["rollout.temperature must be >= 0"]),
        (["rollout.top_p=0"], ["rollout.top_p must be in (0, 1]"]),
        (["rollout.top_p=1.5"], ["rollout.top_p must be in (0, 1]"]),
        (["rollout.top_k=-1"], ["rollout.top_k must be >= 0"]),
        (["train.max_sampled_tokens=0"], ["train.max_sampled_tokens must be >= 1 or null"]),
        (["algo.clip_low=0"], ["algo.clip_low must be in (0, 1)"]),
        (["algo.clip_high=-0.1"], ["algo.clip_high must be > 0"]),
        (["algo.dual_clip=1"], ["algo.dual_clip must be > 1"]),
        (["algo.kl_coef=-1"], ["algo.kl_coef must be >= 0"]),
        (["algo.num_minibatches=3"], ["rollout.prompts_per_step=8 must be a multiple of algo.num_minibatches",
                                      "3 × 1 × 1 × 1 = 3"]),
        (["mesh.fsdp=2", "algo.grad_accum_steps=8"], ["1 × 8 × 1 × 2 = 16"]),
        (["optim.learning_rate=0"], ["optim.learning_rate must be > 0"]),
        (["optim.learning_rate=nan"], ["optim.learning_rate must be a finite number"]),
        (["optim.b2=1"], ["optim.b2 must be in [0, 1)"]),
        (["mesh.fsdp=0"], ["mesh.fsdp must be >= 1"]),
        (["mesh.data=3"], ["1 × 1 × 3 × 1 = 3", "whole groups"]),
        (["model.num_heads=3"], ["model.hidden_size must be a multiple of model.num_heads=3"]),
        (["data.difficulty=13"], ["data.difficulty must be in [0, 12]"]),
        (["perf.logprob_chunk=-1"], ["perf.logprob_chunk must be >= 0 (0 = automatic)", "got -1"]),
        (["perf.remat=partial"], ["perf.remat='partial' is not a valid choice", "none, projections, full"]),
        (["perf.matmul_backward=cuda"], ["perf.matmul_backward='cuda' is not a valid choice", "auto, explicit, xla"]),
        (["perf.prompt_packing=maybe"], ["perf.prompt_packing must be bool"]),
        (["perf.lm_head=triton"], ["perf.lm_head='triton' is not a valid choice", "auto, xla, fused"]),
        (["perf.lm_head=fused", "rollout.top_p=0.9"], ["perf.lm_head=fused has no top-k/top-p truncation",
                                                       "set perf.lm_head=auto or xla"]),
        (["perf.lm_head=fused", "rollout.top_k=50"], ["rollout.top_k=50"]),
        (["perf.rematt=full"], ["unknown key 'perf.rematt'", "did you mean 'perf.remat'"]),
        (["algo.remat.x=1"], ["algo.remat moved to perf.remat"]),
        (["train.steps=0"], ["train.steps must be >= 1"]),
        (["checkpoint.keep=0"], ["checkpoint.keep must be >= 1"]),
        (["seed=-1"], ["seed must be >= 0"]),
        (["train.steps=2.5"], ["train.steps must be int", "2.5"]),
        (["train.steps=abc"], ["train.steps must be int"]),
        (["log.tensorboard=maybe"], ["log.tensorboard must be bool"]),
        (["train.steps=null"], ["train.steps may not be null"]),
        (["algo.estimator_args=3"], ["algo.estimator_args must be dict"]),
        (["data.rewards.arithmetic=high"], ["data.rewards.arithmetic must be float"]),
        (["rollout.top_p=[1, 2]"], ["rollout.top_p must be float"]),
        (["algo.estimator={oops"], ["not valid YAML"]),
    ],
)
def test_bad_overrides_name_the_problem(overrides, fragments):
    with pytest.raises(C.ConfigError) as info:
        C.load_config(None, overrides)
    msg = str(info.value)
    for fragment in fragments:
        assert fragment in msg, (fragment, msg)


@pytest.mark.parametrize("section_key, choices", list(C.CHOICES.items()))
def test_every_enum_field_lists_its_choices(section_key, choices):
    section, key = section_key
    with pytest.raises(C.ConfigError) as info:
        C.load_config(None, [f"{section}.{key}=bogus"])
    msg = str(info.value)
    assert f"{section}.{key}='bogus' is not a valid choice" in msg
    assert all(c in msg for c in choices)
    for c in choices:  # and each listed choice is accepted
        extra = {("data", "source", "gsm8k"): ["data.rewards={gsm8k: 1}"],
                 ("data", "source", "words"): ["data.rewards={gsm8k_lenient: 1}"]}.get((section, key, c), [])
        assert getattr(getattr(C.load_config(None, [f"{section}.{key}={c}", *extra]), section), key) == c


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("algo:\n  estimater: sign\n", ["unknown key 'algo.estimater'", "did you mean 'algo.estimator'"]),
        ("optimizer:\n  learning_rate: 1\n", ["unknown key 'optimizer'", "did you mean 'optim'"]),
        ("algo: sign\n", ["config section 'algo' must be a mapping"]),
        ("- 1\n- 2\n", ["top level must be a mapping"]),
        ("algo: {estimator: [\n", ["invalid YAML"]),
        ("rollout:\n  group_size: 4\n  prompts_per_step 8\n", [
            "invalid YAML: line 4, column 1: could not find expected ':' (while scanning a simple key started at "
            "line 3, column 3)"]),
        ("rollout:\n  group_size: one\n", ["rollout.group_size must be int"]),
    ],
)
def test_bad_files(tmp_path, text, fragments):
    path = write(tmp_path, text)
    with pytest.raises(C.ConfigError) as info:
        C.load_config(path, [])
    for fragment in fragments:
        assert fragment in str(info.value)
    assert "\n" not in str(info.value)  # one line


def test_empty_file_and_missing_file(tmp_path):
    assert C.load_config(write(tmp_path, ""), []) == C.Config()
    with pytest.raises(C.ConfigError, match="config file 'nope.yaml' not found; give a YAML path or a packaged config"):
        C.load_config("nope.yaml", [])


def test_the_readme_configs_path_reaches_the_packaged_config_from_anywhere(tmp_path, monkeypatch):
    # README: `--config configs/smollm2_gsm8k.yaml`; after `pip install` there is no configs/ in the working directory
    monkeypatch.chdir(tmp_path)
    assert C.resolve_config_path("configs/smollm2_gsm8k.yaml") == C.PACKAGED_CONFIGS / "smollm2_gsm8k.yaml"
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "smollm2_gsm8k.yaml").write_text("seed: 5\n")  # a file of the user's own wins
    assert C.load_config("configs/smollm2_gsm8k.yaml", []).seed == 5
    for missing in ("configs/nope.yaml", "other/default.yaml", "configs/sub/default.yaml"):
        with pytest.raises(C.ConfigError, match=f"config file '{missing}' not found"):
            C.resolve_config_path(missing)


def test_resolved_yaml_round_trip(tmp_path):
    cfg = C.load_config(None, ["algo.estimator=pass_at_k", "algo.estimator_args.k=4", "algo.clip_high=null",
                               "optim.learning_rate=1e-7", "data.system_prompt=Be brief: 2 lines.",
                               "data.rewards.gsm8k_lenient=0.1", "model.name_or_path=007", "seed=9", "data.path=null",
                               "perf.remat=full"])
    text = C.to_yaml(cfg)
    assert C.from_dict(yaml.safe_load(text)) == cfg
    path = write(tmp_path, text, "config.yaml")
    assert C.load_config(path, []) == cfg
    assert C.to_dict(cfg)["algo"]["estimator_args"] == {"k": 4}
    assert list(C.to_dict(cfg)) == [f.name for f in dataclasses.fields(C.Config)]


def test_packaged_configs_load():
    names = sorted(p.stem for p in C.PACKAGED_CONFIGS.glob("*.yaml"))
    assert names, "no packaged configs"
    errors = {}
    for name in names:
        try:
            cfg = C.load_config(name, [])  # a packaged config is reachable by name
        except C.ConfigError as e:
            errors[name] = str(e)
            continue
        assert cfg == C.load_config(str(C.PACKAGED_CONFIGS / f"{name}.yaml"), [])
    assert not errors, errors


def test_parse_cli():
    assert C.parse_cli([]) == ("default", None, [])
    assert C.parse_cli(["a.b=1", "--config", "x.yaml", "c.d=2", "--run-dir=runs/r"]) == (
        "x.yaml", "runs/r", ["a.b=1", "c.d=2"])
    with pytest.raises(C.ConfigError, match="'train' is not an override"):
        C.parse_cli(["train"])
    with pytest.raises(SystemExit) as info:
        C.parse_cli(["--bogus"])
    assert info.value.code == 2
    assert C.config_name("configs/smollm2_gsm8k.yaml") == "smollm2_gsm8k" and C.config_name(None) == "default"


def test_cli_error(capsys):
    assert C.cli_error("rollout.group_size must be >= 2") == 2
    captured = capsys.readouterr()
    assert captured.err == "error: rollout.group_size must be >= 2\n" and captured.out == ""


def test_cli_error_without_traceback_in_a_process():
    code = (
        "import sys\n"
        "from jaxgrpo import config as c\n"
        "try:\n"
        "    c.load_config(None, sys.argv[1:])\n"
        "except c.ConfigError as e:\n"
        "    sys.exit(c.cli_error(str(e)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, "algo.degenerate_groups=drop"], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: algo.degenerate_groups='drop' is not a valid choice")
    assert "keep, mask, resample" in proc.stderr and "Traceback" not in proc.stderr


def test_mixed_precision_and_sampler_correction_keys():
    cfg = C.load_config("default", ["model.dtype=bfloat16", "algo.sampler_correction=seq_mask"])
    assert (cfg.model.dtype, cfg.model.param_dtype, cfg.algo.sampler_correction) == ("bfloat16", "float32", "seq_mask")
    assert C.load_config("default", []).algo.sampler_correction == "auto"
    with pytest.raises(C.ConfigError, match="algo.sampler_correction_cap"):
        C.load_config("default", ["algo.sampler_correction_cap=1.0"])
    with pytest.raises(C.ConfigError, match="token_tis"):
        C.load_config("default", ["algo.sampler_correction=tis"])
    with pytest.raises(C.ConfigError, match="model.param_dtype"):
        C.load_config("default", ["model.param_dtype=float16"])


def test_data_multiturn_is_environment_or_tools():
    """`DataConfig.multiturn`, the one test every module asks (multi-turn rollouts): environment or tools set."""
    DataConfig = config_sections.DataConfig
    assert not DataConfig().multiturn
    assert DataConfig(environment="pkg.mod:Env").multiturn
    assert DataConfig(tools=["pkg.mod:fn"]).multiturn
    assert C.from_dict({"data": {"tools": ["pkg.mod:fn"]}}).data.multiturn



def test_a_synthetic_split_is_train_or_test():
    with pytest.raises(C.ConfigError, match="data.split must be train or test for data.source=synthetic, got 'tset'"):
        C.load_config("default", ["data.split=tset"])
    assert C.load_config("default", ["data.split=test"]).data.split == "test"
