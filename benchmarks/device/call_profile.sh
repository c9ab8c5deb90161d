#!/usr/bin/env bash
# Device call (carry .stage/p6 .whl2): where W2's device time goes (profile_step.py: a decode step and
# an admission chunk by kernel), then W2 and W4 with the audio in the pinned arena and pageable.
#   [PROFILE_ARGS="--arch turbo --slots 512"] [PROFILE_CONFIGS=auto:auto:fp8] bash benchmarks/device/call_profile.sh COMMIT
set -u
source benchmarks/device/env.sh
commit=$1
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl2/*.whl 2>&1 | tail -2
T=../.stage/p6/basetok
D=../.stage/p6/data/train-clean-5-text.parquet
cd benchmarks
timeout 150 python3 profile_step.py --tokenizer-from $T --configs ${PROFILE_CONFIGS:-auto:fp8} --rows 22 ${PROFILE_ARGS:-} > $OUT/profile.txt 2>&1
grep -E "===|Self CUDA time total" $OUT/profile.txt
for a in "" "--pageable-audio"; do
    timeout 120 python3 w2_large_v3.py --tokenizer-from $T --windows 1024 --slots 256 --configs auto:fp8 --peer-batch $a > $OUT/w2$a.txt 2>&1
    echo "== W2 $a"; grep -E "^batchscribe|host seconds|Error" $OUT/w2$a.txt | cut -c1-420
    timeout 150 python3 w4_turbo.py --tokenizer-from $T --windows 4096 --slots 512 --tokens-from $D --durations-from $D \
        --configs auto:auto --peer-batch $a > $OUT/w4$a.txt 2>&1
    echo "== W4 $a"; grep -E "^batchscribe|host seconds|Error" $OUT/w4$a.txt | cut -c1-420
done
cp RESULTS.md $OUT/
