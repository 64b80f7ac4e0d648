# Sourced by the device scripts: device environment, the checkout on PYTHONPATH, a log file.
source .devtools/device-env.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} DLRT_CACHE_DIR=/tmp/dlrt-cache
M=.devtools/models
LOG=$OUT/run.log
t0=$(date +%s)
