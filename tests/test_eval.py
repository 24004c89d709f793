# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for jaxgrpo.eval: unbiased pass@k against the binomial definition and hand values, the hypergeometric
degeneracy probability against brute-force enumeration of subsets, the Jensen-gap summary on hand-made prompt sets
(and its unbiasedness for mean_j(p_j^G + (1-p_j)^G) by simulation), the sampling driver on a tiny random model
(prompt-major grouping checked against the reward calls it made), the report files, and the command line on a
checkpointed run directory."""

import dataclasses
import itertools
import json
import pathlib
import threading
from fractions import Fraction
from math import comb

import jax
import numpy as np
import pytest

from jaxgrpo import checkpoint as ckpt
from jaxgrpo import config as config_lib
from jaxgrpo import data as data_lib
from jaxgrpo import degeneracy
from jaxgrpo import eval as ev

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# -- pass@k ---------------------------------------------------------------------------------------------------------


def test_pass_at_k_hand_values():
    assert ev.pass_at_k_unbiased(4, 2, 2) == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert ev.pass_at_k_unbiased(10, 3, 1) == pytest.approx(0.3)
    assert ev.pass_at_k_unbiased(5, 0, 3) == 0.0
    assert ev.pass_at_k_unbiased(5, 5, 1) == 1.0
    assert ev.pass_at_k_unbiased(5, 3, 3) == 1.0  # n - c = 2 < k: every 3-subset holds a success


def test_pass_at_k_matches_binomial_definition_and_is_stable():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(comb(n - c, k), comb(n, k))
                assert ev.pass_at_k_unbiased(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)
    # large n: binomials with hundreds of digits, the product form stays accurate
    n, c, k = 2000, 3, 700
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert ev.pass_at_k_unbiased(n, c, k) == pytest.approx(float(exact), rel=1e-10)
    got = ev.pass_at_k_unbiased(4, np.array([0, 1, 2, 4]), 2)
    np.testing.assert_allclose(got, [0.0, 0.5, 5 / 6, 1.0])
    assert got.dtype == np.float64


def test_pass_at_k_bad_input():
    with pytest.raises(ValueError, match=r"k=5 must be an integer in \[1, n=4\]"):
        ev.pass_at_k_unbiased(4, 1, 5)
    with pytest.raises(ValueError, match="success counts must lie in"):
        ev.pass_at_k_unbiased(4, 6, 1)
    with pytest.raises(ValueError, match="integer success counts"):
        ev.pass_at_k_unbiased(4, 1.5, 1)


# -- degeneracy -----------------------------------------------------------------------------------------------------


def test_degenerate_probability_hand_values_and_enumeration():
    assert ev.degenerate_probability(4, 2, 2) == pytest.approx(1 / 3)  # [C(2,2)+C(2,2)]/C(4,2) = 2/6
    assert ev.degenerate_probability(4, 1, 2) == pytest.approx(1 / 2)  # [0 + C(3,2)]/6
    assert ev.degenerate_probability(4, 0, 3) == 1.0
    assert ev.degenerate_probability(4, 3, 1) == 1.0  # a group of one is always degenerate
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [1] * c + [0] * (n - c)
            for g in range(1, n + 1):
                subsets = list(itertools.combinations(samples, g))
                brute = sum(len(set(s)) == 1 for s in subsets) / len(subsets)
                assert ev.degenerate_probability(n, c, g) == pytest.approx(brute, abs=1e-12), (n, c, g)
    with pytest.raises(ValueError, match=r"group size G=8 must be an integer in \[1, n=4\].*--num-samples"):
        ev.degenerate_probability(4, 1, 8)


def test_summarize_prompts_at_rates_zero_and_one():
    s = np.array([[0, 0, 0, 0], [1, 1, 1, 1]], bool)
    r = ev.summarize(s, [1, 2, 4])
    assert r["pass@k"] == {"1": 0.5, "2": 0.5, "4": 0.5}
    assert r["mean_success_rate"] == 0.5
    assert r["success_counts"] == [0, 4]
    assert r["success_histogram"] == {"rate": [0, 0.25, 0.5, 0.75, 1.0], "prompts": [1, 0, 0, 0, 1]}
    assert r["all_fail_prompts"] == 0.5 and r["all_pass_prompts"] == 0.5
    for d, g in zip(r["degeneracy"], [1, 2, 4]):
        assert d["group_size"] == g
        assert d["measured"] == 1.0 and d["all_fail"] == 0.5 and d["all_pass"] == 0.5
        iid = 2 * comb(4, g) / comb(8, g)  # 4 successes among the 8 samples, dealt into groups of g at random
        assert d["iid"] == pytest.approx(iid) and d["gap"] == pytest.approx(1 - iid)
    json.dumps(r, allow_nan=False)  # JSON-ready


def test_summarize_homogeneous_prompts_by_hand():
    # every prompt 2 of 4: pass@2 = 5/6; measured at G=2 is 1/3 (without replacement), the i.i.d. rate of the 6
    # successes among 12 samples 2 C(6,2) / C(12,2) = 5/11 (plugging p-bar in would say 1/2)
    s = np.array([[1, 1, 0, 0], [0, 1, 0, 1], [1, 0, 0, 1]], bool)
    r = ev.summarize(s, [2, 3])
    assert r["pass@k"]["2"] == pytest.approx(5 / 6)
    d2, d3 = r["degeneracy"]
    assert d2["measured"] == pytest.approx(1 / 3) and d2["iid"] == pytest.approx(5 / 11)
    assert d2["all_pass"] == pytest.approx(1 / 6) and d2["all_fail"] == pytest.approx(1 / 6)
    assert d3["measured"] == 0.0 and d3["iid"] == pytest.approx(2 * comb(6, 3) / comb(12, 3))
    with pytest.raises(ValueError, match="must be boolean"):
        ev.summarize(s.astype(np.float32), [2])
    with pytest.raises(ValueError, match="non-empty"):
        ev.summarize(np.zeros((0, 4), bool), [2])


def test_measured_rate_is_unbiased_for_heterogeneous_prompts():
    """With p_j ~ Beta(0.5, 0.5) and c_j ~ Binomial(n, p_j), the mean hypergeometric rate estimates
    expected_rate(p, G) = mean_j(p_j^G + (1-p_j)^G), which exceeds iid_rate(mean p, G) (Jensen)."""
    rng = np.random.default_rng(0)
    n, g, prompts = 8, 4, 4000
    p = rng.beta(0.5, 0.5, size=prompts)
    s = rng.random((prompts, n)) < p[:, None]
    d = ev.summarize(s, [g])["degeneracy"][0]
    target = float(degeneracy.expected_rate(p, g))
    assert d["measured"] == pytest.approx(target, abs=0.015)
    assert d["gap"] > 0.2  # heterogeneous difficulty: far more collapse than the i.i.d. prediction (~0.125)


# -- the sampling driver on a tiny model ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_policy():
    from jaxgrpo import build

    cfg = config_lib.load_config(
        None,
        [
            "model.hidden_size=32",
            "model.intermediate_size=64",
            "model.num_layers=1",
            "model.num_heads=2",
            "model.num_kv_heads=1",
        ],
    )
    model_config, params, tokenizer = build.build_policy(cfg, jax.random.key(0))
    return cfg, model_config, params, tokenizer


def test_evaluate_groups_prompt_major(tiny_policy):
    cfg, model_config, params, tokenizer = tiny_policy
    examples = data_lib.synthetic_arithmetic(3, 1, seed=0, split="test")
    calls = []

    def reward(text, example):
        calls.append((example.prompt, text))
        return float(len(text) % 2 == 0)

    r = ev.evaluate(
        model_config,
        params,
        tokenizer,
        examples,
        reward,
        num_samples=4,
        group_sizes=[2, 4],
        key=jax.random.key(1),
        max_new_tokens=4,
        temperature=1.0,
        data_config=cfg.data,
    )
    assert len(calls) == 12
    # prompt-major: the 4 calls for example p come in one block, and the counts per prompt match the calls
    assert [c[0] for c in calls] == [e.prompt for e in examples for _ in range(4)]
    expected = [sum(len(t) % 2 == 0 for pr, t in calls[4 * i : 4 * i + 4]) for i in range(3)]
    assert r["success_counts"] == expected
    assert r["mean_reward"] == pytest.approx(sum(expected) / 12)
    assert r["num_prompts"] == 3 and r["num_samples"] == 4
    assert [d["group_size"] for d in r["degeneracy"]] == [2, 4]
    assert r["samples"][0]["prompt"] == examples[0].prompt and r["samples"][0]["completion"] == calls[0][1]
    assert 0 <= r["truncated_frac"] <= 1 and 0 < r["completion_length_mean"] <= 4


def _two_hosts(monkeypatch, body, process_index=False):
    """Runs ``body(pid, exchange)`` for two simulated hosts (threads; `jaxgrpo.async_rollout.host_share` split by the
    thread's pid, the coordinator's exchange a barrier; with ``process_index``, `jax.process_index` the thread's pid,
    where no JAX program runs) and returns each host's return value or exception."""
    local, barrier, box, out = threading.local(), threading.Barrier(2), [None, None], [None, None]
    monkeypatch.setattr(ev.async_rollout, "host_share", lambda n: np.array_split(np.arange(n), 2)[local.pid])
    if process_index:
        monkeypatch.setattr(ev.async_rollout.jax, "process_index", lambda: local.pid)

    def exchange(payload):
        box[local.pid] = payload
        barrier.wait()
        got = list(box)
        barrier.wait()  # both have read this exchange before either sends its next
        return got

    def host(pid):
        local.pid = pid
        try:
            out[pid] = body(pid, exchange)
        except Exception as e:  # noqa: BLE001 (the test reads it)
            out[pid] = e

    threads = [threading.Thread(target=host, args=(pid,)) for pid in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_two_hosts_score_their_blocks_of_an_evaluation_once_and_report_the_one_process_result(tiny_policy,
                                                                                                monkeypatch):
    """Every host samples every row (the global mesh); each scores its block of each batch's prompts (3 prompts, 2
    per batch: host 0 prompt 0 of batch 0 and prompt 2 of batch 1, host 1 prompt 1), so the reward runs once per
    row, and both report the single process's evaluation."""
    cfg, model_config, params, tokenizer = tiny_policy
    examples = data_lib.synthetic_arithmetic(3, 1, seed=0, split="test")
    calls = [[], []]
    pid_of = {}

    def reward(text, example):
        calls[pid_of[threading.get_ident()]].append(example.prompt)
        return float(len(text) % 2 == 0)

    def run(exchange=None):
        return ev.evaluate(model_config, params, tokenizer, examples, reward, num_samples=4, group_sizes=[4],
                           key=jax.random.key(1), max_new_tokens=4, data_config=cfg.data, prompts_per_batch=2,
                           exchange=exchange)  # fmt: skip

    pid_of[threading.get_ident()] = 0
    one = run()
    calls[0].clear()

    def body(pid, exchange):
        pid_of[threading.get_ident()] = pid
        return run(exchange)

    out = _two_hosts(monkeypatch, body)
    p = [e.prompt for e in examples]
    assert calls == [[p[0]] * 4 + [p[2]] * 4, [p[1]] * 4]
    for r in out:
        assert r["success_counts"] == one["success_counts"] and r["mean_reward"] == one["mean_reward"]
        assert r["samples"] == one["samples"]


def test_a_reward_failing_on_one_host_stops_every_host_at_the_same_batch(monkeypatch):
    from jaxgrpo.example import Example

    rows = [Example(p, "1") for p in "AABB"]

    def reward(text, example):
        if example.prompt == "B":
            raise ValueError("bad row")
        return 1.0

    out = _two_hosts(monkeypatch, lambda pid, exchange: ev.score_rows(["x"] * 4, rows, reward, 2, exchange),
                     process_index=True)
    from jaxgrpo.errors import RewardError

    assert all(isinstance(e, RewardError) and "raised ValueError: bad row" in str(e) for e in out)
    assert str(out[0]).startswith("process 1: ") and not str(out[1]).startswith("process")
    ok = _two_hosts(monkeypatch, lambda pid, exchange: ev.score_rows(["x"] * 4, rows[:2] * 2, reward, 2, exchange))
    for rewards, valid in ok:
        assert rewards.tolist() == [1.0] * 4 and valid.tolist() == [True] * 4


def test_samples_a_reward_leaves_unscored_count_as_failures_and_are_reported(tiny_policy, capsys):
    cfg, model_config, params, tokenizer = tiny_policy
    examples = data_lib.synthetic_arithmetic(3, 1, seed=0, split="test")
    r = ev.evaluate(model_config, params, tokenizer, examples,
                    lambda text, example: None if example.prompt == examples[0].prompt else 1.0, num_samples=4,
                    group_sizes=[4], key=jax.random.key(1), max_new_tokens=2, data_config=cfg.data)  # fmt: skip
    assert r["success_counts"] == [0, 4, 4] and r["unscored_frac"] == pytest.approx(4 / 12)
    assert "gave no value (None) for 4 of 12 samples; they count as failures" in capsys.readouterr().err


def test_evaluate_greedy_groups_are_always_degenerate(tiny_policy, tmp_path):
    cfg, model_config, params, tokenizer = tiny_policy
    examples = data_lib.synthetic_arithmetic(4, 2, seed=1, split="test")
    r = ev.evaluate(
        model_config,
        params,
        tokenizer,
        examples,
        lambda t, e: float(len(t) % 2),
        num_samples=4,
        group_sizes=[2, 3],
        key=jax.random.key(0),
        max_new_tokens=3,
        temperature=0.0,
        data_config=cfg.data,
        prompts_per_batch=2,
    )
    # greedy decoding: the n samples of a prompt are identical, so c is 0 or n and every group is degenerate
    assert set(r["success_counts"]) <= {0, 4}
    assert all(d["measured"] == 1.0 for d in r["degeneracy"])
    paths = ev.write_report(r, tmp_path / "rep")
    assert sorted(p.name for p in paths) == ["degeneracy_vs_group_size.png", "eval.json", "success_histogram.png"]
    assert json.loads((tmp_path / "rep" / "eval.json").read_text())["success_counts"] == r["success_counts"]
    for p in paths[1:]:
        assert p.read_bytes()[:8] == PNG_SIGNATURE and p.stat().st_size > 5000
    with pytest.raises(ValueError, match="group size G=5"):
        ev.evaluate(
            model_config,
            params,
            tokenizer,
            examples,
            "arithmetic",
            num_samples=4,
            group_sizes=[5],
            key=jax.random.key(0),
            max_new_tokens=3,
        )


def test_sets_of_other_prompt_lengths_share_one_prefill_on_a_ladder(tiny_policy):
    """``packed_ladder=(w, w)``, w the widest packed row of both sets (`padding.widest_row`): after a set of
    one-digit prompts, a set of two-digit sums (other lengths) compiles nothing, while the first set without the
    ladder compiles its own packed width (the count has teeth); each set gives what it gives without the ladder
    (greedy: the same completions and counts; the padding changes no token)."""
    from jaxgrpo import padding, precompile

    cfg, model_config, params, tokenizer = tiny_policy
    sets = [data_lib.synthetic_arithmetic(4, level, seed=0, split="test") for level in (0, 3)]
    lengths = [[len(p) for p in data_lib.encode_prompts(tokenizer, ex, cfg.data)] for ex in sets]
    assert len(set(lengths[0]) | set(lengths[1])) > 1 and sum(lengths[0]) != sum(lengths[1])
    w = padding.widest_row(lengths[0] + lengths[1], 4)
    kw = dict(num_samples=2, group_sizes=[2], key=jax.random.key(3), max_new_tokens=3, temperature=0.0,
              data_config=cfg.data, keep_texts=8)  # fmt: skip

    def run(examples, ladder):
        return ev.evaluate(model_config, params, tokenizer, examples, lambda t, e: float(len(t) % 2), **kw,
                           packed_ladder=ladder)  # fmt: skip

    counter = precompile.CompileCounter()
    try:
        got = [run(sets[0], (w, w))]
        first = counter.step_path
        got.append(run(sets[1], (w, w)))
        shared = counter.step_path - first
        want = [run(sets[0], None)]  # the short prompts' own packed width: another program (the count has teeth)
        own = counter.step_path - first - shared
        want.append(run(sets[1], None))
    finally:
        counter.close()
    assert first > 0 and shared == 0 and own > 0, (first, shared, own)
    for a, b in zip(got, want):
        assert a["success_counts"] == b["success_counts"]
        assert [r["completion"] for r in a["samples"]] == [r["completion"] for r in b["samples"]]


def test_cli_on_a_checkpointed_run(tiny_policy, tmp_path, capsys):
    cfg, model_config, params, tokenizer = tiny_policy
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        config_lib.to_yaml(
            dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_new_tokens=3, group_size=2))
        )
    )
    trained = jax.tree.map(lambda x: x + 0.5, params)  # not what build_policy initialises
    with ckpt.CheckpointManager(ckpt.run_checkpoint_dir(run), keep=2) as mgr:
        mgr.save(7, {"params": trained, "step": 7}, {"iterator": {"epoch": 0, "position": 0}})
    loaded = ev.load_policy_for_eval(config_lib.load_config(str(run / "config.yaml")), run, None)
    assert loaded.step == 7
    jax.tree.map(np.testing.assert_array_equal, loaded.params, trained)

    rc = ev.main(["--run-dir", str(run), "--num-prompts", "2", "--num-samples", "2", "--split", "test"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    result = json.loads((run / "eval" / "step7-test" / "eval.json").read_text())
    assert result["settings"]["checkpoint_step"] == 7 and result["num_prompts"] == 2
    assert [d["group_size"] for d in result["degeneracy"]] == [2]
    assert "pass@1" in out.out

    assert ev.main(["--config", str(run / "config.yaml")]) == 2  # tiny model: weights only in a run's checkpoint
    assert "pass --run-dir" in capsys.readouterr().err
    assert ev.main(["--run-dir", str(run), "--checkpoint", "3"]) == 2
    assert "available steps: [7]" in capsys.readouterr().err
    assert ev.main(["--run-dir", str(run), "--num-samples", "4", "--group-size", "8"]) == 2
    assert "group size G=8" in capsys.readouterr().err
    assert ev.main(["--run-dir", str(tmp_path / "nope")]) == 2
    assert "does not exist or is not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert ev.main(["--run-dir", str(tmp_path / "empty")]) == 2
    assert "config.yaml not found" in capsys.readouterr().err


def test_correctness_reward_choice():
    cfg = config_lib.load_config(None, [])
    assert ev.correctness_reward(cfg, None) == "arithmetic"
    assert ev.correctness_reward(cfg, "gsm8k") == "gsm8k"

    def with_rewards(source, rewards):
        return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source=source, rewards=rewards))

    assert ev.correctness_reward(with_rewards("gsm8k", {"format": 0.2, "gsm8k_lenient": 1.0}), None) == "gsm8k_lenient"
    assert ev.correctness_reward(with_rewards("gsm8k", {"calibration": 1.0}), None) == "gsm8k"
    assert ev.correctness_reward(with_rewards("synthetic", {"mymod:fn": 1.0}), None) == "mymod:fn"
    with pytest.raises(config_lib.ConfigError, match="--reward"):
        ev.correctness_reward(with_rewards("other", {"format": 1.0}), None)


def test_module_paths():
    assert ckpt.run_checkpoint_dir("x") == pathlib.Path("x") / "checkpoints"


def test_cli_refuses_a_file_as_out_and_a_missing_run_dir_before_loading(tmp_path, capsys, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("loaded the model")

    monkeypatch.setattr(ev, "load_policy_for_eval", no_load)
    afile = tmp_path / "afile"
    afile.write_text("")
    assert ev.main(["--config", "default", "--out", str(afile / "report")]) == 2
    assert f"{afile} is a file, not a directory" in capsys.readouterr().err
    assert ev.main(["--run-dir", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --run-dir") and "does not exist" in err and "--config" not in err


def test_cli_refuses_fewer_samples_than_a_scheduled_runs_group_before_loading(capsys, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("loaded the model")

    monkeypatch.setattr(ev, "load_policy_for_eval", no_load)
    assert ev.main(["--config", "default", "rollout.schedule=skip", "rollout.group_size=8",
                    "rollout.prompts_per_step=8", "--num-samples", "4"]) == 2  # fmt: skip
    assert "pass --num-samples 8 or more" in capsys.readouterr().err
