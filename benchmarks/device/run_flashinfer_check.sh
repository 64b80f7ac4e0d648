#!/usr/bin/env bash
# FlashInfer backend GPU tests at this commit (JIT-builds FA3/FA2 on first use).
set -uo pipefail
source benchmarks/device/common.sh
timeout 250 python3 -m pytest -q tests/e2e/test_flashinfer.py >> $LOG 2>&1
tail -4 $LOG | grep -v "^$"; echo "total $(( $(date +%s) - t0 )) s"
