#!/usr/bin/env bash
# LibriSpeech WER recipe (see librispeech_wer.md): transcribe, then score, for two sets.
# Usage: recipes/librispeech_wer.sh [MODEL] [DATA_DIR] [WORK_DIR]
set -euo pipefail
MODEL=${1:-tiny.en}
DATA=${2:-../shared/data/librispeech}
WORK=${3:-wer-librispeech}

for set in test-other-subset-00000-of-00001 train-clean-5-00000-of-00008; do
    out="$WORK/out/$MODEL/$set"
    report="$WORK/reports/$MODEL/$set"
    batchscribe run "$DATA/$set.parquet" --model "$MODEL" --text-column text \
        --passthrough speaker_id --passthrough chapter_id -o "$out"
    batchscribe eval "$out" --references "$DATA/$set.parquet" --text-column text \
        --group speaker_id --group chapter_id -o "$report"
    echo "$set: $report/report.md"
done
