#!/usr/bin/env bash
# Device call B, right after call A (carry .stage/p2): assemble tiny.en, copy the data to ../shared,
# run the GPU tests and W1 (with its transformers peer). Extra arguments go to pytest.
set -u
source benchmarks/device/env.sh
commit=$1; shift
S=$HOME/stage
bash benchmarks/device/stage_b.sh
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$S/models BATCHSCRIBE_TEST_CACHE=$S/models
# Every test marked gpu (they skip without CUDA on the CPU machine), wherever it lives in tests/.
# Modules that import what the image lacks (av, openai) at the top hold no GPU test: collect the rest.
# -v names each test as it ends (the last one named is where a timed-out suite stood); a test past
# 150 s fails alone (pytest-timeout, in the image) instead of taking the suite's time.
timeout ${TEST_TIMEOUT:-540} python3 -m pytest -v -m gpu --continue-on-collection-errors --timeout=150 --durations=25 \
    tests "$@" > $OUT/tests.txt 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.txt | tail -8 | cut -c1-300
# What the suite left running (a Ray daemon, a worker) takes CPU from every later benchmark here.
ps -eo pid,pcpu,etime,args --sort=-pcpu --no-headers | grep -v -E "ps -eo|grep" | head -5 | cut -c1-160 > $OUT/left.txt
pkill -f -E "raylet|gcs_server|ray::|dashboard" 2>/dev/null || true
echo "left by the suite (top CPU):"; cat $OUT/left.txt
# JIT-built FlashInfer modules, for .fiaot/ here (a result folder holds at most 8 files: one tarball).
(cd $HOME/.cache/flashinfer 2>/dev/null && find . -name "*.so" | tar czf $OUT/aot.tgz -T -) || true
[ "${SKIP_W1:-0}" = 1 ] && exit 0  # e.g. when call_c.sh runs W1 next
cd benchmarks
timeout 150 python3 w1_tiny.py --parquet ../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet \
    --replicate 10 --peer-batch 256 --configs auto:auto auto:fp8 > $OUT/w1.txt 2>&1
grep -E "host seconds|RTFx|timeline|^batchscribe|transformers bs|capture|ratio" $OUT/w1.txt | cut -c1-420
cp RESULTS.md $OUT/
