#!/usr/bin/env bash
# Device call on nvidia-h200-x2 (or larger) after call_a.sh (carry .stage/fa3: FA3's modules): W4
# (w4_turbo.py, no peer) on one GPU alone, then one process per GPU at once, each pinned with
# CUDA_VISIBLE_DEVICES; the sum of their windows/s against the one alone is W4's scaling (issue 22).
#   bash benchmarks/device/call_w4_multi.sh COMMIT N "<w4 args>"
set -u
source benchmarks/device/aot_modules.sh
source benchmarks/device/env.sh
commit=$1; n=$2; args=$3
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit S=$HOME/stage
cd benchmarks
w4() { CUDA_VISIBLE_DEVICES=$1 timeout 300 python3 w4_turbo.py --tokenizer-from $S/basetok --peer-batch --no-append $args; }
w4 0 > $OUT/w4_alone.txt 2>&1
echo "alone: $(grep -E '^batchscribe' $OUT/w4_alone.txt | tail -1)"
for g in $(seq 0 $((n - 1))); do w4 $g > $OUT/w4_gpu$g.txt 2>&1 & done; wait
for g in $(seq 0 $((n - 1))); do echo "gpu $g of $n at once: $(grep -E '^batchscribe' $OUT/w4_gpu$g.txt | tail -1)"; done
