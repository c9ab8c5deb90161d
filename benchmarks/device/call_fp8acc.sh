#!/usr/bin/env bash
# Device call after calls A and B (carry .stage/p7: train-clean-5's shard 0, which stage.sh puts
# there): the fp8 encoder's accuracy on the GPU (benchmarks/fp8_accuracy.py, issue 17) with the
# real tiny.en that call B assembled, on every row of test-other's subset and of the shard.
# Arguments go to fp8_accuracy.py.
set -u
source benchmarks/device/aot_modules.sh  # FA3 modules, where .stage/fa3 rides along
source benchmarks/device/env.sh
commit=$1; shift
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models
mkdir -p ../shared/data && cp -r .stage/p7/data/* ../shared/data/
ls ../shared/data/librispeech/test-other-subset-00000-of-00001.parquet > /dev/null || exit 1  # from call B
cd benchmarks
timeout ${FP8_TIMEOUT:-400} python3 fp8_accuracy.py --models tiny.en --device cuda --rows 1000 "$@" > $OUT/fp8acc.txt 2>&1
grep -vE "Warning|warn" $OUT/fp8acc.txt | tail -8 | cut -c1-300
cp RESULTS.md $OUT/
