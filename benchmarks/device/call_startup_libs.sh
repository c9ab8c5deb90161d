#!/usr/bin/env bash
# Device call after calls A, the modules and B (no carry): what each GPU library costs a fresh
# process (startup_libs.py, three processes, FLASHINFER_CUDA_ARCH_LIST unset / set / unset), then
# startup_profile.py cold with and without FLASHINFER_CUDA_ARCH_LIST (issue 17's start-up).
#   bash benchmarks/device/call_startup_libs.sh COMMIT
set -u
source benchmarks/device/env.sh
commit=$1
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit BATCHSCRIBE_CACHE=$HOME/stage/models
P=../../shared/data/librispeech/test-other-subset-00000-of-00001.parquet
arch=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
cd benchmarks
for k in 1 2 3; do
    if [ $k = 2 ]; then export FLASHINFER_CUDA_ARCH_LIST=$arch; else unset FLASHINFER_CUDA_ARCH_LIST; fi
    echo "== startup_libs $k"; timeout 60 python3 startup_libs.py 2>&1 | cut -c1-200
done
for k in 1 2; do
    unset FLASHINFER_CUDA_ARCH_LIST
    timeout 60 python3 startup_profile.py --parquet $P --rows 3 > $OUT/startup_$k.txt 2>&1
    echo "== startup_profile $k"; head -${LINES_SHOWN:-26} $OUT/startup_$k.txt | cut -c1-160
    FLASHINFER_CUDA_ARCH_LIST=$arch timeout 60 python3 startup_profile.py --parquet $P --rows 3 > $OUT/startup_arch_$k.txt 2>&1
    echo "== startup_profile $k, FLASHINFER_CUDA_ARCH_LIST=$arch"; head -${LINES_SHOWN:-26} $OUT/startup_arch_$k.txt | cut -c1-160
done
