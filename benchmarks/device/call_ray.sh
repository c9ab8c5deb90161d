#!/usr/bin/env bash
# Device call after calls A and B (carry .stage/p3 .stage/p4): Ray (the image has none; stage.sh packs
# a trimmed cp312 Ray in .stage/p4), then the Ray GPU tests and ray_overhead.py --device cuda: a
# plain run, --gpus 1 and one GPU actor on the same rows (issue 21: records equal, within 10 %):
# test-other's 100 rows x REPLICATE (50: 5,000 rows, so that throughput and not start-up is compared).
#   bash benchmarks/device/call_ray.sh COMMIT
set -u
source benchmarks/device/env.sh
commit=$1
mkdir -p /tmp/site && tar xJf .stage/p4/ray.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models BATCHSCRIBE_TEST_CACHE=$HOME/stage/models
python3 -c "import ray; print('ray', ray.__version__)"
timeout 240 python3 -m pytest -q -m gpu tests/system/test_ray.py tests/ray > $OUT/ray_tests.txt 2>&1
tail -4 $OUT/ray_tests.txt | cut -c1-300
cd benchmarks
timeout 300 python3 ray_overhead.py --device cuda --parquet ../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet \
    --rows 100 --replicate ${REPLICATE:-50} --repeat 1 --cpus 16 > $OUT/ray_gpu.txt 2>&1
tail -12 $OUT/ray_gpu.txt | cut -c1-400
