#!/usr/bin/env bash
# Device call right after call_a.sh (carry .stage/p2b .before): start-up A/B, startup_profile.py cold in
# fresh processes alternated between an earlier tree (stage.sh's BEFORE=COMMIT, in .before) and this
# checkout, ROUNDS rounds (issue 17: <= 2.5 s). The first run of each tree is dropped: it pays Triton's builds.
# Carry .stage/fa3 too (FA3's modules, call_fa3.sh) where the encoder's attention is FA3: no JIT build.
#   bash benchmarks/device/call_startup_ab.sh COMMIT
set -u
source benchmarks/device/aot_modules.sh  # call A's install ran before .stage/fa3 was here
source benchmarks/device/env.sh
commit=$1
# The tiny.en parts from .stage/p2b (p2 less its data: p2 and .before pass a call's 64 MiB); call A's test-clean rows.
S=$HOME/stage; mkdir -p $S/models/converted/tiny.en && cp $S/tinyjson/* $S/models/converted/tiny.en/
cat .stage/p2b/tinypart_00 .stage/p2b/tinypart_01 $S/tinypart_02 > $S/models/converted/tiny.en/model.safetensors
export BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models
P=$HOME/stage/data/librispeech/test-clean-subset-00000-of-00001.parquet
for k in $(seq 0 ${ROUNDS:-3}); do
    for tree in .before .; do
        name=$([ $tree = . ] && echo after || echo before)
        (cd $tree/benchmarks && PYTHONPATH=/tmp/site:$(cd .. && pwd) timeout 90 python3 startup_profile.py --parquet $P --rows 3) \
            > $OUT/startup_${name}_$k.txt 2>&1
        echo "== $name $k ($(cat $tree/COMMIT 2>/dev/null || echo $commit)): $(head -1 $OUT/startup_${name}_$k.txt | cut -c1-200)"
    done
done
for f in $OUT/startup_after_1.txt $OUT/startup_before_1.txt; do echo "== $f"; head -26 $f | cut -c1-120; done
