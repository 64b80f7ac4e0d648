#!/usr/bin/env bash
# Fused kernels on the device: GPU tests (kernels, fused vs unfused tokens, mode identity),
# kernel micro-benchmarks, and `bench step` (with the stage breakdown) per config, plus the
# unfused baseline on SDAR-8B. Full log: $OUT/run.log.
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
python3 -m dlrt bench kernels --model $M/SDAR-8B-Chat --load-format dummy --out $OUT >> $LOG 2>&1
grep -A30 "^ *op " $LOG | tail -16
step --model $M/SDAR-1.7B-Chat $O --context 0,4096
step --model $M/SDAR-8B-Chat $O --context 0,4096,32768
DLRT_FUSED_KERNELS=0 step --model $M/SDAR-8B-Chat $O --context 0
step --model $M/LLaDA-8B-Instruct $O --decoder dllm_var --block-length 4 --context 0
step --model $M/LLaDA-8B-Instruct $O --block-length 32 --context 256
echo "total $(( $(date +%s) - t0 )) s"
