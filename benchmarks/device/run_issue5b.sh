#!/usr/bin/env bash
# Second fused-kernel call: GPU tests after the attention trip-count change, `bench step` with
# the stage breakdown per config (SDAR-8B up to 32k), the request benchmark in three modes,
# and the HTTP server against LLM.generate. Full log: $OUT/run.log.
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
step --model $M/SDAR-1.7B-Chat $O --context 0,4096
step --model $M/SDAR-8B-Chat $O --context 0,4096,32640
step --model $M/LLaDA-8B-Instruct $O --decoder dllm_var --block-length 4 --context 0
step --model $M/LLaDA-8B-Instruct $O --block-length 32 --context 256
echo "steps done at $(( $(date +%s) - t0 )) s"
he --modes device_loop,host_loop,eager --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 4 $H
python3 -m dlrt make-checkpoint tiny-sdar /tmp/tiny --dtype bfloat16 >/dev/null
he --modes device_loop,host_loop,eager --model /tmp/tiny --num-prompts 4 $H
timeout 200 python3 -m dlrt bench serve --out $OUT --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 4 $H >> $LOG 2>&1
tail -6 $LOG
echo "total $(( $(date +%s) - t0 )) s"
