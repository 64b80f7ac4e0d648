#!/usr/bin/env bash
# Final measurements of the GEMV rework (x in the weight layout, row tiles, fused-layer option,
# power-of-two splits): GPU tests; bench step per context on SDAR-1.7B and SDAR-8B with
# cuBLAS only (DLRT_SKINNY_GEMM=0) at empty context in the same run; HumanEval request TPS in
# the three modes (SDAR-1.7B); LLaDA-8B dLLM-Var and canvas; tiny-config HumanEval.
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
step --model $M/SDAR-1.7B-Chat $O --context 0,1024,4096,16384 >/dev/null
(export DLRT_SKINNY_GEMM=0; step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null)
step --model $M/SDAR-8B-Chat $O --context 0,4096,32640 >/dev/null
(export DLRT_SKINNY_GEMM=0; step --model $M/SDAR-8B-Chat $O --context 0 >/dev/null)
echo "steps done at $(( $(date +%s) - t0 )) s"
he --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 4 --modes device_loop,host_loop,eager $H >/dev/null
step --model $M/LLaDA-8B-Instruct $O --decoder dllm_var --block-length 4 --context 0 >/dev/null
step --model $M/LLaDA-8B-Instruct $O --block-length 32 --context 256 >/dev/null
python3 -m dlrt make-checkpoint tiny-sdar /tmp/tiny --dtype bfloat16 >/dev/null
he --model /tmp/tiny --num-prompts 4 --modes device_loop,host_loop $H >/dev/null
grep "^projection\|^dense layer\|Error\|error:" $LOG | tail -24
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
