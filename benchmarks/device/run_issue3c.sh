#!/usr/bin/env bash
# Blocks launched ahead of their read-back (graph modes) and the uploaded block graph: GPU
# tests, launch cost in bench step, request benchmarks in three modes, the HTTP server.
set -uo pipefail
source benchmarks/device/common.sh
gpu_tests
timeout 120 python3 -m dlrt bench step --out $OUT --rounds 50 --model $M/SDAR-1.7B-Chat $O --context 0 >> $LOG 2>&1
grep -A1 "block_launch_api_us" $LOG | tail -2
he --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 4 --modes device_loop,host_loop,eager $H
python3 -m dlrt make-checkpoint tiny-sdar /tmp/tiny --dtype bfloat16 >/dev/null
he --model /tmp/tiny --num-prompts 4 --modes device_loop,host_loop,eager $H
he --model $M/SDAR-8B-Chat --load-format dummy --num-prompts 2 --modes device_loop,host_loop $H
he --model $M/LLaDA-8B-Instruct --load-format dummy --decoder dllm_var --num-prompts 2 --modes device_loop,host_loop $H
timeout 200 python3 -m dlrt bench serve --out $OUT --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 4 $H >> $LOG 2>&1
tail -4 $LOG
echo "total $(( $(date +%s) - t0 )) s"
