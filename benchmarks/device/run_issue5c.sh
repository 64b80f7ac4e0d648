#!/usr/bin/env bash
# Third fused-kernel call: GPU tests (skinny GEMM, greedy candidates, folded SDAR commit
# forward), bench step per config with the projection choice, the cuBLAS-only baseline on
# SDAR-8B, kernel micro-benchmarks, and the request benchmark in three modes.
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
step --model $M/SDAR-8B-Chat $O --context 0,4096,32640
DLRT_SKINNY_GEMM=0 step --model $M/SDAR-8B-Chat $O --context 0
step --model $M/SDAR-1.7B-Chat $O --context 0,4096
step --model $M/LLaDA-8B-Instruct $O --decoder dllm_var --block-length 4 --context 0
step --model $M/LLaDA-8B-Instruct $O --block-length 32 --context 256
echo "steps done at $(( $(date +%s) - t0 )) s"
python3 -m dlrt bench kernels --model $M/SDAR-8B-Chat --load-format dummy --out $OUT >> $LOG 2>&1
grep -A24 "^ *op " $LOG | tail -20
he --modes device_loop,host_loop,eager --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 4 $H
python3 -m dlrt make-checkpoint tiny-sdar /tmp/tiny --dtype bfloat16 >/dev/null
he --modes device_loop,host_loop,eager --model /tmp/tiny --num-prompts 4 $H
echo "total $(( $(date +%s) - t0 )) s"
