#!/usr/bin/env bash
# Device call C, after calls A and B (carry .stage/p3): W1 on the first 100 train-clean-5 utterances
# (~13 s each, as BENCHMARKS.md's peer figures) x10, with its transformers peer, after the input
# pipeline alone on the same data (fp16 only, the configuration W1's WER target holds for, so that
# nothing else can keep the peer from running); then W1 variants without the peer, one per further
# argument (e.g. "--configs auto:fp8"):
#   bash benchmarks/device/call_c.sh COMMIT ["--workers 4" ...]
# DECODERS (default: "default") picks the decoders the pipeline benchmark compares; PROFILE=ROWS
# ends with a profiled fp16 run (torch.profiler's top ROWS host ops and kernels).
set -u
source benchmarks/device/env.sh
commit=$1; shift
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models
mkdir -p ../shared/data/librispeech && cp .stage/p3/data/librispeech/* ../shared/data/librispeech/
P=../../shared/data/librispeech/train-clean-5-first100.parquet
cd benchmarks
timeout 120 python3 decode_pipeline.py --parquet $P --workers 8 15 --cuda --decoders ${DECODERS:-default} > $OUT/pipeline.txt 2>&1
cut -c1-200 $OUT/pipeline.txt
timeout 300 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch 256 --configs auto:auto --stall-dump 280 > $OUT/w1c.txt 2>&1
grep -E "host seconds|RTFx|timeline|^batchscribe|transformers bs|capture|ratio" $OUT/w1c.txt | cut -c1-420
cp RESULTS.md $OUT/
for v in "$@"; do
  echo "== $v"; timeout 100 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append $v 2>&1 | grep -E "host seconds|RTFx|timeline" | cut -c1-420
done
if [ -n "${PROFILE:-}" ]; then
  timeout 100 python3 w1_tiny.py --parquet $P --replicate 10 --peer-batch --no-append --configs auto:auto --profile $PROFILE 2>&1 \
    | grep -v "^\[transformers\]" | cut -c1-170 > $OUT/profile.txt
  grep -E "device busy|RTFx" $OUT/profile.txt
fi
