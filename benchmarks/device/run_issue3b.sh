#!/usr/bin/env bash
# Second device call for the device loop: the no-sync test, the request benchmark in three
# modes (SDAR-1.7B config and the tiny config), and bench step on the LLaDA-8B config.
set -uo pipefail
source benchmarks/device/common.sh
python3 -m pytest -q tests/e2e/test_execution_modes.py -k "no_host_sync or reused" >> $LOG 2>&1
tail -2 $LOG
he() { python3 -m dlrt bench humaneval --out $OUT --modes device_loop,host_loop,eager "$@" >> $LOG 2>&1; tail -5 $LOG | grep -v "^wrote"; }
he --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 2 --max-new-tokens 64 --temperature 0 --remasking-strategy low_confidence_static --block-length 4 --denoising-steps 4 --ignore-eos --chat
python3 -m dlrt make-checkpoint tiny-sdar /tmp/tiny --dtype bfloat16 >/dev/null
he --model /tmp/tiny --num-prompts 4 --max-new-tokens 128 --temperature 0 --remasking-strategy low_confidence_static --block-length 4 --denoising-steps 4 --ignore-eos --chat
echo "humaneval done at $(( $(date +%s) - t0 )) s"
step() { python3 -m dlrt bench step --out $OUT --rounds 50 "$@" >> $LOG 2>&1; tail -6 $LOG | grep -v "^wrote"; }
step --model $M/LLaDA-8B-Instruct --load-format dummy --decoder dllm_var --block-length 4 --context 0,1024 --temperature 0 --remasking-strategy low_confidence_static
step --model $M/LLaDA-8B-Instruct --load-format dummy --block-length 32 --context 256 --temperature 0 --remasking-strategy low_confidence_static
echo "total $(( $(date +%s) - t0 )) s"
