#!/usr/bin/env bash
# One device call: the while-graph / attention probe, then the eager benchmarks.
set -uo pipefail
source .devtools/device-env.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
bash benchmarks/device/eager.sh 2>&1 | tee $OUT/eager.log | grep -v "^\s*$"
