#!/usr/bin/env bash
# Device call right after call_a.sh (carry .stage/p2), for issue 20's word timestamps: assemble
# tiny.en, run the GPU tests of the alignment pass and the DTW kernel, then W1 (test-other x10)
# without and with --word-timestamps, alternated, each a fresh process (their cost: <= 25 %).
# Extra arguments go to pytest.
#   bash benchmarks/device/call_words.sh COMMIT
set -u
source benchmarks/device/env.sh
commit=$1; shift
bash benchmarks/device/stage_b.sh
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models BATCHSCRIBE_TEST_CACHE=$HOME/stage/models
timeout 240 python3 -m pytest -q -m gpu tests/engine/test_graph_replay_options.py tests/engine/test_dtw_device.py "$@" > $OUT/tests.txt 2>&1
tail -4 $OUT/tests.txt | cut -c1-300
P=../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet
cd benchmarks
i=0
for v in "--configs auto:auto" "--word-timestamps" "--configs auto:auto" "--word-timestamps"; do
    i=$((i + 1))
    timeout 90 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append $v > $OUT/words_$i.txt 2>&1
    echo "== $v"; grep -E "RTFx|host seconds" $OUT/words_$i.txt | cut -c1-900
done
if [ -n "${PROFILE:-}" ]; then  # PROFILE=ROWS: where a words run's time goes (torch.profiler)
    timeout 120 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append --word-timestamps \
        --profile $PROFILE 2>&1 | grep -v "^\[transformers\]" > $OUT/profile.txt
    grep -E "device busy|RTFx" $OUT/profile.txt
fi
