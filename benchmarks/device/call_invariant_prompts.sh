#!/usr/bin/env bash
# Device call after calls A and B (carry .stage/fa3): --batch-invariant's GPU test (prompts and words
# among its items), then a 100-token prompt per item on W1 with and without it (alternated, no peer).
#   bash benchmarks/device/call_invariant_prompts.sh COMMIT
set -u
source benchmarks/device/aot_modules.sh  # FA3 modules, where .stage/fa3 rides along
source benchmarks/device/env.sh
commit=$1
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models BATCHSCRIBE_TEST_CACHE=$HOME/stage/models
timeout 150 python3 -m pytest -q -m gpu tests/engine/test_engine.py tests/engine/test_prefill.py > $OUT/gpu_tests.txt 2>&1
tail -2 $OUT/gpu_tests.txt | cut -c1-300
cd benchmarks
timeout 200 python3 w1_tiny.py --parquet ../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet \
    --replicate 10 --peer-batch --no-append --prompt-tokens 100 \
    --configs auto:auto auto:auto:invariant auto:auto auto:auto:invariant > $OUT/w1_prompt.txt 2>&1
grep -E "RTFx" $OUT/w1_prompt.txt | cut -c1-200
