#!/usr/bin/env bash
# Dense layers as fused GEMVs (norms, SiLU and residual adds inside the projections; the GEMV
# reads x in its weight layout): GPU tests; bench step at 0 and 4k context on SDAR-1.7B and
# SDAR-8B with the load-time choice and with cuBLAS only (DLRT_SKINNY_GEMM=0) in the same run;
# HumanEval request TPS, device_loop vs host_loop, SDAR-1.7B.
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
for model in SDAR-1.7B-Chat SDAR-8B-Chat; do
  echo "== $model auto" >> $LOG; step --model $M/$model $O --context 0,4096 >/dev/null
  echo "== $model all" >> $LOG; (export DLRT_SKINNY_GEMM=all; step --model $M/$model $O --context 0 >/dev/null)
  echo "== $model cublas" >> $LOG; (export DLRT_SKINNY_GEMM=0; step --model $M/$model $O --context 0,4096 >/dev/null)
done
echo "steps done at $(( $(date +%s) - t0 )) s"
he --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 4 --modes device_loop,host_loop $H >/dev/null
grep "^projection\|^dense layer\|^==\|Error\|error:" $LOG | tail -40
python3 benchmarks/device/summarize_step.py $OUT
cp -r /tmp/dlrt-cache/gemm $OUT/ 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
