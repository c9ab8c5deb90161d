#!/usr/bin/env bash
# Device call A (carry .whl2 .stage/p1): install the wheels, stage tiny.en's last part, then run
# w2_large_v3.py once per further argument (each a quoted argument string), e.g.
#   bash benchmarks/device/call_a.sh abc1234 "--windows 1024 --slots 256 --configs auto:fp8"
set -u
commit=$1; shift
source benchmarks/device/install.sh
source benchmarks/device/env.sh  # after the wheels: they are compiled too
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit
i=0
for args in "$@"; do
    i=$((i + 1))
    (cd benchmarks && timeout ${W2_TIMEOUT:-300} python3 w2_large_v3.py --tokenizer-from $S/basetok $args) > $OUT/w2_$i.txt 2>&1
    echo "== $args"; grep -E "^batchscribe|^Whisper generate|capture|ratio" $OUT/w2_$i.txt | cut -c1-260
done
cp benchmarks/RESULTS.md $OUT/
