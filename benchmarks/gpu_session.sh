#!/usr/bin/env bash
# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
#
# The GPU measurements the open issues wait on, as one call on a lent GPU machine (from the repository root; each
# part cut off by `timeout`, so one slow part cannot take the whole call). The machine has jax 0.11 with CUDA 13,
# flax, optax, orbax, chex, torch and transformers; only the `trl` part needs more (carried, below). Writes under
# $OUT (default ./gpu_out):
#   env.txt               device, driver, versions, commit
#   decode.json/.log      decode at 256 rows against the HBM roofline, then one decode run profiled per kernel
#                         (benchmarks/kernel_profile.py; XLA's CUDA graphs kept while profiling)
#   head_tiles.json/.log  the fused LM head's tilings side by side at the train step's shape (benchmarks/head_tiles.py):
#                         which `fused_head.Blocks` the train step should use (issue 33)
#   decode_nograph.*      the same decode with XLA's command buffers (CUDA graphs) off: what the graphs are worth
#   decode_{default,cublas}.*   the decode as XLA autotunes it, and with every GEMM a cuBLAS call (Triton GEMMs off)
#   train.json/.log       the train step at the Qwen2.5-0.5B shape (cuDNN attention, fused LM head in the fastest
#                         tiling the head part measured, if it ran first; remat projections and none): MFU, and one
#                         step of each profiled per kernel
#   recompile/            `python -m jaxgrpo.train` on the embedded default for 6 steps: time/compiles after step 1
#                         must be 0 under this jax; recompile.log names each compilation's program, thread and
#                         step, and why jit missed its cache
#   vs_trl.json/.log      the GRPO step against TRL (`benchmarks/vs_trl.py --gpu`, BENCHMARKS §9's work: 16 prompts x 8
#                         x 128 tokens), TRL's transformers-continuous-batching arm included. Needs what the machine
#                         lacks (trl, datasets, the model's shape): `python benchmarks/gpu_carry.py` here, then carry
#                         runs/gpu_carry; this part unpacks it under $TMPDIR and puts its packages on PYTHONPATH
# Usage: bash benchmarks/gpu_session.sh [parts...]   (default: env decode train head recompile nograph trl)
# The device time of a session (15 min with the machine's start) does not hold every part: the default order puts
# first what an open issue waits on (decode: issue 30, the decode-layer kernel checked against XLA then timed; train:
# issue 33's MFU with remat keeping cuDNN's forward; head: the fused head's second round of tilings), then the
# checks (recompile: issue 34's fix, verified at 681d164), the diagnoses, then the step against TRL (measured with
# both TRL arms at 6a35145, BENCHMARKS §9). The parts' time limits add up to more than one call's 600 s, so: first call
#   run(command="OUT=$OUT bash benchmarks/gpu_session.sh env decode train", timeout_s=600)
# then, if the session's device time allows, `xlaflags`, `head train` again (the winner), and
# `bash benchmarks/gpu_session.sh nograph trl` with carry=["runs/gpu_carry"] (39 MiB beside a ~21 MiB checkout: the
# call's limit is 64 MiB).
# QUICK=1 shrinks every shape (a check of the script itself on any machine, CPU included).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's jaxgrpo, no install needed (the machine is offline)
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(env decode train xlaflags head recompile nograph trl)
CHIP=h100
if command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  CHIP=h200
fi
SMALL=()
STEPS=6
if [ "${QUICK:-0}" = 1 ]; then  # shapes small enough for a CPU
  SMALL=(--layers 1 --decode-prompts 2 --decode-group 2 --decode-tokens 4 8 --prompts 4 --prompt-len 32
         --completion-len 16 --repeats 1)
  STEPS=3
fi

part_env() {
  {
    date -u +%FT%TZ
    git rev-parse --short HEAD 2> /dev/null
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$PY" -c "import jax, jaxlib, flax; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax',
flax.__version__); print(jax.devices())"
    "$PY" -c "import jaxgrpo; print('jaxgrpo from', jaxgrpo.__file__)" || echo "jaxgrpo not importable"
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
}
part_trl() {
  CARRY=runs/gpu_carry
  if [ -f "$CARRY/carry.tar.xz" ]; then
    X="${TMPDIR:-/tmp}/jaxgrpo_gpu_carry"  # unpacked outside the checkout: 267 MB there would not travel next time
    rm -rf "$X"
    "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
      "$CARRY/carry.tar.xz" "$X"
    TRL_ARGS=(--model "$X/smollm2-135m" --random-init --data-dir "$X/gsm8k")
    TRL_PATH="${PYTHONPATH:-}"  # the carried packages only where the machine lacks them (they are for CPython 3.12)
    "$PY" -c "import trl, datasets" 2> /dev/null || TRL_PATH="$X/site${PYTHONPATH:+:$PYTHONPATH}"
    SHAPE=(--prompts 16 --group 8 --tokens 128 --steps 4 --only jaxgrpo trl trl_cb)  # no-prefix arm: time
    [ "${QUICK:-0}" = 1 ] && SHAPE=(--prompts 2 --group 2 --tokens 8 --steps 2)
    GPU_FLAG=()
    command -v nvidia-smi > /dev/null && GPU_FLAG=(--gpu)
    PYTHONPATH="$TRL_PATH" timeout 300 "$PY" benchmarks/vs_trl.py "${GPU_FLAG[@]}" "${TRL_ARGS[@]}" "${SHAPE[@]}" \
      --out "$OUT/vs_trl.json" > "$OUT/vs_trl.log" 2>&1
    echo "trl: exit $?"; tail -6 "$OUT/vs_trl.log"
  else
    echo "trl: skipped, no $CARRY/carry.tar.xz (make it with python benchmarks/gpu_carry.py and carry runs/gpu_carry)"
  fi
}
part_decode() {
  timeout 150 "$PY" benchmarks/gpu.py --parts decode profile --chip "$CHIP" "${SMALL[@]}" --out "$OUT/decode.json" \
    > "$OUT/decode.log" 2>&1
  echo "decode: exit $?"; grep -E "decode step|device busy|check decode_layer" "$OUT/decode.log"
}
part_nograph() {
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" timeout 90 "$PY" benchmarks/gpu.py --parts decode \
    --chip "$CHIP" "${SMALL[@]}" --out "$OUT/decode_nograph.json" > "$OUT/decode_nograph.log" 2>&1
  echo "nograph: exit $?"; grep -E "decode step" "$OUT/decode_nograph.log"
}
part_xlaflags() {
  # decode under XLA flag sets (each a process of its own: flags are read when the backend starts): Triton GEMMs off
  # makes every projection a cuBLAS call, whose epilogue takes the residual add and the qkv bias (8 kernels a layer
  # compiled for an H100 without a GPU, BENCHMARKS §11); left on, autotuning may pick a Triton GEMM that does not
  # (11 a layer with every GEMM Triton): fewer launches against possibly faster GEMMs
  for arm in "default:" "cublas:--xla_gpu_enable_triton_gemm=false"; do
    # shellcheck disable=SC2086  # unquoted on purpose: no leading blank (XLA reads a value not starting "--" as a file)
    XLA_FLAGS="$(echo ${XLA_FLAGS:-} ${arm#*:})" timeout 100 "$PY" benchmarks/gpu.py --parts decode --chip "$CHIP" \
      "${SMALL[@]}" --out "$OUT/decode_${arm%%:*}.json" > "$OUT/decode_${arm%%:*}.log" 2>&1
    echo "xlaflags ${arm%%:*}: exit $?"; grep -E "decode step" "$OUT/decode_${arm%%:*}.log"
  done
}
part_head() {
  HEAD=()
  [ "${QUICK:-0}" = 1 ] && HEAD=(--tokens 64 --hidden 32 --vocab 256 --tiles 16,128,32,4,2 32,64,16,4,3 --repeats 1)
  timeout 150 "$PY" benchmarks/head_tiles.py "${HEAD[@]}" --out "$OUT/head_tiles.json" > "$OUT/head_tiles.log" 2>&1
  echo "head: exit $?"; grep -E "forward" "$OUT/head_tiles.log"
}
part_train() {
  # the head in its fastest tiling (if the head part ran), with and without remat (issue 33's 40%: 37.2% and 39.7%)
  ATT=(--attention cudnn --lm-head fused --head-tiles "$OUT/head_tiles.json" --remat projections none)
  [ "${QUICK:-0}" = 1 ] && ATT=(--attention chunked --lm-head auto --head-tiles "$OUT/head_tiles.json")
  timeout 200 "$PY" benchmarks/gpu.py --parts train profile "${ATT[@]}" --chip "$CHIP" "${SMALL[@]}" \
    --out "$OUT/train.json" > "$OUT/train.log" 2>&1
  echo "train: exit $?"; grep -E "s/step|device busy" "$OUT/train.log"
}
part_recompile() {
  rm -rf "$OUT/recompile"
  # `python -m jaxgrpo.train` with every compilation logged by thread and step (benchmarks/compile_log.py)
  timeout 120 "$PY" benchmarks/compile_log.py --run-dir "$OUT/recompile" "train.steps=$STEPS" log.progress=false \
    log.tensorboard=false > "$OUT/recompile.log" 2>&1
  echo "recompile: exit $?"
  grep -E "STEP|Compiling|CACHE MISS|^  " "$OUT/recompile.log" | cut -c1-240 | awk '/STEP 0 end/{p=1} p' | head -60
  "$PY" - "$OUT/recompile/metrics.jsonl" << 'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
later = {r["step"]: r.get("time/compiles") for r in rows if r.get("step", 0) > 1}
print("time/compiles after step 1:", later, "OK" if later and not any(later.values()) else "RECOMPILED")
EOF
}

for part in "${PARTS[@]}"; do
  if declare -F "part_$part" > /dev/null; then
    "part_$part"
  else
    echo "unknown part $part (parts: env decode train xlaflags head recompile nograph trl)"; exit 2
  fi
done
