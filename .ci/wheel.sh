#!/usr/bin/env bash
# The wheel as a user gets it: built from this tree, installed into a fresh venv, run from a
# folder outside the checkout (the package must find its CUDA source and data in itself):
# `dlrt generate` on the embedded default model, then a `dlrt serve` smoke test.
# Usage: .ci/wheel.sh TORCH_REQUIREMENT  (e.g. torch==2.13.0)
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
TORCH="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

python -m pip wheel --quiet --no-deps -w "$WORK/dist" "$REPO"
WHEEL="$(ls "$WORK"/dist/dlrt-*.whl)"
python -m zipfile -l "$WHEEL" > "$WORK/contents.txt"
for f in dlrt/csrc/graph_cond.cu dlrt/data/humaneval.jsonl dlrt/data/sdar-qwen3/vocab.json \
         dlrt/data/sdar-stdlib-8m/model.safetensors dlrt/data/sdar-stdlib-8m/tokenizer.json; do
    grep -q "^$f " "$WORK/contents.txt" || { echo "wheel: $f missing" >&2; exit 1; }
done

python3 -m venv "$WORK/venv"
PY="$WORK/venv/bin/python"
"$PY" -m pip install --quiet "$TORCH"
"$PY" -m pip install --quiet "$TORCH" "${WHEEL}[serve]"

cd "$WORK"  # outside the checkout: nothing of it is importable from here
export DLRT_CACHE_DIR="$WORK/cache" PYTHONNOUSERSITE=1
unset PYTHONPATH
"$PY" - "$WORK" <<'PY'
import sys
from pathlib import Path

import dlrt
from dlrt.resources import csrc_path, data_path

venv = Path(sys.argv[1]) / "venv"
assert venv in Path(dlrt.__file__).resolve().parents, f"dlrt imported from {dlrt.__file__}"
assert csrc_path("graph_cond.cu").is_file() and data_path("humaneval.jsonl").is_file()
print(f"wheel: dlrt {dlrt.__version__} from {Path(dlrt.__file__).parent}")
PY
"$WORK/venv/bin/dlrt" generate --prompt "Write a haiku about the sea." --chat \
    --max-new-tokens 12 --json > generate.json
"$PY" - <<'PY'
import json

r = json.load(open("generate.json"))
assert r["finish_reason"] in ("stop", "length") and 0 < len(r["token_ids"]) <= 12, r
print(f"wheel: dlrt generate -> {len(r['token_ids'])} tokens, {r['finish_reason']}")
PY
"$PY" "$REPO/.ci/serve_smoke.py" "$WORK/venv/bin/dlrt"
