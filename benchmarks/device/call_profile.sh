#!/usr/bin/env bash
# Device call: where W2's (or with --arch turbo, W4's) device time goes (profile_step.py: a decode
# step and an admission chunk by kernel), then W2 and W4 with the audio in the pinned arena and
# pageable. Carry .whl2 .stage/p1b .stage/dec .stage/fa3 on a fresh machine (the wheels, the base
# tokenizer, the FlashInfer modules: nothing JIT-built), or after call_a.sh on a warm one .stage/dec
# .stage/fa3 (install.sh keeps what call A installed). W4's token counts need .stage/p6 (skip them
# with PROFILE_ONLY=1).
#   [PROFILE_ARGS="--arch turbo --slots 512"] [PROFILE_CONFIGS=auto:auto:fp8] [W4_CONFIGS="auto:auto:fp8 auto:fp8:fp8"] \
#   [PROFILE_ONLY=1] bash benchmarks/device/call_profile.sh COMMIT
set -u
commit=$1
source benchmarks/device/install.sh
source benchmarks/device/env.sh
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit
T=$S/basetok
D=../.stage/p6/data/train-clean-5-text.parquet
cd benchmarks
timeout ${PROFILE_TIMEOUT:-150} python3 profile_step.py --tokenizer-from $T --configs ${PROFILE_CONFIGS:-auto:fp8} --rows 22 ${PROFILE_ARGS:-} > $OUT/profile.txt 2>&1
grep -E "===|Self CUDA time total|Error" $OUT/profile.txt
if [ -n "${W4_CONFIGS:-}" ]; then  # W4's windows/s for these configs, no peer (e.g. auto:auto:fp8 auto:fp8:fp8)
    timeout ${W4_TIMEOUT:-200} python3 w4_turbo.py --tokenizer-from $T --windows 4096 --slots 512 --peer-batch \
        --configs $W4_CONFIGS > $OUT/w4_configs.txt 2>&1
    echo "== W4 $W4_CONFIGS (no peer)"; grep -E "^batchscribe|capture|Error" $OUT/w4_configs.txt | cut -c1-300
    cp RESULTS.md $OUT/
fi
[ "${PROFILE_ONLY:-0}" = 1 ] && exit 0  # the tables (profile.txt comes back) and W4_CONFIGS' run
for a in "" "--pageable-audio"; do
    timeout 120 python3 w2_large_v3.py --tokenizer-from $T --windows 1024 --slots 256 --configs auto:fp8 --peer-batch $a > $OUT/w2$a.txt 2>&1
    echo "== W2 $a"; grep -E "^batchscribe|host seconds|Error" $OUT/w2$a.txt | cut -c1-420
    timeout 150 python3 w4_turbo.py --tokenizer-from $T --windows 4096 --slots 512 --tokens-from $D --durations-from $D \
        --configs auto:auto --peer-batch $a > $OUT/w4$a.txt 2>&1
    echo "== W4 $a"; grep -E "^batchscribe|host seconds|Error" $OUT/w4$a.txt | cut -c1-420
done
cp RESULTS.md $OUT/
