#!/usr/bin/env bash
# Device call for the encoder (carry .whl2 .stage/p1): the encoder alone (encoder_speed.py), then
# W4 (w4_turbo.py, transformers bs 256 and 1024 in the same run) with each further argument string:
#   bash benchmarks/device/call_w4.sh abc1234 "--windows 4096 --configs auto:auto auto:auto:fp8"
# ENCODER_ARGS overrides encoder_speed.py's arguments; PYTEST_FIRST runs those GPU tests first.
set -u
commit=$1; shift
source benchmarks/device/install.sh
source benchmarks/device/env.sh  # after the wheels: they are compiled too
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit
if [ -n "${PYTEST_FIRST:-}" ]; then
    timeout 200 python3 -m pytest -q -m gpu $PYTEST_FIRST > $OUT/tests_first.txt 2>&1; tail -3 $OUT/tests_first.txt | cut -c1-300
fi
(cd benchmarks && timeout 200 python3 encoder_speed.py ${ENCODER_ARGS:-}) > $OUT/encoder.txt 2>&1
grep -E "group|encoder|Error" $OUT/encoder.txt | cut -c1-260
i=0
for args in "$@"; do
    i=$((i + 1))
    (cd benchmarks && timeout 400 python3 w4_turbo.py --tokenizer-from $S/basetok $args) > $OUT/w4_$i.txt 2>&1
    echo "== $args"; grep -E "^batchscribe|^Whisper generate|^GenerationMixin|capture|ratio|windows/s|Error" $OUT/w4_$i.txt | cut -c1-300
done
cp benchmarks/RESULTS.md $OUT/
if [ "${FLASHINFER_PREFILL:-0}" = 1 ]; then  # last: its first call JIT-builds the prefill kernels
    (cd benchmarks && timeout ${FLASHINFER_TIMEOUT:-240} python3 encoder_speed.py --flashinfer --groups 32) > $OUT/prefill.txt 2>&1
    grep -E "attention|flashinfer" $OUT/prefill.txt | cut -c1-400
fi
