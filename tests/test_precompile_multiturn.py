# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Multi-turn runs compile nothing on the step path after the first step (`jaxgrpo.multiturn_precompile`, issue 34).

* the simple loop's run-fixed sampler (`multiturn.fixed_generate`: ``P * G`` slots, the budget's prefix cache, the
  packed prefill on a ladder) against `sampling.generate` on the same contexts and key: the same tokens, lengths and
  stops, the same log-probs and entropies (so the same trajectories as the loop over `sampling.generate`);
* its shapes by hand (`LoopShapes`);
* a tiny random model on the arithmetic environment, with tool calls forced from step 2 on (a random model writes
  none; the parser is patched to call the calculator on about half the turns): with ``perf.precompile=background``
  and the thread joined after step 1, steps 2 and 3 compile nothing on the step path with either sampler (step 2
  evaluates the held-out prompts through the turns too), and every
  metric but the timings equals the run with ``perf.precompile=off``, whose later steps compile (the count has
  teeth: the loop's longer contexts reach new packed prefill rungs, the engine's first tool reply its ``resume``).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_multiturn_train import small

from jaxgrpo import models, sampling, trainer
from jaxgrpo.rollout import multiturn as MT
from jaxgrpo.rollout import tools

CONFIG = models.ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                            num_kv_heads=1, max_position_embeddings=512)  # fmt: skip


def test_loop_shapes_by_hand():
    """6 rows -> 8 slots; the longest context a turn starts from: prompt 100 + budget 64 - 1 = 163 tokens, bucket 192
    (quarter octaves of 32 in [128, 256)); with a context of 150 and 16 new tokens, 134 -> 160; the packed ladder
    from the slots' rung (16) doubling to the cap 8 x 128."""
    s = MT.TurnSettings(max_turns=4, max_new_tokens=16)
    assert MT.LoopShapes.for_run(6, 100, s, 1024) == MT.LoopShapes(8, 192)
    assert MT.LoopShapes.for_run(6, 100, s, 150) == MT.LoopShapes(8, 160)
    assert MT.LoopShapes(8, 128).packed_rungs() == [16, 32, 64, 128, 256, 512, 1024]
    assert MT.LoopShapes(32, 96).packed_rungs() == [32, 64, 128, 256, 512, 1024, 2048, 3072]


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 20, 0.9), (0.0, 0, 1.0)])
def test_fixed_generate_samples_what_sampling_generate_samples(temperature, top_k, top_p):
    """Five contexts of 3..60 tokens in 8 slots of a 128-wide cache: every token, stop and length of
    `sampling.generate` (2..4 slots, the contexts' own bucket), log-probs and entropies to float32 rounding."""
    params = models.init_params(CONFIG, jax.random.key(4))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 128, n).tolist() for n in (5, 40, 17, 3, 60)]
    kw = dict(max_new_tokens=40, temperature=temperature, top_k=top_k, top_p=top_p, eos_token_ids=(2, 5),
              key=jax.random.key(7))  # fmt: skip
    want = sampling.generate(CONFIG, params, prompts, **kw)
    got = MT.fixed_generate(MT.LoopShapes(8, 128))(CONFIG, params, prompts, **kw)
    for f in ("tokens", "mask", "lengths", "truncated"):
        np.testing.assert_array_equal(getattr(got, f), np.asarray(getattr(want, f)), err_msg=f)
    assert isinstance(got.tokens, np.ndarray)  # host arrays: no transfer program per row count
    np.testing.assert_allclose(got.logprobs, np.asarray(want.logprobs), atol=1e-5)
    np.testing.assert_allclose(got.entropy, np.asarray(want.entropy), atol=1e-5)
    assert temperature == 0 or 0 < int(np.asarray(want.lengths).min()) < 40  # sampled: some row stopped on an EOS


def forced_calls(monkeypatch) -> list[bool]:
    """Patch the turn parser: once ``on[0]`` is set, a turn whose text's code points sum to an odd number calls the
    calculator (deterministic in the text, so both runs of a comparison make the same calls)."""
    on = [False]
    real = tools.parse_tool_calls  # the module's own (not a patched one)

    def parse(text, fmt):
        if not on[0]:
            return real(text, fmt)
        return real(text, fmt) or ([tools.ToolCall("calculator", {"expression": "1 + 2"})]
                                   if sum(map(ord, text)) % 2 else [])  # fmt: skip

    monkeypatch.setattr(MT, "parse_tool_calls", parse)
    return on


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["loop", "engine"])
def test_multiturn_steps_compile_nothing_after_the_first(smollm2_gguf, tmp_path, monkeypatch, sampler):
    """3 steps, tool calls from step 2 on, ``algo.kl_coef > 0`` (the reference log-probs too): background vs off."""
    runs = {}
    for mode in ("off", "background"):
        jax.clear_caches()  # the samplers' programs are module-level: each run compiles its own
        on = forced_calls(monkeypatch)
        cfg = small(smollm2_gguf, "train.steps=3", "checkpoint.every=0", "algo.kl_coef=0.01", "train.eval_every=2",
                    "train.eval_examples=4",  # step 2 evaluates the held-out prompts through the turns
                    f"rollout.turn_engine={str(sampler == 'engine').lower()}", f"perf.precompile={mode}")  # fmt: skip
        t = trainer.Trainer(cfg, tmp_path / f"{sampler}_{mode}")
        out = []
        try:
            for step in range(3):
                out.append(t.step(step))
                on[0] = True
                if step == 0 and mode == "background":
                    assert t.precompiler is not None and t.precompiler.join(300) and t.precompiler.failed == []
                    names = [n for n, _ in t.precompiler.jobs]
                    assert any(n.startswith("turn loop" if sampler == "loop" else "turn engine") for n in names)
                    assert any(n.startswith(f"evaluation turn {sampler}") for n in names)
        finally:
            t.close()
        runs[mode] = out
    on_, off = runs["background"], runs["off"]
    assert sum(m["multiturn/tool_calls"] for m in on_[1:]) > 0 and on_[0]["multiturn/tool_calls"] == 0
    assert "eval/pass@1" in on_[1] and "eval/pass@1" not in on_[0]
    assert on_[0]["time/compiles"] > 0 and [m["time/compiles"] for m in on_[1:]] == [0.0, 0.0], on_
    assert sum(m["time/compiles"] for m in off[1:]) > 0, off  # the count has teeth
    timing = ("time/", "throughput/", "rollout/decode_tokens_per_s", "rollout/decode_steps", "rollout/row_utilization")
    for a, b in zip(on_, off):
        keys = {k for k in a if not k.startswith(timing)}
        assert keys == {k for k in b if not k.startswith(timing)}
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
