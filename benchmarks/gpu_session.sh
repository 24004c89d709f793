#!/usr/bin/env bash
# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
#
# The GPU measurements the open issues wait on, as one call on a lent GPU machine (from the repository root; each
# part cut off by `timeout`, so one slow part cannot take the whole call). The machine has jax 0.11 with CUDA 13,
# flax, optax, orbax, chex and transformers; nothing here needs `datasets`, `gguf` or `tensorboardX`. Writes under
# $OUT (default ./gpu_out):
#   env.txt               device, driver, versions, commit
#   decode.json/.log      decode at 256 rows against the HBM roofline, then one decode run profiled per kernel
#                         (benchmarks/kernel_profile.py; XLA's CUDA graphs kept while profiling)
#   decode_nograph.*      the same decode with XLA's command buffers (CUDA graphs) off: what the graphs are worth
#   train.json/.log       the train step at the Qwen2.5-0.5B shape (cuDNN attention, fused LM head): MFU, and one
#                         step profiled per kernel
#   recompile/            `python -m jaxgrpo.train` on the embedded default for 6 steps: time/compiles after step 1
#                         must be 0 under this jax
# Usage: bash benchmarks/gpu_session.sh [parts...]   (default: env decode nograph train recompile)
# QUICK=1 shrinks every shape (a check of the script itself on any machine, CPU included).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(env decode nograph train recompile)
want() { [[ " ${PARTS[*]} " == *" $1 "* ]]; }

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

if want env; then
  {
    date -u +%FT%TZ
    git rev-parse --short HEAD 2> /dev/null
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$PY" -c "import jax, jaxlib, flax; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax',
flax.__version__); print(jax.devices())"
    "$PY" -c "import jaxgrpo; print('jaxgrpo from', jaxgrpo.__file__)" || echo "jaxgrpo not importable: pip install --no-deps -e ."
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
fi
if want decode; then
  timeout 240 "$PY" benchmarks/gpu.py --parts decode profile --chip "$CHIP" "${SMALL[@]}" --out "$OUT/decode.json" \
    > "$OUT/decode.log" 2>&1
  echo "decode: exit $?"; grep -E "decode step|device busy" "$OUT/decode.log"
fi
if want nograph; then
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" timeout 120 "$PY" benchmarks/gpu.py --parts decode \
    --chip "$CHIP" "${SMALL[@]}" --out "$OUT/decode_nograph.json" > "$OUT/decode_nograph.log" 2>&1
  echo "nograph: exit $?"; grep -E "decode step" "$OUT/decode_nograph.log"
fi
if want train; then
  ATT=(--attention cudnn --lm-head fused)
  [ "${QUICK:-0}" = 1 ] && ATT=(--attention chunked --lm-head auto)
  timeout 240 "$PY" benchmarks/gpu.py --parts train profile "${ATT[@]}" --chip "$CHIP" "${SMALL[@]}" \
    --out "$OUT/train.json" > "$OUT/train.log" 2>&1
  echo "train: exit $?"; grep -E "s/step|device busy" "$OUT/train.log"
fi
if want recompile; then
  rm -rf "$OUT/recompile"
  timeout 180 "$PY" -m jaxgrpo.train --run-dir "$OUT/recompile" "train.steps=$STEPS" log.progress=false \
    > "$OUT/recompile.log" 2>&1
  echo "recompile: exit $?"
  "$PY" - "$OUT/recompile/metrics.jsonl" << 'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
later = {r["step"]: r.get("time/compiles") for r in rows if r.get("step", 0) > 1}
print("time/compiles after step 1:", later, "OK" if later and not any(later.values()) else "RECOMPILED")
EOF
fi
