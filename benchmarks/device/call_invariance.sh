#!/usr/bin/env bash
# Device call after calls A and B (carry .stage/fa3): benchmarks/encoder_invariance.py, then
# batch_invariance.py, on the GPU with the real tiny.en that call B assembled: does a window's
# encoding depend on its chunk, and a row's transcript on its batch? Arguments go to
# batch_invariance.py, e.g.
#   bash benchmarks/device/call_invariance.sh COMMIT --configs auto auto,enc1 auto,enc1,slots=1
set -u
source benchmarks/device/aot_modules.sh  # FA3 modules, where .stage/fa3 rides along
source benchmarks/device/env.sh
commit=$1; shift
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models
ls ../shared/data/librispeech/test-other-subset-00000-of-00001.parquet > /dev/null || exit 1  # from call B
cd benchmarks
timeout 120 python3 encoder_invariance.py > $OUT/encoder_invariance.txt 2>&1
grep -vE "Warning|warn" $OUT/encoder_invariance.txt | tail -8 | cut -c1-300
timeout ${INV_TIMEOUT:-400} python3 batch_invariance.py --device cuda "$@" > $OUT/invariance.txt 2>&1
grep -vE "Warning|warn" $OUT/invariance.txt | tail -14 | cut -c1-300
