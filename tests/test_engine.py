# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests for the rollout engine and its group driver (`jaxgrpo.rollout`).

Static mode against a golden file of the sampler before the engine (tests/data/engine_golden.npz: made by
`sampling.generate` at main commit 0ac6937 on `test_sampling.tiny_model()`, float32, fixed keys; regenerate with
`git checkout 0ac6937 && python tests/data/make_engine_golden.py`); continuous mode against static mode (same per-row
keys, so the same completions) and against teacher-forced log-probs of `models.forward` for rows admitted at
different blocks; every group returned whole and exactly once; the slot utilization against a count by hand.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import numpy as np
import pytest
from test_sampling import PROMPTS, _gather, _log_softmax, _teacher_forced_logits, tiny_model

from jaxgrpo import models, sampling
from jaxgrpo.models.attention import Kernel
from jaxgrpo.rollout import RolloutRecord, SamplingParams, driver, engine

GOLDEN = pathlib.Path(__file__).parent / "data" / "engine_golden.npz"
# the golden cases: (sampling kwargs, key); G and M match tests/test_sampling.py's, so the compilations are shared
CASES = {
    "plain": (dict(num_samples=3, max_new_tokens=8, temperature=1.0), 7),
    "topk_topp": (dict(num_samples=4, max_new_tokens=6, temperature=0.8, top_k=5, top_p=0.8), 3),
    "greedy": (dict(num_samples=2, max_new_tokens=6, temperature=0.0), 0),
    "eos_topp": (dict(num_samples=2, max_new_tokens=5, top_p=0.9, eos_token_ids=(7,)), 5),
}
MORE_PROMPTS = PROMPTS + [[5, 6], [7, 8, 9, 10, 11], [2], [3, 4, 5, 6]]  # 7 prompts of ragged lengths


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


def _run(tiny, prompts, sp, key, **kw):
    config, params = tiny
    groups, stats = driver.run(config, params, prompts, sp, jax.random.key(key), **kw)
    return groups, stats, driver.completions(groups, range(len(prompts)))


@pytest.mark.parametrize("name", list(CASES))
def test_static_mode_gives_the_previous_samplers_tokens_and_logprobs(tiny, name):
    kw, key = CASES[name]
    gold = np.load(GOLDEN)
    comp = sampling.generate(*tiny, PROMPTS, key=jax.random.key(key), **kw)  # static mode through the public API
    np.testing.assert_array_equal(comp.tokens, gold[f"{name}/tokens"])
    np.testing.assert_array_equal(comp.mask, gold[f"{name}/mask"])
    # same math, float32; only the reduction order of a few sums may differ (fused q|k|v, 128-wide cache)
    np.testing.assert_allclose(comp.logprobs, gold[f"{name}/logprobs"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kernel", [Kernel("chunked", 4), Kernel("cudnn", implementation="xla")],
                         ids=["chunked", "cudnn_layout"])
def test_the_prefill_takes_the_runs_attention_kernel(tiny, kernel, monkeypatch):
    """``attention=``: the prefill runs the run's kernel (chunked online softmax; cuDNN's masks and layout through
    XLA) and samples the golden file's tokens, its log-probs within float32 rounding; the spec carries the kernel."""
    kw, key = CASES["plain"]
    gold = np.load(GOLDEN)
    seen, real = [], models.prefill

    def prefill(*args, attention_kernel=None, **kwargs):  # traced once per spec: what the engine's prefill runs
        seen.append(attention_kernel)
        return real(*args, attention_kernel=attention_kernel, **kwargs)

    monkeypatch.setattr(models, "prefill", prefill)
    comp = sampling.generate(*tiny, PROMPTS, key=jax.random.key(key), attention=kernel, **kw)
    assert seen == [kernel]
    np.testing.assert_array_equal(comp.tokens, gold["plain/tokens"])
    np.testing.assert_allclose(comp.logprobs, gold["plain/logprobs"], atol=1e-5, rtol=0)
    spec = engine.make_spec(tiny[0], SamplingParams(**kw), 4, 16, 8, attention=kernel)
    assert spec.attention == kernel and spec != engine.make_spec(tiny[0], SamplingParams(**kw), 4, 16, 8)


def test_continuous_mode_returns_every_group_whole_once_and_equals_static(tiny):
    kw, key = CASES["eos_topp"]  # EOS: groups finish at different blocks
    sp = SamplingParams(**kw)
    _, _, static = _run(tiny, MORE_PROMPTS, sp, key)
    for slots, block in ((1, 1), (3, 2)):
        seen: list[int] = []
        groups, stats, comp = _run(tiny, MORE_PROMPTS, sp, key, slots=slots, block=block,
                                   on_group=lambda p, g, seen=seen: seen.append(p) or False)  # fmt: skip
        assert sorted(seen) == list(range(len(MORE_PROMPTS))), seen  # every group exactly once
        assert stats.admitted == len(MORE_PROMPTS)
        for grp in groups.values():  # whole: G rows, each finished (EOS or M tokens)
            assert grp.tokens.shape == (sp.num_samples, sp.max_new_tokens)
            assert np.all(grp.eos | grp.mask[:, -1])
        np.testing.assert_array_equal(comp.tokens, static.tokens)
        np.testing.assert_array_equal(comp.mask, static.mask)
        np.testing.assert_allclose(comp.logprobs, static.logprobs, atol=1e-5, rtol=0)


def test_groups_dropped_when_the_caller_stops_count_their_sampled_tokens(tiny):
    """``on_group`` stops the run at the first group: every other group is dropped, in flight or finished beside it,
    and ``stats.dropped_tokens`` is what their rows had sampled: with every prompt admitted at step 0, a row has
    min(its full length, 1 + decode steps run) tokens, its full length from the same run left to finish."""
    key = 5  # a quarter of the vocabulary ends a row: groups end at steps 1 to 7 (prompt 2's first, at step 1)
    sp = SamplingParams(num_samples=2, max_new_tokens=8, top_p=0.9, eos_token_ids=tuple(range(0, 64, 4)))
    full, _, _ = _run(tiny, MORE_PROMPTS, sp, key, slots=8, block=1)
    given: list[int] = []
    groups, stats = driver.run(*tiny, MORE_PROMPTS, sp, jax.random.key(key), slots=8, block=1,
                               on_group=lambda p, g: given.append(p) or True)  # fmt: skip
    assert list(groups) == given and len(given) == 1
    dropped = set(range(len(MORE_PROMPTS))) - set(given)
    want = sum(int(np.minimum(full[p].mask.sum(1), 1 + stats.decode_steps).sum()) for p in dropped)
    assert stats.dropped_tokens == want
    assert 0 < want < sum(int(full[p].mask.sum()) for p in dropped)  # some were cut in flight
    _, whole, _ = _run(tiny, MORE_PROMPTS, sp, key, slots=8, block=1)
    assert whole.dropped_tokens == 0


def test_rows_admitted_at_different_blocks_have_teacher_forced_logprobs(tiny):
    config, params = tiny
    g, t = 3, 0.7
    sp = SamplingParams(max_new_tokens=8, num_samples=g, temperature=t, eos_token_ids=(3, 9))
    groups, stats, comp = _run(tiny, MORE_PROMPTS, sp, 13, slots=2, block=2)
    assert stats.admitted == len(MORE_PROMPTS) and len(set(np.asarray(comp.lengths).tolist())) > 1
    ref = _gather(_log_softmax(_teacher_forced_logits(config, params, MORE_PROMPTS, comp, g) / t), comp.tokens)
    np.testing.assert_allclose(comp.logprobs, np.where(comp.mask, ref, 0.0), atol=1e-5, rtol=0)


def test_slot_utilization_counted_by_hand(tiny):
    # no EOS: every row runs M - 1 = 7 decode steps; block 3 -> 3 blocks (9 steps) per admission wave.
    sp = SamplingParams(max_new_tokens=8, num_samples=3, temperature=1.0)
    _, static, _ = _run(tiny, PROMPTS, sp, 7, block=3)  # 3 prompts -> 4 slots (one empty), one wave
    assert static.decode_steps == 9
    assert static.slot_utilization == pytest.approx(3 * 3 * 7 / (9 * 4 * 3))
    _, cont, _ = _run(tiny, PROMPTS, sp, 7, slots=1, block=3)  # one slot: three waves of 9 steps
    assert cont.decode_steps == 27
    assert cont.slot_utilization == pytest.approx(3 * 3 * 7 / (27 * 1 * 3))
    m = cont.metrics()
    assert set(m) == {"rollout/slot_utilization", "rollout/decode_steps", "rollout/prefill_tokens_per_s",
                      "rollout/decode_tokens_per_s"} and all(v > 0 for v in m.values())  # fmt: skip


def test_cache_width_is_a_multiple_of_128(tiny):
    config, _ = tiny
    for m, want in ((1, 128), (8, 128), (129, 128), (130, 256), (512, 512)):
        spec = engine.make_spec(config, SamplingParams(max_new_tokens=m), 2, 16, 4)
        assert spec.cache_width == want


def test_windows_counted_by_hand(tiny):
    # M = 20, blocks of 4 from step 1: a block from step s needs s + 3 slots -> 4, 8, 12, 16, 20 -> windows of 8
    spec = engine.make_spec(tiny[0], SamplingParams(max_new_tokens=20), 2, 16, 4)
    assert engine.windows(dataclasses.replace(spec, window_multiple=8)) == {8: 8, 16: 8, 24: 3}
    assert engine.windows(spec) == {128: 19}  # CPU: windows of 128 slots, capped at the cache width
    # on an accelerator: windows of 32 slots up to 16 of them (512 new tokens); 2,048 new tokens -> windows of 128
    for m, step in ((512, 32), (514, 64), (2048, 128)):
        long = engine.make_spec(tiny[0], SamplingParams(max_new_tokens=m), 2, 16, 8, "gpu")
        assert long.window_multiple == step and len(engine.windows(long)) <= engine.MAX_WINDOWS
        assert max(engine.windows(long)) <= long.cache_width


@pytest.mark.slow
def test_decode_windows_change_no_sample(tiny, monkeypatch):
    """The decode cache resized between blocks to the slots the rows have written (windows of 8 instead of CPU's 128:
    grown as rows advance, cut when a slot's long rows are replaced by new ones) samples what the full-width cache
    samples, in static and continuous mode, with teacher-forced log-probs."""
    config, params = tiny
    sp = SamplingParams(max_new_tokens=24, num_samples=2, temperature=1.0, eos_token_ids=(3, 9))
    _, _, full = _run(tiny, MORE_PROMPTS, sp, 11, block=3)
    widths: list[int] = []
    resize = engine.resize
    monkeypatch.setattr(engine, "WINDOW_MULTIPLE_CPU", 8)
    monkeypatch.setattr(engine, "resize", lambda decode, width: widths.append(width) or resize(decode, width))
    for kw in (dict(block=3), dict(slots=2, block=3)):
        widths.clear()
        _, _, comp = _run(tiny, MORE_PROMPTS, sp, 11, **kw)
        assert len(set(widths)) > 1, widths  # the windows changed during the run
        np.testing.assert_array_equal(comp.tokens, full.tokens)
        np.testing.assert_array_equal(comp.mask, full.mask)
        np.testing.assert_allclose(comp.logprobs, full.logprobs, atol=1e-5, rtol=0)
    assert any(b < a for a, b in zip(widths, widths[1:])), widths  # continuous: a window cut
    ref = _gather(_log_softmax(_teacher_forced_logits(config, params, MORE_PROMPTS, comp, 2)), comp.tokens)
    np.testing.assert_allclose(comp.logprobs, np.where(comp.mask, ref, 0.0), atol=1e-5, rtol=0)


def test_record_masks(tiny):
    kw, key = CASES["eos_topp"]
    comp = sampling.generate(*tiny, PROMPTS, key=jax.random.key(key), **kw)
    rec = RolloutRecord.from_completions(PROMPTS, comp, 2, pad_id=0, policy_version=4)
    width = max(len(p) for p in PROMPTS)
    assert rec.tokens.shape == (6, width + 5)
    assert not np.any(rec.context_mask & rec.action_mask)
    np.testing.assert_array_equal(rec.context_mask.sum(1), np.repeat([len(p) for p in PROMPTS], 2))
    np.testing.assert_array_equal(rec.action_mask[:, width:], comp.mask)
    np.testing.assert_array_equal(rec.group_id, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(rec.policy_version, 4)
    np.testing.assert_array_equal(rec.logprobs[:, width:][np.asarray(comp.mask)], comp.logprobs[np.asarray(comp.mask)])


@pytest.mark.parametrize("bad, match", [(dict(slots=0), "slots"), (dict(block=0), "block")])
def test_bad_driver_input(tiny, bad, match):
    with pytest.raises(ValueError, match=match):
        driver.run(*tiny, PROMPTS, SamplingParams(max_new_tokens=4), jax.random.key(0), **bad)


def test_rollout_never_imports_the_learner():
    import subprocess
    import sys

    code = ("import sys, jaxgrpo.rollout.driver, jaxgrpo.rollout.engine; "
            "bad = [m for m in ('train_step', 'minibatch', 'batch', 'logprobs', 'optim', 'perf', 'config') "
            "if 'jaxgrpo.' + m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
