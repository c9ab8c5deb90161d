#!/usr/bin/env bash
# Device call on nvidia-h200-x2 (or larger) after call_a.sh and stage_b.sh (carry .stage/p4: Ray):
# issue 22's scaling, benchmarks/multi_gpu.py over 1..N GPUs for `--gpus N` and `--ray --ray-workers N`
# on test-other's 100 rows x REPLICATE (default 100: 10,000 rows, >= 5,000 a GPU on two), with a killed
# child and a killed actor. NVLink multicast stays off (the machine's NCCL_NVLS_ENABLE=0 etc.; nothing
# here uses NCCL). Arguments go to multi_gpu.py.
#   bash benchmarks/device/call_multi.sh COMMIT --gpus 1 2 --kill [--run-flags=--batch-invariant]
set -u
source benchmarks/device/env.sh
commit=$1; shift
mkdir -p /tmp/site && tar xJf .stage/p4/ray.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models
nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader
(cd benchmarks && timeout ${MULTI_TIMEOUT:-540} python3 multi_gpu.py --replicate ${REPLICATE:-100} "$@") > $OUT/multi.txt 2>&1
grep -vE "Warning|warn|core_worker" $OUT/multi.txt | tail -16 | cut -c1-300
