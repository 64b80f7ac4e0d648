#!/usr/bin/env bash
# Final measurements with PDL and the GEMV: GPU tests; bench step per context on SDAR-1.7B and
# SDAR-8B, with the previous default (no PDL, cuBLAS only) at empty context in the same run;
# LLaDA-8B dLLM-Var and canvas; HumanEval request TPS in the three modes (SDAR-1.7B, tiny).
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
step --model $M/SDAR-1.7B-Chat $O --context 0,1024,4096,16384 >/dev/null
(export DLRT_PDL=0 DLRT_SKINNY_GEMM=0; step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null)
step --model $M/SDAR-8B-Chat $O --context 0,1024,4096,16384,32640 >/dev/null
(export DLRT_PDL=0 DLRT_SKINNY_GEMM=0; step --model $M/SDAR-8B-Chat $O --context 0 >/dev/null)
step --model $M/LLaDA-8B-Instruct $O --decoder dllm_var --block-length 4 --context 0 >/dev/null
step --model $M/LLaDA-8B-Instruct $O --block-length 32 --context 256 >/dev/null
echo "steps done at $(( $(date +%s) - t0 )) s"
he --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 4 --modes device_loop,host_loop,eager $H >/dev/null
python3 -m dlrt make-checkpoint tiny-sdar /tmp/tiny --dtype bfloat16 >/dev/null
he --model /tmp/tiny --num-prompts 4 --modes device_loop,host_loop,eager $H >/dev/null
grep "^projection\|Error\|error:" $LOG | tail -24
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
