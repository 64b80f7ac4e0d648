#!/usr/bin/env bash
# Query-tile-aware context splits: attention tests; LLaDA canvas 256 bench step; host launch
# cost per kernel and eager request TPS with PDL off and on (eager pays launches on the host).
set -uo pipefail
source benchmarks/device/common.sh
timeout 120 python3 -m pytest -q -x tests/kernels/test_paged_attention.py tests/unit/test_triton_backend.py >> $LOG 2>&1; tail -1 $LOG
step --model $M/LLaDA-8B-Instruct $O --block-length 32 --context 256 >/dev/null
for p in 0 1; do DLRT_PDL=$p python3 benchmarks/device/launch_cost.py 2>&1 | sed "s/^/pdl=$p /"; done
for p in 0 1; do (export DLRT_PDL=$p; he --model $M/SDAR-1.7B-Chat --load-format dummy --num-prompts 2 --modes eager $H >/dev/null); done
python3 benchmarks/device/summarize_step.py $OUT | grep -v compare
echo "total $(( $(date +%s) - t0 )) s"
