#!/usr/bin/env bash
# Device call for the encoder's FA3 attention (carry .whl2 .stage/p1; add .stage/fa3 once an earlier
# call returned its modules as fa3.tgz, where the 64 MiB allow): FlashInfer's FA3 prefill modules
# for fp16 and bf16 built (JIT, timed) or loaded, returned as fa3.tgz; the attention's GPU tests
# (PYTEST_MORE adds files); then call_w4.sh with the further arguments (the encoder alone, W4), e.g.
#   bash benchmarks/device/call_fa3.sh abc1234 "--windows 4096 --configs triton/flashinfer_hnd:auto auto:auto"
set -u
commit=$1
source benchmarks/device/install.sh
source benchmarks/device/env.sh
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit
timeout ${BUILD_TIMEOUT:-420} python3 - > $OUT/fa3_build.txt 2>&1 <<'PY'
import time

import torch

from batchscribe.attention.flashinfer_prefill import FlashInferEncoderAttention

for dtype in (torch.float16, torch.bfloat16):
    start = time.perf_counter()
    attention = FlashInferEncoderAttention(torch.device("cuda"), dtype, 6, 64, 1500)
    attention(torch.randn(1500, 3 * 384, device="cuda", dtype=dtype), 1)
    torch.cuda.synchronize()
    print(f"{dtype}: first FA3 call (build or load) {time.perf_counter() - start:.1f} s", flush=True)
PY
tail -4 $OUT/fa3_build.txt | cut -c1-300
(cd $HOME/.cache/flashinfer 2>/dev/null && find . -name "*.so" -path "*prefill*" | tar czf $OUT/fa3.tgz -T -) || true
timeout 200 python3 -m pytest -q -m gpu tests/attention/test_flashinfer_prefill.py ${PYTEST_MORE:-} > $OUT/tests_fa3.txt 2>&1
tail -3 $OUT/tests_fa3.txt | cut -c1-300
bash benchmarks/device/call_w4.sh "$@"
