#!/usr/bin/env bash
# Device call after call_a.sh, the modules (aot_modules.sh) and stage_b.sh (or call_b.sh), carrying
# .stage/base: another commit's tree (`rm -rf .stage/base && mkdir -p .stage/base && git archive
# BASE | tar -x -C .stage/base`). Start-up before and after a change (issue 17: <= 2.5 s), on one
# machine: startup_profile.py on 3 rows in fresh processes, the base's and this tree's alternated,
# ROUNDS rounds (default 3) after one untimed run of each (it pays Triton's builds). Each run's
# phases are in $OUT/startup_LABEL.txt; the last round's are printed whole.
#   bash benchmarks/device/call_startup_ab.sh COMMIT BASE_COMMIT
set -u
source benchmarks/device/env.sh
commit=$1; base=$2
S=$HOME/stage
export BATCHSCRIBE_CACHE=$S/models
P=$PWD/../shared/data/librispeech/test-clean-subset-00000-of-00001.parquet
profile() {  # TREE COMMIT LABEL
    local tree=$1 at=$2 label=$3
    (cd $tree/benchmarks && PYTHONPATH=/tmp/site:$tree BATCHSCRIBE_COMMIT=$at timeout 90 python3 startup_profile.py --parquet $P --rows 3) \
        > $OUT/startup_$label.txt 2>&1
    echo "$label ($at): $(head -1 $OUT/startup_$label.txt | cut -c1-200)"
}
for r in $(seq 0 ${ROUNDS:-3}); do
    profile $PWD/.stage/base $base base_$r
    profile $PWD $commit new_$r
done
r=${ROUNDS:-3}
for label in base_$r new_$r; do echo "== $label"; head -34 $OUT/startup_$label.txt | cut -c1-120; done
