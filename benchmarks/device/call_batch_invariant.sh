#!/usr/bin/env bash
# Device call after calls A and B (carry .stage/fa3): --batch-invariant on the GPU. Its GPU tests
# (and the encoder's and graph replay's, which it touches), batch_invariance.py with and without it,
# then W1 without and with it (its cost; no peer, nothing appended).
#   bash benchmarks/device/call_batch_invariant.sh COMMIT
set -u
source benchmarks/device/aot_modules.sh  # FA3 modules, where .stage/fa3 rides along
source benchmarks/device/env.sh
commit=$1
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models BATCHSCRIBE_TEST_CACHE=$HOME/stage/models
timeout 240 python3 -m pytest -q -m gpu tests/engine/test_engine.py tests/engine/test_encoder.py \
    tests/engine/test_graph_replay_options.py > $OUT/gpu_tests.txt 2>&1
tail -4 $OUT/gpu_tests.txt | cut -c1-300
P=../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet
cd benchmarks
timeout 150 python3 batch_invariance.py --device cuda --configs auto auto,invariant > $OUT/invariance.txt 2>&1
grep -vE "Warning|warn" $OUT/invariance.txt | tail -3 | cut -c1-300
timeout 170 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append \
    --configs auto:auto auto:auto:invariant auto:auto auto:auto:invariant > $OUT/w1.txt 2>&1
grep -E "RTFx" $OUT/w1.txt | cut -c1-300
