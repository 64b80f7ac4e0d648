# Sourced by the device scripts, from the root of a plain copy of the checkout (no .git).
# Carried: .devtools/ with device-env.sh (../shared/tools/device-env.sh), models/ (the real
# config folders, as in dlrt/data/configs) and commit (the hash recorded as DLRT_COMMIT).
source .devtools/device-env.sh
OUT=${OUT:-/tmp/dlrt-out}
mkdir -p "$OUT"
export OUT=$(cd "$OUT" && pwd)
SITE_PATH=${PYTHONPATH:-}  # device-env.sh's wheels, without the checkout (base runs add theirs)
export PYTHONPATH=$PWD${SITE_PATH:+:$SITE_PATH}
export DLRT_CACHE_DIR=/tmp/dlrt-cache DLRT_COMMIT=$(cat .devtools/commit 2>/dev/null)
# NOTE: without it `python -m` puts the working directory ahead of PYTHONPATH.
export PYTHONSAFEPATH=1
M=$PWD/.devtools/models
LOG=$OUT/run.log
t0=$(date +%s)

elapsed() { echo "$* at $(( $(date +%s) - t0 )) s"; }
