#!/usr/bin/env bash
# Context splits that follow the context length: GPU tests; bench step per context on SDAR-1.7B,
# SDAR-8B (with the no-PDL cuBLAS-only baseline at 0 and 4096 in the same run), LLaDA-8B
# dLLM-Var and canvas 256; HumanEval request TPS in the three modes on SDAR-1.7B.
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
step --model $M/SDAR-1.7B-Chat $O --context 0,1024,4096,16384 >/dev/null
step --model $M/SDAR-8B-Chat $O --context 0,1024,4096,16384,32640 >/dev/null
(export DLRT_PDL=0 DLRT_SKINNY_GEMM=0; step --model $M/SDAR-8B-Chat $O --context 0,4096 >/dev/null)
step --model $M/LLaDA-8B-Instruct $O --decoder dllm_var --block-length 4 --context 0 >/dev/null
step --model $M/LLaDA-8B-Instruct $O --block-length 32 --context 256 >/dev/null
echo "steps done at $(( $(date +%s) - t0 )) s"
he --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 4 --modes device_loop,host_loop,eager $H >/dev/null
grep "Error\|error:" $LOG | tail -5
python3 benchmarks/device/summarize_step.py $OUT | grep -v compare
echo "total $(( $(date +%s) - t0 )) s"
