# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The rollout engine on a mesh (8 fake CPU devices): slots and rows split over the batch axes give the one-device
engine's tokens (exactly) and log-probs, in static and continuous mode, on a data mesh and a data x fsdp one; the
token step needs no collective but the scalar row-step count (no cache, weight, logit or per-row state moves between
devices: each device draws its own rows); slots round up to the shard count; a bad split is refused."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec
from test_engine import CASES, MORE_PROMPTS
from test_sampling import TINY, tiny_model

from jaxgrpo import models, sharding
from jaxgrpo.rollout import SamplingParams, driver, engine

COLLECTIVE = re.compile(r"\b(all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter)\(")


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


@pytest.mark.parametrize("shape", [(8, 1), (2, 4)], ids=["data8", "data2xfsdp4"])
@pytest.mark.parametrize("case, slots", [("eos_topp", None), ("eos_topp", 3), ("topk_topp", 3)])
def test_engine_on_a_mesh_gives_the_one_device_samples(tiny, shape, case, slots):
    kw, key = CASES[case]
    sp = SamplingParams(**kw)
    ref, ref_stats = driver.run(*tiny, MORE_PROMPTS, sp, jax.random.key(key), slots=slots)
    mesh = sharding.make_mesh(*shape, 1)
    got, stats = driver.run(*tiny, MORE_PROMPTS, sp, jax.random.key(key), slots=slots, mesh=mesh)
    assert sorted(got) == sorted(ref) == list(range(len(MORE_PROMPTS)))
    for p in ref:
        np.testing.assert_array_equal(got[p].tokens, ref[p].tokens)
        np.testing.assert_array_equal(got[p].mask, ref[p].mask)
        np.testing.assert_allclose(got[p].logprobs, ref[p].logprobs, atol=1e-5, rtol=0)
    assert stats.admitted == ref_stats.admitted == len(MORE_PROMPTS)
    assert stats.decode_tokens == ref_stats.decode_tokens  # the same row-steps on real rows


def test_slots_round_up_to_the_shards_and_a_bad_split_is_refused(tiny):
    sp = SamplingParams(**CASES["eos_topp"][0])
    mesh = sharding.make_mesh(8, 1, 1)
    assert engine.row_shards(mesh) == 8 and engine.row_shards(None) == 1 and engine.row_sharding(None) is None
    assert engine.row_shards(sharding.make_mesh(2, 2, 2)) == 4  # data x fsdp; the tensor axis holds every row
    _, stats = driver.run(*tiny, MORE_PROMPTS, sp, jax.random.key(0), slots=3, mesh=mesh)  # 3 slots -> 8
    assert stats.slot_utilization == pytest.approx(stats.decode_tokens / (stats.decode_steps * 8 * sp.num_samples))
    with pytest.raises(ValueError, match="3 slots do not split over the mesh's 8 batch shards"):
        engine.make_spec(tiny[0], sp, 3, 16, 8, mesh=mesh)


def test_token_step_on_a_mesh_moves_no_cache_weight_or_row_state(tiny):
    config, params = tiny
    sp = SamplingParams(**CASES["topk_topp"][0])  # top-k and top-p: the draw's candidates and nucleus
    spec = engine.make_spec(config, sp, 8, 16, 8, mesh=sharding.make_mesh(8, 1, 1))
    caches, state = engine.init(config, spec)
    assert all(x.sharding.spec == PartitionSpec("data") for x in jax.tree.leaves((caches, state)) if x.ndim)
    weights = engine.prepare_weights(config, params)
    text = engine.decode_block.lower(config, spec, weights, caches, state, jnp.float32(0.8),
                                     jnp.float32(0.8)).compile().as_text()  # fmt: skip
    found = [(m.group(1), re.search(r'op_name="([^"]*)"', line).group(1).rsplit("/", 1)[-1])
             for line in text.splitlines() if (m := COLLECTIVE.search(line))]  # fmt: skip
    # the scalar row-step count only: each device draws its own rows (no gather of logits or top-k candidates)
    assert found and set(found) == {("all-reduce", "reduce_sum")}, found


# every width distinct (hidden 32, heads x head_dim 48, q|k|v 96, MLP units 80, vocabulary 72, each a multiple of the
# FSDP size 4), so that a collective's shape says which array it moves
DISTINCT = TINY.replace(vocab_size=72, intermediate_size=80, head_dim=12)


def _fsdp_token_step(config, params, sp):
    """data 2 x fsdp 4: the spec, the decode weights (learner-sharded params in) and the token step's collectives."""
    mesh = sharding.make_mesh(2, 4, 1)
    spec = engine.make_spec(config, sp, 8, 16, 8, mesh=mesh)
    weights = engine.prepare_weights(config, sharding.shard_params(params, config, mesh), spec)
    caches, state = engine.init(config, spec)
    text = engine.decode_block.lower(config, spec, weights, caches, state, jnp.float32(0.8),
                                     jnp.float32(0.8)).compile().as_text()  # fmt: skip
    return spec, weights, [ln for ln in text.splitlines() if COLLECTIVE.search(ln)]


def test_an_fsdp_mesh_splits_the_layers_products_over_the_fsdp_axis():
    """data 2 x fsdp 4: the decode layers' weights lie split across the FSDP axis (q|k|v and the output projection
    by output column, the MLP by hidden unit) and a token step moves only row-sized arrays: per layer, the data
    shard's hidden states (and attention outputs) gathered over the FSDP axis, the column products all-to-all back to
    the rows and the MLP's float32 partial outputs summed. No collective carries a weight or the MLP's hidden units
    (the partitioner, on the learner's layout, all-reduced every row's [rows, 2F] partial gate|up products, or
    gathered whole weights). The samples equal the one-device engine's (`test_engine_on_a_mesh_gives_the_one_device_
    samples`, whose tiny model splits too)."""
    c = DISTINCT
    sp = SamplingParams(**CASES["plain"][0])
    assert engine.make_spec(TINY, sp, 8, 16, 8, mesh=sharding.make_mesh(2, 4, 1)).layers_split
    assert not engine.make_spec(c, sp, 8, 16, 8, mesh=sharding.make_mesh(8, 1, 1)).layers_split  # no FSDP axis
    odd = c.replace(intermediate_size=78)  # 78 units do not split 4 ways
    assert not engine.make_spec(odd, sp, 8, 16, 8, mesh=sharding.make_mesh(2, 4, 1)).layers_split
    spec, weights, lines = _fsdp_token_step(c, models.init_params(c, jax.random.key(0)), sp)
    layer = weights["layers"][0]
    assert layer["gate_up"].shape == (32, 2, 80) and layer["gate_up"].sharding.spec == PartitionSpec(None, None, "fsdp")
    assert layer["down"].sharding.spec == PartitionSpec("fsdp", None)
    assert layer["qkv"].sharding.spec == layer["o"].sharding.spec == PartitionSpec(None, "fsdp")
    half = spec.rows // 2
    gathers = [ln for ln in lines if "all-gather(" in ln]
    for d in (32, 48):  # the normed hidden states (q|k|v, MLP) and the attention output (output projection)
        assert any(f"= f32[{half},1,{d}]" in ln for ln in gathers), gathers
    assert sum("all-to-all(" in ln and "shard_map" in ln for ln in lines) >= 2 * c.num_layers, lines
    weight_or_units = r"\[(32,96|48,32|32,160|32,2,80|80,32|96|160|2,80|80)\]|,(160|80)\]|,2,(20|80)\]"
    assert not [ln.split(", metadata")[0] for ln in lines if re.search(weight_or_units, ln.split("(")[0])]
    # no partial sums but the MLP's, which are reduce-scattered: the only all-reduce is the scalar row-step count
    reduces = [ln for ln in lines if "all-reduce(" in ln]
    assert reduces and all(re.search(r"= s32\[\] all-reduce\(", ln) for ln in reduces), reduces


def test_an_fsdp_mesh_splits_the_lm_head_over_the_vocabulary():
    """data 2 x fsdp 4: the decode LM head lies split over the vocabulary across the FSDP axis (replicated over data);
    a token step gathers its data shard's hidden states over the FSDP axis, multiplies them by its vocabulary slice
    and moves the logits all-to-all into the draw's row split. No collective carries the head or a [rows, vocab]
    array whole (the partitioner all-reduced each data shard's partial logits over the FSDP axis). A data mesh keeps
    the head as placed. (The samples equal the one-device engine's: `test_engine_on_a_mesh_gives_the_one_device_
    samples`.)"""
    config = DISTINCT
    sp = SamplingParams(**CASES["plain"][0])
    assert not engine.make_spec(config, sp, 8, 16, 8, mesh=sharding.make_mesh(8, 1, 1)).head_split
    spec, weights, lines = _fsdp_token_step(config, models.init_params(config, jax.random.key(0)), sp)
    assert spec.head_split and weights["lm_head"].sharding.spec == PartitionSpec(None, "fsdp")
    half, v, d = spec.rows // 2, config.vocab_size, config.hidden_size
    assert any(f"= f32[{half},{d}]" in ln and "all-gather(" in ln for ln in lines), lines
    assert any("all-to-all(" in ln and f"f32[1,1,{half // 4},{v // 4}]" in ln for ln in lines), lines
    assert not [ln for ln in lines if re.search(rf"\[({spec.rows}|{half}),{v}\]|\[{d},{v}\]", ln)]


def test_an_admission_of_fewer_rows_than_devices_samples_the_one_device_rows(tiny):
    """A refill of one prompt (G = 3 rows) on 8 devices: its first tokens are drawn as the partitioner places 3 rows
    (each device's own rows are drawn in `shard_map` only when the rows split evenly), the one-device draw."""
    config, params = tiny
    sp = SamplingParams(**CASES["plain"][0])
    weights = engine.prepare_weights(config, params)
    tok, mask = engine.left_pad([[1, 2, 3]], 16, 1)
    firsts = []
    for mesh in (None, sharding.make_mesh(8, 1, 1)):
        spec = engine.make_spec(config, sp, 8, 16, 4, mesh=mesh)
        caches, state = engine.init(config, spec)
        _, state = engine.prefill(config, spec, 0, params, weights, caches, state, tok, mask, np.array([5], np.int32),
                                  np.array([0], np.int32), jax.random.key(1), jnp.float32(1.0), jnp.float32(1.0))
        firsts.append((np.asarray(state.tokens)[15:18, 0], np.asarray(state.logprobs)[15:18, 0]))
    np.testing.assert_array_equal(firsts[1][0], firsts[0][0])
    np.testing.assert_allclose(firsts[1][1], firsts[0][1], atol=1e-5, rtol=0)


TWO_PROCESS_BODY = r"""
from test_engine import CASES, MORE_PROMPTS
from test_sampling import tiny_model
from jaxgrpo import sharding
from jaxgrpo.rollout import SamplingParams, driver
config, params = tiny_model()
sp = SamplingParams(**CASES["eos_topp"][0])
mesh = sharding.make_mesh(8, 1, 1)  # the rows of both processes' devices
params = sharding.shard_params(params, config, mesh)
groups, stats = driver.run(config, params, MORE_PROMPTS, sp, jax.random.key(CASES["eos_topp"][1]), slots=3,
                           mesh=mesh)
comp = driver.completions(groups, range(len(MORE_PROMPTS)))
if pid == 0:
    np.savez(out, tokens=comp.tokens, logprobs=comp.logprobs, mask=comp.mask, admitted=stats.admitted)
"""


@pytest.mark.slow
def test_engine_on_a_mesh_of_two_processes_gives_the_one_device_samples(tiny, tmp_path):
    """The driver on a mesh over two processes' devices (4 each): every process reads the rows of the other's
    devices through a gather once per block (`driver.host_array`), takes the same decisions, and the groups are the
    one-device engine's, refills included (3 slots, rounded up to 8)."""
    from multihost import run_two_processes

    kw, key = CASES["eos_topp"]
    ref, _ = driver.run(*tiny, MORE_PROMPTS, SamplingParams(**kw), jax.random.key(key), slots=3)
    want = driver.completions(ref, range(len(MORE_PROMPTS)))
    got = run_two_processes(TWO_PROCESS_BODY, tmp_path)
    assert int(got["admitted"]) == len(MORE_PROMPTS)
    np.testing.assert_array_equal(got["tokens"], want.tokens)
    np.testing.assert_array_equal(got["mask"], want.mask)
    np.testing.assert_allclose(got["logprobs"], want.logprobs, atol=1e-5, rtol=0)
