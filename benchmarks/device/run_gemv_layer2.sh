#!/usr/bin/env bash
# Fused GEMV layers with row-layout tiles: kernel GPU tests; bench step at empty context on
# SDAR-1.7B and SDAR-8B: load-time choice, forced fused layers, cuBLAS only, same run;
# HumanEval request TPS on SDAR-1.7B, device_loop vs host_loop.
set -uo pipefail
source benchmarks/device/common.sh
timeout 200 python3 -m pytest -q -x tests/kernels tests/e2e/test_fused_tokens.py >> $LOG 2>&1
tail -2 $LOG; echo "tests done at $(( $(date +%s) - t0 )) s"
for model in SDAR-1.7B-Chat SDAR-8B-Chat; do
  echo "== $model auto" >> $LOG; step --model $M/$model $O --context 0,4096 >/dev/null
  echo "== $model all" >> $LOG; (export DLRT_SKINNY_GEMM=all; step --model $M/$model $O --context 0 >/dev/null)
  echo "== $model cublas" >> $LOG; (export DLRT_SKINNY_GEMM=0; step --model $M/$model $O --context 0 >/dev/null)
done
he --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 4 --modes device_loop,host_loop $H >/dev/null
grep "^projection\|^dense layer\|^==\|Error\|error:" $LOG | tail -40
python3 benchmarks/device/summarize_step.py $OUT
python3 - <<'PY'
import json, glob
for f in glob.glob("/tmp/dlrt-cache/gemm/*bfloat16-m4-pdl.json"):
    for k, r in json.load(open(f)).items():
        print(k, {a: b for a, b in r.items() if a in ("config", "configs")})
PY
echo "total $(( $(date +%s) - t0 )) s"
