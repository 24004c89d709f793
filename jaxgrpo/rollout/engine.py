# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The rollout engine: group slots, a jitted `prefill` into them and a jitted `decode_block` of k token steps.

Layout: ``S`` group slots of ``G`` rows each, ``B = S * G`` rows slot-major (row ``b`` belongs to slot ``b // G``).
Slot ``s`` holds one prompt: its keys/values in the prefix cache (per layer ``k [S, K, Tp, H]``, ``v [S, K, H, Tp]``,
written once by `prefill`, read by its G rows), and each row its own decode cache (per layer ``k [B, K, Mc, H]``,
``v [B, K, H, W]``). Every row carries its own step count, so rows admitted at different times share one batch: at
step ``i`` (it has generated tokens ``0 .. i-1``) a row feeds token ``i - 1`` at RoPE position ``len(prompt) + i - 1``,
writes its key/value at decode slot ``i - 1`` (a per-row in-place scatter), attends to its prompt and its decode slots
``0 .. i-1`` (`models.decode.decode_step`) and samples token ``i``.

Mesh (`Spec.sharding`, `make_spec(..., mesh=)`): axis 0 of every cache and per-row state array (slots, rows) is split
over the mesh's batch axes (`jaxgrpo.sharding.BATCH_AXES`), in contiguous blocks, so slot ``s`` and its G rows live
on one device; the per-row writes are vmapped scatters (the row axis a batching dimension), each device draws its
own rows (`jax.shard_map`), and on a data mesh a token step needs no collective but the scalar row-step count.
Weights are read as the caller placed them, but for two on a mesh with an FSDP axis: the LM head
(`Spec.head_split`), which `prepare_weights` splits over the vocabulary across that axis (a token step gathers its
data shard's hidden states over it and moves the logits all-to-all into the draw's row split), and the fused layers'
weight products (`Spec.layers_split`), which it splits across that axis and runs as tensor parallelism does
(`split_ops`). On a mesh over several processes the driver gathers ``done`` and the finished groups from every
process once per block (`jaxgrpo.rollout.driver.host_array`).

Window: the decode cache holds ``W`` slots, the block's `window` (the most steps of an unfinished row + the block,
rounded up to `window_multiple`: 32, 128 on CPU, coarser past `MAX_WINDOWS` windows; at most ``Mc`` = ``M - 1``
rounded up to a multiple of 128); the driver `resize`s it between blocks, so a token step reads the slots its rows
have written (up to the rounding), not ``Mc`` of them: one `decode_block` program per width.

`prefill(prompts -> slots)` encodes the prompts (`models.prefill`, packed end to end), writes their prefix, samples
each row's token 0 from its prompt's last logits and resets the rows' state. `decode_block` runs ``k`` steps in a
`lax.fori_loop` with the cache and the state donated (updated in place); the host tests for the end once per block
(`DecodeState.done`), not once per token. Finished rows keep running masked until their slot is refilled.

Randomness: the row answering prompt ``p`` with sample ``g`` draws token ``i`` with
``fold_in(fold_in(key, p * G + g), i)``: per (prompt index, sample, step), so a completion's randomness does not depend
on its slot, on when it was admitted, on the batch padding or on the mode (static or continuous). Its logits do, in
their last float bits (the batch's width and packing change XLA's reductions, ~1e-6 in a log-prob): a draw whose
uniform falls that close to a boundary of the cumulative distribution can pick the neighbouring token, and the row
differs from there on. These are the keys `sampling.generate` used before the engine (row ``r = p * G + g``).

Sampling distribution: `jaxgrpo.token_sampling` (temperature, then top-k, then top-p, renormalised); the recorded
log-probs are of that truncated distribution (see `jaxgrpo.rollout.record`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgrpo import models
from jaxgrpo.models.attention import DENSE, Kernel, KVCache
from jaxgrpo.models.decode import AS_WRITTEN, DecodeWeights, LayerOps, decode_step, decode_weights
from jaxgrpo.rollout.params import SamplingParams
from jaxgrpo.sharding import BATCH_AXES
from jaxgrpo.token_sampling import sample_from_logits

CACHE_MULTIPLE = 128  # decode cache width granularity (no odd widths for the matmul libraries to pad)
# the decode cache's width during a block: the slots its rows have written, rounded up to this (on accelerators,
# where a token step's bytes are the cost; on CPU, 128: fewer programs to compile, each token step is compute-bound)
WINDOW_MULTIPLE = 32
WINDOW_MULTIPLE_CPU = 128
# at most this many windows (decode programs) per rollout: past 16 x 32 = 512 new tokens the window step grows with
# the cache (2,048 new tokens: windows of 128), so long rollouts compile a bounded number of programs
MAX_WINDOWS = 16


@dataclasses.dataclass(frozen=True)
class Spec:
    """Static shape and sampling settings of one engine (hashable: the jitted functions compile once per Spec)."""

    slots: int  # S
    num_samples: int  # G
    max_new_tokens: int  # M
    prompt_width: int  # Tp
    block: int  # k, decode steps per block
    greedy: bool
    top_k: int
    use_top_p: bool
    eos_token_ids: tuple[int, ...]
    window_multiple: int = WINDOW_MULTIPLE
    # with a mesh: slots and rows (axis 0 of every cache and per-row state array) split over its batch axes
    # (`row_sharding`); slot s and its G rows on the same device, so a token step needs no collective
    sharding: NamedSharding | None = None
    attention: Kernel = DENSE  # the prefill's attention kernel (the run's `perf.attention`, resolved)
    # with an FSDP-split mesh: the LM head split over the vocabulary across the FSDP axis (`head_sharding`)
    head_split: bool = False
    # and the fused layers' weight products split across that axis (`layer_shardings`, `split_ops`)
    layers_split: bool = False

    @property
    def rows(self) -> int:
        return self.slots * self.num_samples

    @property
    def cache_width(self) -> int:
        return cache_slots(self.max_new_tokens - 1)


def cache_slots(tokens: int) -> int:
    """Decode-cache slots for ``tokens`` tokens: rounded up to a multiple of `CACHE_MULTIPLE` (at least one)."""
    return -(-max(int(tokens), 1) // CACHE_MULTIPLE) * CACHE_MULTIPLE


def truncation(config: models.ModelConfig, greedy: bool, top_k: int, top_p: float) -> tuple[int, bool]:
    """``(top_k, use_top_p)`` as the jitted programs take them: none when greedy; k >= V truncates nothing."""
    return (int(top_k) if (not greedy and top_k < config.vocab_size) else 0), (not greedy) and top_p < 1.0


def window_multiple(platform: str | None = None, max_new_tokens: int = 1) -> int:
    """The step of the decode windows: `WINDOW_MULTIPLE`, or `WINDOW_MULTIPLE_CPU` on CPU (``platform``: default
    jax's default backend), raised to a multiple of itself when ``max_new_tokens`` would need more than `MAX_WINDOWS`
    windows."""
    base = WINDOW_MULTIPLE_CPU if (platform or jax.default_backend()) == "cpu" else WINDOW_MULTIPLE
    return base * max(-(-cache_slots(max_new_tokens - 1) // (base * MAX_WINDOWS)), 1)


def make_spec(config: models.ModelConfig, sp: SamplingParams, slots: int, prompt_width: int, block: int,
              platform: str | None = None, mesh: Mesh | None = None, attention: Kernel = DENSE) -> Spec:  # fmt: skip
    """The engine's `Spec` (``platform``: the devices it compiles for, default jax's default backend; ``mesh``: the
    rows split over its batch axes, `row_sharding`; ``slots`` must then be a multiple of `row_shards`;
    ``attention``: the prefill's attention kernel, `models.attention.Kernel`)."""
    top_k, use_top_p = truncation(config, sp.greedy, sp.top_k, sp.top_p)
    sharding = row_sharding(mesh)
    if slots % row_shards(mesh):
        raise ValueError(f"{slots} slots do not split over the mesh's {row_shards(mesh)} batch shards")
    platform = platform or (mesh.devices.flat[0].platform if mesh is not None else None)
    fsdp = (sharding is not None and mesh.shape.get("fsdp", 1) > 1 and mesh.shape.get("tensor", 1) == 1)
    split = fsdp and config.vocab_size % mesh.shape["fsdp"] == 0
    widths = (config.hidden_size, (config.num_heads + 2 * config.num_kv_heads) * config.head_dim,
              config.intermediate_size)  # the split products' output columns and the MLP's units
    layers_split = fsdp and all(n % mesh.shape["fsdp"] == 0 for n in widths)
    return Spec(slots, sp.num_samples, sp.max_new_tokens, prompt_width, block, sp.greedy, top_k, use_top_p,
                sp.eos_token_ids, window_multiple(platform, sp.max_new_tokens), sharding, attention, split,
                layers_split)  # fmt: skip


def _batch_axes(mesh: Mesh | None) -> tuple[str, ...]:
    return () if mesh is None else tuple(a for a in BATCH_AXES if a in mesh.axis_names and mesh.shape[a] > 1)


def row_shards(mesh: Mesh | None) -> int:
    """How many ways the engine splits its slots over ``mesh`` (the product of its batch axes, `BATCH_AXES`)."""
    return int(np.prod([mesh.shape[a] for a in _batch_axes(mesh)])) if mesh is not None else 1


def split_slots(slots: int, mesh: Mesh | None) -> int:
    """``slots`` rounded up to a multiple of `row_shards`: the driver's slot count on ``mesh`` (extra slots idle)."""
    shards = row_shards(mesh)
    return -(-int(slots) // shards) * shards


def row_sharding(mesh: Mesh | None) -> NamedSharding | None:
    """Axis 0 (slots, rows) over ``mesh``'s batch axes (as the training batch), the other axes replicated; None
    without a mesh or when it has no batch axis of size > 1 (every device then runs every row)."""
    axes = _batch_axes(mesh)
    if not axes:
        return None
    return NamedSharding(mesh, PartitionSpec(axes if len(axes) > 1 else axes[0]))


def placed(spec: Spec, tree: Any) -> Any:
    """Abstract arrays (``jax.ShapeDtypeStruct``) of the engine's caches and state placed as the jitted programs
    place them (`_constrain`): for lowering them ahead of time (`jaxgrpo.precompile`, `jaxgrpo.aot`)."""
    if spec.sharding is None:
        return tree
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_placement(spec, x)), tree)


def _placement(spec: Spec, x: Any) -> NamedSharding:
    """An array's placement on the engine's mesh: split over the batch axes if its axis 0 counts slots or rows."""
    assert spec.sharding is not None
    if x.ndim and x.shape[0] in (spec.slots, spec.rows):
        return spec.sharding
    return NamedSharding(spec.sharding.mesh, PartitionSpec())


def _constrain(spec: Spec, tree: Any) -> Any:
    """Every array of ``tree`` with a leading slot or row axis split as `Spec.sharding` says, the rest replicated."""
    if spec.sharding is None:
        return tree
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, _placement(spec, x)), tree)


@flax.struct.dataclass
class DecodeState:
    """Per-row decode state, ``B`` rows (slot-major). ``step``: tokens generated so far; ``last``: the last of them;
    ``done``: finished (EOS, ``M`` tokens, or an empty slot); ``eos``: ended with an EOS id; ``length``: the prompt's
    length; ``row_key``: the row's PRNG key; ``tokens``/``logprobs``/``entropy``/``mask`` ``[B, M]`` the outputs;
    ``active_steps``: row-steps run on unfinished rows (for the slot utilization); ``clock``: decode steps run;
    ``start``: the clock at the row's admission."""

    step: jax.Array
    last: jax.Array
    done: jax.Array
    eos: jax.Array
    length: jax.Array
    row_key: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    entropy: jax.Array
    mask: jax.Array
    active_steps: jax.Array
    clock: jax.Array
    start: jax.Array


@flax.struct.dataclass
class Caches:
    """The prefix cache (per layer, S slots), its mask ``[S, Tp]`` and the decode cache (per layer, B rows)."""

    prefix: list[KVCache]
    prefix_mask: jax.Array
    decode: list[KVCache]


@functools.partial(jax.jit, static_argnames=("config", "spec"))
def init(config: models.ModelConfig, spec: Spec) -> tuple[Caches, DecodeState]:
    """Empty slots: zero caches (the decode cache at the first block's `window`), every row done. One program per
    (config, spec): eagerly, its ~4L + 15 buffers were as many dispatches at the start of every rollout."""
    L, K, H, dt = config.num_layers, config.num_kv_heads, config.head_dim, jnp.dtype(config.dtype)
    S, B, Tp, Mc, M = spec.slots, spec.rows, spec.prompt_width, window(spec, 1), spec.max_new_tokens
    prefix = [KVCache(jnp.zeros((S, K, Tp, H), dt), jnp.zeros((S, K, H, Tp), dt)) for _ in range(L)]
    decode = [KVCache(jnp.zeros((B, K, Mc, H), dt), jnp.zeros((B, K, H, Mc), dt)) for _ in range(L)]
    caches = Caches(prefix, jnp.zeros((S, Tp), bool).at[:, -1].set(True), decode)
    zeros = lambda shape, dt: jnp.zeros(shape, dt)  # noqa: E731  (distinct buffers: every leaf is donated)
    state = DecodeState(zeros(B, jnp.int32), zeros(B, jnp.int32), jnp.ones(B, bool), zeros(B, bool),
                        jnp.ones(B, jnp.int32), jax.random.split(jax.random.key(0), B), zeros((B, M), jnp.int32),
                        zeros((B, M), jnp.float32), zeros((B, M), jnp.float32),
                        jnp.zeros((B, M), bool), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32),
                        zeros(B, jnp.int32))  # fmt: skip
    return _constrain(spec, (caches, state))


def _sample(spec: Spec, keys, logits, temperature, top_p):
    """The draw (`sample_from_logits`, with the TPU block-sum kernel where it applies). On a mesh each device draws
    its own rows (`jax.shard_map` over the batch axes: a row's draw reads only its row), so neither the logits nor
    the top-k candidates are gathered, and the LM head's logits are made row-split."""

    def draw(k, x, t, p, kernel=True):
        return sample_from_logits(k, x, t, greedy=spec.greedy, top_k=spec.top_k, top_p=p if spec.use_top_p else None,
                                  return_entropy=True, tpu_kernel=kernel)  # fmt: skip

    if spec.sharding is None:
        return draw(keys, logits, temperature, top_p)
    if logits.shape[0] % row_shards(spec.sharding.mesh):  # an admission of fewer rows than devices: as the
        return draw(keys, logits, temperature, top_p, kernel=False)  # partitioner places them
    rows, one = spec.sharding.spec, PartitionSpec()
    # check_vma off: the TPU kernel's outputs carry no varying-axes type (each row is its device's own anyway)
    return jax.shard_map(draw, mesh=spec.sharding.mesh, in_specs=(rows, rows, one, one), out_specs=(rows, rows, rows),
                         check_vma=False)(keys, logits, temperature, top_p)  # fmt: skip


def _is_eos(spec: Spec, tokens: jax.Array) -> jax.Array:
    if not spec.eos_token_ids:
        return jnp.zeros(tokens.shape, bool)
    return jnp.isin(tokens, jnp.asarray(spec.eos_token_ids, jnp.int32))


def head_sharding(spec: Spec) -> NamedSharding | None:
    """The decode LM head's placement when `Spec.head_split`: ``[D, V]`` split over the vocabulary across the FSDP
    axis (each device reads ``1 / fsdp`` of it per token step); else None (placed as the partitioner places it)."""
    if not spec.head_split:
        return None
    return NamedSharding(spec.sharding.mesh, PartitionSpec(None, "fsdp"))


def _logits(spec: Spec, weights: DecodeWeights, hidden_BD: jax.Array) -> jax.Array:
    """The LM head as one einsum, accumulated in float32. With `Spec.head_split` the hidden states enter it whole
    over the FSDP axis (rows split over the other batch axes: a gather of ``[rows, D]`` in the compute dtype), so
    each device computes its vocabulary slice of its data shard's logits; the draw's row split then moves them
    all-to-all. (With the head split over the hidden axis, XLA computed every row's partial logits on each device
    and all-reduced them: the pod's decode moved ``[512, 128256]`` float32 twice per token step.)"""
    dot = lambda h, w: jnp.einsum("bd,dv->bv", h, w, preferred_element_type=jnp.float32)  # noqa: E731
    if not spec.head_split:
        return dot(hidden_BD, weights["lm_head"])
    mesh = spec.sharding.mesh
    others = tuple(a for a in _batch_axes(mesh) if a != "fsdp")
    rows = (others if len(others) > 1 else others[0]) if others else None
    if hidden_BD.shape[0] % int(np.prod([mesh.shape[a] for a in others])):
        rows = None
    # explicit, so that the partitioner neither gathers the head nor splits the layers' rows over the FSDP axis
    return jax.shard_map(dot, mesh=mesh, in_specs=(PartitionSpec(rows, None), PartitionSpec(None, "fsdp")),
                         out_specs=PartitionSpec(rows, "fsdp"), check_vma=False)(hidden_BD, weights["lm_head"])


def layer_shardings(spec: Spec) -> dict[str, NamedSharding] | None:
    """The decode layers' weight placement when `Spec.layers_split` (`split_ops`): ``qkv [D, E]`` and ``o [N H, D]``
    split over their output columns, ``gate_up`` as ``[D, 2, F]`` and ``down [F, D]`` over the hidden units ``F``
    (each device holds the gate and up columns of the same units), all across the FSDP axis; else None (the weights
    stay as the caller placed them and the partitioner places the products)."""
    if not spec.layers_split:
        return None
    mesh = spec.sharding.mesh
    cols, units = NamedSharding(mesh, PartitionSpec(None, "fsdp")), NamedSharding(mesh, PartitionSpec("fsdp", None))
    return {"qkv": cols, "o": cols, "gate_up": NamedSharding(mesh, PartitionSpec(None, None, "fsdp")), "down": units}


def split_ops(spec: Spec) -> LayerOps:
    """A fused decode layer's weight products on weights placed by `layer_shardings`, as tensor parallelism runs them
    (Shoeybi et al., "Megatron-LM", 2019) over the FSDP axis, the rows (split over every batch axis) gathered over
    that axis first: q|k|v and the output projection each compute ``1 / fsdp`` of their output columns for the data
    shard's rows and move them all-to-all back to the rows' devices; the MLP runs gate|up, ``silu(gate) * up`` and
    the down product on ``1 / fsdp`` of its hidden units, and the partial outputs are summed in float32 and scattered
    back to the rows. Every output column is one device's whole dot product but the MLP's (a sum of ``fsdp`` float32
    partials). Per token step and layer each device moves ``[rows, D]``-sized arrays and reads ``1 / fsdp`` of the
    layer's weights. (Left to the partitioner on the learner's layout, the pod config's decode all-reduced every row's
    partial gate|up products, ``[rows, 2F]``, and ran ``silu(gate) * up`` on all of them on every device: 56 MiB per
    layer and device.)"""
    mesh, rows = spec.sharding.mesh, PartitionSpec(spec.sharding.spec[0])
    place = layer_shardings(spec)
    gather = lambda x: jax.lax.all_gather(x, "fsdp", axis=0, tiled=True)  # noqa: E731  the data shard's rows

    def columns(x, w):
        y = jnp.einsum("bte,ed->btd", gather(x), w)
        return jax.lax.all_to_all(y, "fsdp", split_axis=0, concat_axis=2, tiled=True)

    def units(h, gate_up, down):
        gu = jnp.einsum("btd,dcf->btcf", gather(h), gate_up)
        y = jnp.einsum("btf,fd->btd", jax.nn.silu(gu[:, :, 0]) * gu[:, :, 1], down, preferred_element_type=jnp.float32)
        return jax.lax.psum_scatter(y, "fsdp", scatter_dimension=0, tiled=True).astype(h.dtype)

    def split(fn, *specs):
        return jax.shard_map(fn, mesh=mesh, in_specs=(rows, *specs), out_specs=rows, check_vma=False)

    def project(w, name, x):
        return split(columns, place[name].spec)(x, w[name])

    def mlp(w, h):
        return split(units, place["gate_up"].spec, place["down"].spec)(h, w["gate_up"], w["down"])

    return LayerOps(project, mlp)


@functools.partial(jax.jit, static_argnames=("config", "spec", "packed_width"), donate_argnames=("caches", "state"))
def prefill(config, spec: Spec, packed_width: int, params, weights: DecodeWeights, caches: Caches,
            state: DecodeState, prompt_AxT, mask_AxT, slot_A, prompt_id_A, key, temperature, top_p):
    """Admit ``A`` prompts (left-padded ``[A, Tp]``) into slots ``slot_A`` (``S`` = a padding prompt, dropped) as
    prompts ``prompt_id_A`` (their global index, for the keys): write their prefix, sample token 0 of their G rows
    and reset those rows' state. ``params``: compute-dtype params (`models.prefill`); ``weights``: `decode_weights`."""
    G, M = spec.num_samples, spec.max_new_tokens
    A = prompt_AxT.shape[0]
    last_AxD, kv = models.prefill(config, params, prompt_AxT, mask_AxT, packed_width=packed_width,
                                  attention_kernel=spec.attention)  # fmt: skip
    prefix = [KVCache(pk.at[slot_A].set(kv.k[i].astype(pk.dtype), mode="drop"),
                      pv.at[slot_A].set(kv.v[i].astype(pv.dtype), mode="drop"))
              for i, (pk, pv) in enumerate(caches.prefix)]  # fmt: skip
    prefix_mask = caches.prefix_mask.at[slot_A].set(mask_AxT, mode="drop")
    logits = jnp.repeat(_logits(spec, weights, last_AxD), G, axis=0)
    sample_ids = (prompt_id_A[:, None] * G + jnp.arange(G)[None, :]).reshape(-1).astype(jnp.uint32)
    row_key = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, sample_ids)
    step_key = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_key, jnp.uint32(0))
    tok, logp, ent = _sample(spec, step_key, logits, temperature, top_p)
    rows = (slot_A[:, None] * G + jnp.arange(G)[None, :]).reshape(-1)  # slot S -> row >= B: dropped
    eos = _is_eos(spec, tok)
    col0 = lambda x, dt: jnp.zeros((A * G, M), dt).at[:, 0].set(x)  # noqa: E731
    lengths = jnp.repeat(jnp.sum(mask_AxT, axis=-1, dtype=jnp.int32), G)
    upd = dict(step=jnp.ones_like(tok), last=tok, done=eos | (M <= 1), eos=eos, length=lengths, row_key=row_key,
               tokens=col0(tok, jnp.int32), logprobs=col0(logp, jnp.float32), entropy=col0(ent, jnp.float32),
               mask=col0(True, bool), start=jnp.full(A * G, state.clock))  # fmt: skip
    state = state.replace(**{k: getattr(state, k).at[rows].set(v, mode="drop") for k, v in upd.items()})
    return _constrain(spec, (Caches(prefix, prefix_mask, caches.decode), state))


def _decode_one(config, spec: Spec, weights, caches: Caches, st: DecodeState, temperature, top_p):
    """One token step for every row (finished rows run masked: their outputs are not written)."""
    B, M = spec.rows, spec.max_new_tokens
    active = ~st.done
    # row b writes its key/value at decode slot step - 1 and attends slots 0 .. step - 1; the cache holds the
    # block's window of slots (`window`: the driver resizes it between blocks), a finished row writes nothing
    width = caches.decode[0].k.shape[2]
    slot_B = jnp.where(active, st.step - 1, width)
    mask_BM = jnp.arange(width, dtype=jnp.int32)[None, :] < st.step[:, None]
    hidden, cache = decode_step(config, weights, st.last, st.length + st.step - 1, caches.prefix,
                                caches.prefix_mask, caches.decode, slot_B, mask_BM,
                                split_ops(spec) if spec.layers_split else AS_WRITTEN)  # fmt: skip
    keys = jax.vmap(jax.random.fold_in)(st.row_key, st.step.astype(jnp.uint32))
    tok, logp, ent = _sample(spec, keys, _logits(spec, weights, hidden), temperature, top_p)
    col = jnp.where(active, st.step, M)  # out of range for finished rows: the write is dropped
    # a write per row, vmapped: a scatter whose row axis is a batching dimension, which a mesh splits with no collective
    put = jax.vmap(lambda buf, v, c: buf.at[c].set(v, mode="drop"))  # noqa: E731
    eos = active & _is_eos(spec, tok)
    step = st.step + active.astype(jnp.int32)
    st = st.replace(step=step, last=jnp.where(active, tok, st.last), done=st.done | eos | (step >= M),
                    eos=st.eos | eos, tokens=put(st.tokens, tok, col), logprobs=put(st.logprobs, logp, col),
                    entropy=put(st.entropy, ent, col), mask=put(st.mask, jnp.ones(B, bool), col),
                    active_steps=st.active_steps + jnp.sum(active, dtype=jnp.int32), clock=st.clock + 1)  # fmt: skip
    return Caches(caches.prefix, caches.prefix_mask, cache), st


@functools.partial(jax.jit, static_argnames=("config", "spec"), donate_argnames=("caches", "state"))
def decode_block(config, spec: Spec, weights: DecodeWeights, caches: Caches, state: DecodeState, temperature,
                 top_p) -> tuple[Caches, DecodeState]:
    """``spec.block`` token steps (a `lax.fori_loop`; cache and state donated, updated in place). The decode cache's
    width (its slots, `window`) must cover every unfinished row's step + ``spec.block`` - 1: one compiled program
    per width, each reading only its window of slots."""

    def body(_, carry):
        return _decode_one(config, spec, weights, *carry, temperature, top_p)

    return _constrain(spec, jax.lax.fori_loop(0, spec.block, body, (caches, state)))


def window(spec: Spec, steps: int) -> int:
    """Decode-cache slots a block needs when its rows have generated at most ``steps`` tokens (a row at step ``i``
    attends slots ``0 .. i - 1``; a block runs ``spec.block`` steps): rounded up to a multiple of
    ``spec.window_multiple``, at most `Spec.cache_width`."""
    need, m = max(int(steps), 1) + spec.block - 1, spec.window_multiple
    return min(spec.cache_width, -(-need // m) * m)


def windows(spec: Spec) -> dict[int, int]:
    """The windows a rollout whose rows all run ``max_new_tokens`` steps decodes with (static mode, admitted
    together): ``{width: token steps run with it}`` (the decode report's weights)."""
    out: dict[int, int] = {}
    for start in range(1, spec.max_new_tokens, spec.block):
        w = window(spec, start)
        out[w] = out.get(w, 0) + min(spec.block, spec.max_new_tokens - start)
    return out


@functools.partial(jax.jit, static_argnames=("width",))
def resize(decode: list[KVCache], width: int) -> list[KVCache]:
    """The decode cache cut or zero-padded to ``width`` slots (between blocks: slots past every unfinished row's
    step hold nothing a later step reads)."""

    def fit(x, axis):
        if width <= x.shape[axis]:
            return jax.lax.slice_in_dim(x, 0, width, axis=axis)
        return jnp.pad(x, [(0, width - x.shape[axis]) if a == axis else (0, 0) for a in range(x.ndim)])

    return [KVCache(fit(c.k, 2), fit(c.v, 3)) for c in decode]


def prepare_weights(config: models.ModelConfig, params: Any, spec: Spec | None = None) -> DecodeWeights:
    """`models.decode.decode_weights`, called outside jit: one small program per layer, shared by every layer (as
    one jitted program over all layers XLA:CPU took minutes to compile it for a 30-layer model); the LM head and the
    fused layers' weights placed as ``spec`` decodes with them (`head_sharding`, `layer_shardings`)."""
    weights = decode_weights(config, params)
    head = None if spec is None else head_sharding(spec)
    if head is not None:
        weights["lm_head"] = jax.lax.with_sharding_constraint(weights["lm_head"], head)
    place = None if spec is None else layer_shardings(spec)
    if place is not None:  # the fused layers (LoRA's unmerged ones keep the partitioner's placement)
        for w in (w for w in weights["layers"] if "gate_up" in w):
            w["gate_up"] = w["gate_up"].reshape(config.hidden_size, 2, config.intermediate_size)
            w.update({k: jax.lax.with_sharding_constraint(w[k], sh) for k, sh in place.items()})
    return weights


def left_pad(prompts: list[Any], width: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` prompts left-padded to ``width`` (a missing prompt is one dummy token, never sampled from)."""
    tok, mask = np.zeros((rows, width), np.int32), np.zeros((rows, width), bool)
    for i in range(rows):
        p = np.asarray(prompts[i], np.int32) if i < len(prompts) else np.zeros(1, np.int32)
        tok[i, width - len(p):], mask[i, width - len(p):] = p, True
    return tok, mask
