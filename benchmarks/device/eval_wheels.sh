#!/usr/bin/env bash
# Wheels of lm-evaluation-harness 0.4.13 and of the packages it needs that the GPU machines'
# image lacks (datasets, evaluate, dill, multiprocess, pytablewriter and its parts, nltk,
# rouge-score, sqlitedict, word2number, more-itertools; about 13 MB) into a folder git ignores,
# for a device run that carries it (`gsm8k_harness.sh`; common.sh's device-env.sh installs
# them). Three of them ship no wheel and are built here (pure Python). datasets 5.2 needs
# pyarrow >= 24: --with-pyarrow adds its wheel (about 45 MB) for an image with an older one.
# Usage: bash benchmarks/device/eval_wheels.sh [--with-pyarrow] [DEST]   (DEST default .whl)
set -euo pipefail
dest=.whl pyarrow=()
for a in "$@"; do
  case $a in
    --with-pyarrow) pyarrow=(pyarrow==26.0.1) ;;
    -*) sed -n 8p "$0"; exit 2 ;;
    *) dest=$a ;;
  esac
done
mkdir -p "$dest"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plat[@]}" -d "$dest" lm-eval==0.4.13 datasets==5.2.0 \
    evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19 more-itertools==11.2.1 \
    pytablewriter==1.2.1 DataProperty==1.1.1 mbstrdecoder==1.1.5 pathvalidate==3.3.1 \
    tabledata==1.3.5 tcolorpy==0.1.7 typepy==1.3.5 chardet==6.0.0.post1 nltk==3.10.4 \
    "${pyarrow[@]}"
python3 -m pip wheel -q --no-deps -w "$dest" rouge-score==0.1.2 sqlitedict==2.1.0 \
    word2number==1.1
du -sh "$dest"
