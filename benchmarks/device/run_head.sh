#!/usr/bin/env bash
# The runtime at HEAD on a fresh machine, rounds before tests: SDAR-1.7B at context 0, SDAR-8B
# at contexts 0 to 32k, the LLaDA-8B canvas of 256; then the kernel and execution-mode GPU
# tests. Step JSONs are packed into steps.tgz (the call returns a limited number of files).
set -uo pipefail
source benchmarks/device/common.sh
step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null
step --model $M/SDAR-8B-Chat $O --context 0,1024,4096,16384,32640 >/dev/null
step --model $M/LLaDA-8B-Instruct $O --block-length 32 --context 256 >/dev/null
python3 benchmarks/device/summarize_step.py $OUT
echo "rounds done at $(( $(date +%s) - t0 )) s"
gpu_tests
(cd $OUT && tar czf steps.tgz step-*.json && rm step-*.json)
echo "total $(( $(date +%s) - t0 )) s"
