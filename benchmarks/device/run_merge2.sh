#!/usr/bin/env bash
# Rounds first on a fresh machine (no tests before them): SDAR-1.7B at context 0, this commit
# and the previous one (.devtools/base), then the GPU's clocks and throttle reasons.
# NOTE: see run_merge1.sh on PYTHONSAFEPATH (the recorded run lacked it).
set -uo pipefail
source benchmarks/device/common.sh
nvidia-smi -q -d PERFORMANCE,CLOCK | grep -v "^$" | head -40 >> $LOG
for i in 1 2; do
  step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null
  (export PYTHONSAFEPATH=1 PYTHONPATH=$PWD/.devtools/base DLRT_COMMIT=a27a864; step --model $M/SDAR-1.7B-Chat $O --context 0 >/dev/null)
done
nvidia-smi -q -d PERFORMANCE,CLOCK | grep -v "^$" | head -40 >> $LOG
grep -i "SM  \|Memory  \|Graphics\|Slowdown\|Thermal\|Power Cap\|Idle\|Active" $LOG | head -40
python3 benchmarks/device/summarize_step.py $OUT
echo "total $(( $(date +%s) - t0 )) s"
