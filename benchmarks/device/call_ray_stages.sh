#!/usr/bin/env bash
# Device call after calls A and B (carry .stage/p3 .stage/p4): Ray as in call_ray.sh, then
# ray_stages.py (where --ray's time goes on one GPU: the decode stage alone, the engine alone, the
# actor in-process, and --ray with each rows-per-call x calls shape) on test-other x REPLICATE.
#   SHAPES=256x2,128x3 bash benchmarks/device/call_ray_stages.sh COMMIT
set -u
source benchmarks/device/env.sh
commit=$1
mkdir -p /tmp/site && tar xJf .stage/p4/ray.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models
cd benchmarks
timeout ${STAGES_TIMEOUT:-420} python3 ray_stages.py --device cuda --parquet ../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet \
    --rows 100 --replicate ${REPLICATE:-50} --cpus 16 --shapes ${SHAPES:-256x2,128x3,64x5} ${STAGES_ARGS:-} > $OUT/ray_stages.txt 2>&1
grep -E "^hardware|^[0-9] |engine host|Error|error" $OUT/ray_stages.txt | cut -c1-600
