#!/usr/bin/env bash
# Every GPU-marked test (kernels against their references, execution modes, FlashInfer).
# Usage: bash benchmarks/device/gpu_tests.sh [pytest args...]   e.g. -x -k attention
# Carry: .devtools (and .whl for FlashInfer / DeepGEMM wheels). Full log in $OUT/run.log.
set -uo pipefail
source benchmarks/device/common.sh
python3 -m pytest -q -m gpu tests "$@" >> "$LOG" 2>&1
rc=$?
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed|error)" "$LOG" | tail -20
elapsed "tests done (rc $rc)"
exit $rc
