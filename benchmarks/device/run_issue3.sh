#!/usr/bin/env bash
# One device call for the device loop: GPU tests (mode identity, kernels), `bench step` per
# config, and the HumanEval request benchmark in the three modes. Full log: $OUT/run.log.
set -uo pipefail
source benchmarks/device/common.sh
python3 -m pytest -q -x tests/kernels tests/unit/test_triton_backend.py \
    tests/e2e/test_execution_modes.py >> $LOG 2>&1
tail -4 $LOG
echo "tests done at $(( $(date +%s) - t0 )) s"
step() { python3 -m dlrt bench step --out $OUT --rounds 100 "$@" >> $LOG 2>&1; tail -8 $LOG | grep -v "^wrote"; }
step --model $M/SDAR-1.7B-Chat --load-format dummy --context 0,1024,4096,16384 --temperature 0 --remasking-strategy low_confidence_static
step --model $M/SDAR-8B-Chat --load-format dummy --context 0,1024,4096,16384 --temperature 0 --remasking-strategy low_confidence_static
step --model $M/LLaDA-8B-Instruct --load-format dummy --decoder dllm_var --block-length 4 --context 0,1024,3072 --temperature 0 --remasking-strategy low_confidence_static
step --model $M/LLaDA-8B-Instruct --load-format dummy --block-length 32 --context 256,1024 --temperature 0 --remasking-strategy low_confidence_static
echo "steps done at $(( $(date +%s) - t0 )) s"
he() { python3 -m dlrt bench humaneval --out $OUT --modes device_loop,host_loop,eager "$@" >> $LOG 2>&1; tail -6 $LOG | grep -v "^wrote"; }
he --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 4 --max-new-tokens 128 --temperature 0 --remasking-strategy low_confidence_static --block-length 4 --denoising-steps 4 --ignore-eos --chat
python3 -m dlrt make-checkpoint tiny-sdar /tmp/tiny --dtype bfloat16 >/dev/null
he --model /tmp/tiny --num-prompts 4 --max-new-tokens 128 --temperature 0 --remasking-strategy low_confidence_static --block-length 4 --denoising-steps 4 --ignore-eos --chat
echo "total $(( $(date +%s) - t0 )) s"
