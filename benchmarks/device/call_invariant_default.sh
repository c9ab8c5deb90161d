#!/usr/bin/env bash
# Device call after calls A and B (carry .stage/fa3 where it exists), or after call_slim.sh's two
# (carry .stage/p6: base's tokenizer for W4): batch invariance as CUDA's
# default, against --no-batch-invariant (`variant`) at one commit: the invariance harness, W1
# (alternated, no peer), W1 with word timestamps, and W4 (turbo arch, 2,048 windows, no peer).
#   bash benchmarks/device/call_invariant_default.sh COMMIT
set -u
source benchmarks/device/aot_modules.sh  # FA3 modules, where .stage/fa3 rides along
source benchmarks/device/env.sh
commit=$1
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models BATCHSCRIBE_TEST_CACHE=$HOME/stage/models
P=../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet
TOK=$HOME/stage/basetok  # call A's; after the slim calls (stage_slim.sh) carry .stage/p6 for it
[ -d .stage/p6/basetok ] && TOK=$PWD/.stage/p6/basetok
cd benchmarks
timeout 100 python3 batch_invariance.py --device cuda --configs auto auto,variant > $OUT/invariance.txt 2>&1
grep -vE "Warning|warn" $OUT/invariance.txt | tail -3 | cut -c1-300
timeout 130 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append \
    --configs auto:auto auto:auto:variant auto:auto auto:auto:variant > $OUT/w1.txt 2>&1
grep -E "RTFx" $OUT/w1.txt | cut -c1-200
timeout 130 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append --word-timestamps \
    --configs auto:auto auto:auto:variant auto:auto auto:auto:variant > $OUT/words.txt 2>&1
grep -E "RTFx" $OUT/words.txt | cut -c1-200
timeout 200 python3 w4_turbo.py --tokenizer-from $TOK --windows 2048 --slots 512 --peer-batch --no-append \
    --configs auto:auto auto:auto:auto:variant auto:auto > $OUT/w4.txt 2>&1
grep -E "^batchscribe .*slots\)|Error" $OUT/w4.txt | cut -c1-200
