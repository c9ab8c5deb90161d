#!/usr/bin/env bash
# Device call after calls A and B (carry .stage/p3): W1-CLI (benchmarks/w1_cli.py), `batchscribe run`
# as a user runs it on W1's rows x50, with transformers' pipeline on the same rows. Arguments go to
# w1_cli.py.
set -u
source benchmarks/device/env.sh
commit=$1; shift
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models
mkdir -p ../shared/data/librispeech && cp .stage/p3/data/librispeech/* ../shared/data/librispeech/
cd benchmarks
timeout ${CLI_TIMEOUT:-500} python3 w1_cli.py --parquet ../../shared/data/librispeech/train-clean-5-first100.parquet "$@" > $OUT/w1cli.txt 2>&1
grep -vE "^\[transformers\]|Warning|warn" $OUT/w1cli.txt | tail -20 | cut -c1-1500
cp RESULTS.md $OUT/
