# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""The fused LM head's tilings side by side (issue 33): `jaxgrpo.learner.fused_head.fused_logprobs` forward and forward
+ backward at one train-step shape, for each ``--tiles`` entry, beside the chunked XLA head, in one run.

Why: on an H200 the Qwen2.5-0.5B train step's largest kernels are the head's forward and its ``dz`` kernel
(BENCHMARKS §9). The forward runs one program per ``bm`` token rows over the whole vocabulary, so ``bm`` sets how
often the head is read per row and the Hopper MMA tile each program issues; ``dz`` one program per ``[bm, bv]`` tile.
The first round on an H200 (six tilings) made ``bm`` 128, 8 warps, 3 stages the default (`fused_head.DEFAULT_BLOCKS`,
forward + backward 1.07x the old ``bm`` 64, 4 warps, 2 stages). The default list is the second round: the default
first, then deeper pipelines, larger ``bk``/``bv`` and the old default as the anchor. Compiled for an H100 without one
(``ptxas -v``), none of them spills: forward 168-174 registers a thread (``bm`` 64 with ``bv`` 256: 241; ``bm`` 256:
255), ``dz`` 96-105. Left out because the forward spills there: ``bm`` 128 with ``bv`` 256 (3 or 4 stages) and ``bm``
256 with 4 stages. A ``bv`` that does not divide the vocabulary (256 for Qwen2.5's 151,936) pads the head.

Each tiling's log-probs are checked against the first's (``max_abs_diff_logp``: the tiles change only the order of
float32 sums). Times are medians of ``--repeats`` calls after a compiling one, with `jax.block_until_ready`.

    python benchmarks/head_tiles.py [--tokens 43008] [--tiles 64,128,64,4,2 128,128,64,8,3 ...] [--out FILE]

``--tiles`` entries are ``bm,bv,bk,num_warps,num_stages`` (`fused_head.Blocks`). Off NVIDIA GPUs the kernels run in
the Pallas interpreter: only a check of the script at tiny shapes (``--tokens 64 --hidden 32 --vocab 256``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from jaxgrpo.learner import fused_head  # noqa: E402
from jaxgrpo.learner import logprobs as logprobs_lib  # noqa: E402

DEFAULT_TILES = ("128,128,64,8,3", "128,128,64,8,4", "128,128,128,8,3", "128,128,32,8,4", "64,256,64,8,3",
                 "64,128,64,4,4", "256,128,64,8,3", "64,128,64,4,2")  # fmt: skip


def _timed(fn: Callable, args: tuple, repeats: int) -> tuple[float, float]:
    """(first call's seconds, median of ``repeats`` further calls) of ``fn(*args)``."""
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return first, statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=43008, help="token rows per call (the train step's per micro-batch)")
    ap.add_argument("--hidden", type=int, default=896, help="hidden size (896 = Qwen2.5-0.5B)")
    ap.add_argument("--vocab", type=int, default=151936, help="vocabulary (151,936 = Qwen2.5)")
    ap.add_argument("--tiles", nargs="+", default=list(DEFAULT_TILES), help="bm,bv,bk,num_warps,num_stages")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "head_tiles.json"))
    args = ap.parse_args(argv)
    tiles = []
    for spec in args.tiles:
        fields = spec.split(",")
        if len(fields) != 5 or not all(f.strip().isdigit() and int(f) > 0 for f in fields):
            ap.error(f"--tiles entry {spec!r} is not bm,bv,bk,num_warps,num_stages (five positive integers)")
        tiles.append(fused_head.Blocks(*map(int, fields)))
    N, D, V = args.tokens, args.hidden, args.vocab
    kh, kw, kt, kg = jax.random.split(jax.random.key(0), 4)
    h = (jax.random.normal(kh, (N, D), jnp.float32)).astype(jnp.bfloat16)
    w = jax.random.normal(kw, (V, D), jnp.float32) * D**-0.5  # a tied head [V, D], float32 master
    t = jax.random.randint(kt, (N,), 0, V)
    g = jax.random.normal(kg, (N,), jnp.float32)
    flops = 2 * N * D * V  # one logits GEMM; the backward recomputes it (dz) and runs two more (dh, dW)

    def arms():
        for b in tiles:
            name = f"fused bm={b.bm} bv={b.bv} bk={b.bk} warps={b.num_warps} stages={b.num_stages}"
            yield name, b, lambda h, t, w, b=b: fused_head.fused_logprobs(h, t, w, blocks=b)[0]
        yield "xla chunked", None, lambda h, t, w: logprobs_lib._xla_head(
            h[None], t[None], w, temperature=1.0, chunk=0, pack_rows=1, trunc=(0, None),
            tied=True, dtype=jnp.bfloat16)[0][0]  # fmt: skip

    out = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "command": " ".join(sys.argv),
           "shape": {"tokens": N, "hidden": D, "vocab": V}, "results": {}}  # fmt: skip
    rows, ref = out["results"], None
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for name, blocks, f in arms():
        fwd = jax.jit(f)
        both = jax.jit(jax.grad(lambda h, w, f=f: jnp.vdot(g, f(h, t, w)), argnums=(0, 1)))
        logp = jax.block_until_ready(fwd(h, t, w))  # one execution at a time: the Pallas interpreter calls back
        ref = logp if ref is None else ref
        first_f, fwd_s = _timed(fwd, (h, t, w), args.repeats)
        first_b, both_s = _timed(both, (h, w), args.repeats)
        rows[name] = {"forward_s": fwd_s, "forward_backward_s": both_s, "first_call_s": [first_f, first_b],
                      "forward_tflops": flops / fwd_s / 1e12, "forward_backward_tflops": 4 * flops / both_s / 1e12,
                      "max_abs_diff_logp": float(jnp.max(jnp.abs(logp - ref))),
                      "blocks": blocks._asdict() if blocks else None}  # fmt: skip
        r = rows[name]
        print(f"{name:48s} forward {fwd_s * 1e3:8.2f} ms ({r['forward_tflops']:6.1f} TFLOP/s)  fwd+bwd "
              f"{both_s * 1e3:8.2f} ms ({r['forward_backward_tflops']:6.1f})  |dlogp| {r['max_abs_diff_logp']:.1e}",
              flush=True)  # fmt: skip
        pathlib.Path(args.out).write_text(json.dumps(out, indent=1))  # after every arm: a time limit keeps the rest
    return out


if __name__ == "__main__":
    main()
