#!/usr/bin/env bash
# Device call after call_a.sh and the modules (aot_modules.sh), carrying .stage/p2t (tiny.en's
# first two parts, stage.sh) and .stage/base: another commit's tree (`rm -rf .stage/base && mkdir -p
# .stage/base && git archive BASE | tar -x -C .stage/base`). Start-up before and after a change
# (issue 17: <= 2.5 s), on one machine: startup_profile.py on 3 rows in fresh processes, the base's
# and this tree's alternated, ROUNDS rounds (default 3) after one untimed run of each (it pays
# Triton's builds). Each run's phases are in $OUT/startup_LABEL.txt; the last round's are printed
# whole. TESTS: GPU test paths to run after (e.g. "tests/engine/test_prewarm.py tests/system"), so
# one call checks the change too.
#   bash benchmarks/device/call_startup_ab.sh COMMIT BASE_COMMIT
set -u
source benchmarks/device/env.sh
commit=$1; base=$2
S=$HOME/stage
export BATCHSCRIBE_CACHE=$S/models BATCHSCRIBE_TEST_CACHE=$S/models
# tiny.en from the parts carried here and call A's test-clean rows, unless already staged
[ -s $S/models/converted/tiny.en/model.safetensors ] || bash benchmarks/device/stage_b.sh .stage/p2t
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
if [ -n "${TESTS:-}" ]; then
    PYTHONPATH=/tmp/site:$PWD timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -m gpu --continue-on-collection-errors \
        --timeout=150 -p no:cacheprovider $TESTS > $OUT/tests.txt 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.txt | tail -8 | cut -c1-300
fi
