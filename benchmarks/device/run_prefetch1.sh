#!/usr/bin/env bash
# L2 prefetch of the next projection's weight: SDAR-1.7B and SDAR-8B rounds at context 0 with
# the prefetch off (0) and at several sizes (MiB) and chunk sizes (KiB), one process each, all
# in this call; a fresh machine, rounds before any test. Off runs first and last (drift).
# Ran at 49e05e0 (the bulk-prefetch kernel); the runtime prefetch and DLRT_L2_PREFETCH_MB were removed
# after these runs (slower at every size).
set -uo pipefail
source benchmarks/device/common.sh
run() { (export DLRT_L2_PREFETCH_MB=$1 DLRT_L2_PREFETCH_CHUNK_KB=$2; shift 2; step "$@" >/dev/null); }
S=$M/SDAR-1.7B-Chat
E=$M/SDAR-8B-Chat
for cfg in "0 16" "8 16" "16 16" "32 16" "16 4" "0 16"; do
  run $cfg --model $S $O --context 0
done
echo "1.7B done at $(( $(date +%s) - t0 )) s"
for cfg in "0 16" "16 16" "32 16" "0 16"; do
  run $cfg --model $E $O --context 0
done
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
