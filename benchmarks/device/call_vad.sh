#!/usr/bin/env bash
# Device call after calls A and B (carry .stage/p5), for issue 20's --vad on CUDA: silero-vad (the
# image has none) and the long-form files, the --vad GPU tests, then vad_speed.py with the batched
# paths on CUDA (the per-item peer on the CPU; "same spans" counts items whose spans equal silero's
# own), then W1 (test-other x10) without and with --vad, each a fresh process.
#   bash benchmarks/device/call_vad.sh COMMIT
set -u
source benchmarks/device/env.sh
commit=$1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .stage/p5/*.whl 2>&1 | tail -2
mkdir -p ../shared/data && cp -r .stage/p5/data/* ../shared/data/
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models BATCHSCRIBE_TEST_CACHE=$HOME/stage/models
# The --vad GPU tests: call B's suite skips them (the image has no silero-vad).
timeout ${VAD_TEST_TIMEOUT:-150} python3 -m pytest -q -m gpu tests/audio/test_vad_model.py tests/audio/test_vad.py \
    tests/engine/test_vad.py > $OUT/vad_tests.txt 2>&1
echo "vad GPU tests: $(tail -1 $OUT/vad_tests.txt | cut -c1-200)"
cd benchmarks
timeout 200 python3 vad_speed.py --device cuda --batch-sizes 8,64 --repeat 2 > $OUT/vad_speed.txt 2>&1
tail -9 $OUT/vad_speed.txt | cut -c1-300
P=../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet
for v in "--configs auto:auto" "--vad"; do
    echo "== $v"; timeout 90 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append $v 2>&1 | grep -E "RTFx|host seconds" | cut -c1-420
done
