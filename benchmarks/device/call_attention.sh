#!/usr/bin/env bash
# Device call for the encoder's attention kernels alone (carry .whl2 .stage/fa3): FlashInfer's
# prefill backends (FA3 in bf16 and in e4m3, FA2, fmha_v2, cuDNN) against cuDNN's SDPA at the
# turbo encoder's shapes, with each one's error against fp32 (encoder_speed.py --flashinfer). The
# FA3 e4m3 module is JIT-built on its first use (~75 s) and comes back as fa3_e4m3.tgz, for
# .stage/fa3 (untar it there) so later calls load it.
#   [BACKENDS="fa3 fa3-e4m3"] bash benchmarks/device/call_attention.sh abc1234 [GROUPS, default "16 32"]
set -u
commit=$1; groups=${2:-16 32}
source benchmarks/device/install.sh
source benchmarks/device/env.sh
export PYTHONPATH=/tmp/site:$PWD BATCHSCRIBE_COMMIT=$commit
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
(cd benchmarks && timeout ${ATTENTION_TIMEOUT:-480} python3 encoder_speed.py --flashinfer --groups $groups --backends ${BACKENDS:-fa3 fa3-e4m3 fa2 fmha_v2 flashinfer-cudnn}) > $OUT/attention.txt 2>&1
grep -E "attention|flashinfer|Error" $OUT/attention.txt | cut -c1-900
(cd $HOME/.cache/flashinfer 2>/dev/null && find . -name "*.so" -path "*prefill*e4m3*" | tar czf $OUT/fa3_e4m3.tgz -T -) || true
