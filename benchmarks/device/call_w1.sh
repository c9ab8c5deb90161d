#!/usr/bin/env bash
# Device call after calls A and B (no carry): W1 (test-other x10) with its transformers peer, then
# the same rows with word timestamps and with a 100-token prompt (issue 20's costs: <= 25 % and
# <= 15 % of W1), then startup_profile.py cold, twice with and twice without Prewarm (issue 17's start-up).
#   bash benchmarks/device/call_w1.sh COMMIT
set -u
source benchmarks/device/env.sh
commit=$1
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models
P=../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet
cd benchmarks
timeout 170 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch 256 --configs auto:auto auto:fp8 > $OUT/w1.txt 2>&1
grep -E "RTFx|^batchscribe|transformers bs|capture|ratio" $OUT/w1.txt | cut -c1-300
for v in "--word-timestamps" "--prompt-tokens 100"; do
    f=$OUT/w1_$(echo "$v" | tr -dc 'a-z0-9').txt
    timeout 90 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append $v > $f 2>&1
    echo "== $v"; grep -E "RTFx|host seconds" $f | cut -c1-420
done
for k in 1 2; do  # alternated with and without Prewarm (engine/prewarm.py)
    timeout 60 python3 startup_profile.py --parquet $P --rows 3 > $OUT/startup_$k.txt 2>&1
    echo "== startup $k"; head -30 $OUT/startup_$k.txt | cut -c1-200
    timeout 60 python3 startup_profile.py --parquet $P --rows 3 --no-prewarm 2>&1 | head -1 | sed "s/^/no prewarm $k: /"
done
cp RESULTS.md $OUT/
